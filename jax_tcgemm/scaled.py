"""tg.scaled_matmul: fp8 and int8 GEMMs with per-tensor, per-row / per-column and DeepSeek-V3
block scales, composed with the fused epilogue (issue 26).

    D = act(sum_k a[m,k] * b[k,n] * scale(m, n, k) + beta * C + bias)

in float32 (int8: exact int32 products), rounded once to out_dtype.

Two paths compute it, with the same numbers (up to float32 summation order):
- the kernels: on a GPU of compute capability 9.0, one call of the sm90
  8-bit kernels (wgmma; ffi/kernels/sm90/kernels_sm90_byte.cu) does the product, the scales
  (block scales of fp8 in the main loop, the others in the epilogue) and the whole epilogue;
  int8 on other GPUs from 8.0 on, one call of the sm80 int8 kernels (mma.sync m16n8k32;
  ffi/kernels/sm80/kernels_s8.cu) does the same (no block scales: those are fp8's). Both read
  b K-major, as (N, K): a b given as (K, N) is copied K-major by the same call first (one pass
  over b; pass transpose_b=True with a (N, K) b to avoid it). They take K a multiple of 16: a
  and b with another K are padded with zeros along K first (_padded_plan);
- lax (everywhere else: CPU, fp8 off compute capability 9.0, GPUs before 8.0, int8 with block
  scales):
  lax.dot_general with float32 / int32 accumulation, the scales applied to the float32
  accumulator, never to a dequantised copy of a or b. It is also the reference of the kernels'
  tests, and it defines the derivatives of both paths.
Rules (shapes, dtypes, scale forms) are pure functions of shapes and dtypes, checked at trace
time. Under a jit over a mesh the kernel path's call (tcgemm_scaled_p) runs on the local shards
(sharding.scaled_partition: batch / M / N sharded as they are, K sharded with one psum before
the epilogue), as tg.gemm's does.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import mlir
# As imported: a user may monkeypatch jax.lax.dot_general = tg.dot_general.
from jax.lax import dot_general as _lax_dot_general

from . import _ffi, configs, epilogue, lowering, plan8, sharding
from .ops import _as_array
from .primitive import _fold, _jitted_impl, map_items
from .problem import symbolic
from .scaled_forms import (BLOCK, FLOAT_OUT, I32, _name, _scale, a_scale_form,  # noqa: F401
                           b_scale_form, check_forms, kind_of)

# ---------------------------------------------------------------------------------------------
# The product in lax: a (R, K), b (K, N) or (N, K); sa None, () , (R,) or (R, Kb); sb None, (),
# (N,) or (Kb, Nb) (block grid K-major whatever b's layout). Returns the scaled float32
# accumulator (R, N).

def _pad_k(x, y, transpose_b):
    """x (R, K) and y ((N, K) with transpose_b, else (K, N)) padded with zeros along K to a
    multiple of 16 (the product is unchanged: the padding's products are zero)."""
    pad = -x.shape[1] % 16
    if not pad:
        return x, y
    return (jnp.pad(x, ((0, 0), (0, pad))),
            jnp.pad(y, ((0, 0), (0, pad)) if transpose_b else ((0, pad), (0, 0))))


def _int_dot(x, y, transpose_b):
    """x @ op(y) of int8 operands as exact int32, K padded to a multiple of 16 (_pad_k): XLA's
    own int8 GEMM gave twice the product for K = 33-35 and 63 on the H200 (jax 0.11.2;
    benchmarks/NOTES.md v62), right for the multiples of 16 tried."""
    x, y = _pad_k(x, y, transpose_b)
    dn = (((1,), (1 if transpose_b else 0,)), ((), ()))
    return _lax_dot_general(x, y, dn, preferred_element_type=jnp.int32)


def _dot(x, y, transpose_b, kind):
    """x @ op(y) with float32 accumulation (int8: exact int32, then converted to float32).
    fp8 at HIGHEST: on GPU, XLA's cuBLASLt fp8 path otherwise may use the fast (fewer-bit)
    accumulation."""
    if kind == "int8":
        return _int_dot(x, y, transpose_b).astype(jnp.float32)
    dn = (((1,), (1 if transpose_b else 0,)), ((), ()))
    return _lax_dot_general(x, y, dn, precision=lax.Precision.HIGHEST,
                            preferred_element_type=jnp.float32)


def _outer(sa, sb):
    """sa[m] * sb[n] (float32, rounded once), None when both are absent."""
    if sa is None:
        return None
    sa = sa[:, None] if sa.ndim == 1 else sa
    return sa * sb


def _impl(a, b, sa, sb, form, transpose_b, kind):
    if form != "block":
        acc = _dot(a, b, transpose_b, kind)
        s = _outer(sa, sb)
        return acc if s is None else acc * s  # acc * (sa * sb), as the kernels' epilogue
    r, k = a.shape
    n = b.shape[0] if transpose_b else b.shape[1]
    sbx = jnp.repeat(sb, BLOCK, axis=1, total_repeat_length=sb.shape[1] * BLOCK)[:, :n]

    def step(kb, acc, width):
        # K block kb: its float32 (int8: exact int32) partial product, scaled by
        # sa[m, kb] * sb[kb, n // 128] and added to the float32 accumulator, in K order (the
        # kernels' main loop, DeepGEMM's promotion every 128 of K).
        ak = lax.dynamic_slice_in_dim(a, kb * BLOCK, width, axis=1)
        bk = lax.dynamic_slice_in_dim(b, kb * BLOCK, width, axis=1 if transpose_b else 0)
        s = (lax.dynamic_index_in_dim(sa, kb, axis=1, keepdims=True)
             * lax.dynamic_index_in_dim(sbx, kb, axis=0, keepdims=True))
        return acc + s * _dot(ak, bk, transpose_b, kind)

    acc = jnp.zeros((r, n), jnp.float32)
    full, tail = divmod(k, BLOCK)
    # checkpoint: under AD the loop keeps no per-block partial product (Kb x R x N) as a
    # residual; the backward recomputes it.
    if full:  # (a loop of no trips would still trace a 128-wide slice)
        acc = lax.fori_loop(0, full, jax.checkpoint(lambda kb, acc: step(kb, acc, BLOCK)), acc)
    if tail:  # the last, partial block: a static slice (no padded copy of a or b)
        acc = step(full, acc, tail)
    return acc


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5, 6))
def _product(a, b, sa, sb, form, transpose_b, kind):
    return _impl(a, b, sa, sb, form, transpose_b, kind)


