"""Drop-in fidelity of tg.dot_general / tg.matmul against lax (issue 25, "Drop-in fidelity"):
fallback dtypes bit-exact with lax and accumulated in the requested type, every pair of JAX's
dtypes as lax, lax's normalisation
of preferred_element_type, lax's validation of precision and dimension numbers, and safety
under a global monkeypatch of jax.lax.dot_general, and jax 0.12.1's reduction_order. CPU; fresh
random inputs per case."""
import inspect
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg
from conftest import f64

LAX_DOT = lax.dot_general  # the original, taken before any test patches it
DN = (((1,), (0,)), ((), ()))


def rand(shape, dtype, seed):
    """Fresh values of any JAX dtype: integers in [-100, 100] (int4's own range), unit normals,
    random booleans."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if jnp.issubdtype(dt, jnp.integer):  # (jnp's: it knows int4)
        info = jnp.iinfo(dt)
        return rng.integers(max(int(info.min), -100), min(int(info.max), 100), shape).astype(dt)
    if np.issubdtype(dt, np.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def same(x, y):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, y.dtype, x.shape, y.shape)
    np.testing.assert_array_equal(x, y)


FALLBACK = ["int8", "int16", "int32", "uint8", "float32", "complex64", "bool"]


@pytest.mark.parametrize("dtype", FALLBACK)
def test_fallback_dtypes_bit_exact_with_lax(dtype):
    a, b = rand((8, 64), dtype, 1), rand((64, 8), dtype, 2)
    same(tg.dot_general(a, b, DN), LAX_DOT(a, b, DN))
    same(tg.matmul(a, b), jnp.matmul(a, b))


@pytest.mark.parametrize("dtype,out", [("int8", "int32"), ("int16", "int32"),
                                       ("uint8", "int32"), ("float16", "float16")])
def test_matmul_accumulates_in_out_dtype(dtype, out):
    """int8 @ int8 -> int32 accumulates in int32 (it used to wrap in int8, then cast)."""
    a = rand((8, 64), dtype, 3) if dtype != "float16" else rand((8, 64), "float16", 3)
    b = rand((64, 8), dtype, 4)
    got = tg.matmul(a, b, out_dtype=out)
    want = jnp.matmul(a, b, preferred_element_type=out)
    assert got.dtype == np.dtype(out)
    if dtype != "float16":
        same(got, want)
        exact = a.astype(np.int64) @ b.astype(np.int64)
        np.testing.assert_array_equal(np.asarray(got, np.int64), exact)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("pet", [np.float64, float, np.int32, np.int8, np.complex64, None,
                                 np.float32, "bfloat16"])
def test_preferred_element_type_normalised_as_lax(dtype, pet):
    a, b = rand((8, 16), "float32", 5).astype(dtype), rand((16, 8), "float32", 6).astype(dtype)
    try:
        want = LAX_DOT(a, b, DN, preferred_element_type=pet)
    except Exception as e:  # lax rejects it: so must we, with the same type of error
        with pytest.raises(type(e)):
            tg.dot_general(a, b, DN, preferred_element_type=pet)
        return
    got = tg.dot_general(a, b, DN, preferred_element_type=pet)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(f64(got), f64(want), rtol=2e-2, atol=2e-2)  # complex: both parts


@pytest.mark.parametrize("precision", ["nonsense", 7, ("high", "low", "x"), object()])
def test_invalid_precision_rejected_as_lax(precision):
    a, b = rand((4, 8), "float16", 7), rand((8, 4), "float16", 8)
    with pytest.raises(Exception) as lax_err:
        LAX_DOT(a, b, DN, precision=precision)
    with pytest.raises(type(lax_err.value)):
        tg.dot_general(a, b, DN, precision=precision)


@pytest.mark.parametrize("precision", [None, "highest", lax.Precision.HIGH,
                                       (lax.Precision.DEFAULT, lax.Precision.HIGHEST)])
def test_valid_precision_accepted(precision):
    a, b = rand((4, 8), "bfloat16", 9), rand((8, 4), "bfloat16", 10)
    out = tg.dot_general(a, b, DN, precision=precision)
    assert out.shape == (4, 4) and out.dtype == jnp.bfloat16


@pytest.mark.parametrize("dims", [
    (((-1,), (0,)), ((), ())),                 # negative contracting dim
    (((1,), (-2,)), ((), ())),
    (((1,), (0,)), ((0,), (0,))),              # a dim both batch and contracting
    (((1, 1), (0, 0)), ((), ())),              # repeated
    (((2,), (0,)), ((), ())),                  # out of range
    (((1,), (1,)), ((), ())),                  # sizes differ
])
def test_dimension_numbers_as_strict_as_lax(dims):
    a, b = rand((4, 8), "float16", 11), rand((8, 6), "float16", 12)
    with pytest.raises((TypeError, ValueError)):  # lax: TypeError
        LAX_DOT(a, b, dims)
    with pytest.raises((TypeError, ValueError)):  # ours: a clear error at trace time
        tg.dot_general(a, b, dims)


def test_global_monkeypatch_does_not_recurse(monkeypatch):
    """jax.lax.dot_general = tg.dot_general: float32 calls (our fallback), half-precision calls
    (our kernel, lowered through lax on CPU) and jitted calls all work and match lax."""
    monkeypatch.setattr(jax.lax, "dot_general", tg.dot_general)
    for dtype in ("float32", "float16", "bfloat16", "int8"):
        a, b = rand((8, 16), dtype, 13), rand((16, 8), dtype, 14)
        got = jax.lax.dot_general(a, b, DN)
        same(got, LAX_DOT(a, b, DN))
        got_jit = jax.jit(lambda x, y: jax.lax.dot_general(x, y, DN))(a, b)
        same(got_jit, LAX_DOT(a, b, DN))
    # and through the gradient (its products are tcgemm again)
    a, b = rand((8, 16), "float32", 15), rand((16, 8), "float32", 16)
    g = jax.grad(lambda x: jax.lax.dot_general(x, b, DN).sum())(a)
    np.testing.assert_allclose(g, np.broadcast_to(b.sum(1), (8, 16)), rtol=1e-5)


def test_every_fallback_pair_matches_lax_result_type():
    """Mixed and fallback dtype pairs: same result dtype as lax (promotion included)."""
    for da, db in itertools.product(["float16", "bfloat16", "float32", "int8"], repeat=2):
        a, b = rand((4, 8), da, 17), rand((8, 4), db, 18)
        try:
            want = LAX_DOT(a, b, DN)
        except Exception as e:
            with pytest.raises(type(e)):
                tg.dot_general(a, b, DN)
            continue
        got = tg.dot_general(a, b, DN)
        assert got.dtype == want.dtype, (da, db)
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                                   rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------------------------------
# reduction_order (jax >= 0.12.1's lax contractions take one): None and 'unordered' leave the
# order to the implementation (our kernels); every other order is lax's, bit-exact with lax.

HAS_ORDER = "reduction_order" in inspect.signature(LAX_DOT).parameters
needs_order = pytest.mark.skipif(not HAS_ORDER, reason=f"jax {jax.__version__}'s "
                                 "lax.dot_general takes no reduction_order (jax >= 0.12.1)")


def lax_enum(order):
    """lax's own normalised form of a string order (its enum member), from a jaxpr's params."""
    jx = jax.make_jaxpr(lambda x, y: LAX_DOT(x, y, DN, reduction_order=order))(
        jnp.ones((2, 3)), jnp.ones((3, 2)))
    return jx.eqns[0].params["reduction_order"]


@needs_order
@pytest.mark.parametrize("order", ["unordered", "enum"])
def test_unordered_reduction_runs_the_kernels(order):
    order = lax_enum("unordered") if order == "enum" else order
    a, b = rand((24, 40), "bfloat16", 19), rand((40, 12), "bfloat16", 20)
    f = lambda x, y: tg.dot_general(x, y, DN, preferred_element_type=jnp.float32,  # noqa: E731
                                    reduction_order=order)
    jx = jax.make_jaxpr(f)(a, b)
    names = {e.primitive.name for e in jx.eqns}
    assert "tcgemm" in names and "dot_general" not in names, jx
    ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)  # bf16 products exact in f32
    np.testing.assert_allclose(np.asarray(f(a, b), np.float64), ref, rtol=1e-5, atol=1e-5)
    # and through lax-signature callers: jnp.einsum hands the order on only when it is set
    out = jnp.einsum("mk,kn->mn", a, b, preferred_element_type=jnp.float32,
                     _dot_general=tg.dot_general, reduction_order="unordered")
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=1e-5, atol=1e-5)


@needs_order
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int8"])
@pytest.mark.parametrize("order", ["linear", "enum"])
def test_ordered_reduction_is_lax_bit_exact(order, dtype):
    order = lax_enum("linear") if order == "enum" else order
    a, b = rand((6, 33), dtype, 21), rand((33, 5), dtype, 22)
    f = lambda x, y: tg.dot_general(x, y, DN, reduction_order=order)  # noqa: E731
    assert not any(e.primitive.name == "tcgemm" for e in jax.make_jaxpr(f)(a, b).eqns)
    same(f(a, b), LAX_DOT(a, b, DN, reduction_order=order))
    same(jax.jit(f)(a, b), LAX_DOT(a, b, DN, reduction_order=order))
    got = jnp.einsum("mk,kn->mn", a, b, _dot_general=tg.dot_general, reduction_order="linear")
    same(got, jnp.einsum("mk,kn->mn", a, b, reduction_order="linear"))
    if dtype == "float32":  # and its gradient is lax's
        same(jax.grad(lambda x: f(x, b).sum())(a),
             jax.grad(lambda x: LAX_DOT(x, b, DN, reduction_order=order).sum())(a))


@needs_order
def test_invalid_reduction_order_rejected_as_lax():
    a, b = rand((4, 8), "float16", 23), rand((8, 4), "float16", 24)
    with pytest.raises(ValueError, match="sideways"):
        LAX_DOT(a, b, DN, reduction_order="sideways")
    with pytest.raises(ValueError, match="sideways"):
        tg.dot_general(a, b, DN, reduction_order="sideways")
    for bad in (np.array(["unordered", "linear"]), 3, ("linear",)):  # lax's error, not ours
        with pytest.raises(Exception) as theirs:
            LAX_DOT(a, b, DN, reduction_order=bad)
        with pytest.raises(type(theirs.value)):
            tg.dot_general(a, b, DN, reduction_order=bad)


@pytest.mark.skipif(HAS_ORDER, reason=f"jax {jax.__version__} takes a reduction_order")
def test_reduction_order_needs_newer_jax():
    a, b = rand((4, 8), "float16", 25), rand((8, 4), "float16", 26)
    for order in ("unordered", "linear"):
        with pytest.raises(TypeError, match=r"reduction_order='\w+' needs jax >= 0.12.1"):
            tg.dot_general(a, b, DN, reduction_order=order)
    assert tg.dot_general(a, b, DN, reduction_order=None).shape == (4, 4)


# Every dtype JAX has (the 8-bit and 4-bit floats among them, int4, bool, complex, float64 under
# x64): most pairs take the lax fallback; the float16 / bfloat16 / fp8 / int8 ones the primitive
# (lowered through lax on CPU).
PAIR_NAMES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "uint8",
              "int4", "bool", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
              "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3",
              "float4_e2m1fn"]
PAIR_DTYPES = [getattr(jnp, n) for n in PAIR_NAMES if hasattr(jnp, n)]


@pytest.mark.parametrize("lhs", PAIR_DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_every_dtype_pair_as_lax(lhs):
    """With and without a preferred_element_type: lax's result dtype, shape and values
    (integers exactly, floats within two ulps of the result type, infinities where lax has
    them), or an error of the same type where lax raises one."""
    i = PAIR_NAMES.index(jnp.dtype(lhs).name)
    with jax.enable_x64(True):
        for j, rhs in enumerate(PAIR_DTYPES):
            for pet in (None, jnp.float32):
                a, b = rand((5, 7), lhs, (i, j, 1)), rand((7, 3), rhs, (i, j, 2))
                case = (jnp.dtype(lhs).name, jnp.dtype(rhs).name, pet)
                try:
                    want = LAX_DOT(a, b, DN, preferred_element_type=pet)
                except Exception as e:  # lax rejects the pair: so must we, with its error type
                    with pytest.raises(type(e)):
                        tg.dot_general(a, b, DN, preferred_element_type=pet)
                    continue
                got = tg.dot_general(a, b, DN, preferred_element_type=pet)
                assert got.dtype == want.dtype and got.shape == want.shape, (case, got.dtype)
                if not jnp.issubdtype(want.dtype, jnp.inexact):  # integers, bool: exactly lax's
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), str(case))
                    continue
                # floats: within two of the result type's ulps (sums rounded apart), on the
                # scale of the largest finite output
                eps = 2 * float(jnp.finfo(want.dtype).eps)
                w = f64(want)
                scale = float(np.abs(w[np.isfinite(w)]).max(initial=1.0))
                np.testing.assert_allclose(f64(got), w, rtol=eps, atol=eps * scale,
                                           err_msg=str(case))
