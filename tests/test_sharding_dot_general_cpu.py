"""tg.dot_general as Flax's Dense and DenseGeneral layers call it, inside `jax.set_mesh` with
explicit axes over 4 CPU devices (conftest.py): values, gradients and result types equal
lax.dot_general's, and nothing is gathered (split from test_sharding.py, whose mesh helper it
uses)."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_tcgemm as tg

from conftest import assert_close, f64, rand
from test_sharding import cpu_mesh

F32, BF16 = np.dtype(np.float32), np.dtype(jnp.bfloat16)


@pytest.mark.parametrize("kind", ["S", "B", "N"])
def test_dense_dot_general_under_set_mesh(kind):
    """A Dense layer's product, tg.dot_general(x (B, S, D), kernel (D, F)), inside
    `jax.set_mesh` with explicit axes: sequence- (S), data- (B) or column- (F) parallel.
    Result and gradients equal the single-device ones (to float32 rounding), each typed with
    lax.dot_general's sharding at trace time (primitive._abstract_eval:
    sharding.result_sharding), and nothing is gathered (an S-sharded x keeps B apart as the
    product's batch: ops.dot_general)."""
    mesh = cpu_mesh((4,), ("d",))
    x = rand(("dense-x", kind), (4, 16, 64), BF16)
    w = rand(("dense-w", kind), (64, 32), BF16)
    sx, sw = {"S": (P(None, "d"), P()), "B": (P("d"), P()), "N": (P(), P(None, "d"))}[kind]
    dn = (((2,), (0,)), ((), ()))
    types = {}

    def loss(fn, x, w):
        y = fn(x, w, dn, preferred_element_type=F32)
        types[fn] = jax.typeof(y).sharding.spec
        return jnp.sum(jnp.tanh(y) * y), y

    xs, ws = jax.device_put(x, NamedSharding(mesh, sx)), jax.device_put(w, NamedSharding(mesh, sw))
    with jax.set_mesh(mesh):
        f = jax.jit(jax.value_and_grad(partial(loss, tg.dot_general), (0, 1), has_aux=True))
        text = f.lower(xs, ws).compile().as_text()
        (v, y), (gx, gw) = f(xs, ws)
        jax.jit(jax.value_and_grad(partial(loss, jax.lax.dot_general), (0, 1), has_aux=True))(
            xs, ws)
    assert types[tg.dot_general] == types[jax.lax.dot_general], types
    assert "all-gather" not in text, text
    (v1, y1), (gx1, gw1) = jax.jit(jax.value_and_grad(partial(loss, tg.dot_general), (0, 1),
                                                      has_aux=True))(x, w)
    # float32 sums of the same bfloat16 products: XLA:CPU may order the whole product's and
    # the shards' sums differently (it does on the GPU machine's CPU: 1-ulp differences)
    np.testing.assert_allclose(f64(y), f64(y1), rtol=0, atol=1e-6 * np.abs(f64(y1)).max())
    np.testing.assert_allclose(float(v), float(v1), rtol=1e-5)
    assert gx.sharding.is_equivalent_to(xs.sharding, 3)
    assert gw.sharding.is_equivalent_to(ws.sharding, 2)
    for g, g1 in ((gx, gx1), (gw, gw1)):
        assert g.dtype == BF16
        assert_close(g, f64(g1), BF16, 32, f"grad {kind}")


@pytest.mark.parametrize("form", ["heads_out", "heads_in"])
def test_dense_general_dot_general_under_set_mesh(form):
    """Attention's projections (flax DenseGeneral): x (B@d, S, D) @ kernel (D, H, Dh) and
    x (B@d, S, H, Dh) @ kernel (H, Dh, D), inside `jax.set_mesh`. Our (batch, M, N) result is
    split into several dims, and operands merged from several: reshapes that explicit
    sharding rejects without an out_sharding (ops._collapse, ops._lax_shaped). Values and
    gradients equal lax's on one device; types equal lax's; nothing gathered."""
    mesh = cpu_mesh((4,), ("d",))
    shapes, dn = {"heads_out": (((8, 16, 32), (32, 4, 8)), (((2,), (0,)), ((), ()))),
                  "heads_in": (((8, 16, 4, 8), (4, 8, 32)), (((2, 3), (0, 1)), ((), ())))}[form]
    x, w = (rand(("dg-" + form, i), s, BF16) for i, s in enumerate(shapes))
    types = {}

    def loss(fn, x, w):
        y = fn(x, w, dn, preferred_element_type=F32)
        types[fn] = jax.typeof(y).sharding.spec
        return jnp.sum(jnp.sin(y)), y

    xs, ws = jax.device_put(x, NamedSharding(mesh, P("d"))), jax.device_put(w, NamedSharding(mesh, P()))
    with jax.set_mesh(mesh):
        f = jax.jit(jax.value_and_grad(partial(loss, tg.dot_general), (0, 1), has_aux=True))
        text = f.lower(xs, ws).compile().as_text()
        (v, y), grads = f(xs, ws)
        jax.eval_shape(partial(loss, jax.lax.dot_general), xs, ws)
    assert types[tg.dot_general] == types[jax.lax.dot_general], types
    assert "all-gather" not in text, text
    (v1, y1), grads1 = jax.jit(jax.value_and_grad(partial(loss, jax.lax.dot_general), (0, 1),
                                                  has_aux=True))(x, w)
    assert_close(y, f64(y1), F32, 32, f"{form} value")
    for g, g1, name in zip(grads, grads1, ("x", "w")):
        assert g.dtype == BF16 and g.shape == g1.shape
        assert_close(g, f64(g1), BF16, 128, f"{form} d{name}")
