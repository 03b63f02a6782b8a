"""Public entry points: argument checks and normalisation onto the primitives.

Supported by the kernels: both operands float16, both bfloat16 or both float32 (run by their
precision: one TF32 pass, f16x3 at HIGHEST, the TF32 and bfloat16 presets; problem.f32_algorithm);
output float16, bfloat16 or float32; accumulation always float32. int8 x int8 -> int32 runs on
the int8 kernels (tg.scaled_matmul). Other dtypes (float64, other integers, complex, mixed
float16 x bfloat16, which promotes to float32) are computed by jnp.matmul / lax.dot_general,
documented in the README; supported dtypes never fall back.
"""
from __future__ import annotations

import functools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
# The functions as imported, not looked up at call time: a user may monkeypatch
# jax.lax.dot_general = tg.dot_general (the fallbacks below must not call back into us).
from jax.lax import dot_general as _lax_dot_general
from jax.numpy import matmul as _jnp_matmul

from . import epilogue, sharding
from .primitive import tcgemm
from .problem import (OPERAND_DTYPES, OUT_DTYPES, canonical_precision, lax_reduction_order,
                      symbolic)


def _as_array(x, name):
    if isinstance(x, (jax.Array, np.ndarray, np.generic)) or hasattr(x, "__jax_array__"):
        return jnp.asarray(x)
    if isinstance(x, (bool, int, float, complex, list, tuple)):
        return jnp.asarray(x)
    raise TypeError(f"jax_tcgemm: {name} must be an array, got {type(x).__name__}")


def _to3(x, batch):
    """x (..., R, C) as (B, R, C) for a result batch `batch`: batch-1 operands stay shared
    (stride 0 in the kernel), others are broadcast to the batch (a partial broadcast has no
    single stride and is materialised)."""
    if math.prod(x.shape[:-2]) == 1:
        return x.reshape((1,) + x.shape[-2:])
    if tuple(x.shape[:-2]) != tuple(batch):
        x = jnp.broadcast_to(x, tuple(batch) + x.shape[-2:])
    return x.reshape((math.prod(batch),) + x.shape[-2:])


def _explicit_spec(x) -> tuple:
    """x's explicit mesh axes per dim (sharding.explicit_spec of its type). A reshape that
    merges dims is rejected by explicit sharding where any but the first of them is sharded,
    so the products below keep such dims apart (as batch)."""
    return sharding.explicit_spec(jax.typeof(x))


def _explicit_rows(x) -> bool:
    """Whether x's rows (dim -2) are sharded over explicit mesh axes: then its batch's rows
    cannot be stacked into one product's M."""
    return x.ndim >= 2 and _explicit_spec(x)[-2] is not None


def _collapse(x, counts):
    """x as len(counts) dims, dim i the product of the next counts[i] dims of x (0: a new dim
    of size 1). Under explicit mesh axes each new dim takes the axes of the first of its dims
    where the others are not sharded (else none: the data moves), as the reshape's
    out_sharding, where a plain reshape merging several groups is rejected."""
    edges = np.cumsum((0,) + tuple(counts))
    shape = tuple(math.prod(x.shape[i:j]) for i, j in zip(edges[:-1], edges[1:]))
    spec = _explicit_spec(x)
    if not any(spec):
        return x.reshape(shape)
    out = [spec[i] if j > i and not any(spec[i + 1:j]) else None
           for i, j in zip(edges[:-1], edges[1:])]
    return lax.reshape(x, shape, out_sharding=jax.sharding.NamedSharding(
        jax.typeof(x).sharding.mesh, jax.sharding.PartitionSpec(*out)))