def _product_jvp(form, transpose_b, kind, primals, tangents):
    a, b, sa, sb = primals
    ta, tb, tsa, tsb = tangents
    for name, x, t in (("a", a, ta), ("b", b, tb)):
        if not isinstance(t, SymbolicZero):
            raise TypeError(
                f"{_name()}: {name} ({x.dtype}) is quantised data and has no gradient here; "
                f"differentiate with respect to the scales, bias, c or beta, or give the "
                f"quantiser a straight-through gradient outside (jax.custom_vjp), as Flax's fp8 "
                f"ops do")
    out = _impl(a, b, sa, sb, form, transpose_b, kind)
    tan = jnp.zeros_like(out)  # D is linear in each scale: d D = D(d sa, sb) + D(sa, d sb)
    if sa is not None and not isinstance(tsa, SymbolicZero):
        tan = tan + _impl(a, b, tsa, sb, form, transpose_b, kind)
    if sb is not None and not isinstance(tsb, SymbolicZero):
        tan = tan + _impl(a, b, sa, tsb, form, transpose_b, kind)
    return out, tan


_product.defjvp(_product_jvp, symbolic_zeros=True)


# ---------------------------------------------------------------------------------------------
# The kernel path: one custom call (ffi/xla/gemm_ffi.cc with 8-bit operands) computes what
# _reference computes. Its derivatives are _reference's (the scales, c, bias and beta enter
# linearly or through the activation; a and b have none).
#
# Both take the call's operands: a3 (1 | B, R, K); b3 (1 | B, K, N), or (1 | B, N, K) with
# transpose_b; sa None, () (per-tensor), (1 | B, R) (per-row) or (1 | B, R, Kb) (block); sb
# None, (), (1 | B, N) (per-column) or (1 | B, Kb, Nb) (block, K-major grid); c3 (1 | B, 1 | R,
# 1 | N); bias (1 | B, N); scale None or [alpha, beta]. A leading 1 is shared by the B items
# (stride 0 in the kernel). st = (form, transpose_b, kind, activation, out_dtype, alpha, beta,
# B, R, N); the result is (B, R, N).

