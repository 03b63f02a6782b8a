"""Sharded jit of tcgemm_p over a mesh (jax_tcgemm/sharding.py), on CPU devices.

conftest.py gives the host 4 CPU devices (--xla_force_host_platform_device_count=4). On CPU
tcgemm_p lowers through lax.dot_general, but over several devices it still goes through the
same custom_partitioning rule as on CUDA, so the compiled HLO shows what the partitioner did:
each device's GEMM has the LOCAL shape, no all-gather of operands for batch/M/N sharding, and
one float32 all-reduce for K sharding. tests/test_multi_gpu.py runs the same cases on 2 GPUs
(`sharded_case` and `check_partitioned` are shared with it).
"""
import itertools
import math
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_tcgemm as tg
from jax_tcgemm.primitives import tcgemm

from conftest import assert_close, f64, rand, ref64

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
KINDS = ("batch", "M", "N", "K")
LAYOUTS = list(itertools.product((False, True), repeat=2))
BATCHES = [(4, 4), (1, 4), (4, 1)]  # (Ba, Bb): both batched, a shared, b shared

# Logical dims a (B, M, K), b (B, K, N): which one each kind shards.
_SHARDED_DIM = {"batch": (0, 0), "M": (1, None), "N": (None, 2), "K": (2, 1)}


def _stored_spec(dim, axis, transposed, batch1):
    """PartitionSpec of an operand stored (B, R, C) or (B, C, R) that shards logical `dim`."""
    spec = [None, None, None]
    if dim is not None and not (dim == 0 and batch1):
        spec[{1: 2, 2: 1}.get(dim, dim) if transposed else dim] = axis
    return P(*spec)


def _stored(x, transposed):
    return np.ascontiguousarray(np.swapaxes(x, 1, 2)) if transposed else x


def sharded_case(mesh, axis, kind, ta=False, tb=False, ba=4, bb=4, dtype=F16, out_dtype=F32,
                 m=64, n=48, k=64):
    """Runs tcgemm (layout ta/tb) jitted over `mesh` with `kind` sharded along mesh `axis`.
    Returns (out, float64 reference, compiled HLO text, expected local result shape, the
    logical operands a (Ba, M, K) and b (Bb, K, N) as host arrays)."""
    a = np.asarray(rand(("shard", kind, ta, tb, ba, bb, m, n, k), (ba, m, k), dtype))
    b = np.asarray(rand(("shard-b", kind, ta, tb, ba, bb, m, n, k), (bb, k, n), dtype))
    da, db = _SHARDED_DIM[kind]
    x = jax.device_put(_stored(a, ta), NamedSharding(mesh, _stored_spec(da, axis, ta, ba == 1)))
    y = jax.device_put(_stored(b, tb), NamedSharding(mesh, _stored_spec(db, axis, tb, bb == 1)))
    f = jax.jit(partial(tcgemm, transpose_a=ta, transpose_b=tb, out_dtype=out_dtype))
    text = f.lower(x, y).compile().as_text()
    out = f(x, y)
    local = [max(ba, bb), m, n]
    if kind != "K":
        dim = {"batch": 0, "M": 1, "N": 2}[kind]
        local[dim] //= mesh.shape[axis] if not (dim == 0 and max(ba, bb) == 1) else 1
    return out, ref64(a, b), text, tuple(local), (a, b)


def gemm_result_shapes(text):
    """Result shapes of the GEMMs in compiled HLO text: our custom call (CUDA; its first
    result) or a dot (the CPU fallback), without size-1 dims (XLA:CPU drops them)."""
    shapes = []
    for line in text.splitlines():
        if 'custom_call_target="tcgemm"' in line or re.search(r"\sdot\(", line):
            dims = re.search(r"= \(?\w+\[([\d,]*)\]", line).group(1)
            shapes.append(tuple(int(d) for d in dims.split(",") if d and int(d) != 1))
    return shapes


def check_partitioned(kind, text, local_shape):
    """The HLO facts of a partitioned tcgemm: every GEMM runs on the local shard; batch/M/N
    sharding moves no operand (no all-gather, all-to-all or all-reduce); K sharding sums the
    partial products with an all-reduce (in float32) and gathers nothing."""
    shapes = gemm_result_shapes(text)
    local_shape = tuple(d for d in local_shape if d != 1)
    assert shapes and all(s == local_shape for s in shapes), (shapes, local_shape, text)
    assert "all-gather" not in text and "all-to-all" not in text, text
    if kind == "K":
        assert re.search(r"= f32\[[\d,]*\][^=]*all-reduce(-start)?\(", text), text
    else:
        assert "all-reduce" not in text, text


def cpu_mesh(shape, names, axis_type=AxisType.Explicit):
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape),
                         devices=jax.devices("cpu")[:math.prod(shape)])


@pytest.fixture(scope="module", params=[AxisType.Explicit, AxisType.Auto], ids=str)
def mesh(request):  # jax.make_mesh's default (Explicit) and Auto axes
    return cpu_mesh((4,), ("d",), request.param)


@pytest.mark.parametrize("ba,bb", BATCHES, ids=lambda v: f"B{v}")
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=lambda v: "T" if v else "N")
@pytest.mark.parametrize("kind", KINDS)
def test_sharded_jit(mesh, kind, ta, tb, ba, bb):
    if kind == "batch" and ba == bb == 1:
        pytest.skip("nothing to shard")
    out, ref, text, local, _ = sharded_case(mesh, "d", kind, ta, tb, ba, bb)
    check_partitioned(kind, text, local)
    assert_close(out, ref, F32, 64, f"{kind} ta={ta} tb={tb} B=({ba},{bb})")
    expected = {"batch": P("d"), "M": P(None, "d"), "N": P(None, None, "d"), "K": P()}[kind]
    if not (kind == "batch" and max(ba, bb) == 1):
        assert out.sharding.spec == expected or tuple(out.sharding.spec) == tuple(expected) + (
            None,) * (3 - len(expected)), out.sharding


