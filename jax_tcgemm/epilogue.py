"""The epilogue's semantics in lax: activations, their derivatives, and the float32 formula

    pre = alpha * acc + beta * c + bias        d = act(pre)        (each rounded once)

that the kernels implement (ffi/kernels/common/epilogue.cuh). Used by the reference lowering
(primitive.reference) and by the K-sharded partition (sharding.py), after its psum.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def activate(name, x):
    """The epilogue's activation on float32 x (epilogue.cuh, activate)."""
    if name == "none":
        return x
    if name == "relu":
        return jnp.where(x < 0, jnp.zeros_like(x), x)
    if name == "gelu":
        return jax.nn.gelu(x, approximate=False)
    if name == "gelu_tanh":
        return jax.nn.gelu(x, approximate=True)
    if name == "silu":
        return x / (1.0 + jnp.exp(-x))
    raise ValueError(f"unknown activation {name!r}")


def activate_grad(name, x):
    """d act / dx at float32 x (epilogue.cuh, activate_grad), elementwise (shards follow)."""
    if name == "none":
        return jnp.ones_like(x)
    if name == "relu":
        return (x > 0).astype(x.dtype)
    return jax.jvp(functools.partial(activate, name), (x,), (jnp.ones_like(x),))[1]


def apply(acc, c, bias, scale, *, alpha, beta, activation, out_dtype, aux, **_):
    """The epilogue on the float32 product acc (B, M, N): [d] or [d, pre] (aux), rounded once.
    c broadcasts to acc; bias is (1 | B, N) float32; scale, when given, is [alpha, beta]."""
    al, be = (scale[0], scale[1]) if scale is not None else (alpha, beta)
    pre = acc * al
    if c is not None:
        pre = pre + be * c.astype(jnp.float32)
    if bias is not None:
        pre = pre + bias[:, None, :]
    d = activate(activation, pre).astype(out_dtype)
    return [d, pre.astype(out_dtype)] if aux else [d]