def _lax_shaped(out, shape, lhs, rhs, dimension_numbers, precision, preferred_element_type):
    """out (batch, M, N) reshaped to lax.dot_general's result `shape`, typed with lax's result
    sharding where an operand has explicit mesh axes: a plain reshape of a sharded M or N into
    several dims is rejected by explicit sharding."""
    typed = None
    if any(_explicit_spec(lhs) + _explicit_spec(rhs)):
        try:
            typed = jax.eval_shape(
                lambda x, y: _lax_dot_general(x, y, dimension_numbers, precision=precision,
                                              preferred_element_type=preferred_element_type),
                *(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=jax.typeof(v).sharding)
                  for v in (lhs, rhs))).sharding
        except Exception:  # noqa: BLE001 (lax asks for an out_sharding: K sharded on both sides)
            pass
    return out.reshape(shape) if typed is None else lax.reshape(out, shape, out_sharding=typed)


def _free_cut(x, nf):
    """How many of x's leading nf free dims (x without batch dims) form a batch that shares
    the other operand: those before its last explicitly sharded free dim (0 where none is),
    since explicit sharding rejects merging them all into M."""
    return max((i for i, e in enumerate(_explicit_spec(x)[:nf]) if e is not None), default=0)


def _kernel_dtype(a, b, allowed=OPERAND_DTYPES) -> bool:
    return a.dtype == b.dtype and np.dtype(a.dtype) in allowed


def _check_out_dtype(out_dtype, what):
    dt = np.dtype(out_dtype)
    if dt not in OUT_DTYPES:
        raise TypeError(f"jax_tcgemm: {what} must be float16, bfloat16 or float32 for "
                        f"float16, bfloat16 or float32 operands; got {dt}")
    return dt


_S1 = jax.ShapeDtypeStruct((1, 1), np.float32)
_DN1 = (((1,), (0,)), ((), ()))


def _check_precision(precision, like_matmul):
    """Raises what lax.dot_general (like_matmul: jnp.matmul) raises for this precision."""
    if like_matmul:
        jax.eval_shape(lambda x, y: _jnp_matmul(x, y, precision=precision), _S1, _S1)
    else:
        jax.eval_shape(lambda x, y: _lax_dot_general(x, y, _DN1, precision=precision), _S1, _S1)


_check_precision_cached = functools.lru_cache(maxsize=64)(_check_precision)


def _precision(precision, like_matmul=False):
    """precision checked by lax (lax.dot_general's exception, like_matmul: jnp.matmul's, for
    anything it rejects), in the canonical form lax keeps in its params
    (primitive.canonical_precision)."""
    if precision is not None:
        try:
            hash(precision)
        except TypeError:  # unhashable (a list): lax decides, uncached
            _check_precision(precision, like_matmul)
        else:
            _check_precision_cached(precision, like_matmul)
    return canonical_precision(precision)


def matmul(a, b, *, out_dtype=None, precision=None):
    """`jnp.matmul(a, b)` on the tensor cores: (..., M, K) @ (..., K, N), batch dims broadcast.

    out_dtype: float16, bfloat16 or float32 (default: the operands' dtype). precision: as in
    jnp.matmul (validated by lax and kept in the primitive's params). float16/bfloat16
    products are exact in the float32 accumulator at any precision; float32 ones run its
    algorithm (None, DEFAULT, HIGH: one TF32 pass, as XLA on GPU; HIGHEST: f16x3, float32
    accuracy; TF32 / BF16 presets as named; others through lax).
    """
    a, b = _as_array(a, "a"), _as_array(b, "b")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"jax_tcgemm.matmul: operands must have rank >= 1; got shapes "
                         f"{a.shape} and {b.shape}")
    if not _kernel_dtype(a, b):  # accumulate in out_dtype, as lax (never cast after the fact)
        out = _int8_matmul(a, b, precision, out_dtype)  # int8 -> int32: ours
        if out is not None:
            return out
        return _jnp_matmul(a, b, precision=precision, preferred_element_type=out_dtype)
    precision = _precision(precision, like_matmul=True)
    out_dtype = _check_out_dtype(a.dtype if out_dtype is None else out_dtype, "out_dtype")
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"jax_tcgemm.matmul: contracting dimensions differ: a{a.shape} "
                         f"{a.dtype} @ b{b.shape} {b.dtype} (K = {a2.shape[-1]} vs "
                         f"{b2.shape[-2]})")
    try:
        jnp.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(f"jax_tcgemm.matmul: batch dimensions do not broadcast: a{a.shape} @ "
                         f"b{b.shape}") from None
    out = gemm(a2, b2, out_dtype=out_dtype, precision=precision)  # (batch folding: there)
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out


