"""The seed demos (/work/shared/seeds/).

Seed 000: a 16x16 @ 16x8 float16 product, the shape of one mma.sync.m16n8k16, checked against
the table numpy printed in the seed. A = arange(16*16).reshape(16, 16) * 0.01 and B =
arange(16*8).reshape(16, 8) * 0.01, both rounded to float16; the seed prints np.dot(A, B)
(float16) with "%8.3f".

Seed 001: the CUDA-samples cudaTensorCoreGemm problem, D = 1.1 * A @ B + 1.2 * C in float32,
with A (M x K) and B (stored N x K, "col-major") float16 of values rand() % 3 and C float32 of
values rand() % 3, at 4096^3. Every product of 0..2 integers and every partial sum (at most
2 * 2 * 4096) is exact in float32, so the only error against float64 is the epilogue's
float32 rounding: a few units in the last place (relative 1e-6 is ~8 of them).

Both run on the CPU fallback everywhere (seed 001 at 512^3) and through the CUDA kernels as
`gpu` tests.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm.primitive import tcgemm

from conftest import assert_close, rel_err

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


# ---------------------------------------------------------------------------------------------
# Seed 001: cudaTensorCoreGemm.

ALPHA, BETA = 1.1, 1.2
SEED001_REL = 1e-6


def seed001(size):
    """A (1, M, K), B stored (1, N, K) float16 and C (1, M, N) float32, values rand() % 3 (as
    numpy integers 0..2), and the float64 D = 1.1 * A @ B^T + 1.2 * C."""
    rng = np.random.default_rng(1)
    a = rng.integers(0, 3, (1, size, size)).astype(np.float16)
    b = rng.integers(0, 3, (1, size, size)).astype(np.float16)
    c = rng.integers(0, 3, (1, size, size)).astype(np.float32)
    d = ALPHA * np.matmul(a.astype(np.float64), np.swapaxes(b, 1, 2).astype(np.float64))
    return a, b, c, d + BETA * c


def check_seed001(out, want, what):
    out = np.asarray(out)
    assert out.dtype == np.float32 and out.shape == want.shape, (what, out.shape, out.dtype)
    assert np.isfinite(out).all(), f"{what}: non-finite elements"
    # every element: A @ B >= 0 with sum ~ K, so |want| is far from zero
    rel = np.abs(out.astype(np.float64) - want) / np.abs(want)
    assert rel.max() <= SEED001_REL, f"{what}: max relative error {rel.max():.3g}"
    assert rel_err(out, want) <= SEED001_REL


def seed001_products(a, b, c):
    """The product the sample computes, through tg.gemm (planned) and with B as stored (N, K)."""
    a, b, c = jnp.asarray(a), jnp.asarray(b), jnp.asarray(c)
    yield "gemm", jax.jit(lambda x, y, z: tg.gemm(x, y, z, alpha=ALPHA, beta=BETA,
                                                   transpose_b=True, out_dtype=jnp.float32))(
        a[0], b[0], c[0])[None]
    yield "gemm NN", jax.jit(lambda x, y, z: tg.gemm(
        x, y.T, z, alpha=ALPHA, beta=BETA, out_dtype=jnp.float32))(a[0], b[0], c[0])[None]
    # alpha and beta as traced float32 scalars
    yield "gemm traced", jax.jit(lambda x, y, z, al, be: tg.gemm(
        x, y, z, alpha=al, beta=be, transpose_b=True, out_dtype=jnp.float32))(
        a, b, c, jnp.float32(ALPHA), jnp.float32(BETA))


def test_seed001_cpu():
    a, b, c, want = seed001(512)
    with jax.default_device(jax.devices("cpu")[0]):
        for what, out in seed001_products(a, b, c):
            check_seed001(out, want, what)


@pytest.mark.gpu
def test_seed001_gpu():
    """At the sample's 4096^3, planned (tg.gemm) and forced onto an sm80 row, an sm90 row (split
    1 and 2: workspace), a clustered sm80 split and a workspace split of 16."""
    from jax_tcgemm import configs
    a, b, c, want = seed001(4096)
    for what, out in seed001_products(a, b, c):
        check_seed001(out, want, what)
    sm80 = next(x.name for x in configs.CONFIGS if x.kind == "sm80")
    sm90 = next(x.name for x in configs.CONFIGS if x.kind == "sm90")
    da, db, dc = jnp.asarray(a), jnp.asarray(b), jnp.asarray(c)
    for cfg, split in ((sm80, 1), (sm90, 1), (sm90, 2), (sm80, 4), (sm80, 16)):
        f = jax.jit(lambda x, y, z, cfg=cfg, split=split: tcgemm(
            x, y, z, transpose_b=True, out_dtype=jnp.float32, alpha=ALPHA, beta=BETA,
            config=cfg, split_k=split))
        check_seed001(f(da, db, dc), want, f"{cfg} split_k={split}")
