"""Trace-time errors of tg.scaled_matmul (issue 26): every bad operand, dtype, out_dtype, scale
presence / dtype / shape / form mix and epilogue argument raises a TypeError or ValueError that
names the shapes and dtypes, eagerly and under jit, before any device work; eval_shape and the
public API.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import jax_tcgemm as tg

# _on_cpu: the module's autouse fixture (the lax path on the CPU, also on a GPU host)
from test_scaled_cpu import BF16, E4M3, E5M2, F16, F32, I8, S, _on_cpu, case  # noqa: F401

def _args(pair=(E4M3, E4M3), fa="row", fb="column", **kw):
    return case(pair, fa, fb, m=8, n=20, k=300, seed="err", **kw)


def _errors():
    a, b, sa, sb = _args()
    ab, bb, sab, sbb = _args(fa="block", fb="block")
    i8 = _args((I8, I8))
    f16 = jnp.ones((8, 300), F16)
    e5 = _args((E5M2, E5M2))
    x = [
        # operand ranks, dtypes, K
        ((a[0], b, sa, sb), {}, ValueError, r"a and b must have rank >= 2.*a\(300,\) float8_e4m3fn"),
        ((a, b[:, 0], sa, sb), {}, ValueError, r"rank >= 2.*b\(300,\)"),
        ((jnp.stack([a, a]), jnp.stack([b] * 3), sa, sb), {}, ValueError,
         r"batch dims of a and b do not broadcast: a\(2, 8, 300\).*b\(3, 300, 20\)"),
        (e5, {}, TypeError, r"unsupported operand dtypes a float8_e5m2 x b float8_e5m2"),
        ((f16, f16.T, None, None), {}, TypeError, r"a float16 x b float16.*tg.gemm"),
        ((i8[0], b, sa, sb), {}, TypeError, r"a int8 x b float8_e4m3fn"),
        ((a, i8[1], sa, sb), {}, TypeError, r"a float8_e4m3fn x b int8"),
        ((a.astype(jnp.float8_e4m3fnuz), b, sa, sb), {}, TypeError,
         r"a float8_e4m3fnuz x b float8_e4m3fn"),
        ((jnp.asarray(np.asarray(i8[0]).view(np.uint8)), i8[1], i8[2], i8[3]), {}, TypeError,
         r"a uint8 x b int8"),
        ((a, b[:299], sa, sb), {}, ValueError,
         r"contracting dimensions differ \(K = 300 vs 299\).*b\(299, 20\)"),
        ((a, b, sa, sb), {"transpose_b": True}, ValueError,
         r"K = 300 vs 20.*transpose_b=True"),
        # out_dtype
        ((a, b, sa, sb), {"out_dtype": jnp.int32}, TypeError,
         r"out_dtype must be one of \['bfloat16', 'float16', 'float32'\] for float8_e4m3fn"),
        (i8, {"out_dtype": jnp.int8}, TypeError, r"'int32'\] for int8 x int8; got int8"),
        ((a, b, sa, sb), {"out_dtype": jnp.float64}, TypeError, r"got float64"),
        (i8, {"out_dtype": jnp.int32}, ValueError, r"int32 is the exact integer product.*no "
                                                   r"scales"),
        ((i8[0], i8[1], None, None), {"out_dtype": jnp.int32, "bias": jnp.ones(20)},
         ValueError, r"no epilogue"),
        # scales: presence, dtype
        ((a, b, sa, None), {}, ValueError, r"both a_scale and b_scale or neither"),
        ((a, b, None, sb), {}, ValueError, r"a_scale None, b_scale given"),
        ((a, b, sa.astype(BF16), sb), {}, TypeError, r"a_scale must be float32; got "
                                                     r"a_scale\(8,\) bfloat16"),
        ((a, b, sa, np.asarray(sb, np.float64)), {}, TypeError,
         r"b_scale must be float32; got b_scale\(20,\) float64"),
        ((a, b, sa, jnp.ones(20, jnp.int32)), {}, TypeError, r"b_scale\(20,\) int32"),
        ((a, b, True, 1.0), {}, TypeError, r"a_scale must be float32.*bool"),
        # scale shapes
        ((a, b, jnp.ones(9, F32), sb), {}, ValueError,
         r"a_scale\(9,\) fits no scale form of a\(8, 300\).*\(8,\).*\(8, 3\)"),
        ((a, b, jnp.ones((8, 2), F32), sbb), {}, ValueError, r"a_scale\(8, 2\) fits no"),
        ((a, b, sa, jnp.ones(21, F32)), {}, ValueError,
         r"b_scale\(21,\) fits no scale form of b\(300, 20\).*\(20,\).*\(3, 1\)"),
        ((ab, b, sab, jnp.ones((1, 3), F32)), {}, ValueError,
         r"b_scale\(1, 3\) fits no.*transpose_b=False.*\(3, 1\) = \(ceil\(K/128\)"),
        ((ab, b.T, sab, sbb), {"transpose_b": True}, ValueError,
         r"b_scale\(3, 1\) fits no.*b\(20, 300\).*\(1, 3\) = \(ceil\(N/128\)"),
        ((jnp.stack([a, a]), b, sa, sb), {}, ValueError,
         r"a_scale\(8,\) fits no scale form of a\(2, 8, 300\).*\(2, 8,\)"),
        # mixed forms
        ((ab, bb, sab, sb), {}, ValueError, r"a_scale is block.*b_scale is column"),
        ((a, b, sa, sbb), {}, ValueError, r"a_scale is row.*b_scale is block"),
        ((a, b, jnp.float32(2), sbb), {}, ValueError, r"a_scale is tensor.*jnp.broadcast_to"),
        # the epilogue
        ((a, b, sa, sb), {"activation": "tanh"}, ValueError,
         r"scaled_matmul: unknown activation 'tanh'"),
        ((a, b, sa, sb), {"bias": jnp.ones(8, F32)}, ValueError,
         r"bias must have shape \(20,\).*\(8,\) float32.*a\(8, 300\) float8_e4m3fn"),
        ((a, b, sa, sb), {"bias": jnp.ones(20, jnp.int32)}, TypeError, r"bias must be floating"),
        ((a, b, sa, sb), {"c": jnp.ones((8, 3), F32)}, ValueError,
         r"c\(8, 3\) does not broadcast to the result \(8, 20\)"),
        ((a, b, sa, sb), {"c": jnp.ones((8, 20), F16)}, TypeError,
         r"c must be of out_dtype \(bfloat16\) or float32; got float16"),
        ((a, b, sa, sb), {"c": jnp.ones((8, 20), F32), "beta": jnp.ones(2)}, ValueError,
         r"beta must be a scalar; got shape \(2,\)"),
    ]
    return x


ERRORS = _errors()


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors(i):
    args, kw, exc, pattern = ERRORS[i]
    with pytest.raises(exc, match=pattern):
        tg.scaled_matmul(*args, **kw)
    # at trace time: the same under jit (static kwargs)
    with pytest.raises(exc, match=pattern):  # closed over: jit would convert float64 args
        jax.jit(lambda: tg.scaled_matmul(*args, **kw))()


def test_eval_shape_and_export():
    a, b, sa, sb = _args(fa="block", fb="block")
    out = jax.eval_shape(lambda *x: tg.scaled_matmul(*x, out_dtype=F16),
                         *(S(x.shape, x.dtype) for x in (a, b, sa, sb)))
    assert out.shape == (8, 20) and out.dtype == F16
    assert tg.scaled_matmul in (getattr(tg, n) for n in tg.__all__)
    assert "issue 26" in tg.scaled_matmul.__doc__ and "K-major" in tg.scaled_matmul.__doc__