@pytest.mark.parametrize("out_dtype", [F16, BF16], ids=str)
def test_k_sharded_rounds_once_after_the_sum(mesh, out_dtype):
    """Partials are summed in float32 and rounded once: the result equals the unsharded one
    (within the output dtype's bound) and the all-reduce is float32."""
    out, ref, text, local, (a, b) = sharded_case(mesh, "d", "K", out_dtype=out_dtype,
                                                 dtype=BF16)
    check_partitioned("K", text, local)
    assert out.dtype == out_dtype
    assert_close(out, ref, out_dtype, 64, "K-sharded")
    single = jax.jit(partial(tcgemm, out_dtype=out_dtype))(a, b)  # default device only
    assert_close(out, f64(single), out_dtype, 64, "K-sharded vs unsharded")


def test_two_axis_mesh_batch_and_n():
    """Batch over mesh axis x and N over y at once (a 2 x 2 mesh): local (2, M, N/2)."""
    mesh2 = cpu_mesh((2, 2), ("x", "y"))
    a, b = rand(("2ax-a",), (4, 40, 24), F16), rand(("2ax-b",), (4, 24, 32), F16)
    x = jax.device_put(a, NamedSharding(mesh2, P("x")))
    y = jax.device_put(b, NamedSharding(mesh2, P("x", None, "y")))
    f = jax.jit(partial(tg.matmul, out_dtype=F32))
    text = f.lower(x, y).compile().as_text()
    check_partitioned("batch", text, (2, 40, 16))
    assert_close(f(x, y), ref64(a, b), F32, 24, "2-axis")


def test_uneven_shards_stay_correct():
    """M = 30 over 4 devices pads the last shard (its rows are dropped); K = 30 over 4 cannot
    be summed over padded shards, so K is gathered instead: correct either way. (Uneven
    shards come from sharding constraints on Auto axes; device_put refuses them.)"""
    mesh = cpu_mesh((4,), ("d",), AxisType.Auto)
    a, b = rand(("uneven-a",), (1, 30, 30), F16), rand(("uneven-b",), (1, 30, 20), F16)
    for spec_a, spec_b in [(P(None, "d"), P()), (P(None, None, "d"), P(None, "d"))]:
        def f(x, y):
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec_a))
            y = jax.lax.with_sharding_constraint(y, NamedSharding(mesh, spec_b))
            return tcgemm(x, y, out_dtype=F32)
        x, y = (jax.device_put(v, NamedSharding(mesh, P())) for v in (a, b))
        assert "CustomSPMDPartitioning" in jax.jit(f).lower(x, y).as_text()
        assert_close(jax.jit(f)(x, y), ref64(a, b), F32, 30, f"uneven {spec_a}")


def test_ops_grad_and_vmap_under_sharding(mesh):
    """tg.matmul / tg.dot_general / grad / vmap inside a data-parallel jit: every tcgemm is
    partitioned (no all-gather) and the values match the unsharded program."""
    x = rand(("dp-x",), (8, 16, 32), BF16)   # (batch, rows, features), batch over devices
    w = rand(("dp-w",), (32, 24), BF16)      # replicated weights

    def loss(x, w):
        y = tg.dot_general(x, w, (((2,), (0,)), ((), ())), preferred_element_type=F32)
        return jnp.sum(jnp.tanh(y))

    f = jax.jit(jax.value_and_grad(loss, argnums=1))
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    ws = jax.device_put(w, NamedSharding(mesh, P()))
    text = f.lower(xs, ws).compile().as_text()
    assert "all-gather" not in text, text
    (v, g), (v1, g1) = f(xs, ws), f(x, w)
    np.testing.assert_allclose(float(v), float(v1), rtol=1e-5)
    assert_close(g, f64(g1), BF16, 1, "weight gradient")
    vm = jax.jit(jax.vmap(partial(tg.matmul, out_dtype=F32), in_axes=(0, None)))
    assert_close(vm(xs, ws), ref64(x, w), F32, 32, "vmap")


def test_inside_shard_map(mesh):
    """In shard_map the primitive sees local shapes and lowers directly; a K split with a
    manual psum equals the product."""
    a, b = rand(("sm-a",), (4, 32, 64), F16), rand(("sm-b",), (4, 64, 16), F16)

    def local(x, y):  # x (4, 32, 16), y (4, 16, 16) per device
        return jax.lax.psum(tcgemm(x, y, out_dtype=F32), "d")

    put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
    specs = (P(None, None, "d"), P(None, "d"))
    f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P()))
    x, y = put(a, specs[0]), put(b, specs[1])
    text = f.lower(x, y).compile().as_text()
    assert gemm_result_shapes(text) == [(4, 32, 16)], text  # local shapes
    assert_close(f(x, y), ref64(a, b), F32, 64, "shard_map")
    g = jax.jit(jax.shard_map(partial(tg.matmul, out_dtype=F32), mesh=mesh,
                              in_specs=(P("d"), P("d")), out_specs=P("d")))
    assert_close(g(put(a, P("d")), put(b, P("d"))), ref64(a, b), F32, 64, "shard_map batch")


def test_single_device_jit_has_no_custom_partitioning():
    """One device: tcgemm_p lowers directly (nothing unserializable in the module)."""
    text = jax.jit(tg.matmul).lower(rand(1, (8, 16), F16), rand(2, (16, 4), F16)).as_text()
    assert "CustomSPMDPartitioning" not in text
    assert "dot_general" in text or "custom_call @tcgemm" in text  # CPU fallback or CUDA
