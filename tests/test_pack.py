"""Operand packing (ffi/kernels/aux/pack.cu): an operand whose rows are not 16-byte multiples, or are
long (>= 512 elements) and not 32-byte multiples, is copied into padded rows in the workspace,
and the 16-byte cp.async / TMA kernel path runs on the copy (configs.needs_pack).

CPU tests: the planner's rule, the workspace size Python asks for against the handler's own
PlanWorkspace (through the extension), and the lowering. GPU tests: packing forced on small odd
shapes and on pitch-only ones (configs.PACK_MIN_FLOP and PITCH_PACK_MIN_FLOP patched to 0,
caches cleared so that every call lowers again) in every layout, dtype, batch sharing and
split-K mode, against the float64 reference, and bitwise equal to the unpacked path (element
loads, or the same kernel on rows at their own pitch): both sum the same products in the same
order. The rules live in C++ (asked of the extension): the CPU tests of them need the built
module and are skipped, with that reason, without it."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_tcgemm import _ffi, configs
from jax_tcgemm.primitive import tcgemm

from conftest import bound, epilogue_ref64, rel_err, seed_of

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
LAYOUTS = list(itertools.product((False, True), repeat=2))
needs_module = pytest.mark.skipif(not _ffi.available(), reason="the packing rules are the CUDA "
                                  "extension's (jax_tcgemm._tcgemm), which is not built here")


# ---------------------------------------------------------------------------------------------
# CPU

@needs_module
@pytest.mark.parametrize("m,n,k,ta,tb,want", [
    (4095, 4097, 4093, False, False, True),   # K and N rows misaligned
    (4096, 4096, 4096, False, False, False),  # aligned
    (4096, 4097, 4096, False, True, False),   # NT: B rows are K (aligned); N odd is harmless
    (4097, 4096, 4096, True, False, True),    # TN: A rows are M = 4097
    (127, 129, 255, False, False, False),     # too small to pay for the copy
    # rows 16-byte but not 32-byte multiples: packed when >= 512 long and >= 2^30 FLOP
    (3000, 3000, 3000, False, False, True),
    (1000, 1000, 1000, False, False, True),   # 2e9 FLOP >= 2^30
    (3072, 3072, 3072, False, False, False),  # 32-byte multiples
    (520, 520, 520, False, False, False),     # 2.8e8 FLOP: too small
    (4096, 4096, 504, False, False, False),   # K rows of 504: under 512, left as stored
    (4096, 4096, 520, False, False, True),    # K rows of 520
    (4096, 3000, 4096, False, False, True),   # NN: B rows are N = 3000
    (4096, 3000, 4096, False, True, False),   # NT: A and B rows are K; N = 3000 only C's rows
    (3000, 4096, 4096, False, False, False),  # NN: M = 3000 is only a row count
    (3000, 4096, 4096, True, False, True),    # TN: A rows are M = 3000
    (3000, 4096, 4096, True, True, True),     # TT: A rows are M = 3000
])
def test_should_pack(m, n, k, ta, tb, want):
    assert configs.should_pack(m, n, k, 1, ta, tb) is want


@needs_module
def test_needs_pack_and_tma():
    assert [x for x in (8, 504, 511, 512, 520, 1000, 1001, 1024, 3000, 3072, 4093)
            if configs.needs_pack(x)] == [511, 520, 1000, 1001, 3000, 4093]
    # a pitch-only product stays TMA-addressable whether or not it is packed
    assert configs.tma_addressable(3000, 3000, 3000) and configs.should_pack(3000, 3000, 3000)
    assert configs.tma_addressable(520, 520, 520) and not configs.should_pack(520, 520, 520)


@needs_module
def test_workspace_floats_by_hand():
    c = configs.CONFIGS[0].name
    # pitch-only 3000^3: both operands' rows of 3000 -> 3008; short rows of 504 are not copied
    assert configs.workspace_floats(3000, 3000, 3000, 1, True, True, False, False, c, 1,
                                    True) == 2 * 3000 * 3008 // 2
    assert configs.workspace_floats(4096, 4096, 504, 1, True, True, False, False, c, 1,
                                    True) == 0
    # a packing product copies both kinds: A rows of K = 1001 -> 1024, B rows of N = 520 -> 576
    assert configs.workspace_floats(300, 520, 1001, 1, True, True, False, False, c, 1,
                                    True) == 300 * 1024 // 2 + 1001 * 576 // 2
    # A (1, 4095, 4093) -> rows of 4096: 4095 * 4096 / 2 floats; B (1, 4093, 4097) -> 4160
    # (rows of 512 or more are padded to 64 elements, shorter ones to 8)
    assert configs.workspace_floats(4095, 4097, 4093, 1, True, True, False, False, c, 1,
                                    True) == 4095 * 4096 // 2 + 4093 * 4160 // 2
    assert [configs.packed_ld(x) for x in (1, 9, 511, 512, 513, 4097)] == [8, 16, 512, 512, 576,
                                                                         4160]
    assert configs.workspace_floats(4095, 4097, 4093, 1, True, True, False, False, c, 1,
                                    False) == 0
    # batch 3 with a shared A: A packed once, B three times; split-K partials come first, their
    # 2 * 3 * 5 * 7 = 210 floats rounded up to 224 so that the copies start 16-byte aligned
    bk = configs.BY_NAME[c].bk
    k = 4 * bk - 3
    want = 224 + 5 * (k + 3) // 2 + 3 * k * 8 // 2
    assert configs.workspace_floats(5, 7, k, 3, True, False, False, False, c, 2, True) == want


@needs_module
def test_packed_copies_start_aligned():
    """The split-K partials before the packed copies take a multiple of 32 floats, so the copies
    start 16-byte aligned (the pack kernel stores 16 bytes at a time) for any split * M * N."""
    rng = np.random.default_rng(7)
    c = configs.CONFIGS[0].name
    for _ in range(200):
        m, n, batch = (int(x) for x in rng.integers(1, 300, 3))
        k, split = int(rng.integers(64, 5000)), int(rng.choice([2, 3, 5, 8]))
        split_part = configs.workspace_floats(m, n, k, batch, False, False, False, False, c,
                                              split, False)
        assert split_part % 32 == 0 and split_part >= (
            configs.effective_split(configs.BY_NAME[c], k, split) * batch * m * n
            if configs.effective_split(configs.BY_NAME[c], k, split) > 1 else 0)


@needs_module
@pytest.mark.parametrize("config", list(dict.fromkeys(  # every third row and every sm90 row
    [c.name for c in configs.CONFIGS16[::3]]
    + [c.name for c in configs.CONFIGS16 if c.kind == "sm90"])))
def test_workspace_floats_match_handler(config):
    """configs.workspace_floats == PlanWorkspace (C++) over shapes, layouts, sharing, splits
    (sm90 configs included: their workspace is their sm80 fallback's)."""
    rng = np.random.default_rng(7)

    def extent():  # any, pitch-only (>= 512, % 16 == 8) or a 32-byte multiple, equally often
        kind = rng.integers(0, 3)
        x = int(rng.integers(1, 3000)) if kind == 0 else 16 * int(rng.integers(32, 190))
        return x + 8 if kind == 1 else x

    for _ in range(300):
        m, n, k = extent(), extent(), extent()
        batch = int(rng.integers(1, 4))
        sa, sb, ta, tb, pack = (bool(x) for x in rng.integers(0, 2, 5))
        split = int(rng.choice([1, 2, 3, 5, 8, 13, 64]))
        args = (m, n, k, batch, sa, sb, ta, tb, config, split, pack)
        assert configs.workspace_floats(*args) == _ffi._tcgemm.workspace_floats(*args), args


@pytest.mark.parametrize("m,k,n,ws", [
    (1023, 1021, 1025, 1023 * 1024 // 2 + 1021 * 1088 // 2),  # rows of 1021 -> 1024, 1025 -> 1088
    (1000, 1000, 1000, 2 * 1000 * 1024 // 2),                  # pitch only: rows of 1000 -> 1024
])
@needs_module
def test_lowering_packs_odd_shapes(m, k, n, ws, monkeypatch):
    """The CUDA lowering of a large odd product asks for packing and the workspace for it."""
    monkeypatch.setattr(_ffi, "require", lambda: None)
    a = jax.ShapeDtypeStruct((1, m, k), F16)
    b = jax.ShapeDtypeStruct((1, k, n), F16)
    cfg = configs.CONFIGS[0].name
    f = jax.jit(lambda x, y: tcgemm(x, y, config=cfg, split_k=1))
    text = f.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    (line,) = [ln for ln in text.splitlines() if "@tcgemm" in ln and "custom_call" in ln]
    assert "pack = true" in line
    assert f"tensor<{ws}xf32>" in line


# ---------------------------------------------------------------------------------------------
# GPU

_tc = jax.jit(tcgemm, static_argnames=("transpose_a", "transpose_b", "out_dtype", "config",
                                        "split_k"))


def _call(pack_min_flop, monkeypatch, a, b, **kw):
    monkeypatch.setattr(configs, "PACK_MIN_FLOP", pack_min_flop)  # both rules: 0 packs every
    monkeypatch.setattr(configs, "PITCH_PACK_MIN_FLOP", pack_min_flop)  # needs_pack operand
    jax.clear_caches()  # lower again under the patched rule
    return np.asarray(_tc(a, b, **kw))


def _operands(rng, batch_a, batch_b, m, n, k, ta, tb, dtype):
    a = rng.standard_normal((batch_a, m, k), np.float32).astype(dtype)
    b = rng.standard_normal((batch_b, k, n), np.float32).astype(dtype)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    sa = np.ascontiguousarray(np.swapaxes(a, 1, 2)) if ta else a
    sb = np.ascontiguousarray(np.swapaxes(b, 1, 2)) if tb else b
    return jax.device_put(sa), jax.device_put(sb), ref


CASES = [  # (batch_a, batch_b, m, n, k, config index, split_k); split 3: in a cluster (sm_90),
           # split 12: through the workspace
    (1, 1, 131, 67, 389, 0, 1), (1, 1, 257, 129, 1021, 2, 1), (1, 1, 33, 1001, 2047, 3, 3),
    (3, 1, 70, 91, 515, 5, 1), (1, 4, 129, 255, 257, 6, 2), (2, 2, 17, 9, 4103, 3, 12),
    (1, 1, 4095, 129, 1029, 1, 1), (1, 1, 200, 72, 1, 4, 1),
]
# the first sm90 row (without the extension the table is empty: the GPU tests are skipped)
_SM90 = next((i for i, c in enumerate(configs.CONFIGS) if c.kind == "sm90"), 0)
# Pitch only: every extent a multiple of 8, rows of >= 512 not of 16 (520, 776, 1000, 1512, 1544,
# 4104; TN / TT rows of M < 512 stay as stored); M, N not tile multiples.
PITCH_CASES = [
    (1, 1, 136, 520, 1000, 0, 1), (1, 1, 520, 1512, 776, _SM90, 1),
    (1, 1, 72, 1000, 1544, 3, 3), (1, 2, 24, 520, 4104, 6, 12), (2, 1, 200, 1000, 1032, _SM90, 2),
]


@needs_module
def test_pitch_cases_are_pitch_only():
    """Each PITCH_CASE has rows that are 16-byte multiples in every layout, and some that
    need_pack (so its packed run differs from the plain one only in the pitch)."""
    for _, _, m, n, k, _, _ in PITCH_CASES:
        for ta, tb in LAYOUTS:
            rows = configs._row_lengths(m, n, k, ta, tb)
            assert all(r % 8 == 0 for r in rows) and any(map(configs.needs_pack, rows))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES + PITCH_CASES, ids=str)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_packed_matches_reference_and_unpacked(case, dtype, monkeypatch):
    ba, bb, m, n, k, ci, split = case
    cfg = configs.CONFIGS[ci].name
    rng = np.random.default_rng(seed_of("pack", *case, dtype.name))
    fails = []
    for i, (ta, tb) in enumerate(LAYOUTS):
        od = F32 if i % 2 else dtype
        x, y, ref = _operands(rng, ba, bb, m, n, k, ta, tb, dtype)
        kw = dict(transpose_a=ta, transpose_b=tb, out_dtype=od, config=cfg, split_k=split)
        packed = _call(0, monkeypatch, x, y, **kw)
        plain = _call(2**62, monkeypatch, x, y, **kw)
        what = f"{case} {dtype}->{od} ta={ta} tb={tb}"
        if np.isnan(packed.astype(np.float32)).any():
            fails.append(f"{what}: NaN (unwritten output)")
        elif not rel_err(packed, ref) <= bound(od, k):
            fails.append(f"{what}: rel err {rel_err(packed, ref):.3g} > {bound(od, k):.3g}")
        elif not np.array_equal(packed.view(np.uint8), plain.view(np.uint8)):
            fails.append(f"{what}: packed and element-load results differ")
    assert not fails, "\n".join(fails)


_tce = jax.jit(tcgemm, static_argnames=("transpose_a", "transpose_b", "out_dtype", "config",
                                         "split_k", "alpha", "beta", "activation", "aux"))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES[::2] + PITCH_CASES[::2], ids=str)
def test_packed_epilogue_matches_unpacked(case, monkeypatch):
    """The fused epilogue on packed operands (full float32 C, a per-item bias, gelu_tanh, and
    the pre-activation as aux): within bounds of the float64 reference, and bitwise equal to
    the unpacked run (packing changes only where the operands are read from)."""
    ba, bb, m, n, k, ci, split = case
    cfg = configs.CONFIGS[ci].name
    rng = np.random.default_rng(seed_of("pack_epi", *case))
    bt = max(ba, bb)
    c = rng.standard_normal((bt, m, n), np.float32)
    bias = rng.standard_normal((bt, n), np.float32)
    fails = []
    for i, (ta, tb) in enumerate(LAYOUTS):
        dtype, od = (BF16, F32) if i % 2 else (F16, F16)
        x, y, _ = _operands(rng, ba, bb, m, n, k, ta, tb, dtype)
        kw = dict(transpose_a=ta, transpose_b=tb, out_dtype=od, config=cfg, split_k=split,
                  alpha=-0.75, beta=1.5, activation="gelu_tanh", aux=True)
        runs = []
        for flop in (0, 2**62):  # packed, then as stored
            monkeypatch.setattr(configs, "PACK_MIN_FLOP", flop)
            monkeypatch.setattr(configs, "PITCH_PACK_MIN_FLOP", flop)
            jax.clear_caches()
            runs.append([np.asarray(o) for o in _tce(x, y, c, bias, **kw)])
        want = epilogue_ref64(x, y, c, bias, alpha=-0.75, beta=1.5, activation="gelu_tanh",
                              transpose_a=ta, transpose_b=tb)
        what = f"{case} {dtype}->{od} ta={ta} tb={tb}"
        for name, got, plain, ref in zip(("d", "pre"), runs[0], runs[1], want):
            if np.isnan(got.astype(np.float32)).any():
                fails.append(f"{what} {name}: NaN (unwritten output)")
            elif not rel_err(got, ref) <= bound(od, k):
                fails.append(f"{what} {name}: rel err {rel_err(got, ref):.3g} > {bound(od, k):.3g}")
            elif not np.array_equal(got.view(np.uint8), plain.view(np.uint8)):
                fails.append(f"{what} {name}: packed and unpacked results differ")
    assert not fails, "\n".join(fails)


@pytest.mark.gpu
def test_odd_large_product_is_packed_by_default():
    """4095 x 4097 x 4093 takes the packed path under the default rule and stays exact."""
    assert configs.should_pack(4095, 4097, 4093)
    rng = np.random.default_rng(11)
    x, y, ref = _operands(rng, 1, 1, 4095, 4097, 4093, False, False, BF16)
    jax.clear_caches()
    out = np.asarray(jax.jit(lambda p, q: tcgemm(p, q, out_dtype=F32))(x, y))
    assert rel_err(out, ref) <= bound(F32, 4093)
