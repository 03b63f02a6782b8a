"""CPU tests of the ragged GEMM's partitioning rule (jax_tcgemm/sharding.py) on 4 CPU devices
(conftest.py): data-parallel lhs rows, expert-parallel rhs groups and sharded N, forward and
gradients, under explicit and auto meshes and jax.set_mesh; uneven groups with an epilogue.
Values against the unsharded product and the float64 reference of test_ragged_cpu.py."""
import contextlib
import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_tcgemm as tg

from conftest import assert_close, f64, rand
from test_ragged_cpu import BF16, F16, F32, K, N, operands, ragged64



def _mesh(axis_type):
    return jax.make_mesh((4,), ("d",), axis_types=(axis_type,), devices=jax.devices("cpu")[:4])


def _hlo_dots(text):
    """Result shapes of the dots in compiled HLO (size-1 dims dropped, as XLA:CPU does)."""
    return [tuple(int(d) for d in m.group(1).split(",") if d and int(d) != 1)
            for m in re.finditer(r"= \w+\[([\d,]*)\]\{[^}]*\} dot\(", text)]


@pytest.mark.parametrize("axis_type,set_mesh", [(AxisType.Explicit, False),
                                                (AxisType.Auto, False),
                                                (AxisType.Explicit, True)],
                         ids=["Explicit", "Auto", "Explicit-set_mesh"])
@pytest.mark.parametrize("kind", ["M", "G", "N"])
def test_sharded_forward_and_grad(kind, axis_type, set_mesh):
    """Data parallel (lhs rows over 4 devices): local products of M/4 rows, no collective in
    the forward, a float32 all-reduce of the weight gradient. Expert parallel (rhs groups over
    4 devices): each device its 2 groups' rows, one all-reduce of d. N sharded: local columns.
    Values equal the unsharded result in every case (sizes with empties and sum < M); also
    inside `jax.set_mesh` (the result typed by sharding.typed, the local function traced
    without the context mesh: sharding._meshless)."""
    mesh, m, g = _mesh(axis_type), 32, 8
    ctx = jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext()
    lhs, rhs = operands(("shard", kind), BF16, m=m, g=g)
    gs = jnp.asarray([3, 0, 7, 2, 5, 0, 6, 4], jnp.int32)  # sum 27 < 32
    spec_l, spec_r = {"M": (P("d"), P()), "G": (P(), P("d")), "N": (P(), P(None, None, "d"))}[kind]
    x = jax.device_put(lhs, NamedSharding(mesh, spec_l))
    y = jax.device_put(rhs, NamedSharding(mesh, spec_r))
    gsh = jax.device_put(gs, NamedSharding(mesh, P()))
    f = jax.jit(lambda *a: tg.ragged_dot(*a, preferred_element_type=F32))
    with ctx:
        assert "CustomSPMDPartitioning" in f.lower(x, y, gsh).as_text()
        text = f.lower(x, y, gsh).compile().as_text()
        out = f(x, y, gsh)
    assert "all-gather" not in text
    assert ("all-reduce" in text) == (kind == "G")
    want_dot = {"M": (m // 4, N), "G": (m, N), "N": (m, N // 4)}[kind]
    assert want_dot in _hlo_dots(text), _hlo_dots(text)
    assert kind != "G" or "bf16[2,24,20]" in text  # each device holds 2 groups' weights
    assert_close(out, ragged64(lhs, rhs, gs), F32, K, f"{kind} sharded")
    wt = rand(("shard-w",), (m, N), F32)
    loss = lambda a, b, gg: jnp.sum(wt * tg.ragged_dot(a, b, gg, preferred_element_type=F32))  # noqa: E731
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    with ctx:
        gtext = grad.lower(x, y, gsh).compile().as_text()
        grads = grad(x, y, gsh)
    if kind == "M":
        assert re.search(r"= f32\[8,24,20\][^=]*all-reduce", gtext), "wgrad: f32 all-reduce"
    single = jax.jit(jax.grad(loss, argnums=(0, 1)))(lhs, rhs, gs)
    for got, ref in zip(grads, single):
        assert_close(got, f64(ref), BF16, m, f"{kind} grad")


def test_sharded_uneven_groups_and_epilogue():
    """G = 6 over 4 devices (padded group blocks), with bias and gelu: each row has one owner."""
    mesh = _mesh(AxisType.Auto)
    lhs, rhs = operands(("uneven",), F16, m=30, g=6)
    bias = rand(("uneven-b",), (6, N), F32)
    gs = jnp.asarray([4, 9, 0, 6, 3, 5], jnp.int32)
    f = jax.jit(lambda a, b, gg, bb: tg.ragged_gemm(
        a, lax.with_sharding_constraint(b, NamedSharding(mesh, P("d"))), gg,
        bias=lax.with_sharding_constraint(bb, NamedSharding(mesh, P("d"))), activation="gelu",
        out_dtype=F32))
    args = [jax.device_put(v, NamedSharding(mesh, P())) for v in (lhs, rhs, gs, bias)]
    assert "CustomSPMDPartitioning" in f.lower(*args).as_text()
    assert_close(f(*args), ragged64(lhs, rhs, gs, bias=bias, act="gelu"), F32, K, "uneven G")