def _many(d):
    """Whether a dim may hold more than one item (a symbolic one may: jax.export)."""
    return symbolic(d) or d > 1


def _rows_apart(x):
    """Whether x's batch dims must stay apart from its rows (..., M, K): explicit sharding
    rejects a reshape merging dims where any but the first of them is sharded (as ops.py's
    products, such dims stay a batch)."""
    return x.ndim > 2 and any(sharding.explicit_spec(jax.typeof(x))[1:-1])


def _over_batch(batch, xs, fn):
    """fn(*items) for every item of the batch dims `batch`, stacked: xs are operands with those
    leading dims, each its own or 1 (None and scalars: shared by every item); one jax.vmap per
    batch dim along which some operand varies (one call of fn where none does, its result
    broadcast). Under the vmaps the call's vmap rule (_batch_rule) makes them one launch."""
    if not batch:
        return fn(*xs)
    lead = [x is not None and x.ndim > 0 for x in xs]
    axes = [0 if has and _many(x.shape[0]) else None for x, has in zip(xs, lead)]
    items = [x[0] if has and ax is None else x for x, has, ax in zip(xs, lead, axes)]
    inner = functools.partial(_over_batch, batch[1:], fn=fn)
    out = (inner(items)[None] if all(ax is None for ax in axes)
           else jax.vmap(lambda *ys: inner(list(ys)), in_axes=axes)(*items))
    return jnp.broadcast_to(out, batch[:1] + out.shape[1:])


def _reference(a3, b3, sa, sb, c3, bias, scale, st):
    form, transpose_b, kind, activation, out_dtype, al, be, nb, r, n = st
    if out_dtype == I32:  # int8 x int8 -> int32: exact, nothing else
        return _over_batch((nb,), [a3, b3], lambda x, y: _int_dot(x, y, transpose_b))
    acc = _over_batch((nb,), [a3, b3, sa, sb],
                      lambda x, y, s, t: _product(x, y, s, t, form, transpose_b, kind))
    out = epilogue.apply(acc, c3, bias, scale, alpha=al, beta=be,
                         activation=activation or "none", out_dtype=out_dtype, aux=False)[0]
    return jnp.broadcast_to(out, (nb, r, n))


