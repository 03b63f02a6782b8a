"""Sharding of tcgemm_p: `jax.experimental.custom_partitioning` with a Shardy sharding rule.

When a module is SPMD-partitioned over more than one device (`jax.jit` over a mesh), tcgemm_p
lowers through `_partitioned`, a custom_partitioning function whose Shardy rule is

    a (b m k) or (b k m), b (b k n) or (b n k), [c (b m n)], [bias (b n)], [scale (s)]
        -> d (b m n), [pre (b m n)]                   k a reduction factor

A shared batch-1 operand, and each size-1 (broadcast) dim of c or bias, has its own size-1
factor; scale (traced [alpha, beta]) is its own factor, replicated. `partition` turns the
shardings Shardy chose into one assignment of mesh axes to (batch, M, N, K) and runs, on the
local shards (there the module is fully manual, so tcgemm_p lowers directly and the CUDA
lowering plans config and split for the LOCAL shapes):

* batch / M / N sharded: the whole fused op on the local shards of a, b, c and bias (no
  operand is gathered);
* K sharded: each device's partial product alpha-free in float32 without epilogue, one psum
  (all-reduce) over the K axes, then the epilogue once on the sum in float32 (`epilogue`:
  the formula of primitive.reference) and one rounding to out_dtype. c and bias stay sharded
  like the result along batch / M / N.

tcgemm_dact_p (the backward of the epilogue: g = ct * act'(pre), dbias = column sums of g)
has a rule too (`dact_rule`: elementwise over (b m n), dbias (b n) or (zb n)): it runs on the
local shards and psums the partial bias gradients over the sharded rows (and batch). So do
tcgemm_ragged_p (`ragged_rule`) and the 8-bit call tcgemm_scaled_p (`scaled_rule`), below.

Lowered directly (no custom_partitioning), always correct: one device; inside `shard_map`
(all axes manual: the primitive already sees local shapes); `jax.export` (custom_partitioning
callbacks cannot be serialized; XLA then replicates the operands of the custom call); pmap;
and meshes that jit does not describe by an abstract mesh.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from . import epilogue as _epilogue
from .problem import dims as _dims, split_operands, symbolic as _symbolic

_RESULT = ("b", "m", "n")
_OWN = ("sa", "sb", "cb", "cm", "cn", "zb", "s")  # size-1 (or scale) factors: never sharded


class _MeshNote(NamedTuple):
    """The mesh of a module, noted (in its keepalives) by the first lowering that found it."""
    mesh: object


def _mesh_of(ctx):
    """The abstract mesh jit partitions this module over, or None: from the axis context if
    jit put it there, else from the operands' avals (jax 0.11 gives every aval under a
    multi-device jit a NamedSharding on the mesh, Auto axes included, but not the results of
    our primitives, whose abstract evaluation gives no sharding), else as noted by an earlier
    lowering in this module (the forward product of the backward's tcgemm_dact_p)."""
    mc = ctx.module_context
    ac = mc.axis_context
    candidates = [getattr(ac, "abstract_mesh", None)]
    candidates += [getattr(getattr(av, "sharding", None), "mesh", None) for av in ctx.avals_in]
    noted = [x.mesh for x in getattr(mc, "keepalives", ()) if isinstance(x, _MeshNote)]
    for mesh in candidates + noted:
        if mesh is not None and not mesh.empty and mesh.size == ac.num_devices:
            if not noted:
                mc.add_keepalive(_MeshNote(mesh))
            return mesh
    return None


def _partitioning_context(ctx):
    """`ctx` with an axis context that custom_partitioning can lower under, or None where
    tcgemm_p must lower directly.

    Duck-typed on `ctx.module_context` (jax has no public predicate): jit lowers with a
    frozen-dataclass axis context holding `num_devices`, `device_assignment` and
    `abstract_mesh`; shard_map bodies (fully manual) and pmap use contexts without
    `num_devices`. jax 0.11 lowers without physical devices unless a primitive is in a private
    registry, but custom_partitioning only needs devices to build a Mesh of the right shape
    (shardings become HLO shardings by mesh position, never by device id), so when jit left
    `device_assignment` unset we fill in the first `num_devices` devices of the lowering
    platform for the mesh of the operands. Export is excluded: custom_partitioning callbacks
    are not serializable.
    """
    mc = ctx.module_context
    ac = mc.axis_context
    if getattr(mc.lowering_parameters, "for_export", False) or getattr(ac, "num_devices", 1) < 2:
        return None
    mesh = _mesh_of(ctx)
    if mesh is None:
        return None
    if ac.device_assignment is None:
        try:
            devices = jax.devices(mc.platforms[0])
        except RuntimeError:  # lowering for a platform this process has no devices of
            return None
        if len(devices) < ac.num_devices:
            return None
        ac = dataclasses.replace(ac, device_assignment=tuple(devices[:ac.num_devices]))
    if ac.abstract_mesh is None:
        ac = dataclasses.replace(ac, abstract_mesh=mesh)
    return ctx.replace(module_context=mc.replace(axis_context=ac))


class Rule(NamedTuple):
    """Factor names of each operand's and result's dims (storage order), the reduction factors
    (summed over by the op) and those that must stay replicated."""
    operands: tuple
    results: tuple
    reduction: tuple
    replicated: tuple


def gemm_rule(shapes, params):
    """tcgemm_p's factors from its operands' shapes: the result is (b m n) and k is contracted.
    A dim that broadcasts (size 1 where the result's is larger) has its own factor: sa / sb (a
    shared operand's batch), cb / cm / cn (c), zb (bias); scale is s."""
    ta, tb = params["transpose_a"], params["transpose_b"]
    a, b, c, bias, scale = split_operands(shapes, params["has_c"], params["has_bias"],
                                          params["has_scale"])
    bt, m, n, _, _ = _dims(a, b, ta, tb)
    ops = [("sa" if a[0] != bt else "b",) + (("k", "m") if ta else ("m", "k")),
           ("sb" if b[0] != bt else "b",) + (("n", "k") if tb else ("k", "n"))]
    if c is not None:
        ops.append(tuple(f if size == full else "c" + f
                         for f, size, full in zip(_RESULT, c, (bt, m, n))))
    if bias is not None:
        ops.append(("b" if bias[0] == bt else "zb", "n"))
    if scale is not None:
        ops.append(("s",))
    own = tuple(f for f in _OWN if any(f in fs for fs in ops))
    return Rule(tuple(ops), (_RESULT,) * (2 if params["aux"] else 1), ("k",), own)


def dact_rule(shapes, params):
    """tcgemm_dact_p(ct, pre) -> [g], [dbias]: elementwise over (b m n); dbias (b n) sums over
    m, or (zb n) over b and m when shared by the batch. pre is a scalar stand-in without an
    activation."""
    pre = _RESULT if len(shapes[1]) else ()
    results = ((_RESULT,) if params["has_g"] else ())
    if params["has_dbias"]:
        results += (("b", "n") if params["bias_batched"] else ("zb", "n"),)
    # (Shardy: a reduction factor may be in no result; with g, the sums are in partition)
    reduction = tuple(f for f in ("b", "m") if not any(f in r for r in results))
    shared = params["has_dbias"] and not params["bias_batched"]
    return Rule((_RESULT, pre), results, reduction, ("zb",) if shared else ())


def symbolic_or(lax_lowering, lowering):
    """`lowering`, or `lax_lowering` where an operand or result has a symbolic dim (jax.export's
    shape polymorphism: the kernels are planned, and their workspace sized, for concrete
    sizes), outside `partitioned` so that custom_partitioning never sees one either."""
    def rule(ctx, *args, **params):
        if any(_symbolic(*av.shape) for av in (*ctx.avals_in, *ctx.avals_out)):
            return lax_lowering(ctx, *args, **params)
        return lowering(ctx, *args, **params)
    return rule


def partitioned(direct_lowering, prim, rule):
    """A lowering rule of primitive `prim` (tcgemm_p with rule=gemm_rule, tcgemm_dact_p with
    rule=dact_rule): through custom_partitioning when jit partitions the module over several
    devices (see `_partitioning_context`), else `direct_lowering`."""

    def lowering(ctx, *args, **params):
        pctx = _partitioning_context(ctx)
        if pctx is None:
            return direct_lowering(ctx, *args, **params)
        factors = rule([av.shape for av in ctx.avals_in], params)
        static = tuple(sorted(params.items()))  # hashable; the global-shape params

        def fun(*xs):  # the op custom_partitioning stands for (its unpartitioned semantics)
            return _partitioned(prim, static, factors, *xs)
        return mlir.lower_fun(fun, multiple_results=True)(pctx, *args)
    return lowering


def _bind(prim, static, factors, *operands):
    del factors  # derived from the operands' shapes
    return prim.bind(*operands, **dict(static))


_partitioned = custom_partitioning(_bind, static_argnums=(0, 1, 2))


def sharding_rule(prim, static, factors, mesh, operand_types, result_types):
    """The Shardy rule, e.g. 'b m k, b k n, cb m n, zb n -> b m n, b m n' (k: reduction)."""
    del prim, static, mesh, operand_types, result_types
    rule = " -> ".join(", ".join(" ".join(f) for f in side)
                       for side in (factors.operands, factors.results))
    return rule, {"reduction_factors": factors.reduction,
                  "need_replication_factors": factors.replicated}


def _axes(sharding, dim):
    """Mesh axis names that shard dimension `dim` of a NamedSharding, as a tuple."""
    spec = tuple(sharding.spec) + (None,) * (dim + 1)
    entry = spec[dim]
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _assign(mesh, factors, shardings, even):
    """One consistent assignment {factor: mesh axes} from the shardings XLA proposes (operands
    in order, then the results): each of b, m, n, k takes the axes of the first array that
    shards it; a mesh axis is used once; a factor of `even` ({factor: size}: one the local op
    sums over) that its axes do not divide evenly is not sharded (padding would be summed)."""
    used, out = set(), {}
    for factor in ("b", "m", "n", "k"):
        proposal = next((ax for fs, sh in zip(factors, shardings) if factor in fs
                         for ax in [_axes(sh, fs.index(factor))] if ax), ())
        axes = tuple(ax for ax in proposal if ax not in used)
        if factor in even and even[factor] % math.prod(mesh.shape[ax] for ax in axes):
            axes = ()
        out[factor] = axes
        used.update(axes)
    return out


def explicit_spec(aval) -> tuple:
    """aval's explicit mesh axes per dim (None: not sharded; all None off an explicit mesh)."""
    sh = getattr(aval, "sharding", None)
    spec = () if sh is None or sh.mesh.empty else tuple(sh.spec)
    return spec + (None,) * (len(aval.shape) - len(spec))


def typed(*dims):
    """ShapedArray's `sharding` keyword for a result under explicit mesh axes ({} where none):
    result dim i takes the axes of operand dim dims[i] = (aval, index), or none (None), each
    mesh axis once, in order. The rules below type our results as lax types a dot_general's
    (batch, then the free dims of a, then b's); axes of summed dims are summed away (the
    partitions psum them, so a K sharded on both sides is allowed where lax asks for an
    out_sharding)."""
    shards = [getattr(d[0], "sharding", None) if d else None for d in dims]
    mesh = next((x.mesh for x in shards if x is not None and not x.mesh.empty), None)
    if mesh is None:
        return {}
    used, out = set(), []
    for d in dims:
        entry = explicit_spec(d[0])[d[1]] if d else None
        axes = tuple(ax for ax in ((entry,) if isinstance(entry, str) else entry or ())
                     if ax not in used)
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return {"sharding": NamedSharding(mesh, P(*out))} if any(out) else {}


def result_sharding(a, b, transpose_a, transpose_b):
    """tcgemm_p's result (batch, M, N): batch from a (b where a is shared), M from a, N
    from b."""
    batch = (a, 0) if a.shape[0] != 1 else (b, 0) if b.shape[0] != 1 else None
    return typed(batch, (a, 2 if transpose_a else 1), (b, 1 if transpose_b else 2))


def dbias_sharding(ct, bias_batched):
    """tcgemm_dact_p's bias gradient (batch or 1, N): ct's rows (and batch) summed away."""
    return typed((ct, 0) if bias_batched else None, (ct, 2))


def _spec(factors, assignment):
    return P(*(assignment.get(f) or None for f in factors))


def _gemm_local(prim, params, k_axes):
    """tcgemm_p on the local shards: the whole fused op, or with K sharded the float32 partial
    product without epilogue, its psum over `k_axes`, and the epilogue once."""
    def lower_fn(*operands):
        if not k_axes:
            return prim.bind(*operands, **params)
        a, b, c, bias, scale = split_operands(operands, params["has_c"], params["has_bias"],
                                              params["has_scale"])
        acc = prim.bind(a, b, **dict(
            params, out_dtype=np.dtype(np.float32), alpha=1.0, beta=0.0, activation="none",
            has_c=False, has_bias=False, has_scale=False, aux=False, overwrite_c=False))[0]
        return _epilogue.apply(lax.psum(acc, k_axes), c, bias, scale, **params)
    return lower_fn


def _dact_local(prim, params, axes):
    """tcgemm_dact_p on the local shards; the partial bias gradients summed over the sharded
    row (and, for a bias shared by the batch, batch) axes."""
    reduce_axes = axes["m"] + (() if params["bias_batched"] else axes["b"])

    def lower_fn(ct, pre):
        outs = list(prim.bind(ct, pre, **params))
        if params["has_dbias"] and reduce_axes:
            outs[-1] = lax.psum(outs[-1], reduce_axes)
        return outs
    return lower_fn


def meshless():
    """A context without the mesh `jax.set_mesh` made current (an empty abstract mesh): for
    shape-only checks through lax (whose explicit-sharding rules may ask for an out_sharding
    that a dtype check has no use for) and for _meshless."""
    return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ()))


