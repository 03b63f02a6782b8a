"""The GEMM problem as the primitives see it: operand shapes and layouts, the dtype table, and
the epilogue's static description. Pure functions of avals and params; no JAX tracing here.

    D = act(alpha * op(A) @ op(B) + beta * C + bias)      (float32, rounded once to out_dtype)

Operands are rank 3: a is (Ba, M, K), or (Ba, K, M) with transpose_a; b is (Bb, K, N), or
(Bb, N, K) with transpose_b; Ba, Bb are the batch B or 1 (a batch-1 operand is shared: stride 0
in the kernel). c is (Bc, Mc, Nc) with each dim 1 or the result's (full, per-row, per-column,
shared by the batch); bias is float32 (Bbias, N) with Bbias 1 or B; scale is float32 [alpha,
beta] when they are traced (else they are the static params alpha, beta).
"""
from __future__ import annotations

import numpy as np
import jax.numpy as jnp

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
IN_DTYPES = (F16, BF16)                 # operand types the kernels take
OUT_DTYPES = (F16, BF16, F32)           # result types they write
C_DTYPES = OUT_DTYPES                   # epilogue C types they read

# Activation names in the order of Activation in ffi/host/gemm_params.h (the FFI passes the
# index); None is "none".
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")


def activation_index(name) -> int:
    return ACTIVATIONS.index("none" if name is None else name)


def dims(a_shape, b_shape, transpose_a, transpose_b):
    """(batch, M, N, K of a, K of b) of operand shapes."""
    m, ka = (a_shape[2], a_shape[1]) if transpose_a else (a_shape[1], a_shape[2])
    kb, n = (b_shape[2], b_shape[1]) if transpose_b else (b_shape[1], b_shape[2])
    batch = b_shape[0] if a_shape[0] == 1 else a_shape[0]  # a batch-1 operand is shared
    return batch, m, n, ka, kb


def layout_name(transpose_a: bool, transpose_b: bool) -> str:
    return ("T" if transpose_a else "N") + ("T" if transpose_b else "N")


def split_operands(args, has_c, has_bias, has_scale):
    """(a, b, c or None, bias or None, scale or None) from the primitive's operand list."""
    a, b, *rest = args
    it = iter(rest)
    c = next(it) if has_c else None
    bias = next(it) if has_bias else None
    scale = next(it) if has_scale else None
    return a, b, c, bias, scale