def _normalize_dims(dims, ndim, what, shape):
    try:
        out = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise TypeError(f"jax_tcgemm.dot_general: {what} must be a sequence of ints, got "
                        f"{dims!r}") from None
    for d in out:
        if d < 0:  # lax takes no negative dimension numbers
            raise TypeError(f"jax_tcgemm.dot_general: {what} {dims} must be nonnegative (as in "
                            f"lax.dot_general) for an operand of shape {shape}")
        if not -ndim <= d < ndim:
            raise ValueError(f"jax_tcgemm.dot_general: {what} {dims} out of range for an operand "
                             f"of shape {shape}")
    out = tuple(d % ndim for d in out)
    if len(set(out)) != len(out):
        raise ValueError(f"jax_tcgemm.dot_general: repeated dimension in {what} {dims}")
    return out


def _plan(lhs_shape, rhs_shape, lc, rc, lb, rb):
    """How to view the operands as (B, M, K)/(B, K, M) and (B, K, N)/(B, N, K): returns
    (lhs permutation, transpose_a, rhs permutation, transpose_b) with identity permutations
    where a layout flag suffices (no copy). Contracting dims are paired in lhs or rhs order,
    whichever needs fewer transposes."""
    lf = [d for d in range(len(lhs_shape)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rhs_shape)) if d not in rc and d not in rb]
    best = None
    for order in (sorted(range(len(lc)), key=lambda i: lc[i]),
                  sorted(range(len(rc)), key=lambda i: rc[i])):
        lco, rco = [lc[i] for i in order], [rc[i] for i in order]
        l_n, l_t = list(lb) + lf + lco, list(lb) + lco + lf
        r_n, r_t = list(rb) + rco + rf, list(rb) + rf + rco
        l_id, r_id = list(range(len(lhs_shape))), list(range(len(rhs_shape)))
        lhs = (None, False) if l_n == l_id else (None, True) if l_t == l_id else (l_n, False)
        rhs = (None, False) if r_n == r_id else (None, True) if r_t == r_id else (r_n, False)
        cost = (lhs[0] is not None) + (rhs[0] is not None)
        if best is None or cost < best[0]:
            best = (cost, lhs + rhs, lf, rf)
    return best[1], best[2], best[3]


def _int8_result(fn, x, y):
    """The result (shape and dtype) fn(x, y) would give, where x and y are int8 and that result
    is int32 (what our int8 kernels compute); None otherwise, or where fn rejects the
    arguments (its own error then comes from the call of fn itself)."""
    if np.dtype(x.dtype) != np.int8 or np.dtype(y.dtype) != np.int8:
        return None
    try:
        want = jax.eval_shape(fn, jax.ShapeDtypeStruct(x.shape, x.dtype),
                              jax.ShapeDtypeStruct(y.shape, y.dtype))
    except Exception:  # noqa: BLE001
        return None
    return want if np.dtype(want.dtype) == np.int32 else None


