"""The CUDA lowering of tg.scaled_matmul's kernel path, from the CPU host (issue 26): what the
custom call receives for each layout of b and each plan. The plan is forced (on the CPU host
scaled.kernel_config finds no GPU), the lowering is the one a GPU would compile."""
import jax.numpy as jnp
import pytest

import jax_tcgemm as tg
from jax_tcgemm import _ffi, configs, plan8, scaled
from test_cpu import cuda_text, custom_calls

pytestmark = pytest.mark.skipif(not _ffi.available(),
                                reason="the extension is not built (the workspace rule is C++'s)")
CFG = "sm90_128x128x64_s6_g2"


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_call_takes_b_as_given(monkeypatch, kind, transpose_b, split):
    """A (K, N) b reaches the custom call as it is, with pack=1 (the handler copies it K-major
    into the workspace: no XLA transpose in front of the call), a (N, K) b with pack=0; the
    plan's K slices are the call's split_k; the workspace result is what the C++ rule
    (configs.workspace_floats, PlanWorkspace) asks for."""
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: (CFG, split))
    m, n, k = 40, 200, 1024
    dt = jnp.float8_e4m3fn if kind == "fp8" else jnp.int8
    a = jnp.ones((m, k), dt)
    b = jnp.ones((n, k) if transpose_b else (k, n), dt)
    out, s = (jnp.int32, None) if kind == "int8" else (jnp.bfloat16, 1.0)
    text = cuda_text(lambda a, b: tg.scaled_matmul(a, b, s, s, out_dtype=out,
                                                   transpose_b=transpose_b), a, b)
    (call,) = custom_calls(text)
    assert call["transpose_b"] == str(transpose_b).lower()
    assert call["pack"] == str(not transpose_b).lower()
    assert call["split_k"].split(":")[0].strip() == str(split) and call["config"] == CFG
    assert "stablehlo.transpose" not in text
    shape_b = f"1x{n}x{k}" if transpose_b else f"1x{k}x{n}"
    assert f"tensor<{shape_b}x" in call["line"].split("->")[0]
    ws = configs.workspace_floats(m, n, k, 1, True, True, False, transpose_b, CFG, split,
                                  not transpose_b, 1)
    # split slices of M x N float32 (int8: int32) partials, then N x K bytes of b's copy
    want = (split * m * n if split > 1 else 0) + (0 if transpose_b else n * k // 4)
    assert ws == want and f"tensor<{ws}xf32>" in call["results"]


@pytest.mark.parametrize("traced_beta", [False, True])
def test_tensor_scales_reach_the_call_as_they_are(monkeypatch, traced_beta):
    """Per-tensor scales (device scalars) are the call's operands, multiplied into alpha by the
    kernel: no XLA op folds them first. Only a traced beta makes a [alpha, beta] operand."""
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: (CFG, 1))
    m, n, k = 40, 200, 256
    a = jnp.ones((m, k), jnp.float8_e4m3fn)
    b = jnp.ones((n, k), jnp.float8_e4m3fn)
    c = jnp.ones((m, n), jnp.bfloat16)

    def f(a, b, sa, sb, beta):
        return tg.scaled_matmul(a, b, sa, sb, transpose_b=True, c=c,
                                beta=beta if traced_beta else 0.5)
    text = cuda_text(f, a, b, jnp.float32(2.0), jnp.float32(3.0), jnp.float32(0.5))
    (call,) = custom_calls(text)
    assert call["tensor_scales"].startswith("2 ")
    assert call["has_scale"] == str(traced_beta).lower()
    operands = call["line"].split("->")[0]
    assert operands.count("tensor<f32>") == 2 and operands.count("tensor<2xf32>") == traced_beta
    if not traced_beta:  # nothing but the call (and c's reshape) between the arguments and D
        assert "stablehlo.multiply" not in text and "stablehlo.concatenate" not in text


