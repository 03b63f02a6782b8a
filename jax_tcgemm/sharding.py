"""Sharding of tcgemm_p: `jax.experimental.custom_partitioning` with a Shardy sharding rule.

When a module is SPMD-partitioned over more than one device (`jax.jit` over a mesh), tcgemm_p
lowers through `_partitioned`, a custom_partitioning function whose Shardy rule says

    a (b m k) or (b k m), b (b k n) or (b n k)  ->  (b m n),   k a reduction factor

so batch (b), M and N shard freely (no all-gather of operands: each device runs the GEMM on
its shard) and a sharded K gives local float32 partial products, a psum (all-reduce), and one
rounding to out_dtype afterwards. A shared batch-1 operand has its own size-1 batch factor.
`partition` turns the shardings Shardy chose into one consistent assignment of mesh axes to
(batch, M, N, K) and binds tcgemm_p on the local operands with config and split_k planned
for the LOCAL shapes; there the module is fully manual, so tcgemm_p lowers directly.

Lowered directly (no custom_partitioning), always correct: one device; inside `shard_map`
(all axes manual: the primitive already sees local shapes); `jax.export` (custom_partitioning
callbacks cannot be serialized; XLA then replicates the operands of the custom call); pmap;
and meshes that jit does not describe by an abstract mesh.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from .primitive import tcgemm, tcgemm_p
from .problem import dims as _dims, has_epilogue


def _mesh_of(ctx):
    """The abstract mesh jit partitions this module over, or None: from the axis context if
    jit put it there, else from the operands' avals (jax 0.11 gives every aval under a
    multi-device jit a NamedSharding on the mesh, Auto axes included)."""
    ac = ctx.module_context.axis_context
    candidates = [getattr(ac, "abstract_mesh", None)]
    candidates += [getattr(getattr(av, "sharding", None), "mesh", None) for av in ctx.avals_in]
    for mesh in candidates:
        if mesh is not None and not mesh.empty and mesh.size == ac.num_devices:
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
    platform for the mesh of the operands. Export is excluded: custom_partitioning callbacks are not serializable.
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


def partitioned(direct_lowering):
    """A tcgemm_p lowering rule: through custom_partitioning when jit partitions the module
    over several devices (see `_partitioning_context`), else `direct_lowering`."""
    def lowering(ctx, *args, **params):
        pctx = _partitioning_context(ctx)
        if pctx is None or has_epilogue(params) or params["has_scale"]:  # TODO(epilogue rule)
            return direct_lowering(ctx, *args, **params)
        a, b = args
        a_aval, b_aval = ctx.avals_in
        ta, tb = params["transpose_a"], params["transpose_b"]
        bt = _dims(a_aval.shape, b_aval.shape, ta, tb)[0]
        shared = (bt > 1 and a_aval.shape[0] == 1, bt > 1 and b_aval.shape[0] == 1)
        static = tuple(sorted(params.items()))  # hashable; the global-shape params

        def fun(x, y):  # the op custom_partitioning stands for (its unpartitioned semantics)
            return _partitioned(x, y, ta, tb, np.dtype(params["out_dtype"]), *shared, static)
        return mlir.lower_fun(lambda x, y: [fun(x, y)], multiple_results=True)(pctx, a, b)
    return lowering


def _bind(a, b, transpose_a, transpose_b, out_dtype, a_shared, b_shared, params):
    del transpose_a, transpose_b, out_dtype, a_shared, b_shared  # also in params
    return tcgemm_p.bind(a, b, **dict(params))[0]


_STATIC = (2, 3, 4, 5, 6, 7)  # transpose_a, transpose_b, out_dtype, a_shared, b_shared, params
_partitioned = custom_partitioning(_bind, static_argnums=_STATIC)


def _operand_factors(transpose_a, transpose_b, a_shared, b_shared):
    """Factor names of a's and b's dims (in storage order). A shared (batch-1) operand's
    batch dim is its own size-1 factor, never the result's batch `b`."""
    a = ["sa" if a_shared else "b"] + (["k", "m"] if transpose_a else ["m", "k"])
    b = ["sb" if b_shared else "b"] + (["n", "k"] if transpose_b else ["k", "n"])
    return a, b