def _int8_product(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                  out_sharding):
    """int8 x int8 -> int32 (lax's result type for that preferred_element_type), any dimension
    numbers: through tg.scaled_matmul as one (batched) product, lhs as (batch, M, K) and rhs
    as (batch, N, K) (or (batch, K, N) where that is its layout): the int8 kernels where they
    run (sm90, or sm80 off Hopper), lax elsewhere (the same exact int32). None for every other
    case (lax's own errors come from the lax call)."""
    if out_sharding is not None:
        return None
    want = _int8_result(lambda x, y: _lax_dot_general(
        x, y, dimension_numbers, precision=precision,
        preferred_element_type=preferred_element_type), lhs, rhs)
    if want is None:
        return None
    (lc, rc), (lb, rb) = dimension_numbers  # (lax took them)
    lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
    from .scaled import scaled_matmul
    lf = tuple(d for d in range(lhs.ndim) if d not in lc + lb)
    rf = tuple(d for d in range(rhs.ndim) if d not in rc + rb)
    nb, nf, nc = len(lb), len(lf), len(lc)
    x = jnp.transpose(lhs, lb + lf + lc)
    cut = 0 if nb else _free_cut(x, nf)  # as in dot_general
    a = _collapse(x, (cut, nf - cut, nc) if cut else (nb, nf, nc))
    a = a if nb or cut else a[0]
    kn = rb + rc + rf  # (batch, K, N) as stored: no copy; otherwise K-major, what wgmma reads
    transpose_b = kn != tuple(range(rhs.ndim))
    y = jnp.transpose(rhs, rb + rf + rc) if transpose_b else rhs
    b = _collapse(y, (nb, len(rf), nc) if transpose_b else (nb, nc, len(rf)))
    b = b if nb else b[0]
    out = scaled_matmul(a, b, None, None, out_dtype=jnp.int32, transpose_b=transpose_b)
    return _lax_shaped(out, want.shape, lhs, rhs, dimension_numbers, precision,
                       preferred_element_type)


