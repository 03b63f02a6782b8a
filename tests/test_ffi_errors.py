"""The FFI handlers' answer to inconsistent calls: the "tcgemm" and "tcgemm_dact" targets called
directly through jax.ffi.ffi_call, with no Python-side check, with buffers and attributes that
disagree (the epilogue operands and results, the scale operands, the workspace, the tail and
block-scale attributes). Each must come back as an XLA error carrying the handler's message (a
Python exception), never an abort or an out-of-bounds access; the runtime works afterwards.

GPU tests are marked `gpu` (conftest: skipped off-GPU with a reason, failed instead under
TCGEMM_REQUIRE_GPU=1).
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_tcgemm import _ffi, configs, lowering

from conftest import assert_close, ref64, seed_of
from test_cpu import FP8_ONLY  # a row with no 16-bit kernels

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
CONFIG_NAMES = [c.name for c in configs.CONFIGS16]
F32_ROW = next(c.name for c in configs.CONFIGS if c.f32)  # rows with promoted float16 kernels
gpu = pytest.mark.gpu

DROP = object()  # an attribute left out of the call


def x(*shape, dt=F16):
    rng = np.random.default_rng(seed_of("ffi", shape, np.dtype(dt).name))
    return jnp.asarray(rng.standard_normal(shape, np.float32).astype(dt))


def raw_call(a, b, c_shape, c_dtype=F32, *, ws=((0,), F32), extra=(), results=None,
             aux_results=(), **attrs):
    """The "tcgemm" target through jax.ffi.ffi_call: no Python-side check at all. `extra`:
    epilogue operands after a and b; `aux_results`: (shape, dtype) of results after the
    workspace."""
    attrs = {**lowering.ffi_attrs(  # the plain call's attributes, typed as the lowering's
        transpose_a=False, transpose_b=False, config=CONFIG_NAMES[0], split_k=1, pack=False,
        has_c=False, has_bias=False, has_scale=False, aux=False, activation=None), **attrs}
    attrs = {k: v for k, v in attrs.items() if v is not DROP}
    if results is None:  # c, and the float32 workspace of split-K
        results = [jax.ShapeDtypeStruct(c_shape, c_dtype), jax.ShapeDtypeStruct(*ws)]
        results += [jax.ShapeDtypeStruct(*r) for r in aux_results]
    operands = [a] + ([] if b is None else [b]) + list(extra)
    return jax.block_until_ready(jax.ffi.ffi_call(_ffi.TARGET, results)(*operands, **attrs))


ok_a, ok_b = (lambda: x(1, 4, 8)), (lambda: x(1, 8, 3))
TAIL = {"tail_rows": np.int64(128), "tail_split": np.int64(2)}
TAIL_WS = {**TAIL, "ws": ((1 << 16,), F32)}
FFI_CASES = [  # (id, thunk, regex of the error message)
    ("unknown_config", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), config="sm80_1x1x1"),
     r"tcgemm: unknown config 'sm80_1x1x1'"),
    ("empty_config", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), config=""),
     r"tcgemm: unknown config ''"),
    *([("fp8_only_config_16bit", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), config=FP8_ONLY),
        rf"tcgemm: config {FP8_ONLY} has kernels for fp8 operands only")] if FP8_ONLY else []),
    ("contracting_mismatch", lambda: raw_call(ok_a(), x(1, 7, 3), (1, 4, 3)),
     r"tcgemm: contracting sizes differ: a\(1, 4, 8\) transpose_a=0, b\(1, 7, 3\)"),
    ("contracting_mismatch_flags", lambda: raw_call(
        x(1, 8, 4), x(1, 3, 7), (1, 4, 3), transpose_a=True, transpose_b=True),
     r"tcgemm: contracting sizes differ: .*transpose_a=1.*transpose_b=1"),
    ("result_shape", lambda: raw_call(ok_a(), ok_b(), (1, 4, 5)),
     r"tcgemm: result shape does not match operands: .*c\(1, 4, 5\)"),
    ("result_shape_ignores_flag", lambda: raw_call(x(1, 8, 4), ok_b(), (1, 8, 3),
                                                          transpose_a=True),
     r"tcgemm: result shape does not match operands"),
    ("result_dtype_int32", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), np.int32),
     r"tcgemm: result must be float16, bfloat16 or float32"),
    ("result_dtype_int8", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), np.int8),
     r"tcgemm: result must be float16, bfloat16 or float32"),
    ("batch_mismatch", lambda: raw_call(x(2, 4, 8), x(3, 8, 3), (2, 4, 3)),
     r"tcgemm: batch sizes must equal the result's or be 1"),
    ("result_batch_mismatch", lambda: raw_call(x(2, 4, 8), x(2, 8, 3), (3, 4, 3)),
     r"tcgemm: batch sizes must equal the result's or be 1"),
    ("rank2_operands", lambda: raw_call(x(4, 8), x(8, 3), (4, 3)),
     r"tcgemm: operands and result must have rank 3 .*a\(4, 8\), b\(8, 3\), c\(4, 3\)"),
    ("rank4_result", lambda: raw_call(ok_a(), ok_b(), (1, 1, 4, 3)),
     r"tcgemm: operands and result must have rank 3"),
    ("int8_operands_n_major", lambda: raw_call(x(1, 4, 8, dt=np.int8), x(1, 8, 3, dt=np.int8),
                                               (1, 4, 3)),
     r"tcgemm: 8-bit operands are read K-major: .* with transpose_b=1, pack=0"),
    ("float32_operands_n_major", lambda: raw_call(x(1, 4, 8, dt=F32), x(1, 8, 3, dt=F32),
                                                  (1, 4, 3)),
     r"tcgemm: float32 operands are read K-major"),
    ("promote_bfloat16", lambda: raw_call(x(1, 4, 8, dt=BF16), x(1, 3, 8, dt=BF16), (1, 4, 3),
                                          transpose_b=True, promote=True),
     r"tcgemm: promoted operands are float16, read K-major"),
    ("promote_n_major", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), promote=True),
     r"tcgemm: promoted operands are float16, read K-major"),
    ("piece_scale_plain", lambda: raw_call(x(1, 4, 128), x(1, 3, 128), (1, 4, 3),
                                           transpose_b=True, piece_scale_k=np.int64(64)),
     r"tcgemm: scaled pieces go with promoted float16 operands, below a multiple of 64"),
    ("piece_scale_unaligned", lambda: raw_call(x(1, 4, 128), x(1, 3, 128), (1, 4, 3),
                                               transpose_b=True, promote=True,
                                               config=F32_ROW, piece_scale_k=np.int64(96)),
     r"scaled pieces go with .* \(got piece_scale_k = 96 for K = 128\)"),
    ("piece_scale_past_k", lambda: raw_call(x(1, 4, 64), x(1, 3, 64), (1, 4, 3),
                                            transpose_b=True, promote=True,
                                            config=F32_ROW, piece_scale_k=np.int64(128)),
     r"\(got piece_scale_k = 128 for K = 64\)"),
    ("tail_batch", lambda: raw_call(x(2, 256, 64), x(1, 64, 64), (2, 256, 64), config=F32_ROW,
                                    **TAIL), r"tcgemm: a tail split needs .* and batch 1"),
    ("tail_rows_past_m", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3),
                                          **{**TAIL, "tail_rows": np.int64(4)}),
     r"tcgemm: a tail split needs 0 <= tail_rows < M"),
    ("tail_with_split_k", lambda: raw_call(x(1, 256, 1024), x(1, 1024, 64), (1, 256, 64),
                                           config=F32_ROW, split_k=np.int64(2), **TAIL),
     r"tcgemm: a tail split needs .* got tail_rows 128, tail_split 2, split_k 2"),
    ("tail_sm80_row", lambda: raw_call(x(1, 256, 64), x(1, 64, 64), (1, 256, 64), **TAIL_WS,
                                       config=CONFIG_NAMES[0]),
     r"tcgemm: a tail split takes 16-bit operands on an sm90 row"),
    ("tail_head_unaligned", lambda: raw_call(x(1, 256, 64), x(1, 64, 64), (1, 256, 64),
                                             config=F32_ROW,
                                             **{**TAIL_WS, "tail_rows": np.int64(100)}),
     r"tcgemm: a tail split takes .* \(got tail_rows 100, tail_split 2 for M = 256\)"),
    ("row_scale_16bit", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_row_scale=True,
                                         extra=(jnp.ones((1, 4), F32),)),
     r"tcgemm: row and column scales go with 8-bit or promoted float16 operands"),
    ("col_scale_batch", lambda: raw_call(x(2, 4, 16), x(1, 3, 16), (2, 4, 3), transpose_b=True,
                                         promote=True, has_col_scale=True,
                                         extra=(jnp.ones((3, 3), F32),)),
     r"tcgemm: col_scale must be float32 \(1 or 2, 3\); got float32\(3, 3\)"),
    # block scales: (ceil(K/128) or B ceil(K/128), >= M) and (the same rows, ceil(N/128))
    ("block_sa_rows", lambda: raw_call(
        x(2, 4, 128, dt=jnp.float8_e4m3fn), x(2, 3, 128, dt=jnp.float8_e4m3fn), (2, 4, 3),
        transpose_b=True, config=F32_ROW, has_block_scale=True,
        extra=(jnp.ones((3, 4), F32), jnp.ones((2, 1), F32))),
     r"tcgemm: block_sa must have ceil\(K/128\) = 1 or B \* 1 rows; got 3"),
    ("block_sb_cols", lambda: raw_call(
        x(2, 4, 128, dt=jnp.float8_e4m3fn), x(2, 3, 128, dt=jnp.float8_e4m3fn), (2, 4, 3),
        transpose_b=True, config=F32_ROW, has_block_scale=True,
        extra=(jnp.ones((2, 4), F32), jnp.ones((2, 2), F32))),
     r"tcgemm: block_sb must be float32 \(rows, 1\); got float32\(2, 2\)"),
    ("mixed_operands", lambda: raw_call(ok_a(), x(1, 8, 3, dt=BF16), (1, 4, 3)),
     r"tcgemm: operands must be float16 x float16, bfloat16 x bfloat16, float32 x float32, "
     r"int8 x int8 or float8 .*; got float16 and bfloat16"),
    ("k_beyond_2_31", lambda: raw_call(  # 2 x 4 GB of zeros; the kernels index with int
        jnp.zeros((1, 1, 2 ** 31), F16), jnp.zeros((1, 2 ** 31, 1), F16), (1, 1, 1)),
     r"tcgemm: M, N and K must each be below 2\^31"),
    ("config_not_a_string", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3),
                                                    config=np.int64(3)),
     r"Failed to decode"),
    ("attribute_missing", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), transpose_b=DROP),
     r"Wrong number of attributes"),
    ("extra_operand", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), extra=(ok_a(),)),
     r"tcgemm: expected 0 epilogue operands; got 1"),
    # ("missing_operand": one operand where the handler declares a, b and the remaining
    # epilogue operands crashed the process on an H100 (jaxlib 0.11.2) instead of returning
    # "Wrong number of arguments"; left out until the handler decodes every operand from its
    # RemainingArgs (benchmarks/NOTES.md v30). The public API never makes such a call.)
    ("split_k_0", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), split_k=np.int64(0)),
     r"tcgemm: split_k must be in \[1, \d+\]; got 0"),
    ("split_k_1000", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), split_k=np.int64(1000)),
     r"tcgemm: split_k must be in \[1, \d+\]; got 1000"),
    ("workspace_dtype", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), ws=((16,), F16)),
     r"tcgemm: the workspace result must be a rank-1 float32 buffer; got float16\(16,\)"),
    ("workspace_rank", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), ws=((4, 4), F32)),
     r"tcgemm: the workspace result must be a rank-1 float32 buffer"),
    ("workspace_too_small", lambda: raw_call(
        x(1, 16, 4096), x(1, 4096, 16), (1, 16, 16), split_k=np.int64(4), ws=((10,), F32)),
     r"tcgemm: split_k=4, pack=0 needs a workspace of \d+ floats; got 10"),
    ("pack_workspace_too_small", lambda: raw_call(
        x(1, 16, 4093), x(1, 4093, 16), (1, 16, 16), pack=True, ws=((10,), F32)),
     r"tcgemm: split_k=1, pack=1 needs a workspace of \d+ floats; got 10"),
    ("missing_workspace_result", lambda: raw_call(
        ok_a(), ok_b(), None, results=[jax.ShapeDtypeStruct((1, 4, 3), F32)]),
     r"Wrong number of results"),
    # the epilogue operands and results (DecodeEpilogue)
    ("c_missing", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_c=True),
     r"tcgemm: expected 1 epilogue operands; got 0"),
    ("c_shape", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_c=True,
                                 extra=(x(1, 4, 5, dt=F32),)),
     r"tcgemm: c\(1, 4, 5\) does not broadcast to the result\(1, 4, 3\)"),
    ("c_batch", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_c=True,
                                 extra=(x(2, 4, 3, dt=F32),)),
     r"tcgemm: c\(2, 4, 3\) does not broadcast"),
    ("c_rank2", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_c=True, extra=(x(4, 3),)),
     r"tcgemm: c\(4, 3\) does not broadcast"),
    ("c_int8", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_c=True,
                                extra=(x(1, 4, 3, dt=np.int8),)),
     r"tcgemm: c must be float16, bfloat16 or float32"),
    ("bias_int32", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_bias=True,
                                    extra=(x(1, 3, dt=np.int32),)),
     r"tcgemm: bias must be float16, bfloat16 or float32 \(1 or B, N\); got int32\(1, 3\)"),
    ("bias_length", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_bias=True,
                                     extra=(x(1, 4, dt=F32),)),
     r"tcgemm: bias must be float16, bfloat16 or float32 \(1 or B, N\); got float32\(1, 4\)"),
    ("bias_rank1", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_bias=True,
                                    extra=(x(3, dt=F32),)),
     r"tcgemm: bias must be float16, bfloat16 or float32"),
    ("scale_size", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_scale=True,
                                    extra=(x(3, dt=F32),)),
     r"tcgemm: scale must be float32 \[alpha, beta\]"),
    ("scale_dtype", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_scale=True,
                                     extra=(x(2, dt=F16),)),
     r"tcgemm: scale must be float32 \[alpha, beta\]"),
    ("tensor_scale_shape", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3),
                                            tensor_scales=np.int64(1), extra=(x(2, dt=F32),)),
     r"tcgemm: a tensor scale must be one float32; got float32\(2,\)"),
    ("tensor_scales_count", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3),
                                             tensor_scales=np.int64(3)),
     r"tcgemm: tensor_scales must be 0, 1 or 2; got 3"),
    ("flags_vs_operands", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), has_c=True,
                                           has_bias=True, extra=(x(1, 4, 3, dt=F32),)),
     r"tcgemm: expected 2 epilogue operands; got 1"),
    ("activation_unknown", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3),
                                            activation=np.int32(99)),
     r"tcgemm: unknown activation 99"),
    ("activation_negative", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3),
                                             activation=np.int32(-1)),
     r"tcgemm: unknown activation -1"),
    ("aux_missing", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), aux=True),
     r"tcgemm: expected 1 aux results; got 0"),
    ("aux_unasked", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3),
                                     aux_results=[((1, 4, 3), F32)]),
     r"tcgemm: expected 0 aux results; got 1"),
    ("aux_shape", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), aux=True,
                                   aux_results=[((1, 4, 4), F32)]),
     r"tcgemm: aux must have the result's type and shape\(1, 4, 3\); got \(1, 4, 4\)"),
    ("aux_dtype", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), aux=True,
                                   aux_results=[((1, 4, 3), F16)]),
     r"tcgemm: aux must have the result's type and shape"),
    ("alpha_as_double", lambda: raw_call(ok_a(), ok_b(), (1, 4, 3), alpha=np.float64(2.0)),
     r"Failed to decode|Wrong (attribute|scalar data) type"),
    # the backward pass of the epilogue (the "tcgemm_dact" target)
    ("dact_pre_shape", lambda: dact_call(x(1, 4, 3), x(1, 4, 4), [((1, 4, 3), F16)],
                                         activation=np.int32(2), has_g=True),
     r"tcgemm: dact: pre must have ct's shape"),
    ("dact_results", lambda: dact_call(x(1, 4, 3), x(1, 4, 3), [((1, 4, 3), F16)],
                                       has_g=True, has_dbias=True),
     r"tcgemm: dact: results do not match has_g / has_dbias"),
    ("dact_g_shape", lambda: dact_call(x(1, 4, 3), x(1, 4, 3), [((1, 3, 4), F16)],
                                       has_g=True),
     r"tcgemm: dact: g must have ct's shape"),
    ("dact_dbias_shape", lambda: dact_call(x(2, 4, 3), x(2, 4, 3), [((1, 3), F32)],
                                           has_dbias=True, bias_batched=True),
     r"tcgemm: dact: dbias must be float32 \(B or 1, cols\)"),
    ("dact_dbias_dtype", lambda: dact_call(x(2, 4, 3), x(2, 4, 3), [((1, 3), F16)],
                                           has_dbias=True),
     r"tcgemm: dact: dbias must be float32"),
    ("dact_int_ct", lambda: dact_call(x(1, 4, 3, dt=np.int32), x(1, 4, 3), [((1, 4, 3), F16)],
                                      has_g=True),
     r"tcgemm: dact: ct and pre must be float16, bfloat16 or float32"),
    ("dact_activation", lambda: dact_call(x(1, 4, 3), x(1, 4, 3), [((1, 4, 3), F16)],
                                          has_g=True, activation=np.int32(5)),
     r"tcgemm: dact: unknown activation 5"),
    ("dact_rank2", lambda: dact_call(x(4, 3), x(4, 3), [((4, 3), F16)], has_g=True),
     r"tcgemm: dact: ct must have rank 3"),
]


def dact_call(ct, pre, results, **attrs):
    """The "tcgemm_dact" target through jax.ffi.ffi_call, unchecked."""
    attrs = {"activation": np.int32(1), "has_g": False, "has_dbias": False,
             "bias_batched": False, **attrs}
    return jax.block_until_ready(jax.ffi.ffi_call(
        _ffi.DACT_TARGET, [jax.ShapeDtypeStruct(*r) for r in results])(ct, pre, **attrs))


@gpu
@pytest.mark.parametrize("thunk,pattern", [c[1:] for c in FFI_CASES],
                         ids=[c[0] for c in FFI_CASES])
def test_ffi_rejects_inconsistent_calls(thunk, pattern):
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        thunk()
    assert re.search(pattern, str(info.value), re.S), str(info.value)
    a, b = x(2, 33, 20), x(1, 20, 17)  # and the runtime still works
    assert_close(raw_call(a, b, (2, 33, 17))[0], ref64(a, b), F32, 20, "call after the error")
