"""tcgemm_p: C[z] = op(A[z]) @ op(B[z]) with float32 accumulation, and all of its rules.

Operands are rank 3:  a is (Ba, M, K), or (Ba, K, M) with transpose_a;  b is (Bb, K, N), or
(Bb, N, K) with transpose_b;  Ba and Bb are the result's batch B or 1 (a batch-1 operand is
shared by the whole batch: stride 0 in the kernel, never materialised). The result is
(B, M, N) of `out_dtype`. Params: transpose_a, transpose_b (bool), out_dtype (numpy dtype),
config (a name from configs.CONFIGS), split_k (K slices summed in float32 in a fixed order;
the CUDA lowering adds the float32 workspace they need as a second, discarded result).
"""
from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _ffi, autotune, configs

tcgemm_p = Primitive("tcgemm")

IN_DTYPES = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
OUT_DTYPES = IN_DTYPES + (np.dtype(np.float32),)


def _dims(a_shape, b_shape, transpose_a, transpose_b):
    """(batch, M, N, K of a, K of b) of operand shapes."""
    m, ka = (a_shape[2], a_shape[1]) if transpose_a else (a_shape[1], a_shape[2])
    kb, n = (b_shape[2], b_shape[1]) if transpose_b else (b_shape[1], b_shape[2])
    batch = b_shape[0] if a_shape[0] == 1 else a_shape[0]  # a batch-1 operand is shared
    return batch, m, n, ka, kb


def tcgemm(a, b, *, transpose_a=False, transpose_b=False, out_dtype=None, config=None,
           split_k=None):
    """Binds tcgemm_p. out_dtype defaults to the operands' dtype; config and split_k to
    autotune.plan for the shapes (configs.plan's cost model unless autotuning is on), planned
    for the default device's compute capability (configs.device_arch(): sm90 configs only on
    9.0); a given config runs with split_k = 1 unless split_k is given too. An sm90 config
    runs on any GPU: elsewhere, or on operands TMA cannot address, as configs.sm80_fallback."""
    out_dtype = np.dtype(a.dtype if out_dtype is None else out_dtype)
    if config is None and np.ndim(a) == 3 and np.ndim(b) == 3:
        bt, m, n, k, _ = _dims(a.shape, b.shape, transpose_a, transpose_b)
        config, planned = autotune.plan(m, n, k, bt, a.dtype,
                                        configs.layout_name(transpose_a, transpose_b))
        split_k = planned if split_k is None else split_k
    return tcgemm_p.bind(a, b, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b),
                         out_dtype=out_dtype, config=config,
                         split_k=1 if split_k is None else operator.index(split_k))


# ---------------------------------------------------------------------------------------------
# Abstract evaluation: the one place that validates.

def _abstract_eval(a, b, *, transpose_a, transpose_b, out_dtype, config, split_k):
    desc = (f"a{tuple(a.shape)} {a.dtype} transpose_a={transpose_a}, "
            f"b{tuple(b.shape)} {b.dtype} transpose_b={transpose_b}")
    if a.ndim != 3 or b.ndim != 3:
        raise ValueError(f"tcgemm: operands must have rank 3 (batch, rows, cols); got {desc}")
    if a.dtype != b.dtype or np.dtype(a.dtype) not in IN_DTYPES:
        raise TypeError(f"tcgemm: operands must both be float16 or both bfloat16; got {desc}")
    if np.dtype(out_dtype) not in OUT_DTYPES:
        raise TypeError(f"tcgemm: out_dtype must be float16, bfloat16 or float32; got {out_dtype}")
    bt, m, n, ka, kb = _dims(a.shape, b.shape, transpose_a, transpose_b)
    if ka != kb:
        raise ValueError(f"tcgemm: contracting sizes differ ({ka} vs {kb}): {desc}")
    if max(m, n, ka) >= 2**31:
        raise ValueError(f"tcgemm: M, N and K must each be below 2^31: {desc}")
    if a.shape[0] not in (1, bt) or b.shape[0] not in (1, bt):
        raise ValueError(f"tcgemm: batch sizes must be equal or 1: {desc}")
    if config not in configs.BY_NAME:
        raise ValueError(f"tcgemm: unknown config {config!r}; known: {sorted(configs.BY_NAME)}")
    if not 1 <= split_k <= configs.MAX_SPLIT_K:
        raise ValueError(f"tcgemm: split_k must be in [1, {configs.MAX_SPLIT_K}]; got {split_k}")
    return jax.core.ShapedArray((bt, m, n), np.dtype(out_dtype))


# ---------------------------------------------------------------------------------------------
# Lowerings: the FFI custom call on CUDA; lax.dot_general everywhere else.

def _cuda_lowering(ctx, a, b, *, transpose_a, transpose_b, out_dtype, config, split_k):
    del out_dtype  # the result buffer's type
    _ffi.require()
    (out,) = ctx.avals_out
    a_aval, b_aval = ctx.avals_in
    bt, m, n, k, _ = _dims(a_aval.shape, b_aval.shape, transpose_a, transpose_b)
    pack = configs.should_pack(m, n, k, bt, transpose_a, transpose_b)
    # Split-K partials and packed operand copies live in a float32 workspace: a second result
    # of the call (command buffers allow no scratch allocation inside the handler), dropped here.
    ws = jax.core.ShapedArray((configs.workspace_floats(
        m, n, k, bt, a_aval.shape[0] == 1, b_aval.shape[0] == 1,
        transpose_a, transpose_b, config, split_k, pack),), np.dtype(np.float32))
    c, _ = jax.ffi.ffi_lowering(_ffi.TARGET)(
        ctx.replace(avals_out=[out, ws]), a, b, transpose_a=transpose_a,
        transpose_b=transpose_b, config=config, split_k=np.int64(split_k), pack=pack)
    return [c]


