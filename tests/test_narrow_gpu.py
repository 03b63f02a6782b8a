"""GPU tests of the narrow rows (ffi/kernels/narrow/narrow8.cu): 8-bit products of at most 16 or
32 rows with b stored (K, N), on mma.sync m16n8k32, b read as stored (turned K-major in
registers), no K-major copy. Every row forced with 1-3 and 16 K slices, int8 (exact int32;
W8A8 with the epilogue) and the fp8 pairs (per-tensor, per-row / per-column and block scales),
shapes that are not tile multiples (M of 1 and 5, N down to 8, K down to 16 and not a multiple of
128), a batch of a and of b; float64 references of the quantised values, every product run
twice into poisoned outputs (test_scaled_gpu.check_forced). Then what the planner does with
decode-sized products, and the handler's errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm import configs, scaled

from conftest import bound, rel_err, seed_of
from test_scaled_gpu import (BF16, F16, F32, I32, I8, PAIRS, check_forced, quantised, reference,
                             run_poisoned)

pytestmark = pytest.mark.gpu

NARROW = tuple(c.name for c in configs.CONFIGS if c.kind == "narrow")


def _arch():
    return configs.device_arch()


def _runs(pair):
    arch = _arch()
    return arch is not None and (arch >= (8, 0) if pair[0] == I8 else arch == (9, 0))


# (batch, M, N, K), K slices, out dtype, scale forms, epilogue (c form, act, beta); b (K, N)
CASES = (
    ((1, 200, 1024), 1, None, ("tensor", "tensor"), (None, None, None)),
    ((5, 136, 144), 2, BF16, ("row", "column"), ("bias", "gelu_tanh", None)),
    ((0, 8, 16), 1, F32, ("tensor", "tensor"), (None, None, None)),
    ((0, 72, 4096), 3, F16, ("tensor", "column"), ("full", "relu", 0.5)),
    ((0, 520, 2064), 16, F32, ("row", "tensor"), ("col", "silu", -1.0)),
    ((2, 2, 4, 264, 640), 2, BF16, ("tensor", "tensor"), (None, None, None)),
)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].name}x{p[1].name}")
@pytest.mark.parametrize("row", NARROW)
def test_every_narrow_row(row, pair, monkeypatch):
    """Each narrow row forced with 1, 2, 3 and 16 K slices on CASES (a batch of a folds into
    M), each operand pair: int8 -> int32 exact, W8A8 and fp8 with the epilogue; fp8 with block
    scales on the two-slice cases."""
    if not _runs(pair):
        pytest.skip("int8 on the narrow rows from compute capability 8.0, fp8 on 9.0")
    bm = configs.BY_NAME[row].bm
    int8 = pair[0] == I8
    fails = []
    for (*batch, m, n, k), split, out_dtype, forms, epi in CASES:
        shape = (*batch, m or bm, n, k)  # M 0: the row's whole height
        block = not int8 and split == 2  # fp8: block scales on the two-slice cases
        out_dtype = out_dtype or (I32 if int8 else BF16)
        if out_dtype == I32:
            forms, epi = (None, None), (None, None, None)
        check_forced(fails, monkeypatch, row, split, shape, False, out_dtype, forms, epi, pair,
                     block)
    assert not fails, "\n".join(fails)


@pytest.mark.parametrize("pair", [PAIRS[0], PAIRS[3]], ids=["e4m3", "int8"])
def test_decode_products_are_planned_narrow(pair):
    """Decode-sized products (M = 1, 16, 32 against a 4096 x 4096 or 4096 x 14336 weight stored
    (K, N)) are planned onto a narrow row and are right: int8 -> int32 bit-exact, fp8 ->
    bfloat16 within its rounding."""
    transpose_b = False
    if not _runs(pair):
        pytest.skip("int8 on the narrow rows from compute capability 8.0, fp8 on 9.0")
    fails = []
    for m, n, k in ((1, 4096, 4096), (16, 4096, 4096), (32, 14336, 4096), (16, 4096, 14336)):
        plan = scaled.kernel_config("int8" if pair[0] == I8 else "fp8", m, n, k, "outer", 1,
                                    transpose_b)
        if plan is None or configs.BY_NAME[plan[0]].kind != "narrow":
            fails.append(f"{m}x{n}x{k}: planned {plan}")
            continue
        rng = np.random.default_rng(seed_of("decode", m, n, k, transpose_b, pair[0].name))
        a = quantised(rng, (m, k), pair[0])
        b = quantised(rng, (n, k) if transpose_b else (k, n), pair[1])
        int8 = pair[0] == I8
        s = None if int8 else np.float32(0.25)
        out_dtype = I32 if int8 else BF16

        def fn(a, b):
            return tg.scaled_matmul(a, b, s, s, out_dtype=out_dtype, transpose_b=transpose_b)
        out, same = run_poisoned(fn, jax.eval_shape(fn, a, b), a, b)
        want = reference(a, b, s, s, None, None, 0.0, None, transpose_b)
        if int8:
            ok = same and np.array_equal(out, want.astype(np.int64))
        else:
            ok = same and rel_err(out, want) <= bound(BF16, k)
        if not ok:
            fails.append(f"{m}x{n}x{k} on {plan}: wrong (same={same})")
    assert not fails, "\n".join(fails)


def test_narrow_errors(monkeypatch):
    """The handler's errors on a narrow row: more rows than the row holds, b (K, N) with N not
    a multiple of 8, b (N, K) (a 16-bit product on one: test_errors_cpu)."""
    if not _runs(PAIRS[3]):
        pytest.skip("the narrow rows need compute capability 8.0+")
    rng = np.random.default_rng(seed_of("narrow_errors"))
    cases = ((NARROW[0], (17, 64), (64, 64), False, r"takes at most 16 rows \(M = 17\)"),
             (NARROW[0], (4, 64), (64, 12), False, r"N a multiple of 8 \(got N = 12\)"),
             (NARROW[1], (4, 64), (72, 64), True, r"B N-major .* \(got B K-major\)"))
    for row, ashape, bshape, tb, msg in cases:
        monkeypatch.setattr(scaled, "kernel_config", lambda *_, p=(row, 1): p)
        a, b = quantised(rng, ashape, I8), quantised(rng, bshape, I8)
        with pytest.raises(Exception, match=msg):
            jax.block_until_ready(jax.jit(lambda a, b: tg.scaled_matmul(
                a, b, None, None, out_dtype=jnp.int32, transpose_b=tb))(a, b))


@pytest.mark.parametrize("pair", [PAIRS[1], PAIRS[3]], ids=["e4m3xe5m2", "int8"])
def test_batch_of_b(pair, monkeypatch):
    """A batch of b (the kernel's batch: grid z, each item's a, b and block scales at their
    strides) on each narrow row, 1 and 2 K slices, against float64 per item."""
    if not _runs(pair):
        pytest.skip("int8 on the narrow rows from compute capability 8.0, fp8 on 9.0")
    int8, transpose_b = pair[0] == I8, False
    fails = []
    for row in NARROW:
        for split in (1, 2):
            monkeypatch.setattr(scaled, "kernel_config", lambda *_, p=(row, split): p)
            nb, m, n, k = 3, configs.BY_NAME[row].bm - 3, 72, 528
            rng = np.random.default_rng(seed_of("narrow_batch", row, split, transpose_b))
            a = quantised(rng, (nb, m, k), pair[0])
            b = quantised(rng, (nb, n, k) if transpose_b else (nb, k, n), pair[1])
            kb = -(-k // 128)
            if int8:
                sa = sb = None
            else:
                sa = rng.uniform(0.5, 2, (nb, m, kb)).astype(np.float32)
                sb = rng.uniform(0.5, 2, (nb, 1, kb) if transpose_b else (nb, kb, 1))
                sb = sb.astype(np.float32)
            out_dtype = I32 if int8 else F32

            def fn(a, b, sa, sb):
                return tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, transpose_b=transpose_b)
            out, same = run_poisoned(fn, jax.eval_shape(fn, a, b, sa, sb), a, b, sa, sb)
            for z in range(nb):
                want = reference(a[z], b[z], None if int8 else sa[z], None if int8 else sb[z],
                                 None, None, 0.0, None, transpose_b)
                ok = (np.array_equal(out[z], want.astype(np.int64)) if int8 else
                      rel_err(out[z], want) <= 2e-4)
                if not (same and ok):
                    fails.append(f"{row} split {split} item {z}: same={same}, ok={ok}")
    assert not fails, "\n".join(fails)
