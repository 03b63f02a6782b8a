"""CPU tests of the errors of tg.* and tcgemm_p: for each bad input, the exception type and a
message naming the shapes and dtypes, raised at trace time (also under jit), before any GPU
work; config overrides checked against the extension's config table."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm.primitive import tcgemm, tcgemm_p

from test_cpu import BF16, CFG0, DG_NN, F16, F32, FP8_ONLY, S, h, needs_module
from jax_tcgemm import configs

NARROW = next((c.name for c in configs.CONFIGS if c.kind == "narrow"), None)  # 8-bit only


def bind(a, b, *extra, ta=False, tb=False, out_dtype=F16, plan=None, **epilogue):
    """tcgemm_p.bind with every param given (extra: c, bias, scale as the has_* flags say)."""
    params = dict(transpose_a=ta, transpose_b=tb, out_dtype=np.dtype(out_dtype), alpha=1.0,
                  beta=0.0, activation="none", has_c=False, has_bias=False, has_scale=False,
                  aux=False, plan=plan, overwrite_c=False, precision=None)
    params.update(epilogue)
    return tcgemm_p.bind(a, b, *extra, **params)


ERROR_CASES = [  # (id, thunk, exception type, regex the message must match)
    ("matmul_K_mismatch", lambda: tg.matmul(h(4, 7), h(8, 3)), ValueError,
     r"\(4, 7\).*\(8, 3\).*7 vs 8"),
    ("matmul_rank0", lambda: tg.matmul(h(), h(8, 3)), ValueError, r"rank.*\(\).*\(8, 3\)"),
    ("matmul_batch_not_broadcastable", lambda: tg.matmul(h(2, 4, 8), h(3, 8, 3)), ValueError,
     r"\(2, 4, 8\).*\(3, 8, 3\)"),
    ("matmul_out_int8", lambda: tg.matmul(h(4, 8), h(8, 3), out_dtype=jnp.int8), TypeError, "int8"),
    ("matmul_out_float64", lambda: tg.matmul(h(4, 8), h(8, 3), out_dtype=np.float64),
     TypeError, r"float64"),
    ("matmul_string", lambda: tg.matmul("abc", h(8, 3)), TypeError, r"str"),
    ("matmul_object", lambda: tg.matmul(h(4, 8), object()), TypeError, r"object"),
    ("dg_num_contracting", lambda: tg.dot_general(h(4, 8), h(8, 3), (((1,), (0, 1)), ((), ()))),
     ValueError, r"\(4, 8\).*\(8, 3\)"),
    ("dg_num_batch", lambda: tg.dot_general(h(2, 4, 8), h(2, 8, 3), (((2,), (1,)), ((0,), ()))),
     ValueError, r"\(2, 4, 8\).*\(2, 8, 3\)"),
    ("dg_out_of_range", lambda: tg.dot_general(h(4, 8), h(8, 3), (((5,), (0,)), ((), ()))),
     ValueError, r"\(5,\).*\(4, 8\)"),
    ("dg_repeated", lambda: tg.dot_general(h(4, 8), h(8, 8), (((1, 1), (0, 1)), ((), ()))),
     ValueError, r"repeated.*\(1, 1\)"),
    ("dg_batch_and_contracting", lambda: tg.dot_general(
        h(2, 4, 8), h(2, 8, 3), (((0,), (0,)), ((0,), (0,)))), ValueError,
     r"both.*\(2, 4, 8\).*\(2, 8, 3\)"),
    ("dg_contracting_size", lambda: tg.dot_general(h(4, 8), h(7, 3), DG_NN), ValueError,
     r"contracting.*\(4, 8\).*\(7, 3\)"),
    ("dg_batch_size", lambda: tg.dot_general(h(2, 4, 8), h(3, 8, 3), (((2,), (1,)), ((0,), (0,)))),
     ValueError, r"batch.*\(2, 4, 8\).*\(3, 8, 3\)"),
    ("dg_malformed_dims", lambda: tg.dot_general(h(4, 8), h(8, 3), ((1,), (0,))), TypeError,
     r"dimension_numbers"),
    ("dg_dims_none", lambda: tg.dot_general(h(4, 8), h(8, 3), None), TypeError,
     r"dimension_numbers.*None"),
    ("dg_dims_not_ints", lambda: tg.dot_general(h(4, 8), h(8, 3), (((None,), (0,)), ((), ()))),
     TypeError, r"contracting.*None"),
    ("dg_string", lambda: tg.dot_general(h(4, 8), "x", DG_NN), TypeError, r"str"),
    ("bind_rank2", lambda: bind(h(4, 8), h(8, 3)), ValueError, r"rank 3.*\(4, 8\).*\(8, 3\)"),
    ("bind_mixed_dtypes", lambda: bind(h(1, 4, 8), h(1, 8, 3, dt=BF16)), TypeError,
     r"float16.*bfloat16"),
    ("bind_int32_in", lambda: bind(h(1, 4, 8, dt=np.int32), h(1, 8, 3, dt=np.int32)),
     TypeError, "float32; got"),
    ("bind_split_k_0", lambda: bind(h(1, 4, 8), h(1, 8, 3), plan=(CFG0, 0)), ValueError,
     r"split_k must be in \[1, 64\]; got 0"),
    ("bind_split_k_too_many", lambda: bind(h(1, 4, 8), h(1, 8, 3), plan=(CFG0, 65)), ValueError,
     r"split_k must be in \[1, 64\]; got 65"),
    ("bind_unknown_config", lambda: bind(h(1, 4, 8), h(1, 8, 3), plan=("nope", 1)), ValueError,
     r"'nope'.*sm80_"),
    ("tcgemm_split_k_without_config", lambda: tcgemm(h(1, 4, 8), h(1, 8, 3), split_k=2),
     ValueError, r"split_k needs a config"),
    ("tcgemm_unknown_config", lambda: tcgemm(h(1, 4, 8), h(1, 8, 3), config="nope"), ValueError,
     r"unknown config 'nope'"),
    *([("tcgemm_fp8_only_config", lambda: tcgemm(h(1, 4, 8), h(1, 8, 3), config=FP8_ONLY),
        ValueError, rf"config {FP8_ONLY} has kernels for fp8 operands only.*a\(1, 4, 8\) float16")]
      if FP8_ONLY else []),
    *([("tcgemm_narrow_config", lambda: tcgemm(h(1, 4, 8), h(1, 8, 3), config=NARROW),
        ValueError, rf"config {NARROW} has kernels for 8-bit operands only.*a\(1, 4, 8\) float16")]
      if NARROW else []),
    # the epilogue operands (tg.gemm's own checks: test_epilogue_cpu.py)
    ("bind_c_not_broadcastable", lambda: bind(h(2, 4, 8), h(1, 8, 3), h(2, 4, 2, dt=F32),
                                              has_c=True), ValueError,
     r"c\(2, 4, 2\) does not broadcast to the result \(2, 4, 3\)"),
    ("bind_c_rank2", lambda: bind(h(1, 4, 8), h(1, 8, 3), h(4, 3, dt=F32), has_c=True),
     ValueError, r"c\(4, 3\)"),
    ("bind_c_int32", lambda: bind(h(1, 4, 8), h(1, 8, 3), h(1, 4, 3, dt=np.int32), has_c=True),
     TypeError, r"c must be float16, bfloat16 or float32; got int32"),
    ("bind_bias_wrong_n", lambda: bind(h(1, 4, 8), h(1, 8, 3), h(1, 4, dt=F32), has_bias=True),
     ValueError, r"bias must be float16, bfloat16 or float32 \(1 or 1, 3\); got \(1, 4\) float32"),
    ("bind_bias_int32", lambda: bind(h(1, 4, 8), h(1, 8, 3), h(1, 3, dt=np.int32),
                                     has_bias=True), ValueError, r"bias.*got \(1, 3\) int32"),
    ("bind_bias_batch", lambda: bind(h(2, 4, 8), h(1, 8, 3), h(3, 3, dt=F32), has_bias=True),
     ValueError, r"\(1 or 2, 3\); got \(3, 3\)"),
    ("bind_scale_shape", lambda: bind(h(1, 4, 8), h(1, 8, 3), h(3, dt=F32), has_scale=True),
     ValueError, r"scale must be float32 \[alpha, beta\]; got \(3,\)"),
    ("bind_unknown_activation", lambda: bind(h(1, 4, 8), h(1, 8, 3), activation="tanh"),
     ValueError, r"unknown activation 'tanh'.*gelu_tanh"),
    ("bind_batch_2_vs_3", lambda: bind(h(2, 4, 8), h(3, 8, 3)), ValueError,
     r"\(2, 4, 8\).*\(3, 8, 3\)"),
    ("bind_K_mismatch_transposed", lambda: bind(h(1, 8, 4), h(1, 8, 3), ta=True, tb=True),
     ValueError, r"8 vs 3"),
    ("bind_out_int32", lambda: bind(h(1, 4, 8), h(1, 8, 3), out_dtype=np.int32), TypeError, "int32"),
    # issue 5: more ranks, unsupported dtypes, non-arrays, dimension numbers and out dtypes
    ("bind_rank4", lambda: bind(h(1, 1, 4, 8), h(1, 8, 3)), ValueError, r"rank 3.*\(1, 1, 4, 8\)"),
    ("bind_int8_in", lambda: bind(h(1, 4, 8, dt=np.int8), h(1, 8, 3, dt=np.int8)), TypeError,
     r"int8"),
    ("bind_bool_in", lambda: bind(h(1, 4, 8, dt=np.bool_), h(1, 8, 3, dt=np.bool_)), TypeError,
     r"bool"),
    ("bind_out_float64", lambda: bind(h(1, 4, 8), h(1, 8, 3), out_dtype=np.float64), TypeError,
     "float64"),
    ("matmul_none", lambda: tg.matmul(None, h(8, 3)), TypeError, r"NoneType"),
    ("matmul_dict", lambda: tg.matmul(h(4, 8), {"b": 1}), TypeError, r"dict"),
    ("matmul_out_unknown_dtype", lambda: tg.matmul(h(4, 8), h(8, 3), out_dtype="float7"),
     TypeError, r"float7"),
    ("dg_shape_dtype_struct", lambda: tg.dot_general(S((4, 8), F16), h(8, 3), DG_NN), TypeError,
     r"ShapeDtypeStruct"),
    ("dg_rank0_contracting", lambda: tg.dot_general(h(), h(8), (((0,), (0,)), ((), ()))),
     ValueError, r"out of range.*shape \(\)"),
    ("dg_dims_float", lambda: tg.dot_general(h(4, 8), h(8, 3), (((1.0,), (0,)), ((), ()))),
     TypeError, r"\(1\.0,\)"),
]


_CONFIG_CASES = {"bind_split_k_0", "bind_split_k_too_many", "bind_unknown_config"}


@pytest.mark.parametrize("thunk,exc,pattern", [
    pytest.param(*c[1:], marks=[needs_module] if c[0] in _CONFIG_CASES else [])
    for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_errors(thunk, exc, pattern):
    with pytest.raises(exc) as info:
        thunk()
    assert re.search(pattern, str(info.value), re.S), str(info.value)
    # ... and the same error under jit (raised at trace time, in Python)
    with pytest.raises(exc):
        jax.jit(lambda: thunk())()