def _kernel(a3, b3, sa, sb, c3, bias, scale, st, plan):
    """The product on the 8-bit kernels (sm90 rows; int8 also sm80 rows), one launch for the B
    items: per-tensor scales are operands the kernel multiplies into alpha on the device (no XLA
    op folds them first), per-row and per-column ones are the epilogue's row and column scales;
    block scales are applied in the kernel's main loop (passed K-major, each item's (Kb, R) and
    (Kb, Nb) stacked along the rows)."""
    form, transpose_b, kind, activation, out_dtype, al, be, nb, r, n = st
    config, split = plan  # plan8.plan_byte: K slices summed by the split-K reduction
    k = a3.shape[2]
    # wgmma reads 8-bit operands K-major only: a (K, N) b is copied K-major inside the call
    # (pack=1: ffi/host PlanWorkspace / LaunchTransposeBytes), not by an XLA transpose (the
    # narrow rows read it as stored)
    int_out = out_dtype == I32
    args = [a3, b3] + [x for x in (c3, bias) if x is not None]
    block = form == "block"
    row = not block and sa is not None and sa.ndim == 2
    col = not block and sb is not None and sb.ndim == 2
    # alpha and beta static, or the float32 [alpha, beta] of epilogue.scale_operand when traced
    # (which then stands in for al and be, as in epilogue.apply); then the per-tensor scales
    traced = not int_out and scale is not None
    if traced:
        args.append(scale)
    tensor = [] if int_out else [x for x in (sa, sb) if x is not None and x.ndim == 0]  # float32
    args += tensor
    if row:
        args.append(jnp.broadcast_to(sa, (nb, r)))
    if col:
        args.append(sb)
    if block:  # a's scales K-major, rows padded to 16 bytes (a tile's scales: one bulk copy);
        # the items' (1 | B) stacked along the rows: (Kb or B Kb, R padded), (Kb or B Kb, Nb)
        sat = jnp.pad(jnp.swapaxes(sa, 1, 2), ((0, 0), (0, 0), (0, -r % 4)))
        args += [sat.reshape(-1, sat.shape[2]), sb.reshape(-1, sb.shape[2])]
    # (none at split_k 1 without packing; traced also where the extension is missing, as the
    # CUDA branch of platform_dependent, never lowered there)
    ws = (configs.workspace_floats(r, n, k, nb, a3.shape[0] == 1, b3.shape[0] == 1, False,
                                   transpose_b, config, split, not transpose_b, 1)
          if _ffi.available() else 0)
    call = jax.ffi.ffi_call(
        _ffi.TARGET, (jax.ShapeDtypeStruct((nb, r, n), out_dtype),
                      jax.ShapeDtypeStruct((ws,), jnp.float32)),
        vmap_method="sequential")  # (never used: _call's vmap rule batches the call)
    d, _ = call(*args, **lowering.ffi_attrs(
        transpose_a=False, transpose_b=transpose_b, config=config, split_k=split,
        pack=not transpose_b, has_c=c3 is not None, has_bias=bias is not None,
        has_scale=traced, alpha=al, beta=be, tensor_scales=len(tensor), aux=False,
        activation=activation, row_scale=row, col_scale=col, block_scale=block))
    return d


# tcgemm_scaled_p: the call as one primitive. Operands a3, b3, then those of (sa, sb, c3, bias,
# scale) that are given (`present`); `st` its first 7 entries (the rest is the operands' shapes).
# It lowers to the kernels on CUDA, planned for the shapes it lowers with (over several devices
# the local shards: sharding.scaled_partition), and to _reference elsewhere.
tcgemm_scaled_p = Primitive("tcgemm_scaled")


def _abstract(*xs, st, present):
    nb, r, n, _ = sharding.scaled_dims([x.shape for x in xs], st[1])
    return jax.core.ShapedArray((nb, r, n), np.dtype(st[4]),
                                **sharding.result_sharding(xs[0], xs[1], False, st[1]))


def _lowering(kernels):
    """The lowering: the kernels (if `kernels`, where one runs these shapes) or _reference."""
    def rule(ctx, *xs, st, present):
        nb, r, n, k = sharding.scaled_dims([x.shape for x in ctx.avals_in], st[1])
        full = tuple(st) + (nb, r, n)
        plan = kernel_config(st[2], r, n, k, st[0], nb, st[1]) if kernels else None
        fn = (functools.partial(_reference, st=full) if plan is None
              else functools.partial(_kernel, st=full, plan=plan))
        return mlir.lower_fun(lambda *ys: fn(*sharding.scaled_operands(ys, present)),
                              multiple_results=False)(ctx, *xs)
    return rule