def reference(a, b, *, transpose_a, transpose_b, out_dtype, config=None, split_k=1):
    """tcgemm_p's semantics in lax: float32 accumulation, rounded once to out_dtype."""
    del config, split_k
    bt = b.shape[0] if a.shape[0] == 1 else a.shape[0]
    a = jnp.broadcast_to(a, (bt,) + a.shape[1:])
    b = jnp.broadcast_to(b, (bt,) + b.shape[1:])
    dn = (((1 if transpose_a else 2,), (2 if transpose_b else 1,)), ((0,), (0,)))
    # float32 operands: half-precision products are exact in float32, and XLA:CPU has no
    # batched bf16 x bf16 -> f32 dot for some operand layouts (jaxlib 0.11.2).
    out = lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dn,
                          precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    return out.astype(out_dtype)


_fallback_lowering = mlir.lower_fun(reference, multiple_results=False)


# ---------------------------------------------------------------------------------------------
# Batching: vmapped axes fold into the kernel's batch dimension (one launch).

def _batch_rule(args, dims, *, transpose_a, transpose_b, out_dtype, config, split_k):
    del config, split_k  # re-planned for the batched shapes
    a, b = args
    da, db = dims
    v = a.shape[da] if da is not None else b.shape[db]
    ba, bb = a.shape[0], b.shape[0]
    if da is not None:
        a = jnp.moveaxis(a, da, 0)
        ba = a.shape[1]
    if db is not None:
        b = jnp.moveaxis(b, db, 0)
        bb = b.shape[1]
    bt = bb if ba == 1 else ba
    # A mapped operand must cover (v, bt); an unmapped one is shared (batch 1) or repeated.
    if da is not None:
        a = jnp.broadcast_to(a, (v, bt) + a.shape[2:]).reshape((v * bt,) + a.shape[2:])
    elif ba != 1:  # unmapped but batched: no single stride expresses (v, bt) -> bt; materialise
        a = jnp.broadcast_to(a[None], (v,) + a.shape).reshape((v * bt,) + a.shape[1:])
    if db is not None:
        b = jnp.broadcast_to(b, (v, bt) + b.shape[2:]).reshape((v * bt,) + b.shape[2:])
    elif bb != 1:
        b = jnp.broadcast_to(b[None], (v,) + b.shape).reshape((v * bt,) + b.shape[1:])
    out = tcgemm(a, b, transpose_a=transpose_a, transpose_b=transpose_b, out_dtype=out_dtype)
    return out.reshape((v, bt) + out.shape[1:]), 0


# ---------------------------------------------------------------------------------------------
# Differentiation: bilinear; each transpose is tcgemm_p again with flipped layout flags.
#   dA = dC · op(B)^T   stored as A is (transposed if transpose_a)
#   dB = op(A)^T · dC   stored as B is

def _sum_to_batch(x, batch):
    return x if x.shape[0] == batch else jnp.sum(x, axis=0, keepdims=True, dtype=jnp.float32)


def _transpose_a(ct, a, b, *, transpose_a, transpose_b, out_dtype, config, split_k):
    del out_dtype, config, split_k
    a_aval = a.aval
    ct = ct.astype(a_aval.dtype)
    acc = jnp.float32 if a_aval.shape[0] != ct.shape[0] else a_aval.dtype
    if not transpose_a:  # dA (M, K) = dC (M, N) · op(B)^T (N, K)
        da = tcgemm(ct, b, transpose_a=False, transpose_b=not transpose_b, out_dtype=acc)
    else:                # dA^T (K, M) = op(B) (K, N) · dC^T (N, M)
        da = tcgemm(b, ct, transpose_a=transpose_b, transpose_b=True, out_dtype=acc)
    return _sum_to_batch(da, a_aval.shape[0]).astype(a_aval.dtype)


def _transpose_b(ct, a, b, *, transpose_a, transpose_b, out_dtype, config, split_k):
    del out_dtype, config, split_k
    b_aval = b.aval
    ct = ct.astype(b_aval.dtype)
    acc = jnp.float32 if b_aval.shape[0] != ct.shape[0] else b_aval.dtype
    if not transpose_b:  # dB (K, N) = op(A)^T (K, M) · dC (M, N)
        db = tcgemm(a, ct, transpose_a=not transpose_a, transpose_b=False, out_dtype=acc)
    else:                # dB^T (N, K) = dC^T (N, M) · op(A) (M, K)
        db = tcgemm(ct, a, transpose_a=True, transpose_b=transpose_a, out_dtype=acc)
    return _sum_to_batch(db, b_aval.shape[0]).astype(b_aval.dtype)


# ---------------------------------------------------------------------------------------------
# Registration of every rule, in one place.

@functools.lru_cache(maxsize=None)
def _jitted_impl(**params):
    return jax.jit(lambda x, y: tcgemm_p.bind(x, y, **params))


tcgemm_p.def_impl(lambda a, b, **params: _jitted_impl(**params)(a, b))
tcgemm_p.def_abstract_eval(_abstract_eval)
# Over several devices the lowerings go through custom_partitioning (sharding.py), which
# binds tcgemm_p again on the local shards; there they lower directly.
from . import sharding  # noqa: E402  (it imports tcgemm_p, tcgemm and _dims from here)

mlir.register_lowering(tcgemm_p, sharding.partitioned(_fallback_lowering))
mlir.register_lowering(tcgemm_p, sharding.partitioned(_cuda_lowering), platform="cuda")
batching.primitive_batchers[tcgemm_p] = _batch_rule
ad.defbilinear(tcgemm_p, _transpose_a, _transpose_b)