def _meshless(fn):
    """fn traced without the context mesh. custom_partitioning traces the local function
    under the mesh `jax.set_mesh` made current; an explicit one puts sharding ops (custom call
    "Sharding") into the per-device module, which nothing removes there (XLA: "No registered
    implementation for untyped custom call to Sharding")."""
    def local(*xs):
        with meshless():
            return fn(*xs)
    return local


def _named(prim, arg_shapes, result_shapes):
    shardings = [s.sharding for s in (*arg_shapes, *result_shapes)]
    if not all(isinstance(s, NamedSharding) for s in shardings):
        raise NotImplementedError(
            f"jax_tcgemm: sharded {prim} needs NamedShardings over a mesh; got {shardings}")
    return shardings


def partition(prim, static, factors, mesh, arg_shapes, result_shapes):
    if prim.name in _PARTITIONS:
        return _PARTITIONS[prim.name](prim, static, factors, mesh, arg_shapes, result_shapes)
    params = dict(static)
    shardings = _named(prim, arg_shapes, result_shapes)
    if prim.name == "tcgemm":
        even = {"k": _dims(arg_shapes[0].shape, arg_shapes[1].shape, params["transpose_a"],
                           params["transpose_b"])[3]}
    else:  # the bias gradient sums over m (and b for a bias shared by the batch)
        bt, m, _ = arg_shapes[0].shape
        even = {} if not params["has_dbias"] else {"m": m} if params["bias_batched"] else {
            "m": m, "b": bt}
    axes = _assign(mesh, factors.operands + factors.results, shardings, even)
    lower_fn = (_gemm_local(prim, params, axes["k"]) if prim.name == "tcgemm"
                else _dact_local(prim, params, axes))
    arg_shardings = tuple(NamedSharding(mesh, _spec(f, axes)) for f in factors.operands)
    out_shardings = [NamedSharding(mesh, _spec(f, axes)) for f in factors.results]
    return mesh, _meshless(lower_fn), out_shardings, arg_shardings