def _int8_matmul(a, b, precision, out_dtype):
    """jnp.matmul of int8 x int8 -> int32 operands of rank >= 2 (batch dims broadcast) as one
    tg.scaled_matmul, or None (other dtypes, ranks or result types: jnp's)."""
    if min(a.ndim, b.ndim) < 2 or out_dtype is None:
        return None
    want = _int8_result(lambda x, y: _jnp_matmul(x, y, precision=precision,
                                                 preferred_element_type=out_dtype), a, b)
    if want is None:
        return None
    from .scaled import scaled_matmul
    return scaled_matmul(a, b, None, None, out_dtype=jnp.int32).reshape(want.shape)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *,
                out_sharding=None, reduction_order=None):
    """Drop-in for `lax.dot_general` on the tensor cores (same signature and result).

    Any dimension numbers map onto one batched GEMM: free and contracting dims are collapsed by
    reshapes, and operands whose dims are already ordered (batch, free, contracting) or (batch,
    contracting, free) need no copy (layout flags); other orders cost one transpose of that
    operand. `precision` is validated by lax and kept, in lax's canonical form, in the
    primitive's params (and those of its gradient's products); float16/bfloat16 products are
    exact in the float32 accumulator at any precision, float32 ones run its algorithm (see
    matmul). `preferred_element_type` is normalised
    as lax does it; a result type the kernels do not write (float64, integers) is computed by
    lax. `reduction_order` (jax >= 0.12.1): None and 'unordered' run the kernels; any other
    order is lax's, computed in exactly that order (problem.lax_reduction_order).
    """
    lhs, rhs = _as_array(lhs, "lhs"), _as_array(rhs, "rhs")
    order_kw = lax_reduction_order(reduction_order, _lax_dot_general, "jax_tcgemm.dot_general")
    if order_kw:
        return _lax_dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                preferred_element_type=preferred_element_type,
                                out_sharding=out_sharding, **order_kw)
    try:
        (lc, rc), (lb, rb) = dimension_numbers
    except (TypeError, ValueError):
        raise TypeError("jax_tcgemm.dot_general: dimension_numbers must be "
                        f"((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)); got "
                        f"{dimension_numbers!r}") from None
    if not _kernel_dtype(lhs, rhs):
        out = _int8_product(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                            out_sharding)
        if out is not None:
            return out
        return _lax_dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                preferred_element_type=preferred_element_type,
                                out_sharding=out_sharding)
    lc = _normalize_dims(lc, lhs.ndim, "lhs contracting dims", lhs.shape)
    rc = _normalize_dims(rc, rhs.ndim, "rhs contracting dims", rhs.shape)
    lb = _normalize_dims(lb, lhs.ndim, "lhs batch dims", lhs.shape)
    rb = _normalize_dims(rb, rhs.ndim, "rhs batch dims", rhs.shape)
    desc = f"lhs{lhs.shape} {lhs.dtype}, rhs{rhs.shape} {rhs.dtype}, dims {dimension_numbers}"
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise ValueError(f"jax_tcgemm.dot_general: lhs and rhs need as many contracting and "
                         f"batch dims: {desc}")
    if set(lc) & set(lb) or set(rc) & set(rb):
        raise ValueError(f"jax_tcgemm.dot_general: a dim is both batch and contracting: {desc}")
    if any(lhs.shape[i] != rhs.shape[j] for i, j in zip(lc, rc)):
        raise ValueError(f"jax_tcgemm.dot_general: contracting sizes differ: {desc}")
    if any(lhs.shape[i] != rhs.shape[j] for i, j in zip(lb, rb)):
        raise ValueError(f"jax_tcgemm.dot_general: batch sizes differ: {desc}")
    # lax's own checks and result type (dimension numbers, precision, preferred_element_type),
    # on shapes only: every argument lax rejects is rejected with lax's error, and the result
    # dtype is lax's (float64 with x64, Python float -> float32 or float64, ints, ...).
    want = jax.eval_shape(
        lambda x, y: _lax_dot_general(x, y, dimension_numbers, precision=precision,
                                      preferred_element_type=preferred_element_type),
        jax.ShapeDtypeStruct(lhs.shape, lhs.dtype), jax.ShapeDtypeStruct(rhs.shape, rhs.dtype))
    if np.dtype(want.dtype) not in OUT_DTYPES:
        return _lax_dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                preferred_element_type=preferred_element_type,
                                out_sharding=out_sharding)
    preferred_element_type = want.dtype
    out_dtype = _check_out_dtype(preferred_element_type, "preferred_element_type")
    precision = canonical_precision(precision)  # valid: lax took it above

    lhs0, rhs0 = lhs, rhs
    (lperm, ta, rperm, tb), lf, rf = _plan(lhs.shape, rhs.shape, lc, rc, lb, rb)
    if lperm is not None:
        lhs = jnp.transpose(lhs, lperm)
    if rperm is not None:
        rhs = jnp.transpose(rhs, rperm)
    # Now each operand's dims are (batch, free, contracting) or (batch, contracting, free).
    nb, nc = len(lb), len(lc)
    batch = lhs.shape[:nb]
    l_free = lhs.shape[nb + nc:] if ta else lhs.shape[nb:nb + len(lf)]
    r_free = rhs.shape[nb:nb + len(rf)] if tb else rhs.shape[nb + nc:]
    # lhs's free dims after its last explicitly sharded one form M, those before it a batch
    # that shares rhs (no batch dims only; explicit sharding rejects merging them all)
    nf = len(lf)
    cut = 0 if nb or ta else _free_cut(lhs, nf)
    a3 = _collapse(lhs, (nb, nc, nf) if ta else (cut, nf - cut, nc) if cut else (nb, nf, nc))
    b3 = _collapse(rhs, (0 if cut else nb,) + ((len(rf), nc) if tb else (nc, len(rf))))
    out = tcgemm(a3, b3, transpose_a=ta, transpose_b=tb, out_dtype=out_dtype,
                 precision=precision)
    out = _lax_shaped(out, batch + l_free + r_free, lhs0, rhs0, dimension_numbers, precision,
                      preferred_element_type)
    if out_sharding is not None:
        out = jax.sharding.reshard(out, out_sharding)
    return out


