"""Flax layers whose bias and activation run in the GEMM's epilogue (one `tg.gemm` launch).

    from jax_tcgemm import layers
    y = layers.Dense(1024, activation="gelu_tanh", dtype=jnp.bfloat16).apply(params, x)  # linen
    lin = layers.Linear(512, 1024, activation="relu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))

`Dense` is a `flax.linen.Dense` and `Linear` a `flax.nnx.Linear`, with the same parameters
(names, shapes, initializers, RNG use): 'kernel' (in, features) and 'bias' (features,), so
checkpoints interchange with the stock layers. They compute activation(x @ kernel + bias), the
stock layer followed by the activation:

- activation: None, "relu", "gelu" (exact, erf: `jax.nn.gelu(approximate=False)`; note that
  `flax.linen.gelu` defaults to the tanh form), "gelu_tanh" or "silu".
- dtype / param_dtype as in flax: inputs, kernel and bias are promoted to `dtype` (the layer's
  `promote_dtype`). When they come out float16 or bfloat16, the product, the bias and the
  activation are one `tg.gemm` call, computed in float32 from the accumulator and rounded once
  (the stock layer rounds the product, then the sum); under `jax.grad` the backward is our
  kernels too. Otherwise (float32 and other dtypes), or with a custom `dot_general`, the layer
  computes the stock way: `dot_general`, then `+ bias`, then the activation.

This module imports flax; `import jax_tcgemm` does not import it.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from jax import lax

from .ops import gemm
from .problem import ACTIVATIONS, IN_DTYPES, OUT_DTYPES

__all__ = ["Dense", "Linear", "ACTIVATION_FNS"]

ACTIVATION_FNS = {  # the stock activation each name means
    None: lambda y: y,
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
}


def _check_activation(activation):
    if activation is not None and activation not in ACTIVATIONS[1:]:
        raise ValueError(f"jax_tcgemm.layers: unknown activation {activation!r}; use None or "
                         f"one of {ACTIVATIONS[1:]}")


def _apply(inputs, kernel, bias, activation, dot_general, precision, **dot_kw):
    """activation(inputs @ kernel + bias) on promoted operands: one tg.gemm where it can (both
    float16 or both bfloat16, no custom dot_general), else the stock composite."""
    _check_activation(activation)
    out_dtype = dot_kw.get("preferred_element_type")
    fused = (dot_general is None and inputs.dtype == kernel.dtype
             and np.dtype(inputs.dtype) in IN_DTYPES
             and (out_dtype is None or np.dtype(out_dtype) in OUT_DTYPES))
    if not fused:
        dot_general = lax.dot_general if dot_general is None else dot_general
        y = dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())),
                        precision=precision, **dot_kw)
        if bias is not None:
            y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        return ACTIVATION_FNS[activation](y)
    lead, k = inputs.shape[:-1], inputs.shape[-1]
    y = gemm(inputs.reshape(-1, k), kernel, bias=bias, activation=activation,
             out_dtype=out_dtype, precision=precision)  # leading dims folded into M
    y = y.reshape(lead + (kernel.shape[-1],))
    if dot_kw.get("out_sharding") is not None:
        y = jax.sharding.reshard(y, dot_kw["out_sharding"])
    return y


class Dense(nn.Dense):
    """`flax.linen.Dense` with the bias and `activation` fused into one tg.gemm (module
    docstring). Same fields as nn.Dense, plus `activation` (None, "relu", "gelu", "gelu_tanh",
    "silu"). A `dot_general` / `dot_general_cls` given makes it the stock computation."""

    activation: str | None = None

    @nn.compact
    def __call__(self, inputs):
        _check_activation(self.activation)
        kernel = self.param("kernel", self.kernel_init, (jnp.shape(inputs)[-1], self.features),
                            self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        dot_general = (self.dot_general_cls() if self.dot_general_cls is not None
                       else self.dot_general)
        return _apply(inputs, kernel, bias, self.activation, dot_general, self.precision)


class Linear(nnx.Linear):
    """`flax.nnx.Linear` with the bias and `activation` fused into one tg.gemm (module
    docstring). Same arguments as nnx.Linear, plus `activation` (None, "relu", "gelu",
    "gelu_tanh", "silu"). A `dot_general` other than lax.dot_general makes it the stock
    computation; `out_sharding` and `preferred_element_type` mean what they mean there."""

    def __init__(self, in_features: int, out_features: int, *, activation: str | None = None,
                 **kwargs):
        _check_activation(activation)
        super().__init__(in_features, out_features, **kwargs)
        self.activation = activation

    def __call__(self, inputs, out_sharding=None):
        kernel = self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
        dot_kw = {"out_sharding": out_sharding}
        if self.preferred_element_type is not None:
            dot_kw["preferred_element_type"] = self.preferred_element_type
        dot_general = None if self.dot_general is lax.dot_general else self.dot_general
        return _apply(inputs, kernel, bias, self.activation, dot_general, self.precision,
                      **dot_kw)