_partitioned.def_partition(partition, sharding_rule=sharding_rule)


# ---------------------------------------------------------------------------------------------
# tcgemm_ragged_p (ragged.py): mode 0  a (m k), b (g k n) or (g n k), sizes (gs), [bias (g n)]
# -> d (m n), g a reduction factor; mode 1  a (m k), b (m n), sizes (gs) -> d (g k n), m a
# reduction factor. k of mode 0 and the sizes stay whole (every device needs the sizes of the
# groups before its own). On the local shards:
#
# * m sharded (data parallel): each device multiplies its rows; its group sizes are the
#   global groups cut to its window of rows (ragged.local_sizes). Mode 1 sums the float32
#   per-device weight gradients (psum over the m axes), rounded once after.
# * g sharded (expert parallel): each device computes its groups' rows only; those start at a
#   row that is device data, so the rows are rotated to the front (jnp.roll, one copy) and d's
#   rotated back. Mode 0 then sums over the g axes: every row has one owner, the other devices'
#   rows are exact zeros.
# * n (and in mode 1 k) sharded: each device its columns, no communication.

def ragged_rule(shapes, params):
    """tcgemm_ragged_p's factors (see above)."""
    if params["mode"] == 1:
        return Rule((("m", "k"), ("m", "n"), ("gs",)), (("g", "k", "n"),), ("m",), ("gs",))
    ops = [("m", "k"), ("g", "n", "k") if params["transpose_b"] else ("g", "k", "n"), ("gs",)]
    if params["has_bias"]:
        ops.append(("g", "n"))
    return Rule(tuple(ops), (("m", "n"),), ("g",), ("k", "gs"))


