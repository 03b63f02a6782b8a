"""Seeded fuzz of tg.scaled_matmul on the CPU (its lax path) against a float64 reference of the
quantised values.

Each case draws an operand pair, M / N / K among 1, 16 and sizes off the 16 / 128 grid, b's
layout, batch dims of a and b that broadcast ((), (1,), (2,)), a scale form (none, per-tensor,
per-row with a per-tensor b scale, per-tensor a scale with per-column, per-row with
per-column, 128-block), an out dtype (int32: the exact product), and an epilogue (activation,
bias, beta * C). test_scaled_cpu.py holds the fixed grid; this reaches the mixtures it does not
name (batched b with block scales, broadcast batches with the epilogue, tiny and ragged sizes).
float16 results of int8 products past 65504 must be inf, as a float16 result is. Cases are
reproducible from (group, index).
"""
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg

from conftest import epilogue64, f64, scaled_ref64

PAIRS = (("float8_e4m3fn", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e5m2"),
         ("float8_e5m2", "float8_e4m3fn"), ("int8", "int8"))
FORMS = ("none", "tensor", "row", "column", "rowcol", "block")
TOL = {"bfloat16": 8e-3, "float16": 1e-3, "float32": 1e-5}
GROUPS, PER_GROUP = 4, 30


def _quant(rng, shape, dtype):
    if dtype == "int8":
        return rng.integers(-127, 128, shape).astype(np.int8)
    return rng.normal(0, 2, shape).astype(np.float32).astype(dtype)


def _case(group, i):
    r = random.Random(f"scaled-fuzz {group} {i}")
    rng = np.random.default_rng(r.getrandbits(32))
    da, db = r.choice(PAIRS)
    m, n, k = r.choice((1, 3, 16, 100, 130)), r.choice((1, 8, 16, 40, 136)), \
        r.choice((1, 15, 16, 128, 200, 260))
    tb = r.random() < 0.5
    ba, bb = r.choice(((), (1,), (2,))), r.choice(((), (1,), (2,)))
    out = r.choice(("bfloat16", "float16", "float32") + (("int32",) if da == "int8" else ()))
    form = "none" if out == "int32" else r.choice(FORMS)
    a, b = _quant(rng, ba + (m, k), da), _quant(rng, bb + ((n, k) if tb else (k, n)), db)
    kb, nb = -(-k // 128), -(-n // 128)

    def u(shape):
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    sa, sb = {"none": (None, None), "tensor": (u(()), u(())), "row": (u(ba + (m,)), u(())),
              "column": (u(()), u(bb + (n,))), "rowcol": (u(ba + (m,)), u(bb + (n,))),
              "block": (u(ba + (m, kb)), u(bb + ((nb, kb) if tb else (kb, nb))))}[form]
    epi = {}
    if out != "int32":
        epi["activation"] = r.choice((None, None, "relu", "gelu", "gelu_tanh", "silu"))
        if r.random() < 0.3:
            epi["bias"] = rng.normal(0, 1, (n,)).astype(np.float32)
        if r.random() < 0.3:
            epi["c"], epi["beta"] = rng.normal(0, 1, (m, n)).astype(np.float32), 0.5
    return a, b, sa, sb, tb, out, form, epi


@pytest.mark.parametrize("group", range(GROUPS))
def test_scaled_matmul_fuzz_vs_float64(group):
    for i in range(PER_GROUP):
        a, b, sa, sb, tb, out, form, epi = _case(group, i)
        what = (f"case ({group}, {i}): a{a.shape} {a.dtype} x b{b.shape} {b.dtype} "
                f"transpose_b={tb} {form} -> {out} epilogue {sorted(epi)}")
        fn = jax.jit(lambda a, b, sa, sb: tg.scaled_matmul(
            a, b, sa, sb, out_dtype=out, transpose_b=tb, **epi))
        got = fn(a, b, sa, sb)
        ab = scaled_ref64(a, b, sa, sb, transpose_b=tb, block=form == "block")
        with np.errstate(over="ignore"):  # (silu of a large negative sum: exp overflows)
            ref, _ = epilogue64(ab, epi.get("c"), epi.get("bias"), beta=epi.get("beta", 0.0),
                                activation=epi.get("activation"))
        assert got.shape == ref.shape and got.dtype == np.dtype(out), what
        g = f64(jnp.asarray(got).astype(jnp.float32))
        if out == "int32":
            np.testing.assert_array_equal(g, ref, err_msg=what)
            continue
        if out == "float16":  # past float16's range (65504, rounding up from 65520): inf
            big = np.abs(ref) > 65600
            assert np.all(np.isinf(g[big]) & (np.sign(g[big]) == np.sign(ref[big]))), what
            edge = np.abs(ref) > 65400
            g, ref = np.where(edge, 0.0, g), np.where(edge, 0.0, ref)
        lim = TOL[out] * np.maximum(np.abs(ref), 1.0) + 1e-4
        assert np.all(np.abs(g - ref) <= lim), f"{what}: max error {np.abs(g - ref).max():.3g}"
