"""The "tcgemm" FFI call: its attributes and workspace (one builder for every caller), the
lowering of tcgemm_p on operands the kernels read as they are, and f16x3, float32 HIGHEST on the
promoted float16 kernels (problem.f32_algorithm; primitive._f32_lowering routes it here); the
"tcgemm_split" call that writes a float32 operand's parts for every multi-pass algorithm
(f32_parts, f32.layout).

Attributes (ffi/xla/gemm_ffi.cc, TcgemmHandler): the layout, the plan (config, split_k, pack,
and a planned product's tail split: configs.tail_plan),
which epilogue operands follow a and b (c, bias, scale, row_scale, col_scale, block scales, in
that order), aux, promote (GemmProblem::promote) and its scaled pieces (GemmParams::
piece_scale_k, piece_scale), alpha, beta and the activation. The call's second result is its
float32 workspace (split-K partials, packed operands: configs.workspace_floats asks C++ for its
size), dropped by every caller.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir

from . import _ffi, f32, problem
from .problem import F32, dims


def ffi_attrs(*, transpose_a, transpose_b, config, split_k, pack, has_c, has_bias, has_scale,
              aux, activation, alpha=1.0, beta=0.0, tensor_scales=0, row_scale=False,
              col_scale=False, block_scale=False, promote=False, piece_scale_k=0,
              piece_scale=1.0, tail=(0, 1)) -> dict:
    """The call's attributes, typed as the handler binds them (tail: configs.tail_plan's
    (tail_rows, tail_split); tensor_scales: how many float32 scalars follow `scale` among the
    operands, multiplied into alpha by the kernel)."""
    return dict(transpose_a=bool(transpose_a), transpose_b=bool(transpose_b), config=config,
                split_k=np.int64(split_k), pack=bool(pack), has_c=bool(has_c),
                has_bias=bool(has_bias), has_scale=bool(has_scale),
                tensor_scales=np.int64(tensor_scales), has_row_scale=bool(row_scale),
                has_col_scale=bool(col_scale),
                has_block_scale=bool(block_scale), aux=bool(aux), promote=bool(promote),
                piece_scale_k=np.int64(piece_scale_k), piece_scale=np.float32(piece_scale),
                tail_rows=np.int64(tail[0]), tail_split=np.int64(tail[1]),
                alpha=np.float32(alpha), beta=np.float32(beta),
                activation=np.int32(problem.activation_index(activation or "none")))


def _workspace(a_shape, b_shape, transpose_a, transpose_b, config, split_k, pack, operand_bytes,
               tail=(0, 1)):
    from . import configs
    bt, m, n, k, _ = dims(a_shape, b_shape, transpose_a, transpose_b)
    return configs.workspace_floats(m, n, k, bt, a_shape[0] == 1, b_shape[0] == 1, transpose_a,
                                    transpose_b, config, split_k, pack, operand_bytes, tail)


def kernel_lowering(ctx, *args, transpose_a, transpose_b, out_dtype, alpha, beta, activation,
                    has_c, has_bias, has_scale, aux, plan, overwrite_c, precision):
    """tcgemm_p's FFI call on operands the kernels read as they are: float16 / bfloat16 in any
    layout, float32 K-major with K a multiple of 4 (one TF32 pass: primitive._f32_lowering
    makes the rest so)."""
    from . import configs
    del precision  # float16 / bfloat16: exact products at any; float32: one TF32 pass here
    _ffi.require()
    a_aval, b_aval = ctx.avals_in[:2]
    bt, m, n, k, _ = dims(a_aval.shape, b_aval.shape, transpose_a, transpose_b)
    tf32 = np.dtype(a_aval.dtype) == F32  # (always with a plan: primitive._f32_product)
    fused = problem.fused_epilogue(has_c, has_bias, has_scale, aux, activation)
    tail = (0, 1)  # a forced plan runs as named
    if plan is not None:
        config, split_k = plan
    else:
        config, split_k = configs.plan_for_device(
            m, n, k, bt, a_aval.dtype, problem.layout_name(transpose_a, transpose_b), fused)
        tail = configs.tail_plan(config, split_k, m, n, k, bt, fused)
    pack = not tf32 and configs.should_pack(m, n, k, bt, transpose_a, transpose_b)
    # Split-K partials and packed operand copies live in a float32 workspace: an extra result
    # of the call (command buffers allow no scratch allocation inside the handler), dropped.
    ws = jax.core.ShapedArray((_workspace(a_aval.shape, b_aval.shape, transpose_a, transpose_b,
                                          config, split_k, pack,
                                          np.dtype(a_aval.dtype).itemsize, tail),),
                              np.dtype(np.float32))
    outs = list(ctx.avals_out)
    avals_out = [outs[0], ws] + outs[1:]
    c_aval = ctx.avals_in[2] if has_c else None
    alias = (overwrite_c and c_aval.shape == outs[0].shape and c_aval.dtype == outs[0].dtype)
    res = jax.ffi.ffi_lowering(_ffi.TARGET, operand_output_aliases={2: 0} if alias else None)(
        ctx.replace(avals_out=avals_out), *args, **ffi_attrs(
            transpose_a=transpose_a, transpose_b=transpose_b, config=config, split_k=split_k,
            pack=pack, has_c=has_c, has_bias=has_bias, has_scale=has_scale, aux=aux,
            activation=activation, alpha=alpha, beta=beta, tail=tail))
    return [res[0]] + list(res[2:])


def f16x3_product(a, b, *rest, transpose_a, transpose_b, out_dtype, alpha, beta, activation,
                  has_c, has_bias, has_scale, aux, plan, overwrite_c, precision):
    """tcgemm_p's results for float32 a and b by f16x3 (traced, lowered by mlir.lower_fun): the
    operands made K-major, their float16 parts side by side along K (f32_parts, padded
    to 16-byte rows), one call of the promoted float16 kernels whose epilogue first scales the
    product back by the parts' powers of two (row and column scales), then runs the epilogue
    the params ask for. `plan`: forced, or configs.plan_f32's for K' (the same rows, the same K
    slices as 3xTF32)."""
    from . import configs
    del precision
    k = dims(a.shape, b.shape, transpose_a, transpose_b)[3]
    a2, b2, _, _, (inv_a, inv_b) = f32_parts(a, b, "f16x3", transpose_a, transpose_b)
    bt, m, n, kk, _ = dims(a2.shape, b2.shape, False, True)
    if plan is None:
        plan = configs.plan_f32(m, n, kk, bt, epilogue=True)
    config, split_k = plan
    row = jnp.broadcast_to(inv_a, (bt, m))  # (B, M): one per row of each item
    col = inv_b  # (1 or B, N)
    out = jax.ShapeDtypeStruct((bt, m, n), np.dtype(out_dtype))
    results = [out, jax.ShapeDtypeStruct(
        (_workspace(a2.shape, b2.shape, False, True, config, split_k, False, 2),), np.float32)]
    results += [out] if aux else []
    alias = has_c and overwrite_c and rest[0].shape == out.shape and rest[0].dtype == out.dtype
    res = jax.ffi.ffi_call(_ffi.TARGET, results,
                           input_output_aliases={2: 0} if alias else None)(
        a2, b2, *rest, row, col, **ffi_attrs(
            transpose_a=False, transpose_b=True, config=config, split_k=split_k, pack=False,
            has_c=has_c, has_bias=has_bias, has_scale=has_scale, aux=aux,
            activation=activation, alpha=alpha, beta=beta, row_scale=True, col_scale=True,
            promote=True, piece_scale_k=f32.f16x3_lo_k(k),
            piece_scale=2.0 ** -f32.F16_LO_SHIFT))
    return [res[0]] + list(res[2:])


_SPLIT_KINDS = {"tf32": 0, "bf16": 1, "f16": 2}  # SplitKind (ffi/host/split.h)


def split_operand(x, algo, role, k_major):
    """The parts of float32 operand x of algorithm `algo` (f32.TERMS; role "a" or "b"), laid
    out along K' by the tcgemm_split kernel as f32.layout says: x (B, rows, K) if k_major, else
    (B, K, rows) -> (B, rows, K') of the parts' type, plus f16x3's (B, rows) float32 powers of
    two that scale it back (f32.f16_parts's inv). Bit for bit f32.operand_parts of x made K-major."""
    bt = x.shape[0]
    rows, k = (x.shape[1], x.shape[2]) if k_major else (x.shape[2], x.shape[1])
    blocks, zeros, kk = f32.layout(algo, role, k)
    kind = algo[:4] if algo != "f16x3" else "f16"
    dtype = {"tf32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}[kind]
    results = [jax.ShapeDtypeStruct((bt, rows, kk), dtype)]
    results += [jax.ShapeDtypeStruct((bt, rows), jnp.float32)] if kind == "f16" else []
    # zeros: (begin, end) pairs, never a zero-length attribute: [K', K') stands for none
    return jax.ffi.ffi_call(_ffi.SPLIT_TARGET, results)(
        x, kind=np.int32(_SPLIT_KINDS[kind]), k_major=bool(k_major),
        offsets=np.array([o for o, _, _ in blocks], np.int64),
        parts=np.array([p + 4 * m for _, p, m in blocks], np.int32),
        zeros=np.array([e for z in zeros for e in z] or [kk, kk], np.int64),
        top_exp=np.int32(f32.F16_TOP), lo_scale=np.float32(2.0 ** f32.F16_LO_SHIFT))


# An operand of at least SPLIT_MIN_ELEMENTS elements is split by the tcgemm_split kernel;
# a smaller one by f32.operand_parts's XLA ops, which XLA fuses into fewer launches than the
# kernel's (f16x3: up to four per operand). H200, per product: 1024^3 HIGHEST 58.9 us with XLA's
# ops against 72.0 with the kernel, BF16x3 43.0 against 55.4; 2048^3 175.7 against 172.8 and
# 121.4 against 118.1; 8192^3 0.5-1.4 ms less with the kernel (benchmarks/NOTES.md v54).
SPLIT_MIN_ELEMENTS = 1 << 22


def f32_parts(a, b, algo, transpose_a, transpose_b, keep_layout=False,
              min_elements=None):
    """The parts of float32 a and b for algorithm `algo` (batched (B, M, K) / (B, K, N), or
    transposed as flagged), laid out along K' (f32.layout): (a', b', transpose_a',
    transpose_b', scales), scales f16x3's [inv_a (B, M), inv_b (B, N)] or []. Each operand
    is split by the tcgemm_split kernel (K-major result) if it has at least `min_elements`
    (default SPLIT_MIN_ELEMENTS) elements, else by f32.operand_parts (XLA ops; K-major too,
    but in its own layout with keep_layout: the bfloat16 kernels read both). Either way the
    same parts, bit for bit."""
    limit = SPLIT_MIN_ELEMENTS if min_elements is None else min_elements

    def one(x, role, k_major):  # -> (parts, K-major, f16x3's inv or None)
        if x.size >= limit:
            _ffi.require()
            res = split_operand(x, algo, role, k_major)
            return res[0], True, res[1] if algo == "f16x3" else None
        if not k_major and not keep_layout:
            x, k_major = jnp.swapaxes(x, 1, 2), True
        res = f32.operand_parts(x, algo, role, 2 if k_major else 1)
        parts, inv = res if algo == "f16x3" else (res, None)
        return parts, k_major, inv

    pa, ka, inv_a = one(a, "a", not transpose_a)
    pb, kb, inv_b = one(b, "b", transpose_b)
    return pa, pb, not ka, kb, ([inv_a, inv_b] if algo == "f16x3" else [])


def f16x3_lowering(ctx, *args, **params):
    return mlir.lower_fun(lambda *xs: f16x3_product(*xs, **params),
                          multiple_results=True)(ctx, *args)
