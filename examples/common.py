"""What the examples share (train_mlp.py, train_fp8.py, moe.py): the regression task they train
on, y = sin(x T) for a fixed random T (OUT_FEATURES wide) and x ~ N(0, 1), its jitted Adam step,
the comparison of two loss curves by window means, and an equation count of a jaxpr. Each
example puts its own directory on sys.path to import this file (it runs from its path, also
under the tests)."""
from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import optax

OUT_FEATURES = 16


def teacher(key, width):
    """The task's fixed T (width x OUT_FEATURES)."""
    return jax.random.normal(key, (width, OUT_FEATURES)) / jnp.sqrt(width)


def batch(key, t, n, width):
    x = jax.random.normal(key, (n, width), jnp.float32)
    return x, jnp.sin(x @ t)


def make_step(model, opt, t, n, width, meta=None):
    """jit(step(variables, opt_state, key) -> (variables, opt_state, loss)): one Adam step on a
    fresh batch, the loss in float32. `meta`: a variable collection besides "params" whose
    gradients are its new values (flax's fp8 recipe: '_overwrite_with_gradient'); then
    `variables` holds both, else it is the params alone."""
    @jax.jit
    def step(variables, opt_state, key):
        x, y = batch(key, t, n, width)

        def loss_fn(v):
            return jnp.mean(jnp.square(model.apply(v, x).astype(jnp.float32) - y))

        loss, grads = jax.value_and_grad(loss_fn)(variables)
        params, g = (variables["params"], grads["params"]) if meta else (variables, grads)
        updates, opt_state = opt.update(g, opt_state, params)
        new = optax.apply_updates(params, updates)
        return ({"params": new, meta: grads[meta]} if meta else new), opt_state, loss
    return step


def windows(losses, every):
    return [statistics.fmean(losses[i:i + every]) for i in range(0, len(losses), every)]


def compare(ours, ref, every, rtol):
    """(ok, worst relative difference of the window means, whether both losses fell 2x) of two
    loss curves."""
    ours, ref = windows(ours, every), windows(ref, every)
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
    fell = ref[-1] < 0.5 * ref[0] and ours[-1] < 0.5 * ours[0]
    return worst <= rtol and fell, worst, fell


def count_eqns(jaxpr, name):
    """Equations of primitive `name` in a jaxpr, nested jaxprs (jit, custom_jvp, ...) included."""
    n = 0
    for e in jaxpr.eqns:
        n += e.primitive.name == name
        for v in e.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                sub = getattr(sub, "jaxpr", sub)
                n += count_eqns(sub, name) if hasattr(sub, "eqns") else 0
    return n
