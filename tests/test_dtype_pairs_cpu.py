"""tg.dot_general on every pair of the dtypes JAX has (the 8-bit and 4-bit floats among them,
int4, bool, complex, float64 under x64), with and without a preferred_element_type: the same
result dtype, shape and values as lax.dot_general (integers exactly, floats within two ulps of
the result type, infinities where lax has them), or an error of the same type where lax raises
one. Most pairs take the lax fallback; the float16 / bfloat16 / fp8 / int8 ones the primitive
(lowered through lax on CPU). CPU; fresh random inputs per case."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg

LAX_DOT = lax.dot_general  # the original, taken before any test patches it
DN = (((1,), (0,)), ((), ()))
NAMES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "uint8", "int4",
         "bool", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
         "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3", "float4_e2m1fn"]
DTYPES = [getattr(jnp, n) for n in NAMES if hasattr(jnp, n)]


def rand(shape, dtype, rng):
    """Values every type holds exactly enough: small integers, unit normals, random booleans."""
    x = rng.standard_normal(shape)
    if dtype == jnp.bool_:
        return jnp.asarray(x > 0)
    if jnp.issubdtype(dtype, jnp.unsignedinteger):
        return jnp.asarray(np.abs(np.round(2 * x))).astype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.asarray(np.clip(np.round(2 * x), -7, 7)).astype(dtype)
    return jnp.asarray(x).astype(dtype)


def as64(x):
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("lhs", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_every_dtype_pair_as_lax(lhs):
    rng = np.random.default_rng(NAMES.index(jnp.dtype(lhs).name))
    for rhs in DTYPES:
        for pet in (None, jnp.float32):
            a, b = rand((5, 7), lhs, rng), rand((7, 3), rhs, rng)
            case = (jnp.dtype(lhs).name, jnp.dtype(rhs).name, pet)
            try:
                want = LAX_DOT(a, b, DN, preferred_element_type=pet)
            except Exception as e:  # lax rejects the pair: so must we, with the same error type
                with pytest.raises(type(e)):
                    tg.dot_general(a, b, DN, preferred_element_type=pet)
                continue
            got = tg.dot_general(a, b, DN, preferred_element_type=pet)
            assert got.dtype == want.dtype and got.shape == want.shape, (case, got.dtype)
            if not jnp.issubdtype(want.dtype, jnp.inexact):  # integers, bool: exactly lax's
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want), str(case))
                continue
            # floats: within two of the result type's ulps (sums rounded apart), on the scale
            # of the largest output
            eps = 2 * float(jnp.finfo(want.dtype).eps)
            w = as64(want)
            scale = float(np.abs(w[np.isfinite(w)]).max(initial=1.0))
            np.testing.assert_allclose(as64(got), w, rtol=eps, atol=eps * scale,
                                       err_msg=str(case))
