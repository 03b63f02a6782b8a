"""Train one mixture-of-experts model twice, from the same init on the same data: with its
experts through tg.ragged_gemm / tg.ragged_dot (our grouped kernel: the first expert matrix
with the SiLU fused, the backward on our kernels too) and through lax.ragged_dot (the stock
way). Same parameter tree, so one init serves both. Prints both loss curves side by side, the
final values and the median step time of each; exits 1 if the curves differ by more than the
tolerance below, if the loss did not fall, or if the tcgemm model's gradient still holds a
lax ragged_dot.

    python examples/moe.py                                                # CPU: ~20 s
    python examples/moe.py --tokens 8192 --dim 2048 --hidden 5632 --steps 300   # GPU

The layer (flax.linen): a linear router picks the top-k of E experts per token (softmax
weights over the k chosen); the T*k (token, expert) assignments are sorted by expert (a
stable argsort: the token permutation), so each expert's tokens are contiguous rows and the
group sizes are the experts' token counts; the experts run as two grouped products,
h = silu(x_sorted @ W1[e]) and y = h @ W2[e]; the rows are put back in token order (the
inverse permutation) and combined with the router weights. Around it: an input projection, a
residual, and an output projection; the task regresses y = sin(x T) for a fixed random T.

Precision: the usual mixed-precision recipe. Weights and Adam state are float32; the experts'
operands are cast to bfloat16 and each grouped product accumulates in float32 (ours rounds
silu(x W1) once; lax rounds x W1 to bf16 and applies the SiLU to that). Routing is discrete: a
token whose two best experts score within a rounding of each other may pick differently in the
two models, which moves the loss a little. The curves are compared as window means (as
examples/train_mlp.py does); a difference beyond 8 bf16 ulps (3.1%) is not rounding any more,
while a wrong gradient or permutation breaks training outright.
"""
from __future__ import annotations

import argparse
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax import lax

import jax_tcgemm as tg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # examples/common.py
from common import (OUT_FEATURES, count_eqns, make_step, report, teacher,  # noqa: E402
                    train_lockstep)

BF16_ULP = 2.0 ** -8
RTOL = 8 * BF16_ULP


def tcgemm_experts(x, w1, w2, sizes):
    return tg.ragged_dot(tg.ragged_gemm(x, w1, sizes, activation="silu"), w2, sizes)


def lax_experts(x, w1, w2, sizes):
    return lax.ragged_dot(jax.nn.silu(lax.ragged_dot(x, w1, sizes)), w2, sizes)


class MoE(nn.Module):
    experts: int
    hidden: int
    top_k: int
    expert_fn: object  # (x_sorted, w1, w2, group_sizes) -> y_sorted, in bfloat16

    @nn.compact
    def __call__(self, x):
        t, d = x.shape
        logits = nn.Dense(self.experts, use_bias=False, name="router")(x)
        weights, expert = lax.top_k(logits, self.top_k)                # (T, k)
        weights = jax.nn.softmax(weights, axis=-1)
        flat = expert.reshape(-1)                                      # (T * k,) assignments
        order = jnp.argsort(flat, stable=True)                         # sorted by expert
        sizes = jnp.bincount(flat, length=self.experts).astype(jnp.int32)
        tokens = order // self.top_k                                   # token of each row
        init = nn.initializers.lecun_normal(in_axis=1, out_axis=2, batch_axis=0)
        w1 = self.param("w1", init, (self.experts, d, self.hidden), jnp.float32)
        w2 = self.param("w2", init, (self.experts, self.hidden, d), jnp.float32)
        bf = jnp.bfloat16
        y = self.expert_fn(x[tokens].astype(bf), w1.astype(bf), w2.astype(bf), sizes)
        y = jnp.zeros_like(y).at[order].set(y)                         # back in token order
        return jnp.einsum("tkd,tk->td", y.reshape(t, self.top_k, d).astype(jnp.float32),
                          weights)


class Model(nn.Module):
    dim: int
    experts: int
    hidden: int
    top_k: int
    expert_fn: object

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(self.dim, name="embed")(x)
        h = h + MoE(self.experts, self.hidden, self.top_k, self.expert_fn, name="moe")(
            nn.LayerNorm(name="norm")(h))
        return nn.Dense(OUT_FEATURES, name="head")(h)


def train_both(args, lr):
    """Trains the tcgemm and the lax model in lockstep; {name: (losses, seconds)} and the
    tcgemm model's gradient's counts of tcgemm_ragged and ragged_dot_general equations."""
    k_init, k_teacher, k_data = jax.random.split(jax.random.PRNGKey(args.seed), 3)
    t = teacher(k_teacher, args.dim)
    models = {name: Model(args.dim, args.experts, args.hidden, args.top_k, fn)
              for name, fn in (("tcgemm", tcgemm_experts), ("lax", lax_experts))}
    x0 = jnp.zeros((args.tokens, args.dim), jnp.float32)
    params = jax.jit(models["lax"].init)(k_init, x0)
    opt = optax.adam(lr)
    state = {name: (params, opt.init(params)) for name in models}
    step = {name: make_step(m, opt, t, args.tokens, args.dim) for name, m in models.items()}
    grad = jax.grad(lambda p, x: jnp.sum(models["tcgemm"].apply(p, x)))
    jaxpr = jax.make_jaxpr(grad)(params, x0).jaxpr
    counts = count_eqns(jaxpr, "tcgemm_ragged"), count_eqns(jaxpr, "ragged_dot_general")
    hist, _ = train_lockstep(step, state, k_data, args.steps)
    return hist, counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    on_gpu = jax.default_backend() == "gpu"
    ap.add_argument("--steps", type=int, default=300 if on_gpu else 150)
    ap.add_argument("--tokens", type=int, default=4096 if on_gpu else 256)
    ap.add_argument("--dim", type=int, default=1024 if on_gpu else 64)
    ap.add_argument("--hidden", type=int, default=2816 if on_gpu else 128)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None, help="Adam (default 3e-3 * sqrt(64/dim))")
    ap.add_argument("--every", type=int, default=0, help="print interval (default steps/15)")
    args = ap.parse_args(argv)
    every = args.every or max(1, args.steps // 15)
    lr = args.lr or 3e-3 * min(1.0, (64 / args.dim) ** 0.5)
    print(f"backend {jax.default_backend()}: MoE of {args.experts} experts (top {args.top_k}), "
          f"dim {args.dim}, hidden {args.hidden}, {args.tokens} tokens a batch, {args.steps} "
          f"Adam steps (lr {lr:g}); experts through tg.ragged_gemm + tg.ragged_dot (tcgemm) vs "
          "lax.ragged_dot (lax), bf16 operands, float32 weights")
    hist, (n_ours, n_lax) = train_both(args, lr)
    print(f"equations in the tcgemm model's gradient: tcgemm_ragged {n_ours}, ragged_dot_general "
          f"{n_lax} (expected 6 and 0: two expert products forward, four backward)")
    ok = report(hist, "lax", every, args.steps, RTOL, " = 8 bf16 ulps")
    if n_ours != 6 or n_lax:
        print("FAIL: the tcgemm model's expert products are not all tcgemm_ragged")
        return 1
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
