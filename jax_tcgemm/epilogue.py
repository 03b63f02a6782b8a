"""The epilogue's semantics in lax: activations, their derivatives, and the float32 formula

    pre = alpha * acc + beta * c + bias        d = act(pre)        (each rounded once)

that the kernels implement (ffi/kernels/common/epilogue.cuh). Used by the reference lowering
(primitive.reference), by the K-sharded partition (sharding.py), after its psum, and by
tg.scaled_matmul's lax path (scaled.py). Below it, the epilogue's operand rules (c's broadcast
forms, bias, activation names, alpha / beta) shared by tg.gemm and tg.scaled_matmul.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .problem import ACTIVATIONS, C_DTYPES


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
        return _silu(x)
    raise ValueError(f"unknown activation {name!r}")


@jax.custom_jvp
def _silu(x):
    return x / (1.0 + jnp.exp(-x))


@_silu.defjvp
def _silu_jvp(primals, tangents):
    """The kernels' derivative, s (1 + x (1 - s)) with s = sigmoid(x): finite where exp(-x)
    overflows (x < -88), where the quotient's own derivative is inf / inf = NaN."""
    (x,), (t,) = primals, tangents
    s = jax.nn.sigmoid(x)
    return _silu(x), t * (s * (1.0 + x * (1.0 - s)))


def activate_grad(name, x):
    """d act / dx at float32 x (epilogue.cuh, activate_grad), elementwise (shards follow)."""
    if name == "none":
        return jnp.ones_like(x)
    if name == "relu":
        return (x > 0).astype(x.dtype)
    return jax.jvp(functools.partial(activate, name), (x,), (jnp.ones_like(x),))[1]


def apply(acc, c, bias, scale, *, alpha, beta, activation, out_dtype, aux, **_):
    """The epilogue on the float32 product acc (B, M, N): [d] or [d, pre] (aux), rounded once.
    c broadcasts to acc; bias is (1 | B, N), added in float32; scale, when given, is [alpha,
    beta]."""
    al, be = (scale[0], scale[1]) if scale is not None else (alpha, beta)
    pre = acc * al
    if c is not None:
        pre = pre + be * c.astype(jnp.float32)
    if bias is not None:
        pre = pre + bias.astype(jnp.float32)[:, None, :]
    d = activate(activation, pre).astype(out_dtype)
    return [d, pre.astype(out_dtype)] if aux else [d]


# ---------------------------------------------------------------------------------------------
# The epilogue's operand rules, shared by the public functions that take an epilogue
# (tg.gemm, tg.scaled_matmul): one copy of each check and normalisation. `fn` names the caller
# in the error messages; `desc` describes its operands.

def check_activation(activation, fn):
    """None or a name of problem.ACTIVATIONS (ValueError otherwise)."""
    if activation is not None and activation not in ACTIVATIONS[1:]:
        raise ValueError(f"jax_tcgemm.{fn}: unknown activation {activation!r}; use None or one "
                         f"of {ACTIVATIONS[1:]}")
    return activation


def scalar_param(x, name, fn):
    """(static Python float, None) or (None, float32 scalar array) for alpha / beta."""
    if isinstance(x, (bool, int, float, np.floating, np.integer)) and not isinstance(x, np.ndarray):
        return float(x), None
    x = jnp.asarray(x)
    if x.shape != ():
        raise ValueError(f"jax_tcgemm.{fn}: {name} must be a scalar; got shape {x.shape}")
    return None, x.astype(jnp.float32)


def scale_operand(alpha, beta, fn):
    """(alpha, beta, scale) as apply / tcgemm_p take them: static floats, or 1.0, 0.0 and the
    float32 pair [alpha, beta] when either is traced."""
    al, al_arr = scalar_param(alpha, "alpha", fn)
    be, be_arr = scalar_param(beta, "beta", fn)
    if al_arr is None and be_arr is None:
        return al, be, None
    scale = jnp.stack([jnp.float32(al) if al_arr is None else al_arr,
                       jnp.float32(be) if be_arr is None else be_arr])
    return 1.0, 0.0, scale


