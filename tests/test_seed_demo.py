"""Seed 000 demo (/work/shared/seeds/000_*.txt): a 16x16 @ 16x8 float16 product, the shape of
one mma.sync.m16n8k16, checked against the table numpy printed in the seed.

A = arange(16*16).reshape(16, 16) * 0.01 and B = arange(16*8).reshape(16, 8) * 0.01, both
rounded to float16; the seed prints np.dot(A, B) (float16) with "%8.3f". Runs on the CPU
fallback everywhere, and through the CUDA kernel as a `gpu` test.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm.primitives import tcgemm

from conftest import assert_close

M, N, K = 16, 8, 16
A = (np.arange(M * K, dtype=np.float32).reshape(M, K) * 0.01).astype(np.float16)
B = (np.arange(K * N, dtype=np.float32).reshape(K, N) * 0.01).astype(np.float16)

# Rows 0, 1, 2 and 15 of the table printed in the seed (numpy's float16 np.dot).
SEED_ROWS = {
    0: [0.992, 1.004, 1.016, 1.028, 1.040, 1.052, 1.063, 1.076],
    1: [2.527, 2.566, 2.604, 2.641, 2.678, 2.717, 2.754, 2.791],
    2: [4.062, 4.125, 4.191, 4.254, 4.316, 4.379, 4.441, 4.508],
    15: [24.031, 24.422, 24.828, 25.219, 25.609, 26.016, 26.406, 26.797],
}
ATOL = 0.02  # float16 spacing is 1/64 in [16, 32): the printed values are float16 roundings


def check(out):
    out = np.asarray(out)
    assert out.shape == (M, N) and out.dtype == np.float16
    for row, want in SEED_ROWS.items():
        np.testing.assert_allclose(out[row].astype(np.float64), want, rtol=0, atol=ATOL,
                                   err_msg=f"row {row} differs from the seed's table")
    # the whole product against float64 numpy on the (exactly representable) float16 inputs
    assert_close(out, A.astype(np.float64) @ B.astype(np.float64), np.float16, K, "seed 000")
    # and numpy's own float16 np.dot, which the seed printed
    np.testing.assert_allclose(out.astype(np.float64), np.dot(A, B).astype(np.float64),
                               rtol=0, atol=ATOL)


def products():
    a, b = jnp.asarray(A), jnp.asarray(B)
    yield "matmul", tg.matmul(a, b)
    yield "jit(matmul)", jax.jit(tg.matmul)(a, b)
    yield "dot_general", tg.dot_general(a, b, (((1,), (0,)), ((), ())))
    # the same product from operands stored transposed (both layout flags set)
    yield "tcgemm TT", tcgemm(a.T[None], b.T[None], transpose_a=True, transpose_b=True)[0]


def test_seed_table_is_numpys():
    out = np.dot(A, B)
    for row, want in SEED_ROWS.items():
        np.testing.assert_allclose(out[row].astype(np.float64), want, atol=ATOL)


def test_seed_demo_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        for what, out in products():
            check(out)


@pytest.mark.gpu
def test_seed_demo_gpu():
    gpu = jax.devices("gpu")[0]
    with jax.default_device(gpu):
        for what, out in products():
            assert out.devices() == {gpu}, what
            check(out)