def _ragged_local(prim, params, axes, mesh, m, groups):
    """tcgemm_ragged_p on the local shards (the rows of a shard: its m window; its groups: its
    g block, padded ones empty)."""
    from . import ragged  # the clamping rule (ragged.py imports this module)
    g_axes, m_axes = axes["g"], axes["m"]
    local_groups = -(-groups // math.prod(mesh.shape[ax] for ax in g_axes))
    mode = params["mode"]

    def lower_fn(a, b, gs, *bias):
        rows = a.shape[0]
        row0 = lax.axis_index(m_axes) * rows if m_axes else 0
        group0 = lax.axis_index(g_axes) * local_groups if g_axes else 0
        sizes, first = ragged.local_sizes(gs, m, row0, rows, group0, local_groups)
        if g_axes:
            a = jnp.roll(a, -first, axis=0)
            b = jnp.roll(b, -first, axis=0) if mode == 1 else b
        sum_m = mode == 1 and m_axes
        out = prim.bind(a, b, sizes, *bias, **dict(
            params, out_dtype=np.dtype(np.float32) if sum_m else params["out_dtype"]))[0]
        if mode == 1:
            return [lax.psum(out, m_axes).astype(params["out_dtype"]) if sum_m else out]
        if g_axes:
            out = lax.psum(jnp.roll(out, first, axis=0), g_axes)
        return [out]
    return lower_fn


def ragged_partition(prim, static, factors, mesh, arg_shapes, result_shapes):
    params = dict(static)
    shardings = _named(prim, arg_shapes, result_shapes)
    arrays = factors.operands + factors.results
    used, axes = set(), {}
    for factor in ("g", "m", "n", "k"):  # experts first: gathering rows is cheaper than weights
        if factor in factors.replicated:
            axes[factor] = ()
            continue
        proposal = next((ax for fs, sh in zip(arrays, shardings) if factor in fs
                         for ax in [_axes(sh, fs.index(factor))] if ax), ())
        axes[factor] = tuple(ax for ax in proposal if ax not in used)
        used.update(axes[factor])
    lower_fn = _ragged_local(prim, params, axes, mesh, arg_shapes[0].shape[0],
                             arg_shapes[2].shape[0])
    arg_shardings = tuple(NamedSharding(mesh, _spec(f, axes)) for f in factors.operands)
    out_shardings = [NamedSharding(mesh, _spec(f, axes)) for f in factors.results]
    return mesh, _meshless(lower_fn), out_shardings, arg_shardings


# ---------------------------------------------------------------------------------------------
# tcgemm_scaled_p (scaled.py, the 8-bit call): a (b m k), b (b k n) or (b n k), then as given
# sa () | (b m) | (b m kb), sb () | (b n) | (b kb nb), c (b m n), bias (b n), scale (s)
# -> d (b m n), k a reduction factor; kb / nb (block scales: 128-slices of K, 128-blocks of N)
# stay whole, and each device slices its own. On the local shards:
#
# * batch / M / N sharded: the whole op (scales, epilogue); N only in whole 128-column blocks
#   where b has block scales.
# * K sharded (in 16-element pieces, the kernels' K unit; 128-slices with block scales): each
#   device's scaled partial product in float32 (int8 -> int32: exact, wrapping as one int32 sum
#   does), one psum over the K axes, then the epilogue once (the formula of scaled._reference).

def scaled_operands(xs, present):
    """[a, b, sa, sb, c, bias, scale] of a call's operands (or their shapes), None where absent."""
    it = iter(xs[2:])
    return list(xs[:2]) + [next(it) if p else None for p in present]


def scaled_dims(shapes, transpose_b):
    """(batch, M, N, K) of a call on operands of these shapes: the batch is the largest leading
    dim of the operands that have one (a, b, row / column / block scales, c, bias)."""
    a, b = shapes[:2]
    return (max(s[0] for s in shapes if len(s) >= 2), a[1], b[1] if transpose_b else b[2], a[2])


def scaled_rule(shapes, params):
    """tcgemm_scaled_p's factors (above); a size-1 batch has its own factor, as in gemm_rule."""
    tb = params["st"][1]
    a, b, sa, sb, c, bias, scale = scaled_operands(shapes, params["present"])
    bt, m, n, _ = scaled_dims(shapes, tb)

    def lead(s, own):
        return "b" if s[0] == bt else own
    ops = [(lead(a, "sa"), "m", "k"), (lead(b, "sb"),) + (("n", "k") if tb else ("k", "n"))]
    if sa is not None:
        ops.append(() if not sa else (lead(sa, "xb"), "m") + (("kb",) if len(sa) == 3 else ()))
    if sb is not None:
        ops.append(() if not sb else (lead(sb, "yb"), "n") if len(sb) == 2 else
                   (lead(sb, "yb"), "kb", "nb"))
    if c is not None:
        ops.append(tuple(f if size == full else "c" + f
                         for f, size, full in zip(_RESULT, c, (bt, m, n))))
    if bias is not None:
        ops.append((lead(bias, "zb"), "n"))
    if scale is not None:
        ops.append(("s",))
    own = tuple(sorted({f for fs in ops for f in fs} - {"b", "m", "n", "k"}))
    return Rule(tuple(ops), (_RESULT,), ("k",), own)


def _own_blocks(x, dim, axes, mesh):
    """This device's equal part of x along dim (x whole: the blocks of its shard of K or N;
    axis_index over several axes counts major first, as a PartitionSpec entry splits a dim)."""
    count = x.shape[dim] // math.prod(mesh.shape[ax] for ax in axes)
    return lax.dynamic_slice_in_dim(x, lax.axis_index(axes) * count, count, axis=dim)


def _scaled_local(prim, params, axes, mesh):
    st, present = params["st"], params["present"]
    block, k_axes, n_axes = st[0] == "block", axes["k"], axes["n"]
    int_out = np.dtype(st[4]) == np.int32

    def lower_fn(*xs):
        a, b, sa, sb, c, bias, scale = scaled_operands(xs, present)
        if block and k_axes:
            sa, sb = _own_blocks(sa, 2, k_axes, mesh), _own_blocks(sb, 1, k_axes, mesh)
        if block and n_axes:
            sb = _own_blocks(sb, 2, n_axes, mesh)
        if not k_axes:
            return prim.bind(*(x for x in (a, b, sa, sb, c, bias, scale) if x is not None),
                             **params)
        part_st = st[:3] + (None, np.dtype(np.int32 if int_out else np.float32), 1.0, 0.0)
        acc = lax.psum(prim.bind(*(x for x in (a, b, sa, sb) if x is not None), st=part_st,
                                 present=present[:2] + (False,) * 3), k_axes)
        if int_out:
            return acc
        return _epilogue.apply(acc, c, bias, scale, alpha=st[5], beta=st[6],
                               activation=st[3] or "none", out_dtype=st[4], aux=False)[0]
    return lower_fn


def scaled_partition(prim, static, factors, mesh, arg_shapes, result_shapes):
    params = dict(static)
    shardings = _named(prim, arg_shapes, (result_shapes,))  # one result, not a list
    st = params["st"]
    _, _, n, k = scaled_dims([x.shape for x in arg_shapes], st[1])
    axes = _assign(mesh, factors.operands + factors.results, shardings, {})

    def parts(f):
        return math.prod(mesh.shape[ax] for ax in axes[f])
    if k % (parts("k") * (128 if st[0] == "block" else 16)):
        axes["k"] = ()
    if st[0] == "block" and n % (parts("n") * 128):
        axes["n"] = ()
    arg_shardings = tuple(NamedSharding(mesh, _spec(f, axes)) for f in factors.operands)
    out_sharding = NamedSharding(mesh, _spec(_RESULT, axes))
    return mesh, _meshless(_scaled_local(prim, params, axes, mesh)), out_sharding, arg_shardings


_PARTITIONS = {"tcgemm_ragged": ragged_partition, "tcgemm_scaled": scaled_partition}