def c_operand(c, out_shape, out_dtype, fn, desc):
    """c (any array broadcastable to the result out_shape = batch + (M, N), of out_dtype or
    float32) as (Bc, Mc, Nc) with Bc 1 or prod(batch) and Mc, Nc 1 or M, N: full, per-row
    (M, 1), per-column (N,), with or without batch dims; a partly broadcast batch is
    materialised."""
    c = jnp.asarray(c)
    if np.dtype(c.dtype) not in (np.dtype(out_dtype), np.dtype(np.float32)):
        raise TypeError(f"jax_tcgemm.{fn}: c must be of out_dtype ({np.dtype(out_dtype)}) or "
                        f"float32; got {c.dtype}")
    out_shape = tuple(out_shape)
    try:
        if jnp.broadcast_shapes(c.shape, out_shape) != out_shape:
            raise ValueError
    except ValueError:
        raise ValueError(f"jax_tcgemm.{fn}: c{c.shape} does not broadcast to the result "
                         f"{out_shape} ({desc})") from None
    batch = out_shape[:-2]
    bsz = math.prod(batch)
    cf = c.reshape((1,) * (len(out_shape) - c.ndim) + c.shape)
    cb = cf.shape[:-2]
    if math.prod(cb) != 1 and cb != batch:  # partly broadcast batch: materialised
        cf = jnp.broadcast_to(cf, batch + cf.shape[-2:])
    return cf.reshape((1 if math.prod(cf.shape[:-2]) == 1 else bsz,) + cf.shape[-2:])


def bias_operand(bias, n, fn, desc):
    """bias (N,) of a floating dtype as (1, N): float16, bfloat16 and float32 as they are (the
    kernels read them; no conversion pass before the product), others as float32."""
    bias = jnp.asarray(bias)
    if bias.shape != (n,):
        raise ValueError(f"jax_tcgemm.{fn}: bias must have shape ({n},) (N); got "
                         f"{bias.shape} {bias.dtype} ({desc})")
    if not jnp.issubdtype(bias.dtype, jnp.floating):
        raise TypeError(f"jax_tcgemm.{fn}: bias must be floating; got {bias.dtype}")
    return kernel_bias(bias).reshape(1, n)


def kernel_bias(bias):
    """A floating bias as the kernels read it: float16, bfloat16 and float32 as they are (no
    conversion pass before the product), other float types as float32."""
    return bias if np.dtype(bias.dtype) in C_DTYPES else bias.astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# Cotangents of the backward products (the transpose rules of tcgemm_p and tcgemm_ragged_p).

def narrow_cotangent(ct, dtype):
    """(g, inv): the cotangent ct as the operand dtype of a backward product, and the float32
    scalar that product must be multiplied by (None: 1). lax multiplies a float32 cotangent in
    float32; cast to float16 as it is, its small values would flush to 0 and its large ones
    overflow to inf. So a cotangent of a wider range than float16 (float32, bfloat16) is first
    scaled by the power of two that puts its largest finite magnitude in [2^14, 2^15): exact,
    and the product's own float32 epilogue undoes it (alpha * inv). bfloat16 and float32
    operands have float32's exponent range and take ct as it is."""
    dtype = np.dtype(dtype)
    if dtype != np.dtype(jnp.float16) or np.dtype(ct.dtype) == dtype:
        return ct.astype(dtype), None
    x = ct.astype(jnp.float32)
    top = jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0))
    _, e = jnp.frexp(top)                 # top = f * 2^e, f in [0.5, 1); frexp(0) = (0, 0)
    p = jnp.clip(15 - e, -126, 126)        # 2^p and 2^-p both normal float32
    return (x * jnp.ldexp(jnp.float32(1.0), p)).astype(dtype), jnp.ldexp(jnp.float32(1.0), -p)
