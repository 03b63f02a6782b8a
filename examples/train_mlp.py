"""Train one MLP twice, from the same init on the same data: with tcgemm layers
(`flax.linen.Dense(..., dot_general=tg.dot_general)`) and with stock layers (lax.dot_general).
Prints both loss curves side by side and the median step time of each; exits 1 if the curves
differ by more than the bf16 tolerance below, or if the loss did not fall.

    python examples/train_mlp.py                                        # CPU: ~10 s
    python examples/train_mlp.py --width 4096 --batch 4096 --steps 300  # GPU

Precision: the usual mixed-precision recipe. Weights and Adam state are float32; every Dense
casts its input and kernel to bfloat16, and its GEMM (forward and both gradients) runs in
bfloat16 with float32 accumulation (the cotangent is rounded to bfloat16 before each gradient
GEMM, in both models). The task: regress y = sin(x T) for a fixed random T, x ~ N(0, 1).

Tolerance: the two models differ only in the GEMMs' summation order, so at equal weights each
bf16 GEMM output differs by at most 1 bf16 ulp (2^-8 relative), and the loss, a mean over many
such elements, by far less. Training feeds these differences back into the weights, where they
can grow; a window-mean loss that differs by more than 8 ulps (8 * 2^-8 = 3.1%) is not bf16
rounding any more. A defective gradient (a wrong layout flag, a dropped batch reduction) breaks
training outright, far beyond that. Losses are compared as means over each print window (not
per step), which removes step-to-step noise without hiding a drift.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jax_tcgemm as tg

BF16_ULP = 2.0 ** -8
RTOL = 8 * BF16_ULP  # see the module docstring
OUT_FEATURES = 16


class MLP(nn.Module):
    width: int
    depth: int
    dot_general: Any = None  # None: lax.dot_general (stock)

    @nn.compact
    def __call__(self, x):
        kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.float32, dot_general=self.dot_general)
        for _ in range(self.depth):
            x = nn.gelu(nn.Dense(self.width, **kw)(x))
        return nn.Dense(OUT_FEATURES, **kw)(x)


def batch(key, teacher, n, width):
    x = jax.random.normal(key, (n, width), jnp.float32)
    return x, jnp.sin(x @ teacher)


def make_step(model, opt, teacher, n, width):
    @jax.jit
    def step(params, opt_state, key):
        x, y = batch(key, teacher, n, width)

        def loss_fn(p):
            return jnp.mean(jnp.square(model.apply(p, x).astype(jnp.float32) - y))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return step


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


def train_both(steps, batch_size, width, depth=3, seed=0, lr=1e-3):
    """Trains the tcgemm and the stock model in lockstep; returns {name: (losses, seconds)}
    and the number of tcgemm equations in the tcgemm model's step."""
    key = jax.random.PRNGKey(seed)
    k_init, k_teacher, k_data = jax.random.split(key, 3)
    teacher = jax.random.normal(k_teacher, (width, OUT_FEATURES)) / jnp.sqrt(width)
    models = {"tcgemm": MLP(width, depth, tg.dot_general), "jnp": MLP(width, depth)}
    params = jax.jit(models["jnp"].init)(k_init, jnp.zeros((1, width), jnp.float32))
    opt = optax.adam(lr)
    state = {name: (params, opt.init(params)) for name in models}
    step = {name: make_step(m, opt, teacher, batch_size, width) for name, m in models.items()}
    n_tcgemm = count_eqns(jax.make_jaxpr(step["tcgemm"])(*state["tcgemm"], k_data).jaxpr,
                          "tcgemm")
    hist = {name: ([], []) for name in models}
    for i in range(steps):
        k = jax.random.fold_in(k_data, i)
        for name in models:  # interleaved: both see the same machine state
            t0 = time.perf_counter()
            p, o, loss = step[name](*state[name], k)
            loss = float(loss)  # waits for the step
            hist[name][1].append(time.perf_counter() - t0)
            hist[name][0].append(loss)
            state[name] = (p, o)
    return hist, n_tcgemm


def windows(losses, every):
    return [statistics.fmean(losses[i:i + every]) for i in range(0, len(losses), every)]


def compare(hist, every, rtol=RTOL):
    """(ok, worst relative difference of the window means, whether the loss fell 2x)."""
    ours, ref = windows(hist["tcgemm"][0], every), windows(hist["jnp"][0], every)
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
    fell = ref[-1] < 0.5 * ref[0] and ours[-1] < 0.5 * ours[0]
    return worst <= rtol and fell, worst, fell


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3, help="hidden layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None,
                    help="Adam learning rate (default 1e-3 * min(1, sqrt(256 / width)))")
    ap.add_argument("--every", type=int, default=0, help="print interval (default steps/15)")
    args = ap.parse_args(argv)
    every = args.every or max(1, args.steps // 15)
    lr = args.lr or 1e-3 * min(1.0, (256 / args.width) ** 0.5)
    print(f"backend {jax.default_backend()}: MLP {args.depth}x{args.width} -> {OUT_FEATURES}, "
          f"batch {args.batch}, {args.steps} Adam steps (lr {lr:g}), bf16 GEMMs, float32 weights")
    hist, n_tcgemm = train_both(args.steps, args.batch, args.width, args.depth, args.seed, lr)
    print(f"tcgemm equations in the tcgemm model's step: {n_tcgemm}")
    print(f"{'step':>6} {'loss tcgemm':>12} {'loss jnp':>12} {'rel diff':>9}   (window means)")
    ours, ref = windows(hist["tcgemm"][0], every), windows(hist["jnp"][0], every)
    for w, (a, b) in enumerate(zip(ours, ref)):
        last = min((w + 1) * every, args.steps)
        print(f"{last:>6} {a:>12.6f} {b:>12.6f} {abs(a - b) / abs(b):>9.2e}")
    med = {name: statistics.median(h[1][1:] or h[1]) * 1e3 for name, h in hist.items()}
    print(f"median step time: tcgemm {med['tcgemm']:.3f} ms, jnp {med['jnp']:.3f} ms "
          f"(tcgemm/jnp = {med['tcgemm'] / med['jnp']:.3f}; first step, the compile, excluded)")
    ok, worst, fell = compare(hist, every)
    print(f"worst window difference {worst:.2e} (tolerance {RTOL:.2e} = 8 bf16 ulps); "
          f"loss fell 2x: {fell}")
    if n_tcgemm == 0:
        print("FAIL: the tcgemm model does not use tcgemm")
        return 1
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
