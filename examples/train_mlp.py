"""Train one MLP twice, from the same init on the same data: with the fused layers of
`jax_tcgemm.layers` (`Dense(width, activation="gelu_tanh")`: x @ W + b and the GELU in one
tg.gemm launch, and our kernels in the backward) and with stock layers (`flax.linen.Dense`
followed by `nn.gelu`). Same parameter tree, so one init serves both. Prints both loss curves
side by side, their final values and the median step time of each; exits 1 if the curves
differ by more than the bf16 tolerance below, or if the loss did not fall.

    python examples/train_mlp.py                                        # CPU: 100 steps, ~10 s
    python examples/train_mlp.py --width 4096 --batch 4096 --steps 300  # GPU (default 300 steps)

Precision: the usual mixed-precision recipe. Weights and Adam state are float32; every Dense
casts its input and kernel to bfloat16, and its GEMM (forward and both gradients) runs in
bfloat16 with float32 accumulation (the cotangent is rounded to bfloat16 before each gradient
GEMM, in both models). The task: regress y = sin(x T) for a fixed random T, x ~ N(0, 1).

Tolerance: at equal weights the two models differ in the GEMMs' summation order and in
rounding: the stock layer rounds x @ W to bf16, adds the bias in bf16 and applies the GELU to
that, the fused one rounds once, after the GELU (float32 from the accumulator). So each bf16
layer output differs by a few bf16 ulps (2^-8 relative) at most, and the loss, a mean over many
such elements, by far less. Training feeds these differences back into the weights, where they
can grow; a window-mean loss that differs by more than 8 ulps (8 * 2^-8 = 3.1%) is not bf16
rounding any more. A defective gradient (a wrong layout flag, a dropped batch reduction) breaks
training outright, far beyond that. Losses are compared as means over each print window (not
per step), which removes step-to-step noise without hiding a drift.
"""
from __future__ import annotations

import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax_tcgemm import layers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # examples/common.py
from common import OUT_FEATURES, mlp_args, mlp_verdict, train_pair  # noqa: E402

BF16_ULP = 2.0 ** -8
RTOL = 8 * BF16_ULP  # see the module docstring


class MLP(nn.Module):
    width: int
    depth: int
    fused: bool = False  # layers.Dense with the GELU fused, or nn.Dense then nn.gelu (stock)

    @nn.compact
    def __call__(self, x):
        kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.float32)
        for i in range(self.depth):  # explicit names: the same tree in both models
            if self.fused:
                x = layers.Dense(self.width, activation="gelu_tanh", name=f"Dense_{i}", **kw)(x)
            else:
                x = nn.gelu(nn.Dense(self.width, name=f"Dense_{i}", **kw)(x))  # tanh form
        cls = layers.Dense if self.fused else nn.Dense
        return cls(OUT_FEATURES, name=f"Dense_{self.depth}", **kw)(x)


def train_both(steps, batch_size, width, depth=3, seed=0, lr=1e-3):
    """Trains the tcgemm and the stock model in lockstep (common.train_pair); returns
    {name: (losses, seconds)} and the numbers of tcgemm and of dot_general equations in the
    tcgemm model's gradient."""
    models = {"tcgemm": MLP(width, depth, fused=True), "jnp": MLP(width, depth)}
    x = jnp.zeros((1, width), jnp.float32)
    key = jax.random.split(jax.random.PRNGKey(seed), 3)[0]  # train_pair's init key
    trees = [jax.eval_shape(m.init, key, x) for m in models.values()]
    assert jax.tree.structure(trees[0]) == jax.tree.structure(trees[1])  # one init serves both
    return train_pair(models, steps, batch_size, width, seed, lr)


def main(argv=None) -> int:
    args = mlp_args(__doc__, argv, 300, 15)
    lr = args.lr
    print(f"backend {jax.default_backend()}: MLP {args.depth}x{args.width} -> {OUT_FEATURES}, "
          f"batch {args.batch}, {args.steps} Adam steps (lr {lr:g}), bf16 GEMMs, float32 weights;"
          " fused layers (tcgemm) vs nn.Dense + nn.gelu (jnp)")
    hist, n_tcgemm, n_dot = train_both(args.steps, args.batch, args.width, args.depth,
                                       args.seed, lr)
    return mlp_verdict(hist, n_tcgemm, n_dot, args, RTOL, " = 8 bf16 ulps")

if __name__ == "__main__":
    sys.exit(main())