def gemm(a, b, c=None, *, alpha=1.0, beta=0.0, bias=None, activation=None, transpose_a=False,
         transpose_b=False, out_dtype=None, precision=None, overwrite_c=False):
    """D = activation(alpha * op(a) @ op(b) + beta * c + bias) in one fused kernel launch.

    a: (..., M, K), or (..., K, M) with transpose_a; b: (..., K, N), or (..., N, K) with
    transpose_b; both float16, both bfloat16 or both float32 (run by `precision`, as in
    matmul); leading batch dims broadcast as in matmul.
    c: out_dtype or float32, broadcastable to the result (..., M, N): full, per-row (M, 1),
    per-column (N,), with or without batch dims. bias: (N,), added in float32 (a float16,
    bfloat16 or float32 bias is read by the kernel as it is; other float types are converted to
    float32 first). activation:
    None, "relu", "gelu" (erf), "gelu_tanh" or "silu". alpha, beta: Python numbers or float32
    scalars (traced values allowed). Everything is computed in float32 from the accumulator
    and rounded once to out_dtype (default: the operands' dtype). `precision`: anything
    lax.dot_general takes (validated by lax), kept in lax's canonical form in the primitive's
    params and its gradient's products (float16/bfloat16 products are exact in the float32
    accumulator at any precision). overwrite_c: the result may take c's buffer when c has its
    shape and dtype, so that a c donated to the enclosing jit is updated in place (no second
    M x N buffer); without donation XLA copies c.
    """
    a, b = _as_array(a, "a"), _as_array(b, "b")
    desc = f"a{a.shape} {a.dtype}, b{b.shape} {b.dtype}"
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"jax_tcgemm.gemm: a and b must have rank >= 2; got {desc}")
    if a.dtype != b.dtype or np.dtype(a.dtype) not in OPERAND_DTYPES:
        raise TypeError(f"jax_tcgemm.gemm: a and b must both be float16, both bfloat16 or both "
                        f"float32; got {desc}")
    epilogue.check_activation(activation, "gemm")
    out_dtype = _check_out_dtype(a.dtype if out_dtype is None else out_dtype, "out_dtype")
    precision = _precision(precision)
    m, k = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
    if k != kb:
        raise ValueError(f"jax_tcgemm.gemm: contracting dimensions differ (K = {k} vs {kb}): "
                         f"{desc}, transpose_a={transpose_a}, transpose_b={transpose_b}")
    try:
        batch = tuple(jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except ValueError:
        raise ValueError(f"jax_tcgemm.gemm: batch dimensions do not broadcast: {desc}") from None
    out_shape = batch + (m, n)
    bsz = math.prod(batch)

    c3 = None if c is None else epilogue.c_operand(_as_array(c, "c"), out_shape, out_dtype,
                                                    "gemm", desc)
    bias2 = None if bias is None else epilogue.bias_operand(_as_array(bias, "bias"), n, "gemm",
                                                            desc)
    al, be, scale = epilogue.scale_operand(alpha, beta, "gemm")
    if ((symbolic(bsz) or bsz > 1) and not transpose_a and math.prod(b.shape[:-2]) == 1
            and not _explicit_rows(a)
            and (c3 is None or (c3.shape[0] == bsz and c3.shape[1] == m)
                 or (c3.shape[0] == 1 and c3.shape[1] == 1))):
        # b shared by the batch: one GEMM over the batch's rows stacked (M' = B * M), whose
        # weight gradient is then one product too (no per-item products and reduction)
        a2 = jnp.broadcast_to(a, batch + a.shape[-2:]).reshape(1, bsz * m, k)
        if c3 is not None and c3.shape[0] == bsz:
            c3 = c3.reshape(1, bsz * m, c3.shape[2])
        out = tcgemm(a2, _to3(b, batch), c3, bias2, scale, transpose_b=transpose_b,
                     out_dtype=out_dtype, alpha=al, beta=be, activation=activation,
                     overwrite_c=overwrite_c, precision=precision)
        return out.reshape(out_shape)
    out = tcgemm(_to3(a, batch), _to3(b, batch), c3, bias2, scale, transpose_a=transpose_a,
                 transpose_b=transpose_b, out_dtype=out_dtype, alpha=al, beta=be,
                 activation=activation, overwrite_c=overwrite_c, precision=precision)
    return out.reshape(out_shape)
