"""What the examples share (train_mlp.py, train_f32.py, train_fp8.py, moe.py): the regression task
they train on, y = sin(x T) for a fixed random T (OUT_FEATURES wide) and x ~ N(0, 1), its jitted
Adam step, the lockstep training of two models and the comparison of their loss curves by
window means, an equation count of a jaxpr, and the MLP examples' options. Each
example puts its own directory on sys.path to import this file (it runs from its path, also
under the tests)."""
from __future__ import annotations

import argparse
import statistics
import time

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


def train_lockstep(step, state, key, steps):
    """steps of every model in turn on the same batches (step[name](*state[name], key) ->
    (variables, opt_state, loss); interleaved, so both see the same machine state): returns
    {name: (losses, seconds per step)} and the final {name: (variables, opt_state)}."""
    hist = {name: ([], []) for name in step}
    state = dict(state)
    for i in range(steps):
        k = jax.random.fold_in(key, i)
        for name in step:
            t0 = time.perf_counter()
            v, o, loss = step[name](*state[name], k)
            loss = float(loss)  # waits for the step
            hist[name][1].append(time.perf_counter() - t0)
            hist[name][0].append(loss)
            state[name] = (v, o)
    return hist, state


def report(hist, ref, every, steps, rtol, tol_note=""):
    """Prints the loss curves of hist["tcgemm"] and hist[ref] side by side (window means), the
    final losses, the median step times and the comparison; returns compare's ok."""
    print(f"{'step':>6} {'loss tcgemm':>12} {'loss ' + ref:>12} {'rel diff':>9}   (window means)")
    ours, other = windows(hist["tcgemm"][0], every), windows(hist[ref][0], every)
    for w, (a, b) in enumerate(zip(ours, other)):
        print(f"{min((w + 1) * every, steps):>6} {a:>12.6f} {b:>12.6f} {abs(a - b) / abs(b):>9.2e}")
    print(f"final loss (last window): tcgemm {ours[-1]:.6f}, {ref} {other[-1]:.6f}")
    med = {name: statistics.median(h[1][1:] or h[1]) * 1e3 for name, h in hist.items()}
    print(f"median step time: tcgemm {med['tcgemm']:.3f} ms, {ref} {med[ref]:.3f} ms "
          f"(tcgemm/{ref} = {med['tcgemm'] / med[ref]:.3f}; first step, the compile, excluded)")
    ok, worst, fell = compare(hist["tcgemm"][0], hist[ref][0], every, rtol)
    print(f"worst window difference {worst:.2e} (tolerance {rtol:.2e}{tol_note}); "
          f"loss fell 2x: {fell}")
    return ok


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


def mlp_args(doc, argv, gpu_steps, windows):
    """The MLP examples' options (train_mlp.py, train_f32.py): steps (gpu_steps on a GPU, 100
    elsewhere), batch, width, depth, seed, Adam's lr (1e-3 * min(1, sqrt(256 / width))) and the
    print interval (steps / windows)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None,
                    help=f"default {gpu_steps} on GPU, 100 elsewhere")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3, help="hidden layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None,
                    help="Adam learning rate (default 1e-3 * min(1, sqrt(256 / width)))")
    ap.add_argument("--every", type=int, default=0,
                    help=f"print interval (default steps/{windows})")
    args = ap.parse_args(argv)
    args.steps = args.steps or (gpu_steps if jax.default_backend() == "gpu" else 100)
    args.every = args.every or max(1, args.steps // windows)
    args.lr = args.lr or 1e-3 * min(1.0, (256 / args.width) ** 0.5)
    return args


def train_pair(models, steps, batch_size, width, seed, lr):
    """Trains models {"tcgemm": ours, "jnp": stock} (one parameter tree: the stock model's init
    serves both) in lockstep with Adam on the task; returns the histories (train_lockstep) and
    the numbers of tcgemm and of dot_general equations in our model's gradient."""
    k_init, k_teacher, k_data = jax.random.split(jax.random.PRNGKey(seed), 3)
    t = teacher(k_teacher, width)
    x0 = jnp.zeros((batch_size, width), jnp.float32)
    params = jax.jit(models["jnp"].init)(k_init, x0[:1])
    opt = optax.adam(lr)
    state = {name: (params, opt.init(params)) for name in models}
    step = {name: make_step(m, opt, t, batch_size, width) for name, m in models.items()}
    grad = jax.grad(lambda p, x: jnp.sum(models["tcgemm"].apply(p, x).astype(jnp.float32)))
    jaxpr = jax.make_jaxpr(grad)(params, x0).jaxpr  # the model's forward and backward
    hist, _ = train_lockstep(step, state, k_data, steps)
    return hist, count_eqns(jaxpr, "tcgemm"), count_eqns(jaxpr, "dot_general")


def mlp_verdict(hist, n_tcgemm, n_dot, args, rtol, tol_note=""):
    """The MLP examples' end: the equation count of our model's gradient (expected: a forward,
    weight-gradient and input-gradient product per layer, no input gradient for the first),
    the curves (report), and the exit status: 0 if the curves agree and every product is
    ours."""
    print(f"equations in the tcgemm model's gradient: tcgemm {n_tcgemm}, dot_general {n_dot} "
          f"(expected {3 * args.depth + 2} and 0: per layer forward, weight and input gradient, "
          "no input gradient for the first layer)")
    ok = report(hist, "jnp", args.every, args.steps, rtol, tol_note)
    if n_tcgemm == 0 or n_dot:
        print("FAIL: the tcgemm model's products are not all tcgemm")
        return 1
    print("OK" if ok else "FAIL")
    return 0 if ok else 1