tcgemm_scaled_p.def_abstract_eval(_abstract)
tcgemm_scaled_p.def_impl(lambda *xs, **params: _jitted_impl(tcgemm_scaled_p, **params)(*xs))
for _plat, _kernels in ((None, False), ("cuda", True)):
    mlir.register_lowering(tcgemm_scaled_p, sharding.symbolic_or(
        _lowering(False), sharding.partitioned(_lowering(_kernels), tcgemm_scaled_p,
                                               sharding.scaled_rule)), platform=_plat)


@functools.lru_cache(maxsize=None)
def _call(st):
    """The call for st, with a vmap rule (_batch_rule) that makes a vmapped call one launch, as
    tg.gemm's primitive does."""
    def run(*xs):
        return tcgemm_scaled_p.bind(*(x for x in xs if x is not None), st=st[:7],
                                    present=tuple(x is not None for x in xs[2:]))
    fn = jax.custom_batching.custom_vmap(run)
    fn.def_vmap(functools.partial(_batch_rule, st))
    return fn


def _batch_rule(st, v, batched, *xs):
    """vmap of _call (v items, `batched`: which operands carry them on axis 0): one launch.
    Where b, its scales and the bias are shared, the v items' rows join the call's rows (a
    taller product); otherwise they join its batch, shared operands at stride 0 (per-tensor
    scales of an item become its row / column scales). Items that differ in alpha / beta run
    one call per item (lax.map)."""
    nb, r, n = st[7:]
    a3, b3, sa, sb, c3, bias, scale = xs
    ba, bb, bsa, bsb, bc, bbias, bscale = batched
    shared = (not (bb or bsb or bbias or bscale) and b3.shape[0] == 1
              and (sb is None or sb.ndim == 0 or sb.shape[0] == 1)
              and (bias is None or bias.shape[0] == 1) and not (ba and _rows_apart(a3)))
    if shared:  # one item of v * nb * r rows
        r2 = v * nb * r

        def rows(x, bx):  # (v,) + (1 | nb, 1 | r) + tail -> (1, r2) + tail
            tail = x.shape[2 + bx:]
            return jnp.broadcast_to(x if bx else x[None], (v, nb, r) + tail).reshape(
                (1, r2) + tail)
        sa2 = (sa if sa is None or sa.ndim == 0 else rows(sa[:, None, None], True) if
               sa.ndim == 1 else rows(sa, bsa))
        c2 = None if c3 is None else c3 if not bc and c3.shape[:2] == (1, 1) else rows(c3, bc)
        new = [rows(a3, ba), b3, sa2, sb, c2, bias, scale]
        return _rerun(st[:7] + (1, r2, n), new).reshape(v, nb, r, n), True
    if bscale:
        return map_items(_call(st), xs, [0 if bx else None for bx in batched]), True
    def fold(x, bx):  # into the batch (primitive._fold); unbatched scalars and None stay
        return x if x is None or (not bx and x.ndim == 0) else _fold(x, 0 if bx else None, v, nb)

    def vec(x, bx, size):  # per-item per-tensor scales (v,) -> row / column scales (v nb, size)
        return fold(jnp.broadcast_to(x[:, None, None], (v, 1, size)), True) if bx and \
            x.ndim == 1 else fold(x, bx)
    new = [fold(a3, ba), fold(b3, bb), vec(sa, bsa, r), vec(sb, bsb, n), fold(c3, bc),
           fold(bias, bbias), scale]
    return _rerun(st[:7] + (v * nb, r, n), new).reshape(v, nb, r, n), True


def _rerun(st, xs):
    """_call for the batched problem st, planned anew for its shape."""
    form, kind, nb, r, n, k = st[0], st[2], st[7], st[8], st[9], xs[0].shape[2]
    plan = kernel_config(kind, r, n, k, form, nb, st[1])
    return _reference(*xs, st) if plan is None else _call(st)(*xs)


