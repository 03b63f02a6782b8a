"""tg.scaled_matmul's operand rules (scaled.py): the dtype pairs and kinds, and the scale forms
of a and b, decided from shapes alone (checked at trace time, before any GPU work)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .ops import _as_array

E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
I8, I32, F32 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float32)
F16, BF16 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16)

# (a dtype, b dtype) -> kind. e5m2 x e5m2 is not a wgmma fp8 form the kernels will take
# (issue 26), nor are the fnuz / e8m0 / 4-bit types; int8 pairs only with int8.
PAIRS = {(E4M3, E4M3): "fp8", (E4M3, E5M2): "fp8", (E5M2, E4M3): "fp8", (I8, I8): "int8"}
FLOAT_OUT = (BF16, F16, F32)
BLOCK = 128  # DeepSeek-V3 block: a has one scale per row per 128 of K, b one per 128 x 128

# Scale forms, decided from shapes: "tensor" (a scalar), "row" (one per row of a), "column"
# (one per column of b), "block" (DeepSeek-V3). Allowed combinations: any of tensor / row for
# a with any of tensor / column for b (all scale the float32 accumulator: the kernels'
# epilogue), or block with block (the kernels' main loop). Anything else is a ValueError.
OUTER_A, OUTER_B = ("tensor", "row"), ("tensor", "column")


def _name(fn="scaled_matmul"):
    return f"jax_tcgemm.{fn}"


def kind_of(a_dtype, b_dtype):
    """"fp8" or "int8" for a supported (a, b) dtype pair; TypeError otherwise."""
    kind = PAIRS.get((np.dtype(a_dtype), np.dtype(b_dtype)))
    if kind is None:
        raise TypeError(
            f"{_name()}: unsupported operand dtypes a {np.dtype(a_dtype)} x b "
            f"{np.dtype(b_dtype)}; supported: float8_e4m3fn x float8_e4m3fn, float8_e4m3fn x "
            f"float8_e5m2, float8_e5m2 x float8_e4m3fn, int8 x int8 (not float8_e5m2 x "
            f"float8_e5m2; for float16 / bfloat16 use tg.gemm)")
    return kind


def _fits(lead, batch):
    """A scale's batch dims `lead` against its operand's `batch`: as many, each its own or 1."""
    return len(lead) == len(batch) and all(s in (1, d) for s, d in zip(lead, batch))


def a_scale_form(shape, a_shape):
    """The form of a_scale of shape `shape` for a of shape a_shape (..., M, K): "tensor" (() or
    (1,)), "row" (batch + (M,), each batch dim its own or 1) or "block" (batch + (M, ceil(K /
    128))). ValueError otherwise."""
    shape, a_shape = tuple(shape), tuple(a_shape)
    batch, m, k = a_shape[:-2], a_shape[-2], a_shape[-1]
    kb = -(-k // BLOCK)

    if shape in ((), (1,)):
        return "tensor"
    if len(shape) == len(batch) + 1 and shape[-1] == m and _fits(shape[:-1], batch):
        return "row"
    if len(shape) == len(batch) + 2 and shape[-2:] == (m, kb) and _fits(shape[:-2], batch):
        return "block"
    bt = "".join(f"{d}, " for d in batch)
    raise ValueError(
        f"{_name()}: a_scale{shape} fits no scale form of a{a_shape}: per-tensor () or (1,), "
        f"per-row ({bt}{m},), or 1x128 blocks ({bt}{m}, {kb}) = (M, ceil(K/128)) (batch dims "
        f"may be 1)")


def b_scale_form(shape, b_shape, transpose_b):
    """The form of b_scale for b (..., K, N), or (..., N, K) with transpose_b: "tensor" (() or
    (1,)), "column" (batch + (N,)) or "block": 128 x 128 blocks laid out as b is, batch +
    (ceil(K/128), ceil(N/128)), or batch + (ceil(N/128), ceil(K/128)) with transpose_b
    (DeepSeek-V3 keeps the weight and its scales in the same orientation); batch: b's batch
    dims, each its own or 1. ValueError otherwise."""
    shape, b_shape = tuple(shape), tuple(b_shape)
    batch = b_shape[:-2]
    n, k = (b_shape[-2], b_shape[-1]) if transpose_b else (b_shape[-1], b_shape[-2])
    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    grid = (nb, kb) if transpose_b else (kb, nb)
    if shape in ((), (1,)):
        return "tensor"
    if len(shape) == len(batch) + 1 and shape[-1] == n and _fits(shape[:-1], batch):
        return "column"
    if len(shape) == len(batch) + 2 and shape[-2:] == grid and _fits(shape[:-2], batch):
        return "block"
    what = "(ceil(N/128), ceil(K/128))" if transpose_b else "(ceil(K/128), ceil(N/128))"
    bt = "".join(f"{d}, " for d in batch)
    raise ValueError(
        f"{_name()}: b_scale{shape} fits no scale form of b{b_shape} "
        f"(transpose_b={transpose_b}): per-tensor () or (1,), per-column ({bt}{n},), or 128x128 "
        f"blocks ({bt}{grid[0]}, {grid[1]}) = {what}" + (" (batch dims may be 1)" if batch else ""))


def check_forms(fa, fb, a_desc, b_desc):
    if (fa in OUTER_A and fb in OUTER_B) or (fa == fb == "block"):
        return
    raise ValueError(
        f"{_name()}: a_scale is {fa} ({a_desc}) but b_scale is {fb} ({b_desc}): block scales "
        f"go with block scales only, per-tensor / per-row / per-column scales with each other. "
        f"A per-tensor or per-row scale of a is a block scale broadcast to (M, ceil(K/128)), a "
        f"per-tensor scale of b one broadcast to the block grid (jnp.broadcast_to)")


def _scale(x, name, a_desc):
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return jnp.asarray(x, jnp.float32)
    dt = getattr(x, "dtype", None)  # before any conversion (numpy float64 -> float32)
    x = _as_array(x, name)
    dt = np.dtype(x.dtype if dt is None else dt)
    if dt != F32:
        raise TypeError(f"{_name()}: {name} must be float32; got {name}{x.shape} {dt} "
                        f"({a_desc})")
    return x