@pytest.mark.parametrize("m", [40, 41])
def test_block_scales_of_a_padded_to_16_bytes(monkeypatch, m):
    """a's block scales reach the call K-major, (ceil(K/128), M rounded up to 4) float32: rows of
    16-byte multiples, which the staging rows copy per tile with one bulk copy (gemm_sm90.cuh);
    b's as given."""
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: ("sm90_64x128x64_s8_g1", 1))
    n, k = 200, 1024
    a = jnp.ones((m, k), jnp.float8_e4m3fn)
    b = jnp.ones((n, k), jnp.float8_e4m3fn)
    sa, sb = jnp.ones((m, k // 128), jnp.float32), jnp.ones((2, k // 128), jnp.float32)
    text = cuda_text(lambda a, b, sa, sb: tg.scaled_matmul(a, b, sa, sb, transpose_b=True),
                     a, b, sa, sb)
    (call,) = custom_calls(text)
    operands = call["line"].split("->")[0]
    assert f"tensor<{k // 128}x{-(-m // 4) * 4}xf32>" in operands
    assert f"tensor<2x{k // 128}xf32>" in operands or f"tensor<{k // 128}x2xf32>" in operands


def test_block_scales_plan_on_staging_rows():
    """The rows whose fp8 kernels stage block scales in shared memory (the C++ rule,
    Sm90StagesScales, through the config table) and the planner's use of them: with block
    scales, every fp8 product plans on a staging row (the fp8-only rows stage them; 128x256's
    consumers load them, 0.83 of its per-tensor rate)."""
    staged = {c.name for c in configs.CONFIGS if c.staged_scales}
    g3, g2 = "sm90_192x128x64_s4_g3_f8", "sm90_128x128x64_s5_g2_f8"
    assert {g3, g2, "sm90_64x128x64_s8_g1"} <= staged
    assert not staged & {"sm90_128x256x64_s4_g2", "sm90_128x128x64_s6_g2"}
    assert all(c.kind == "sm90" for c in configs.CONFIGS if c.staged_scales)
    llm, m128 = (4096, 7168, 16384), (128, 7168, 16384)
    for shape in (llm, m128, (8192, 8192, 8192)):
        for bs in (False, True):
            assert plan8.plan_byte(*shape, "fp8", arch=(9, 0), block_scales=bs)[0] in staged
    # the two-consumer row's block-scale rate (0.92 of its own) keeps llm's block product on
    # the three-consumer row; at M = 128 it takes the block form in 2 K slices (21% faster
    # than 128x256 in 4: benchmarks/NOTES.md v70), while per-tensor scales run on 64x128,
    # whose 112 tiles fill one wave (plan8.ONE_WAVE_FILL; 11-13% faster: v73)
    assert plan8.plan_byte(*llm, "fp8", arch=(9, 0)) == (g2, 1)
    assert plan8.plan_byte(*llm, "fp8", arch=(9, 0), block_scales=True) == (g3, 1)
    assert plan8.plan_byte(*m128, "fp8", arch=(9, 0), block_scales=True) == (g2, 2)
    assert plan8.plan_byte(*m128, "fp8", arch=(9, 0)) == ("sm90_64x128x64_s8_g1", 1)


def test_8bit_one_wave_on_the_smallest_row():
    """8-bit products on the sm90 rows (fp8 without block scales, int8) of at most
    ONE_WAVE_MAX_M rows whose 64x128 tiles fill one wave of the SMs from ONE_WAVE_FILL plan on
    that row in one slice (both b layouts, the batch counted in the tiles; benchmarks/NOTES.md
    v73); with block scales, below the fill, past one wave, past ONE_WAVE_MAX_M rows or on the
    sm80 rows (int8 up to INT8_SM80_MAX_M rows) the plan stands."""
    small = min((c for c in configs.CONFIGS if c.kind == "sm90" and c.fp8 and c.int8),
                key=lambda c: c.bm * c.bn)
    assert (small.bm, small.bn) == (64, 128)
    for m, n, k, batch in ((128, 8192, 8192, 1), (160, 4096, 4096, 1), (384, 2048, 7168, 1),
                           (96, 2048, 4096, 4), (512, 2048, 7168, 1), (128, 7168, 16384, 1),
                           (448, 2048, 14336, 1)):
        for kind in ("fp8", "int8"):
            for tb in (False, True):
                assert plan8.plan_byte(m, n, k, kind, arch=(9, 0), batch=batch,
                                       transpose_b=tb) == (small.name, 1), (m, n, k, kind, tb)
    assert plan8.plan_byte(192, 4096, 14336, "fp8", arch=(9, 0)) == (small.name, 1)
    assert plan8.plan_byte(192, 4096, 14336, "fp8", arch=(9, 0), block_scales=True) != (
        small.name, 1)
    for m, n, k in ((128, 4096, 4096), (320, 28672, 4096), (600, 2048, 7168)):
        fill = small.tiles(m, n) / configs.SMS
        assert m > plan8.ONE_WAVE_MAX_M or not plan8.ONE_WAVE_FILL <= fill <= 1
        assert plan8.plan_byte(m, n, k, "fp8", arch=(9, 0)) != (small.name, 1), (m, n, k)
    # 16 x 14336 fills the wave too, but int8 of so few rows runs on the sm80 rows
    row = plan8.plan_byte(16, 14336, 4096, "int8", arch=(9, 0))[0]
    assert configs.BY_NAME[row].kind == "sm80"
    assert plan8.plan_byte(128, 8192, 8192, "fp8", arch=(8, 9)) is None  # no fp8 kernel there
    assert configs.BY_NAME[plan8.plan_byte(128, 8192, 8192, "int8", arch=(8, 9))[0]].kind == "sm80"


@pytest.mark.parametrize("shape", [(40, 200, 1024), (16, 4096, 4096), (300, 1000, 784)])
def test_int8_off_hopper_lowers_to_an_sm80_row(monkeypatch, shape):
    """Lowered for a compute capability 8.x device, int8 (exact int32, and W8A8 into bfloat16)
    is one tcgemm call on the sm80 (or, up to NARROW_MAX_M rows, narrow) row and K slices
    plan_byte picks there (mma.sync m16n8k32), with the workspace the C++ rule asks for (int32
    partials of the slices, b's K-major copy but on a narrow row);
    fp8 has no kernel there and lowers to lax (no custom call)."""
    monkeypatch.setattr(configs, "device_arch", lambda: (8, 6))
    m, n, k = shape
    row, split = plan8.plan_byte(m, n, k, "int8", transpose_b=False)
    narrow = m <= plan8.NARROW_MAX_M  # (N a multiple of 8: b (K, N) read as stored, no copy)
    assert configs.BY_NAME[row].kind == ("narrow" if narrow else "sm80")
    a, b = jnp.ones((m, k), jnp.int8), jnp.ones((k, n), jnp.int8)
    for out, s in ((jnp.int32, None), (jnp.bfloat16, 0.5)):
        text = cuda_text(lambda a, b: tg.scaled_matmul(a, b, s, s, out_dtype=out), a, b)
        (call,) = custom_calls(text)
        assert call["config"] == row and call["split_k"].split(":")[0].strip() == str(split)
        ws = configs.workspace_floats(m, n, k, 1, True, True, False, False, row, split, True, 1)
        slices = configs.effective_split(configs.BY_NAME[row], k, split, 1)
        assert ws == (slices * m * n if slices > 1 else 0) + (0 if narrow else n * k // 4)
        assert f"tensor<{ws}xf32>" in call["results"]
    f8 = jnp.ones((m, k), jnp.float8_e4m3fn), jnp.ones((k, n), jnp.float8_e4m3fn)
    assert not custom_calls(cuda_text(lambda a, b: tg.scaled_matmul(a, b, 1.0, 1.0), *f8))


@pytest.mark.parametrize("transpose_b", [False, True])
def test_k_not_a_multiple_of_16_is_padded(monkeypatch, transpose_b):
    """A K that is not a multiple of 16 reaches the kernel padded with zeros to the next one (a
    and b; scaled._padded_plan), planned for that K; without a plan, lax's int8 product is
    padded the same way (scaled._int_dot)."""
    m, n, k = 40, 200, 1000
    asked = []
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: asked.append(a) or (CFG, 1))
    a = jnp.ones((m, k), jnp.int8)
    b = jnp.ones((n, k) if transpose_b else (k, n), jnp.int8)
    def fn(a, b):
        return tg.scaled_matmul(a, b, None, None, out_dtype=jnp.int32, transpose_b=transpose_b)
    text = cuda_text(fn, a, b)
    (call,) = custom_calls(text)
    # at trace time, then by the lowering (for the shapes it lowers: here the same)
    assert asked[0] == ("int8", m, n, 1008, "tensor", 1, transpose_b)
    assert {x[3] for x in asked} == {1008} and {x[6] for x in asked} == {transpose_b}
    ops = call["line"].split("->")[0]
    assert "tensor<1x40x1008xi8>" in ops
    assert ("tensor<1x200x1008xi8>" if transpose_b else "tensor<1x1008x200xi8>") in ops
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: None)
    text = cuda_text(lambda a, b: fn(a, b), a, b)  # traced anew
    assert not custom_calls(text) and "tensor<40x1008xi8>" in text


@pytest.mark.parametrize("arch", [(9, 0), (8, 0), (8, 9)])
@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_narrow_rows_take_few_rows(monkeypatch, arch, kind):
    """Up to NARROW_MAX_M rows an 8-bit product with b stored (K, N) (N a multiple of 8) runs
    on the narrow row of the fewest rows that holds it (int8 from 8.0, fp8 on 9.0), its K slices
    within NARROW_BLOCKS blocks, each warp given a k tile; the call reads b as given with no
    K-major copy (workspace: the slices' partials only). b (N, K) stays on the other rows."""
    monkeypatch.setattr(configs, "device_arch", lambda: arch)
    runs = kind == "int8" or arch == (9, 0)
    for m, n, k in ((1, 4096, 4096), (16, 4096, 4096), (17, 200, 1024), (32, 14336, 4096),
                    (5, 8, 4096), (3, 8, 16)):
        plan = plan8.plan_byte(m, n, k, kind, transpose_b=False)
        if not runs:
            assert plan is None or configs.BY_NAME[plan[0]].kind != "narrow"
            continue
        row, split = plan
        c = configs.BY_NAME[row]
        assert c.kind == "narrow" and c.bm == (16 if m <= 16 else 32), (m, n, k, plan)
        blocks, k_tiles = -(-n // c.bn), -(-k // 128)
        assert split == 1 or (split * blocks <= plan8.NARROW_BLOCKS
                              and k_tiles >= split * c.warps_k)
        assert 2 * split * blocks > plan8.NARROW_BLOCKS or k_tiles < 2 * split * c.warps_k
    # b (N, K), N not a multiple of 8, or more rows: not a narrow row
    for m, n, tb in ((16, 4096, True), (16, 77, False), (33, 4096, False)):
        plan = plan8.plan_byte(m, n, 1024, kind, transpose_b=tb)
        assert plan is None or configs.BY_NAME[plan[0]].kind != "narrow"
    if not runs:
        return
    m, n, k = 16, 4096, 4096
    dt = jnp.int8 if kind == "int8" else jnp.float8_e4m3fn
    a, b = jnp.ones((m, k), dt), jnp.ones((k, n), dt)
    out = jnp.int32 if kind == "int8" else jnp.bfloat16
    s = None if kind == "int8" else 1.0
    (call,) = custom_calls(cuda_text(lambda a, b: tg.scaled_matmul(a, b, s, s, out_dtype=out), a, b))
    row, split = plan8.plan_byte(m, n, k, kind, transpose_b=False)
    assert call["config"] == row and call["split_k"].split(":")[0].strip() == str(split)
    slices = configs.effective_split(configs.BY_NAME[row], k, split, 1)
    assert f"tensor<{slices * m * n if slices > 1 else 0}xf32>" in call["results"]
