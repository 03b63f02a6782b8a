"""Train one MLP twice, from the same init on the same data: with flax's stock fp8 op
(`nn.Dense(..., dot_general_cls=flax.linen.Fp8DotGeneralOp)`) and with ours
(`dot_general_cls=jax_tcgemm.layers.Fp8DotGeneralOp`: the same variables and recipe, its GEMMs
through `tg.scaled_matmul`). Prints both loss curves side by side and the median step time of
each; exits 1 if the curves differ by more than the tolerance below, or if the loss did not
fall.

    python examples/train_fp8.py                                        # CPU: 60 steps, seconds
    python examples/train_fp8.py --width 4096 --batch 4096 --steps 300  # GPU sizes

The recipe (both models): every Dense quantises its input and kernel to float8_e4m3fn with
per-tensor scales from a delayed amax history, and in the backward the output gradient to
float8_e5m2; the updated scales / histories come back as the gradients of the
'_overwrite_with_gradient' collection, which the step writes over the old values (as flax's fp8
recipe expects). Weights, Adam state and the compute dtype are float32 (--bf16: the Dense layers
compute in bfloat16). The task: regress y = sin(x T) for a fixed random T, x ~ N(0, 1).

Tolerance: both models quantise the same values with the same scales; the stock op multiplies
the dequantised float32 (bf16) operands, ours the fp8 ones with the scales applied to the float32
accumulator. Per step the two differ by float32 rounding (a few 2^-24 relative; with --bf16 a few
2^-8), which can move a value across an fp8 rounding boundary now and then, and training feeds
the differences back. So the window-mean losses are compared at RTOL = 1% (float32) or 3.1%
(8 bf16 ulps, --bf16); a wrong scale, a missing e5m2 quantisation or a transposed gradient is far
beyond that, and breaks training outright.

Step times: on an H100/H200 (compute capability 9.0, K a multiple of 16) our op's products run
on the sm90 fp8 kernels, the stock op's are XLA's products of the dequantised operands; on other
devices tg.scaled_matmul runs through XLA as well (float32-accumulated fp8 products).
"""
from __future__ import annotations

import argparse
import os
import functools
import sys
import warnings
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.linen import fp8_ops

from jax_tcgemm import layers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # examples/common.py
from common import OUT_FEATURES, make_step, report, teacher, train_lockstep  # noqa: E402

OWG = fp8_ops.OVERWRITE_WITH_GRADIENT  # the fp8 meta collection
RTOL_F32, RTOL_BF16 = 1e-2, 8 * 2.0 ** -8  # see the module docstring
OPS = {"tcgemm": layers.Fp8DotGeneralOp, "stock": fp8_ops.Fp8DotGeneralOp}


class MLP(nn.Module):
    width: int
    depth: int
    op: Any  # the dot_general_cls: a Module class or a functools.partial of one
    dtype: type = jnp.float32

    @nn.compact
    def __call__(self, x):
        kw = dict(dtype=self.dtype, param_dtype=jnp.float32, dot_general_cls=self.op)
        for i in range(self.depth):
            x = nn.gelu(nn.Dense(self.width, name=f"Dense_{i}", **kw)(x))
        return nn.Dense(OUT_FEATURES, name=f"Dense_{self.depth}", **kw)(x)


def train_both(steps, batch_size, width, depth=2, seed=0, lr=1e-3, dtype=jnp.float32,
               history=16):
    """Trains both models in lockstep; returns {name: (losses, seconds)} and the final
    variables of each."""
    key = jax.random.PRNGKey(seed)
    k_init, k_teacher, k_data = jax.random.split(key, 3)
    t = teacher(k_teacher, width)
    models = {name: MLP(width, depth, functools.partial(op, amax_history_length=history), dtype)
              for name, op in OPS.items()}
    x0 = jnp.zeros((1, width), jnp.float32)
    with warnings.catch_warnings():  # flax deprecates the stock op (for Fp8DirectDotGeneralOp)
        warnings.simplefilter("ignore", DeprecationWarning)
        variables = jax.jit(models["stock"].init)(k_init, x0)
        ours = jax.eval_shape(models["tcgemm"].init, k_init, x0)
    assert jax.tree.structure(ours) == jax.tree.structure(variables)  # one init serves both
    opt = optax.adam(lr)
    state = {name: (variables, opt.init(variables["params"])) for name in models}
    step = {name: make_step(m, opt, t, batch_size, width, meta=OWG) for name, m in models.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        hist, state = train_lockstep(step, state, k_data, steps)
    return hist, {name: s[0] for name, s in state.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2, help="hidden layers")
    ap.add_argument("--history", type=int, default=16, help="amax history length")
    ap.add_argument("--bf16", action="store_true", help="compute dtype bfloat16 (else float32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--every", type=int, default=0, help="print interval (default steps/12)")
    args = ap.parse_args(argv)
    every = args.every or max(1, args.steps // 12)
    dtype, rtol = (jnp.bfloat16, RTOL_BF16) if args.bf16 else (jnp.float32, RTOL_F32)
    print(f"backend {jax.default_backend()}: MLP {args.depth}x{args.width} -> {OUT_FEATURES}, "
          f"batch {args.batch}, {args.steps} Adam steps (lr {args.lr:g}), fp8 Dense layers "
          f"(e4m3 forward, e5m2 output gradient, amax history {args.history}), compute "
          f"{jnp.dtype(dtype).name}: layers.Fp8DotGeneralOp (tcgemm) vs "
          "flax.linen.Fp8DotGeneralOp (stock)")
    hist, _ = train_both(args.steps, args.batch, args.width, args.depth, args.seed, args.lr,
                         dtype, args.history)
    ok = report(hist, "stock", every, args.steps, rtol)
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