def sharding_rule(transpose_a, transpose_b, out_dtype, a_shared, b_shared, params, mesh,
                  operand_types, result_types):
    """The Shardy rule, e.g. 'b m k, b k n -> b m n' with k a reduction factor."""
    del out_dtype, params, mesh, operand_types, result_types
    a, b = _operand_factors(transpose_a, transpose_b, a_shared, b_shared)
    shared = tuple(f for f in ("sa", "sb") if f in a + b)
    rule = f"{' '.join(a)}, {' '.join(b)} -> b m n"
    return rule, {"reduction_factors": ("k",), "need_replication_factors": shared}


def _axes(sharding, dim):
    """Mesh axis names that shard dimension `dim` of a NamedSharding, as a tuple."""
    spec = tuple(sharding.spec) + (None,) * (dim + 1)
    entry = spec[dim]
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _assign(mesh, a_sh, b_sh, transpose_a, transpose_b, a_shared, b_shared, k_size):
    """One consistent assignment {factor: mesh axes} from the operand shardings XLA proposes:
    batch from a batched operand, M from a, N from b, K from a (else b); a mesh axis is used
    once; a K that its axes do not divide evenly is not sharded (padding would be summed)."""
    fa, fb = _operand_factors(transpose_a, transpose_b, a_shared, b_shared)
    proposals = {
        "b": _axes(a_sh, 0) if not a_shared else _axes(b_sh, 0) if not b_shared else (),
        "m": _axes(a_sh, fa.index("m")),
        "n": _axes(b_sh, fb.index("n")),
        "k": _axes(a_sh, fa.index("k")) or _axes(b_sh, fb.index("k")),
    }
    used, out = set(), {}
    for factor in ("b", "m", "n", "k"):
        out[factor] = tuple(ax for ax in proposals[factor] if ax not in used)
        used.update(out[factor])
    if k_size % math.prod(mesh.shape[ax] for ax in out["k"]):
        out["k"] = ()
    return out


def _spec(factors, assignment):
    return P(*(assignment.get(f) or None for f in factors))


def partition(transpose_a, transpose_b, out_dtype, a_shared, b_shared, params, mesh,
              arg_shapes, result_shape):
    del params, result_shape  # re-planned for the local shapes; result follows the operands
    a_shape, b_shape = arg_shapes
    a_sh, b_sh = a_shape.sharding, b_shape.sharding
    if not (isinstance(a_sh, NamedSharding) and isinstance(b_sh, NamedSharding)):
        raise NotImplementedError(
            f"jax_tcgemm: sharded tcgemm needs NamedShardings over a mesh; got {a_sh}, {b_sh}")
    k_size = _dims(a_shape.shape, b_shape.shape, transpose_a, transpose_b)[3]
    axes = _assign(mesh, a_sh, b_sh, transpose_a, transpose_b, a_shared, b_shared, k_size)
    fa, fb = _operand_factors(transpose_a, transpose_b, a_shared, b_shared)
    k_axes = axes["k"]
    local_dtype = np.dtype(np.float32) if k_axes else out_dtype

    def lower_fn(a, b):  # on per-device shapes: tcgemm() plans config (and split) for them
        out = tcgemm(a, b, transpose_a=transpose_a, transpose_b=transpose_b,
                     out_dtype=local_dtype)
        if k_axes:  # partial products over K shards: sum in float32, round once
            out = lax.psum(out, k_axes).astype(out_dtype)
        return out

    arg_shardings = (NamedSharding(mesh, _spec(fa, axes)), NamedSharding(mesh, _spec(fb, axes)))
    out_sharding = NamedSharding(mesh, _spec(("b", "m", "n"), axes))
    return mesh, lower_fn, out_sharding, arg_shardings


_partitioned.def_partition(partition, sharding_rule=sharding_rule)
