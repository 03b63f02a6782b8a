"""GPU tests of the tcgemm_split kernel (lowering.f32_parts): the parts of float32 operands
that the multi-pass float32 algorithms multiply, K-major and laid out along K' (f32.layout),
bit for bit the parts of their specification, f32.operand_parts (XLA ops: f32_parts below its
threshold), on the same GPU.

Cases: every algorithm our kernels run (one TF32 or BF16 pass, 3xTF32, BF16x3/x6/x9, f16x3),
both layouts of each operand (K-major read as is, the other transposed by the kernel), batch
and a shared b (batch 1), shapes that are not multiples of the kernel's 32 x 64 tiles, K not a
multiple of 4 (concat_k's padding) or of 64 (f16x3_lo_k's), and data with infinities, NaNs,
float32 subnormals, values near float32's largest, rows of zeros and rows 2^+-60 apart (f16x3's
powers of two). Each layout runs twice with different data in one jitted function, so that a
column the kernel never writes would show the other call's values; the larger operand also
through the kernel beside the smaller one through the XLA ops (lowering.SPLIT_MIN_ELEMENTS
between their sizes). NaNs compare as NaNs (their payloads are not part of the contract)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_tcgemm import _ffi, configs, lowering

pytestmark = pytest.mark.gpu

ALGOS = ["tf32", "tf32x3", "bf16", "bf16x3", "bf16x6", "bf16x9", "f16x3"]
SPEC = 1 << 62  # f32_parts's min_elements: no operand on the kernel
SHAPES = [(1, 1, 1, 1), (2, 33, 65, 1), (3, 100, 130, 77), (1, 257, 40, 1029), (2, 64, 96, 2048)]


def _data(seed, shape):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)
    x *= 2.0 ** rng.integers(-60, 61, shape[:-1] + (1,))  # rows (and columns) far apart
    x = x.astype(np.float32)
    flat = x.reshape(-1)
    special = [np.inf, -np.inf, np.nan, 1e-40, -3e-39, 3.3e38, -3.4e38, 0.0, -0.0, 2.0**-149]
    idx = rng.choice(flat.size, size=min(flat.size, 3 * len(special)), replace=False)
    flat[idx] = np.resize(np.array(special, np.float32), idx.size)
    if x.shape[-2] > 3:
        x[..., 2, :] = 0.0  # a row (or K column) of zeros
    return x


def _same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    nan = np.isnan(want.astype(np.float32))
    assert (np.isnan(got.astype(np.float32)) == nan).all(), what
    bits = np.uint16 if got.dtype.itemsize == 2 else np.uint32
    g, w = got.view(bits), want.view(bits)
    bad = (g != w) & ~nan
    assert not bad.any(), (what, np.argwhere(bad)[:5], g[bad][:5], w[bad][:5])


@pytest.fixture(autouse=True)
def _needs_sm90():
    if configs.device_arch() != (9, 0):
        pytest.skip("the float32 algorithms run on our kernels on compute capability 9.0 only")
    _ffi.require()


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["NN", "NT", "TN", "TT"])
def test_kernel_parts_bit_exact(algo, ta, tb):
    for s, (bt, m, n, k) in enumerate(SHAPES):
        shape_a = (bt, k, m) if ta else (bt, m, k)
        shape_b = (1, n, k) if tb else (1, k, n)  # a shared b

        args = [_data((s, i), sh) for i, sh in enumerate((shape_a, shape_b) * 2)]
        mixed = max(args[0].size, args[1].size)  # the larger operand on the kernel only
        for limit in (0, mixed):
            @jax.jit
            def both(a1, b1, a2, b2):
                def parts(a, b, min_elements):
                    pa, pb, ta2, tb2, scales = lowering.f32_parts(
                        a, b, algo, ta, tb, min_elements=min_elements)
                    assert (ta2, tb2) == (False, True)  # K-major both
                    return (pa, pb, *scales)
                run = functools.partial(parts, min_elements=limit)
                spec = functools.partial(parts, min_elements=SPEC)  # XLA's ops for both
                return run(a1, b1), spec(a1, b1), run(a2, b2), spec(a2, b2)

            got1, want1, got2, want2 = both(*args)
            for g, w, what in [(got1, want1, 1), (got2, want2, 2)]:
                assert len(g) == len(w) == (4 if algo == "f16x3" else 2)
                for i, (gi, wi) in enumerate(zip(g, w)):
                    _same(gi, wi, (algo, bt, m, n, k, limit, what, i))


def test_bad_layout_is_an_error():
    """A layout whose blocks and zero ranges do not tile K' is the handler's clear error."""
    x = jnp.ones((1, 4, 8), jnp.float32)
    call = jax.ffi.ffi_call(_ffi.SPLIT_TARGET, jax.ShapeDtypeStruct((1, 4, 20), jnp.bfloat16))
    with pytest.raises(Exception, match="do not tile K' = 20"):
        jax.block_until_ready(call(
            x, kind=np.int32(1), k_major=True, offsets=np.array([0, 8], np.int64),
            parts=np.array([0, 1], np.int32), zeros=np.array([17, 20], np.int64),
            top_exp=np.int32(15), lo_scale=np.float32(2048.0)))