@functools.partial(jax.custom_jvp, nondiff_argnums=(7,))
def _fused(a3, b3, sa, sb, c3, bias, scale, st):
    return _call(st)(a3, b3, sa, sb, c3, bias, scale)


def _fused_jvp(st, primals, tangents):
    # The reference's derivatives, with respect to the inputs that have tangents (a tangent of
    # a or b reaches _product's rule, which raises its TypeError).
    live = [i for i, t in enumerate(tangents)
            if primals[i] is not None and not isinstance(t, SymbolicZero)
            and not (hasattr(t, "dtype") and t.dtype == jax.dtypes.float0)]

    def f(*xs):
        full = list(primals)
        for i, x in zip(live, xs):
            full[i] = x
        return _reference(*full, st)
    out = _fused(*primals, st)
    if not live:
        return out, jnp.zeros_like(out)
    _, tan = jax.jvp(f, [primals[i] for i in live], [tangents[i] for i in live])
    return out, tan


_fused.defjvp(_fused_jvp, symbolic_zeros=True)


def kernel_config(kind, r, n, k, form, batch=1, transpose_b=True):
    """(row, K slices) that run this product of `batch` items (plan8.plan_byte; K a multiple
    of 16), or None where lax does (int8 with block scales, no extension, fp8 on a device other
    than compute capability 9.0, int8 on one below 8.0)."""
    if (form == "block" and kind != "fp8") or not _ffi.available() or symbolic(r, n, k, batch):
        return None  # (symbolic dims, jax.export's shape polymorphism: planned by no one)
    return plan8.plan_byte(r, n, k, kind, block_scales=form == "block", batch=batch,
                             transpose_b=transpose_b)


