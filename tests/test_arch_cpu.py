"""CPU tests of the config table, the rules Python asks of the module, and the planner: names,
fallbacks, workspace sizes, split-K, the Hopper (sm90) rows and which configs configs.plan may
pick where (by compute capability), autotune's candidates, the built kernels' resources, and
the CUDA custom call the lowering emits with its plan (config, split_k, workspace).

sm90 configs (TMA + wgmma) run as themselves only on compute capability 9.0 with
TMA-addressable operands; elsewhere as configs.sm80_fallback (C++ Sm80Fallback, reported by the
module's config_table). plan(arch=None) plans with sm80 rows only; the CUDA lowering plans with
configs.device_arch(). The table and the rules come from the compiled module: tests that need
them skip without it.
"""
import dataclasses
import os
import re
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm import _ffi, autotune, configs, plan8, problem
from jax_tcgemm.primitive import tcgemm

from test_cpu import (CFG64, IN_DTYPES, LAYOUT_IDS, LAYOUTS, NO_MODULE, S, cuda_text,
                      custom_calls, h, needs_module)

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
SM90 = [c for c in configs.CONFIGS if c.kind == "sm90"]


# ---------------------------------------------------------------------------------------------
# The table and the module's rules.

@needs_module
def test_config_names_procedural_and_unique():
    assert len(configs.CONFIGS) >= 1
    names = [c.name for c in configs.CONFIGS]
    assert len(set(names)) == len(names)
    kinds = [c.kind for c in configs.CONFIGS]
    order = {"sm80": 0, "sm90": 1, "narrow": 2}  # the table's (= C++ index) order of kinds
    assert set(kinds) <= set(order) and kinds[0] == "sm80"
    assert kinds == sorted(kinds, key=order.get)
    for c in configs.CONFIGS:
        assert configs.BY_NAME[c.name] is c and c.bk % 16 == 0
        if c.kind == "sm80":
            assert re.fullmatch(r"sm80_\d+x\d+x\d+_s\d+_w\d+x\d+(x[2-9]\d*)?", c.name), c.name
            wk = f"x{c.warps_k}" if c.warps_k > 1 else ""
            assert c.name == f"sm80_{c.bm}x{c.bn}x{c.bk}_s{c.stages}_w{c.warps_m}x{c.warps_n}{wk}"
            assert c.consumers == 0 and c.threads == 32 * c.warps_m * c.warps_n * c.warps_k
            assert c.bm % (16 * c.warps_m) == 0 and c.bn % (8 * c.warps_n) == 0
            # sliced K: each k group's share of a stage is whole 64-wide chunk groups
            assert c.warps_k == 1 or (c.bk // 16) % (4 * c.warps_k) == 0
            assert c.smem_bytes > 0 and c.fallback == c.name
        elif c.kind == "narrow":  # 8-bit products of at most bm rows, on every GPU (no fallback)
            assert c.name == f"narrow_{c.bm}x{c.bn}x{c.bk}_w{c.warps_n}x{c.warps_k}"
            assert c.threads == 32 * c.warps_n * c.warps_k and c.smem_bytes == 0
            assert c.int8 and c.fp8 and not (c.f32 or c.ragged or c.element_loads)
            assert c.fallback == c.name and c not in configs.CONFIGS16 and c.bm % 16 == 0
        else:
            assert c.warps_k == 1 and c.smem_bytes == 0
            assert configs.BY_NAME[c.fallback].kind == "sm80"




@pytest.mark.parametrize("m,n,k,batch", [
    (1, 1, 1, 1), (0, 5, 7, 1), (5, 0, 7, 1), (5, 7, 0, 1), (17, 33, 65, 1), (128, 128, 64, 1),
    (1000, 1000, 1000, 1), (4096, 4096, 4096, 1), (16, 4096, 4096, 1), (4096, 16, 4096, 1),
    (8192, 8192, 8192, 1), (256, 256, 256, 64), (64, 64, 65536, 1), (1, 100000, 8, 3)])
@needs_module
def test_select_returns_known_config(m, n, k, batch):
    for dt in IN_DTYPES:
        for layout in configs.LAYOUTS:
            for arch in (None, (9, 0)):
                assert configs.select(m, n, k, batch, dt, layout, arch) in configs.BY_NAME


@needs_module
def test_configs_are_the_module_table():
    """configs.Config rows are exactly the module's config_table (same fields, same order),
    and the limits are the module's."""
    mod = _ffi.module()
    table = mod.config_table()
    assert [f.name for f in dataclasses.fields(configs.Config)] == list(table[0])
    assert configs.CONFIGS == tuple(configs.Config(**r) for r in table)
    assert _ffi.config_names() == [c.name for c in configs.CONFIGS] == list(mod.config_names())
    assert mod.max_split_k() == configs.MAX_SPLIT_K >= 16
    assert mod.max_cluster_split() == configs.MAX_CLUSTER_SPLIT
    assert 1 < configs.MAX_CLUSTER_SPLIT < configs.MAX_SPLIT_K
    assert mod.num_activations() == len(problem.ACTIVATIONS)


@needs_module
def test_module_rules():
    """The derived rules Python asks of the module (NeedsPack, PackedLd, EffectiveSplitK,
    PlanWorkspace), checked against what they are documented to do."""
    for cols, pack in [(8, False), (7, True), (1, True), (504, False), (512, False),
                       (1000, True), (1008, False), (1016, True), (1024, False), (3000, True),
                       (4104, True)]:
        assert configs.needs_pack(cols) is pack, cols
    for cols, ld in [(1, 8), (8, 8), (9, 16), (504, 504), (511, 512), (520, 576),
                     (1000, 1024), (4104, 4160)]:
        assert configs.packed_ld(cols) == ld, cols
    c = configs.BY_NAME[CFG64]  # BK = 64
    for k, split, want in [(192, 3, 3), (9, 3, 1), (320, 4, 3), (64 * 16, 16, 16),
                           (64 * 16, 1, 1), (0, 2, 1), (65, 2, 2)]:
        assert configs.effective_split(c, k, split) == want, (k, split)
    ws = configs.workspace_floats
    # split-K partials: effective split x B x M x N, rounded up to 32 floats
    assert ws(5, 3, 192, 2, False, True, False, False, c.name, 3, False) == 96
    assert ws(5, 3, 192, 2, False, True, False, False, c.name, 1, False) == 0
    assert ws(64, 64, 1024, 1, False, False, False, False, c.name, 2, False) == 2 * 64 * 64
    # packed copies: rows x packed_ld / 2 (2-byte elements), shared operands once
    assert ws(16, 24, 7, 3, False, True, False, False, c.name, 1, True) == 3 * 16 * 8 // 2
    assert ws(16, 24, 7, 3, True, True, False, False, c.name, 1, True) == 16 * 8 // 2
    assert ws(16, 24, 7, 3, False, True, False, False, c.name, 1, False) == 0
    assert ws(16, 9, 8, 1, False, False, False, False, c.name, 1, True) == 8 * 16 // 2
    with pytest.raises(ValueError, match="nope"):
        ws(5, 3, 192, 1, False, False, False, False, "nope", 1, False)


def _cuobjdump():
    """cuobjdump from $CUOBJDUMP, PATH, $CUDA_HOME or /usr/local/cuda (None if there is none)."""
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
              os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", "cuobjdump"),
              "/usr/local/cuda/bin/cuobjdump"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def test_no_kernel_has_a_stack_frame():
    """Every kernel of the built module, for every target (sm_80, sm_90, sm_90a), reports STACK:0
    and LOCAL:0 in cuobjdump's resource usage: no register spills (issue 4 asks for
    __launch_bounds__ with no spills; the large sm80 tiles spilled up to 780 bytes before
    benchmarks/NOTES.md v25) and no local arrays."""
    if not _ffi.available():
        pytest.skip(f"CUDA extension not built: {_ffi._LOAD_ERROR}")
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (set CUOBJDUMP)")
    out = subprocess.run([tool, "--dump-resource-usage", _ffi._tcgemm.__file__],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    usage = re.findall(r"Function (\S+):\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out.stdout)
    sm80 = [u for u in usage if "gemm_sm80_kernel" in u[0]]
    # sm80 rows x 8 variants (4: aligned only, without element-wise loads) x 2 input types,
    # for sm_80 and sm_90; plus the grouped kernels of the sm80 rows that have them (3 aligned
    # layouts: rows with B N- or K-major, the contraction); plus one int8 kernel per sm80 row
    # with int8 kernels (A and B K-major, aligned), for both targets
    rows80 = [c for c in configs.CONFIGS if c.kind == "sm80"]
    assert len(sm80) == 2 * (2 * sum((8 if c.element_loads else 4) + (3 if c.ragged else 0)
                                     for c in rows80) + sum(c.int8 for c in rows80)), len(sm80)
    # Known, measured exception (benchmarks/NOTES.md v30): the sm90 256x128 row with A stored
    # M-major keeps 8 bytes on the stack (two registers past the consumers' 232) since the
    # epilogue redesign; nothing else may use local memory, and it no more than that.
    allowed = re.compile(r"gemm_sm90_kernel.*Li10ELb0E")
    framed = [(name, stack, local) for name, _, stack, local in usage
              if (int(stack) or int(local))
              and not (allowed.search(name) and int(stack) <= 8 and not int(local))]
    assert not framed, f"{len(framed)} of {len(usage)} kernels use local memory: {framed[:4]}"


@pytest.mark.parametrize("m,n,k,batch", [
    (16, 11008, 4096, 1), (128, 4096, 11008, 1), (16, 8192, 28672, 1), (8192, 8192, 8192, 1),
    (4096, 4096, 4096, 1), (256, 256, 256, 64), (64, 64, 65536, 1), (5, 7, 0, 1)], ids=str)
@pytest.mark.parametrize("arch", [None, (9, 0)], ids=str)
@needs_module
def test_plan_split_k(m, n, k, batch, arch):
    """Skinny long-K products split K, tile-rich ones do not, and every slice is >= 512 deep."""
    name, split = configs.plan(m, n, k, batch, arch=arch)
    c = configs.BY_NAME[name]
    assert 1 <= split <= min(16, configs.MAX_SPLIT_K) and split in configs.splits(c, k)
    # resident blocks of a full wave (skinny rows split only while each block has its own SM)
    slots = 132 * (1 if c.bm < 64 else configs.blocks_per_sm(c))
    if c.tiles(m, n) * batch >= slots:
        assert split == 1, (name, split)
    elif 2 * c.tiles(m, n) * batch <= slots and k >= 4096:
        assert split > 1, (name, split)


@needs_module
def test_autotune_off_by_default_uses_model(monkeypatch, tmp_path):
    from jax_tcgemm import autotune
    monkeypatch.delenv("JAX_TCGEMM_AUTOTUNE", raising=False)
    monkeypatch.setenv("JAX_TCGEMM_CACHE_DIR", str(tmp_path))
    assert not autotune.enabled()
    arch = configs.device_arch()  # the model plans for the default device
    for shape in [(16, 4096, 4096, 1), (8192, 8192, 8192, 1)]:
        assert autotune.plan(*shape, F16, "NN") == configs.plan(*shape, arch=arch)
    monkeypatch.setenv("JAX_TCGEMM_AUTOTUNE", "1")
    assert autotune.enabled()
    if jax.default_backend() != "gpu":  # on CPU it still answers with the model, times nothing
        assert autotune.plan(16, 4096, 4096, 1, F16, "NN") == configs.plan(16, 4096, 4096, 1)
        assert autotune.plan(8192, 8192, 8192, 1, F16, "NN")[0].startswith("sm80_")
        assert not (tmp_path / "autotune.json").exists()
    for arch in (None, (8, 0), (9, 0)):
        cands = autotune.candidates(16, 4096, 4096, 1, arch)
        assert ("sm80_64x64x32_s4_w2x2", 1) in cands and len(set(cands)) == len(cands)
        assert all(c in configs.BY_NAME and s in configs.splits(configs.BY_NAME[c], 4096)
                   for c, s in cands)
        hopper = {c for c, _ in cands if configs.BY_NAME[c].kind == "sm90"}
        # every sm90 row but ping-pong ones (planned for fused epilogues only: competes()) and
        # fp8-only ones (no 16-bit kernels)
        assert hopper == ({c.name for c in SM90 if not (c.pingpong or c.fp8_only)} if arch == (9, 0)
                          else set()), arch
        assert all(s == 1 for c, s in cands if c in hopper)
    assert autotune.candidates(16, 4096, 4096) == autotune.candidates(16, 4096, 4096, 1, None)


# ---------------------------------------------------------------------------------------------
# Hopper rows and planning by compute capability.



@needs_module
def test_sm90_rows():
    """Hopper rows: name rule, no warp layout, warpgroup threads, one block per SM, split by the
    planner in at most 2 slices and only with M >= 64, and an sm80 fallback with the same BK
    (Sm80Fallback in C++)."""
    assert SM90, "the module's config table has no sm90 row (TCGEMM_SM90_CONFIG)"
    for c in SM90:
        assert re.fullmatch(r"sm90_\d+x\d+x\d+_s\d+_[gp]\d+(_f8)?", c.name), c.name
        kind = "p" if c.pingpong else "g"
        f8 = "_f8" if c.fp8_only else ""
        assert c.name == f"sm90_{c.bm}x{c.bn}x{c.bk}_s{c.stages}_{kind}{c.consumers}{f8}"
        assert not c.pingpong or c.consumers == 2
        # an fp8-only row: fp8 kernels and nothing else (Has16BitKernels, HasByteKernels)
        assert not c.fp8_only or (c.fp8 and not (c.int8 or c.f32 or c.ragged or c.pingpong))
        assert (c.warps_m, c.warps_n) == (0, 0) and c.consumers >= 1
        assert c.threads == 128 * (c.consumers + 1) and c.bm % c.consumers == 0
        assert configs.blocks_per_sm(c) == 1 and configs.splits(c, 65536) == (1, 2)
        assert configs.splits(c, 65536, 16) == configs.splits(c, 1023, 128) == (1,)
        f = configs.sm80_fallback(c)
        assert f.kind == "sm80" and f.bk == c.bk and f.name == c.fallback
        assert f is next(x for x in configs.CONFIGS if x.kind == "sm80" and x.bk == c.bk)
    for c in configs.CONFIGS:
        if c.kind != "sm90":
            assert configs.sm80_fallback(c) is c
    assert {c.name for c in SM90} >= {"sm90_128x256x64_s4_g2", "sm90_128x128x64_s6_g2"}


@needs_module
@pytest.mark.parametrize("shape", [(8192, 16384, 4096, 1), (4096, 4096, 4096, 1),
                                   (2048, 4096, 1024, 4), (1000, 1032, 1096, 1),
                                   (16, 14336, 4096, 1), (128, 4096, 4096, 1)])
def test_ping_pong_only_for_fused_epilogues(shape):
    """The ping-pong row is planned for products with a fused epilogue only (configs.competes),
    and wins the large ones on 9.0 (a cooperative row's epilogue costs _EPI_TILE_SM90 per tile
    wave); plain products plan as before, and the planner's choice never changes off 9.0."""
    pp = {c.name for c in SM90 if c.pingpong}
    assert pp == {"sm90_128x128x64_s6_p2"}
    m, n, k, b = shape
    for arch in (None, (8, 0), (9, 0)):
        plain = configs.plan(m, n, k, b, arch=arch)
        fused = configs.plan(m, n, k, b, arch=arch, epilogue=True)
        assert plain[0] not in pp
        if arch != (9, 0):
            assert fused == plain and fused[0] not in pp
    if m * n >= 4096 * 4096:  # several waves of tiles: the epilogue hides under main loops
        assert configs.plan(m, n, k, b, arch=(9, 0), epilogue=True)[0] in pp
    assert problem.fused_epilogue(False, False, False, False, None) is False
    assert problem.fused_epilogue(False, False, False, False, "none") is False
    assert problem.fused_epilogue(False, False, True, False, None) is False  # alpha from device
    for flags in ((True, False, False, False, None), (False, True, False, False, None),
                  (True, False, True, False, None), (False, False, False, True, None),
                  (False, False, False, False, "relu")):
        assert problem.fused_epilogue(*flags) is True


@pytest.mark.parametrize("m,n,k,batch", [
    (8192, 8192, 8192, 1), (4096, 4096, 4096, 1), (4096, 11008, 4096, 1), (16, 4096, 4096, 1),
    (128, 4096, 4096, 1), (4095, 4097, 4093, 1), (127, 129, 255, 1), (256, 256, 256, 64)],
    ids=str)
@needs_module
def test_plan_by_arch(m, n, k, batch):
    """sm90 rows are candidates on compute capability 9.0 only, and only where both operands
    are TMA-addressable (rows 16-byte multiples as stored, or packed)."""
    for layout in configs.LAYOUTS:
        for arch in (None, (8, 0), (8, 9), (10, 0)):
            name, _ = configs.plan(m, n, k, batch, F16, layout, arch=arch)
            assert configs.BY_NAME[name].kind == "sm80", (arch, layout, name)
            assert configs.select(m, n, k, batch, F16, layout, arch) == name
        assert configs.plan(m, n, k, batch, F16, layout, arch=None) == configs.plan(
            m, n, k, batch, F16, layout)  # the default is sm80 only
        name, split = configs.plan(m, n, k, batch, F16, layout, arch=(9, 0))
        ta, tb = layout[0] == "T", layout[1] == "T"
        if not configs.tma_addressable(m, n, k, batch, ta, tb):
            assert configs.BY_NAME[name].kind == "sm80", (layout, name)
        if configs.BY_NAME[name].kind == "sm90":  # split only with M >= 64, at most 2
            assert split in configs.splits(configs.BY_NAME[name], k, m) and (split == 1 or m >= 64)


@pytest.mark.parametrize("m,n,k", [(8192, 8192, 8192), (4096, 11008, 4096),
                                   (8192, 28672, 8192), (4096, 4096, 11008)], ids=str)
@needs_module
def test_plan_picks_sm90_on_hopper(m, n, k):
    name, split = configs.plan(m, n, k, arch=(9, 0))
    assert name.startswith("sm90_") and split == 1, (name, split)
    assert configs.plan(m, n, k)[0].startswith("sm80_")


@needs_module
def test_skinny_plans_on_hopper():
    """Against 4096 x 4096 weights on 9.0 (H100, CUDA-graph replay of every candidate): M = 16
    takes the 16-row tile in a 2-block cluster split (8.6 us, 8.3 since v20's push reduction;
    64x64x64 split 2 12.1, the best sm90 plan 12.2), M = 32 the 16-row tile in one slice
    (11.8 us; two slices 14.3, 64x64x64 split 2 12.5), and since v22 the sliced-K 16-row tile in
    one slice (10.5 us), M = 128 the one-warpgroup sm90 row in 2 slices (harness 25.2 us; sm80
    64x64x64 split 2 31.8). 16 x 28672 x 8192 needs two waves of 16-row tiles: sm90 instead."""
    assert configs.plan(16, 4096, 4096, arch=(9, 0)) == ("sm80_16x64x64_s6_w1x4", 2)
    assert configs.plan(32, 4096, 4096, arch=(9, 0)) == ("sm80_16x64x128_s6_w1x4x2", 1)
    assert configs.plan(128, 4096, 4096, arch=(9, 0)) == ("sm90_64x128x64_s8_g1", 2)
    assert configs.plan(16, 28672, 8192, arch=(9, 0)) == ("sm90_64x128x64_s8_g1", 1)


@needs_module
def test_refit_plans_on_hopper():
    """The sm90 constants refit to 16-bit products on an H200 (benchmarks/NOTES.md v58): 128x128
    where its tiles fill the last wave (3000^3 plain: 1.12x the 128x256 plan there, 2500 x 4096
    x 11008 1.17x), 128x256 where they do not (4096^3, 6000^3); fused epilogues on the ping-pong
    row from M = 256 up (256 x 11008 x 4096: 1.61x the sm80 128x256 plan). 8-bit and float32
    plans keep the first fit."""
    g2, g128, p2 = "sm90_128x256x64_s4_g2", "sm90_128x128x64_s6_g2", "sm90_128x128x64_s6_p2"
    assert configs.plan(3000, 3000, 3000, arch=(9, 0)) == (g128, 1)
    assert configs.plan(2500, 4096, 11008, arch=(9, 0)) == (g128, 1)
    assert configs.plan(4096, 4096, 4096, arch=(9, 0)) == (g2, 1)
    assert configs.plan(6000, 6000, 6000, arch=(9, 0)) == (g2, 1)
    assert configs.plan(256, 11008, 4096, arch=(9, 0), epilogue=True) == (p2, 1)
    assert configs.plan(1024, 4096, 4096, arch=(9, 0), epilogue=True) == (p2, 1)
    assert plan8.plan_byte(128, 4096, 14336, "fp8", (9, 0), block_scales=True) == (
        "sm90_128x128x64_s5_g2_f8", 4)  # the 8-bit plans' own rates (v70)
    assert configs.plan_f32(128, 4096, 12288, arch=(9, 0), epilogue=True) == (
        "sm90_64x128x64_s8_g1", 2)


@pytest.mark.parametrize("m,n,k,batch", [(16, 4096, 4096, 1), (32, 4096, 4096, 1),
                                         (16, 28672, 8192, 1), (8, 8192, 28672, 1),
                                         (33, 4096, 4096, 1), (1000, 1000, 1000, 1),
                                         (16, 256, 4096, 64), (24, 4096, 4096, 1),
                                         (16, 8192, 8192, 1), (16, 4096, 512, 1),
                                         (32, 4096, 11008, 1)], ids=str)
@pytest.mark.parametrize("arch", [None, (9, 0)], ids=str)
@needs_module
def test_skinny_rows_only_where_they_pay(m, n, k, batch, arch):
    """A skinny row (BM < 64) is planned only for M <= SKINNY_MAX_M, all its blocks in one
    wave, and split only while every block has an SM to itself; autotune offers the same."""
    name, split = configs.plan(m, n, k, batch, arch=arch)
    c = configs.BY_NAME[name]
    if c.bm < 64:
        blocks = c.tiles(m, n) * batch
        assert m <= configs.SKINNY_MAX_M and blocks <= 132 * configs.blocks_per_sm(c)
        assert split == 1 or blocks * split <= 132, (name, split)
        if c.warps_k > 1:  # sliced K: one slice, where the plain skinny row cannot take two
            assert split == 1 and (2 * blocks > 132 or k < 1024), (name, split)
            assert 2 * blocks <= 132 or m > c.bm or n * k * 2 <= configs.SLICED_K_MAX_WEIGHT
    for cname, s in autotune.candidates(m, n, k, batch, arch):
        assert configs.competes(configs.BY_NAME[cname], s, m, n, k, batch)
    assert any(c.bm < 64 for c in configs.CONFIGS)


@needs_module
def test_tma_addressable():
    assert configs.tma_addressable(300, 520, 200)       # NN: rows of K and N, both % 8 == 0
    assert not configs.tma_addressable(300, 520, 200, 1, True, False)  # TN: A rows are M = 300
    assert not configs.tma_addressable(129, 67, 1001)   # K rows odd, too small to pack
    assert configs.tma_addressable(1000, 1000, 1001)    # packed (configs.should_pack)
    assert configs.should_pack(1000, 1000, 1001) and not configs.should_pack(129, 67, 1001)


def test_device_arch():
    arch = configs.device_arch()
    assert arch is configs.device_arch()  # cached
    if jax.default_backend() != "gpu":
        assert arch is None
    else:
        assert arch is None or (isinstance(arch, tuple) and all(isinstance(x, int) for x in arch))
    assert configs.configs_for(None) == configs.configs_for((8, 0)) == tuple(
        c for c in configs.CONFIGS if c.kind == "sm80")
    assert configs.configs_for((9, 0)) == tuple(c for c in configs.CONFIGS
                                                if not c.fp8_only and c.kind != "narrow")


@pytest.mark.parametrize("split", [1, 2, 3, 64])
@needs_module
def test_sm90_workspace_equals_fallback(split):
    """An sm90 config asks for the same float32 workspace as its fallback (same BK)."""
    for c in SM90:
        f = configs.sm80_fallback(c)
        for args in [(300, 520, 200, 1, True, True, False, False),
                     (129, 257, 1000, 3, False, True, True, False),
                     (5, 7, 1001, 2, True, False, False, True)]:
            for pack in (False, True):
                ws = configs.workspace_floats(*args, c.name, split, pack)
                assert ws == configs.workspace_floats(*args, f.name, split, pack), (c, args, pack)
        m, n = 300, 520
        want = 2 * m * n if split == 2 else (0 if split == 1 else None)
        if want is not None:
            assert configs.workspace_floats(m, n, 1024, 1, True, True, False, False, c.name,
                                            split, False) == want


# ---------------------------------------------------------------------------------------------
# The CUDA lowering from the CPU host: the custom call with the plan it was given or made.

@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
def test_cuda_lowering_needs_or_emits(ta, tb):
    """The real behaviour: custom call text with the extension, a 'rebuild' error without."""
    a, b = h(2, 9, 5) if ta else h(2, 5, 9), h(2, 3, 9) if tb else h(2, 9, 3)
    f = lambda x, y: tcgemm(x, y, transpose_a=ta, transpose_b=tb, out_dtype=F32)
    if _ffi.available():
        (call,) = custom_calls(cuda_text(f, a, b))
        assert call["transpose_a"] == str(ta).lower() and call["transpose_b"] == str(tb).lower()
    else:
        with pytest.raises(RuntimeError, match="rebuild"):
            cuda_text(f, a, b)


@pytest.fixture
def cuda_lowering():
    """The CUDA lowering plans and sizes its workspace with the module's rules: it needs the
    extension (not a GPU: the call is only emitted)."""
    if not _ffi.available():
        pytest.skip(NO_MODULE)


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("out_dtype,mlir_t", [(F16, "f16"), (BF16, "bf16"), (F32, "f32")], ids=str)
def test_cuda_lowering_text(cuda_lowering, ta, tb, out_dtype, mlir_t):
    a, b = h(2, 9, 5) if ta else h(2, 5, 9), h(1, 3, 9) if tb else h(1, 9, 3)
    cfg = CFG64
    f = lambda x, y: tcgemm(x, y, transpose_a=ta, transpose_b=tb, out_dtype=out_dtype, config=cfg)
    text = cuda_text(f, a, b)
    (call,) = custom_calls(text)
    assert call["transpose_a"] == str(ta).lower() and call["transpose_b"] == str(tb).lower()
    assert call["config"] == cfg and call["split_k"].startswith("1 ")
    assert [call[k] for k in ("has_c", "has_bias", "has_scale", "aux")] == ["false"] * 4
    assert call["activation"].startswith("0 ")  # "none"
    # d, then the float32 workspace (empty: no split, no packing)
    assert call["results"] == [f"tensor<2x5x3x{mlir_t}>", "tensor<0xf32>"]
    assert "dot_general" not in text


def test_cuda_lowering_split_k_workspace(cuda_lowering):
    """split_k > 1: the call gets a float32 workspace result of split_k * B * M * N for the
    slices that run (K = 192 is 3 k tiles of 64; with K = 9 a split of 3 leaves one slice);
    the same for an sm90 config with BK = 64 (its slices are its fallback's)."""
    for cfg in [CFG64] + [c.name for c in SM90 if c.bk == 64 and not c.fp8_only]:
        assert configs.BY_NAME[cfg].bk == 64
        f = lambda x, y: tcgemm(x, y, out_dtype=BF16, config=cfg, split_k=3)  # noqa: B023
        (call,) = custom_calls(cuda_text(f, h(2, 5, 192), h(1, 192, 3)))
        assert "split_k = 3" in call["line"] and "pack = false" in call["line"]
        assert call["config"] == cfg
        # 3 slices x 2 x 5 x 3 = 90 partial floats, rounded up to 96 (32-float granule)
        assert "tensor<2x5x3xbf16>, tensor<96xf32>" in call["line"]
        (call,) = custom_calls(cuda_text(f, h(2, 5, 9), h(1, 9, 3)))
        assert "tensor<0xf32>" in call["line"]
        f1 = lambda x, y: tcgemm(x, y, config=cfg, split_k=1)  # noqa: B023
        (call,) = custom_calls(cuda_text(f1, h(2, 5, 9), h(1, 9, 3)))
        assert "tensor<0xf32>" in call["line"]


def test_cuda_lowering_grad_and_vmap(cuda_lowering):
    # value_and_grad: with grad alone the unused forward product is dead code and is dropped
    g = jax.value_and_grad(lambda a, b: tg.matmul(a, b, out_dtype=F32).sum(), argnums=(0, 1))
    calls = custom_calls(cuda_text(g, h(5, 7), h(7, 3)))
    assert len(calls) == 3
    assert {(c["transpose_a"], c["transpose_b"]) for c in calls} == {
        ("false", "false"), ("false", "true"), ("true", "false")}
    assert all(c["config"] in configs.BY_NAME for c in calls)  # planned at lowering
    calls = custom_calls(cuda_text(jax.vmap(tg.matmul, in_axes=(0, None)), h(4, 5, 7), h(7, 3)))
    assert len(calls) == 1 and calls[0]["config"] in configs.BY_NAME


def test_cuda_lowering_plans_for_the_shapes(cuda_lowering):
    """Without an override the lowering asks the planner (a CPU host: sm80 rows only)."""
    for shape in [(16, 4096, 4096), (4096, 4096, 4096), (5, 7, 9)]:
        m, n, k = shape
        (call,) = custom_calls(cuda_text(lambda x, y: tcgemm(x, y), S((1, m, k), F16),
                                                 S((1, k, n), F16)))
        want = configs.plan_for_device(m, n, k, 1, F16, "NN")
        assert (call["config"], int(call["split_k"].split()[0])) == want, shape


@needs_module
def test_tail_split_plans(monkeypatch, cuda_lowering):
    """configs.tail_plan (GemmProblem::tail_rows): where the cost model runs a product's last
    rows in K slices of their own (5000^3 on 128x256: the 8 rows of its last tile row, whose 20
    tiles would be a wave of 8 of 132 SMs; measured 1.095x the whole product in one launch,
    H200, benchmarks/NOTES.md v59), the head is whole tile rows, the tail the rest; none for a
    forced split, a batch, an sm80 row, or a wave that is more than half full. A planned
    product carries the tail in its attributes and sizes the workspace for the tail's
    partials."""
    g2 = "sm90_128x256x64_s4_g2"
    assert configs.tail_plan(g2, 1, 5000, 5000, 5000) == (8, 6)
    for shape in [(3000, 3000, 3000), (4096, 4096, 4096), (8192, 16384, 4096), (2500, 3000, 3000)]:
        assert configs.tail_plan(*configs.plan(*shape, arch=(9, 0)), *shape) == (0, 1), shape
    assert configs.tail_plan(g2, 2, 5000, 5000, 5000) == (0, 1)
    assert configs.tail_plan(g2, 1, 5000, 5000, 5000, batch=2) == (0, 1)
    assert configs.tail_plan("sm80_128x256x32_s4_w2x4", 1, 5000, 5000, 5000) == (0, 1)
    for m, n, k in [(5000, 5000, 5000), (6000, 5000, 4096), (1500, 3000, 8192), (3000, 1000, 8192)]:
        cfg, split = configs.plan(m, n, k, arch=(9, 0))
        rows, s = configs.tail_plan(cfg, split, m, n, k)
        if rows:
            bm = configs.BY_NAME[cfg].bm
            assert split == 1 and 0 < rows < m and (m - rows) % bm == 0 and s in configs.TAIL_SPLITS
    monkeypatch.setattr(configs, "device_arch", lambda: (9, 0))
    (call,) = custom_calls(cuda_text(lambda x, y: tcgemm(x, y), S((1, 5000, 5000), BF16),
                                     S((1, 5000, 5000), BF16)))
    assert call["config"] == g2 and call["tail_rows"] == "8 : i64" and call["tail_split"] == "6 : i64"
    ws = configs.workspace_floats(5000, 5000, 5000, 1, True, True, False, False, g2, 1, True, 2,
                                  (8, 6))
    assert f"tensor<{ws}xf32>" in call["results"]
    assert ws - configs.workspace_floats(5000, 5000, 5000, 1, True, True, False, False, g2, 1,
                                         True) == 6 * 8 * 5000  # the tail's partials
    forced = custom_calls(cuda_text(lambda x, y: tcgemm(x, y, config=g2), S((1, 5000, 5000), BF16),
                                    S((1, 5000, 5000), BF16)))[0]
    assert forced["tail_rows"] == "0 : i64"  # a forced plan runs as named
