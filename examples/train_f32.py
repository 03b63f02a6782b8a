"""Train one float32 MLP twice at precision HIGHEST, from the same init on the same data: with
every product on our kernels (`flax.linen.Dense(dot_general=tg.dot_general)`: f16x3 on the
tensor cores of an H100 / H200, float32 accuracy) and with stock layers (XLA's float32 product
on the CUDA cores). Prints both loss curves side by side, their final values and the median
step time of each; exits 1 if the curves differ by more than the tolerance below, or if the
loss did not fall.

    python examples/train_f32.py                                        # CPU: 100 steps, ~10 s
    python examples/train_f32.py --width 4096 --batch 4096 --steps 200  # GPU (default 200 steps)

Everything is float32: weights, activations, Adam state, and every GEMM of the forward and
backward at lax.Precision.HIGHEST (issue 25: float32 accuracy, grads at the same algorithm).
On the CPU both sides compute lax's float32 product (our primitive's CPU lowering is lax).

Tolerance: both models compute each product to float32 accuracy (relative error ~1e-6 against
float64), differing only in summation order and the split's last bits; training feeds these
differences back into the weights, where they may grow, but a window-mean loss that differs by
more than 1e-3 relative is not float32 rounding. A defective product or gradient breaks
training far beyond that.
"""
from __future__ import annotations

import os
import sys

import flax.linen as nn
import jax
from jax import lax

import jax_tcgemm as tg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # examples/common.py
from common import OUT_FEATURES, mlp_args, mlp_verdict, train_pair  # noqa: E402

RTOL = 1e-3  # see the module docstring


class MLP(nn.Module):
    width: int
    depth: int
    ours: bool = False  # every Dense through tg.dot_general, or stock

    @nn.compact
    def __call__(self, x):
        kw = dict(precision=lax.Precision.HIGHEST)
        if self.ours:
            kw["dot_general"] = tg.dot_general
        for i in range(self.depth):  # explicit names: the same tree in both models
            x = nn.gelu(nn.Dense(self.width, name=f"Dense_{i}", **kw)(x))
        return nn.Dense(OUT_FEATURES, name=f"Dense_{self.depth}", **kw)(x)


def train_both(steps, batch_size, width, depth=3, seed=0, lr=1e-3):
    """Trains the tcgemm and the stock model in lockstep (common.train_pair); returns
    {name: (losses, seconds)} and the numbers of tcgemm and of dot_general equations in the
    tcgemm model's gradient."""
    models = {"tcgemm": MLP(width, depth, ours=True), "jnp": MLP(width, depth)}
    return train_pair(models, steps, batch_size, width, seed, lr)


def main(argv=None) -> int:
    args = mlp_args(__doc__, argv, 200, 10)
    lr = args.lr
    print(f"backend {jax.default_backend()}: MLP {args.depth}x{args.width} -> {OUT_FEATURES}, "
          f"batch {args.batch}, {args.steps} Adam steps (lr {lr:g}), float32 at precision "
          "HIGHEST; nn.Dense(dot_general=tg.dot_general) (tcgemm) vs nn.Dense (jnp)")
    hist, n_tcgemm, n_dot = train_both(args.steps, args.batch, args.width, args.depth,
                                       args.seed, lr)
    return mlp_verdict(hist, n_tcgemm, n_dot, args, RTOL)

if __name__ == "__main__":
    sys.exit(main())