def _padded_plan(a2, b, kind, n, form, transpose_b):
    """(a2, b, plan): the kernels take K a multiple of 16 (16-byte rows); any other K runs on
    them too, with a2 and b padded with zeros along K to the next multiple (exact: the padding's
    products are zero, and the block scales' 128-slices stay as they are), wherever they run.
    XLA's own int8 GEMM gave twice the product for some such K on the H200 (K = 33-35, 63; jax
    0.11.2; benchmarks/NOTES.md v62): lax is left only where no kernel runs."""
    r, k = a2.shape
    plan = kernel_config(kind, r, n, -(-k // 16) * 16, form, 1, transpose_b)
    return (*(_pad_k(a2, b, transpose_b) if plan is not None else (a2, b)), plan)


# ---------------------------------------------------------------------------------------------

def scaled_matmul(a, b, a_scale, b_scale, *, out_dtype=jnp.bfloat16, bias=None, activation=None,
                  c=None, beta=0.0, transpose_b=False):
    """D = activation(sum_k a[..., m, k] * b[..., k, n] * scales + beta * c + bias): fp8 / int8
    GEMM with scales (issue 26).

    On an H100/H200 (compute capability 9.0), one call of the sm90 8-bit kernels computes
    everything (product, scales, epilogue); int8 on other GPUs from 8.0 on (A100, L4, ...), one
    call of the sm80 int8 kernels. A (K, N) b is copied K-major by the call first (the kernels
    read b as (N, K)); a K that is not a multiple of 16 is padded with zeros first. int8 with
    block scales, fp8 off 9.0 and the CPU run through lax (module docstring); the numbers are
    the same contract.

    a: (..., M, K); b: (..., K, N), or (..., N, K) with transpose_b (K-major b: what Hopper fp8
    wgmma reads). The batch dims of a and b broadcast as in jnp.matmul. A b without batch dims
    (or only dims of 1) is shared: a's batch dims fold into M. A batched b runs as one batched
    launch, as does jax.vmap of this function (a per-item alpha / beta: one call per item).
    dtypes (a x b): float8_e4m3fn x float8_e4m3fn, float8_e4m3fn x float8_e5m2,
    float8_e5m2 x float8_e4m3fn, int8 x int8.

    a_scale, b_scale: float32 arrays (Python numbers are taken as float32 per-tensor scales),
    or both None (no scaling). Their form is decided from their shapes:
      per-tensor   a_scale () or (1,)                  b_scale () or (1,)
      per-row/col  a_scale batch + (M,)                b_scale batch + (N,)
      block        a_scale batch + (M, ceil(K/128))    b_scale batch + (ceil(K/128), ceil(N/128)),
                   (1 x 128, DeepSeek-V3)              or batch + (ceil(N/128), ceil(K/128)) with
                                                       transpose_b (128 x 128, b's layout)
    (batch dims of a_scale: a's, each its own or 1; of b_scale: b's.) Per-tensor and per-row
    scales of a combine with per-tensor and per-column scales of b: D = acc * (sa[m] * sb[n]),
    acc the float32 (int8: exact int32, then float32) sum over all of K. Block scales combine
    with block scales only: for each 128-slice kb of K, in K order, acc += (sa[m, kb] *
    sb[kb, n // 128]) * P_kb with P_kb the slice's float32 (int8: exact int32) partial product.
    Other mixes are a ValueError (broadcast a per-tensor / per-row scale to the block form
    instead).

    out_dtype: bfloat16 (default), float16 or float32; int32 for int8 x int8 without scales or
    epilogue: the exact integer product (wrapping on overflow as int32 does, K > 131072).
    Then the epilogue of tg.gemm (same rules: jax_tcgemm.epilogue): c (out_dtype or float32,
    broadcast to the result: full, per-row (M, 1), per-column (N,), with or without batch
    dims) times beta (Python number or float32 scalar, traced allowed), bias (N,) floating,
    activation None / "relu" / "gelu" / "gelu_tanh" / "silu", all in float32, then rounded
    once to out_dtype.

    AD: jit, vmap, jvp and grad work with respect to the scales, c, bias and beta. a and b are
    quantised data: differentiating with respect to them is a TypeError (an fp8 cotangent would
    be a silently lossy gradient); give the quantiser its own straight-through rule instead.
    Under grad the block form keeps no per-block partial products (they are recomputed).
    """
    a, b = _as_array(a, "a"), _as_array(b, "b")
    desc = f"a{a.shape} {a.dtype}, b{b.shape} {b.dtype}, transpose_b={transpose_b}"
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"{_name()}: a and b must have rank >= 2: a (..., M, K), b (..., K, N) "
                         f"or (..., N, K) with transpose_b; got {desc}")
    kind = kind_of(a.dtype, b.dtype)
    m, k = a.shape[-2:]
    kb_, n = (b.shape[-1], b.shape[-2]) if transpose_b else b.shape[-2:]
    if k != kb_:
        raise ValueError(f"{_name()}: contracting dimensions differ (K = {k} vs {kb_}): {desc}")
    try:
        batch = tuple(jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except ValueError:
        raise ValueError(f"{_name()}: the batch dims of a and b do not broadcast: {desc}") from None
    out_dtype = np.dtype(out_dtype)
    allowed = FLOAT_OUT + ((I32,) if kind == "int8" else ())
    if out_dtype not in allowed:
        raise TypeError(f"{_name()}: out_dtype must be one of {[str(d) for d in allowed]} for "
                        f"{a.dtype} x {b.dtype}; got {out_dtype}")
    if (a_scale is None) != (b_scale is None):
        raise ValueError(f"{_name()}: give both a_scale and b_scale or neither; got a_scale "
                         f"{'None' if a_scale is None else 'given'}, b_scale "
                         f"{'None' if b_scale is None else 'given'} ({desc})")
    out_shape = batch + (m, n)
    bsz, nbat = math.prod(batch), len(batch)
    epi = c is not None or bias is not None or activation is not None
    if out_dtype == I32 and (a_scale is not None or epi):
        raise ValueError(f"{_name()}: out_dtype int32 is the exact integer product of int8 x "
                         f"int8: it takes no scales (a_scale=b_scale=None) and no epilogue (c, "
                         f"bias, activation); use a float out_dtype for those ({desc})")
    epilogue.check_activation(activation, "scaled_matmul")
    form, fa, fb = "tensor", None, None
    if a_scale is not None:
        a_scale = _scale(a_scale, "a_scale", desc)
        b_scale = _scale(b_scale, "b_scale", desc)
        fa = a_scale_form(a_scale.shape, a.shape)
        fb = b_scale_form(b_scale.shape, b.shape, transpose_b)
        check_forms(fa, fb, f"a_scale{a_scale.shape}, {desc}", f"b_scale{b_scale.shape}")
        form = "block" if fa == "block" else "outer"
    c3 = None if c is None else epilogue.c_operand(_as_array(c, "c"), out_shape, out_dtype,
                                                    "scaled_matmul", desc)
    bias2 = None if bias is None else epilogue.bias_operand(_as_array(bias, "bias"), n,
                                                            "scaled_matmul", desc)
    al, be, scale = epilogue.scale_operand(1.0, beta, "scaled_matmul")

    if any(map(_many, b.shape[:-2])) or _rows_apart(a):  # the items (and operands) one by one
        def lead(x, tail):  # x with the result's nbat batch dims (1 where x has none)
            return x.reshape((1,) * (nbat + tail - x.ndim) + x.shape)
        peeled = [lead(a, 2), lead(b, 2)]
        scales = [(x, f) for x, f in ((a_scale, fa), (b_scale, fb)) if f not in (None, "tensor")]
        peeled += [lead(x, 1 if f in ("row", "column") else 2) for x, f in scales]
        if c3 is not None:
            peeled.append(c3.reshape((batch if _many(c3.shape[0]) else (1,) * nbat) + c3.shape[1:]))

        def item(x, y, *rest):
            it = iter(rest)
            sa = next(it) if fa not in (None, "tensor") else a_scale
            sb = next(it) if fb not in (None, "tensor") else b_scale
            return scaled_matmul(x, y, sa, sb, out_dtype=out_dtype, bias=bias,
                                 activation=activation, c=next(it, None), beta=beta,
                                 transpose_b=transpose_b)
        return _over_batch(batch, peeled, item)

    # b shared by the batch (its batch dims, if any, are 1): a's batch folds into the rows
    b = b.reshape(b.shape[-2:])
    r = bsz * m
    sa = sb = None
    if fa == "tensor":
        sa = a_scale.reshape(())
    elif fa == "row":
        sa = jnp.broadcast_to(a_scale, batch + (m,)).reshape(1, r)
    elif fa == "block":
        sa = jnp.broadcast_to(a_scale, batch + a_scale.shape[-2:]).reshape(1, r, -1)
    if fb == "tensor":
        sb = b_scale.reshape(())
    elif fb == "column":
        sb = b_scale.reshape(1, n)
    elif fb == "block":  # K-major grid (Kb, Nb): tiny
        grid = b_scale.reshape(b_scale.shape[-2:])
        sb = (grid.T if transpose_b else grid)[None]
    if c3 is not None and (c3.shape[0] != 1 or (_many(bsz) and c3.shape[1] != 1)):
        c3 = jnp.broadcast_to(c3, (bsz, m, c3.shape[2])).reshape(1, r, c3.shape[2])
    if out_dtype == I32:
        scale = None
    st = (form, bool(transpose_b), kind, activation, out_dtype, al, be, 1, r, n)
    a2, b, config = _padded_plan(a.reshape(r, k), b, kind, n, form, transpose_b)
    args = (a2[None], b[None], sa, sb, c3, bias2, scale)
    out = _reference(*args, st) if config is None else _fused(*args, st)
    return out.reshape(out_shape)
