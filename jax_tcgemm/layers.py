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

`Fp8DotGeneralOp` drops in for `flax.linen.Fp8DotGeneralOp` (`nn.Dense(...,
dot_general_cls=layers.Fp8DotGeneralOp)`): the same variables and fp8 recipe, its three GEMMs
through `tg.scaled_matmul` (see its docstring).

This module imports flax; `import jax_tcgemm` does not import it.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.linen import fp8_ops  # the stock fp8 op: its variables and quantisers
from jax import lax

from .ops import gemm
from .problem import ACTIVATIONS, IN_DTYPES, OUT_DTYPES
from .scaled import FLOAT_OUT, scaled_matmul

__all__ = ["Dense", "Linear", "Fp8DotGeneralOp", "fp8_dot_general", "ACTIVATION_FNS"]

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


# ---------------------------------------------------------------------------------------------
# fp8: a drop-in for flax.linen.Fp8DotGeneralOp whose GEMMs are tg.scaled_matmul (issue 26).

def _f32(v):
    """float32 view of a scale / amax history (the stock ops' fm32 meta dtype included)."""
    return v if v.dtype == jnp.float32 else lax.convert_element_type(v, jnp.float32)


def _canon(x, k, dn):
    """dot_general(x, k, dn) as a batched matmul (B, M, K) @ (B, K, N): the permutations of x
    and k, their permuted shapes' splits and the sizes."""
    (xc, kc), (xb, kb) = dn
    xc, kc, xb, kb = map(tuple, (xc, kc, xb, kb))
    xf = tuple(i for i in range(x.ndim) if i not in xc + xb)
    kf = tuple(i for i in range(k.ndim) if i not in kc + kb)
    size = lambda a, dims: math.prod(a.shape[d] for d in dims)  # noqa: E731
    return dict(xperm=xb + xf + xc, kperm=kb + kc + kf, b=size(x, xb), m=size(x, xf),
                k=size(x, xc), n=size(k, kf),
                out_shape=tuple(x.shape[d] for d in xb + xf) + tuple(k.shape[d] for d in kf))


def _mm(a, b, sa, sb, out_dtype, transpose_b=False):
    """(B, M, K) @ (B, K, N) (or (B, N, K) with transpose_b) through tg.scaled_matmul, per-tensor
    scales; one call when B == 1, else vmapped over B (a batched b)."""
    f = functools.partial(scaled_matmul, a_scale=sa, b_scale=sb, out_dtype=out_dtype,
                          transpose_b=transpose_b)
    if a.shape[0] == 1:
        return f(a[0], b[0])[None]
    return jax.vmap(lambda a, b: f(a, b))(a, b)


def _uncanon(t, shape, perm):
    """t (B, P, Q) reshaped to `shape` permuted by perm, then put back in the original layout."""
    t = t.reshape(tuple(shape[d] for d in perm))
    return jnp.transpose(t, np.argsort(perm))


def _fp8_forward(dn, comp, e4m3, x, k, x_scale, x_hist, k_scale, k_hist):
    c = _canon(x, k, dn)
    # Delayed scaling: the scales come from the histories before this step's amax.
    sx, hx = fp8_ops.update_fp8_meta(x, e4m3, x_scale, x_hist)
    sk, hk = fp8_ops.update_fp8_meta(k, e4m3, k_scale, k_hist)
    qx = fp8_ops.quantize(x, e4m3, _f32(sx), comp)
    qk = fp8_ops.quantize(k, e4m3, _f32(sk), comp)
    a = jnp.transpose(qx, c["xperm"]).reshape(c["b"], c["m"], c["k"])
    b = jnp.transpose(qk, c["kperm"]).reshape(c["b"], c["k"], c["n"])
    y = _mm(a, b, _f32(sx), _f32(sk), comp).reshape(c["out_shape"])
    return y, (a, b, sx, hx, sk, hk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _fp8_dot(dn, comp, e4m3, e5m2, x, k, x_scale, x_hist, k_scale, k_hist, g_scale, g_hist):
    return _fp8_forward(dn, comp, e4m3, x, k, x_scale, x_hist, k_scale, k_hist)[0]


def _fp8_dot_fwd(dn, comp, e4m3, e5m2, x, k, x_scale, x_hist, k_scale, k_hist, g_scale, g_hist):
    y, res = _fp8_forward(dn, comp, e4m3, x, k, x_scale, x_hist, k_scale, k_hist)
    shapes = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype))
    return y, (res, g_scale, g_hist, shapes)


def _fp8_dot_bwd(dn, comp, e4m3, e5m2, saved, g):
    (a, b, sx, hx, sk, hk), g_scale, g_hist, (xs, ks) = saved
    sg, hg = fp8_ops.update_fp8_meta(g, e5m2, g_scale, g_hist)
    qg = fp8_ops.quantize(g, e5m2, _f32(sg), comp)
    nb, m, n = a.shape[0], a.shape[1], b.shape[2]
    g3 = qg.reshape(nb, m, n)
    dx = _mm(g3, b, _f32(sg), _f32(sk), comp, transpose_b=True)      # e5m2 x e4m3: (B, M, K)
    dk = _mm(jnp.swapaxes(a, 1, 2), g3, _f32(sx), _f32(sg), comp)    # e4m3 x e5m2: (B, K, N)
    c = _canon(xs, ks, dn)
    dx = _uncanon(dx, xs.shape, c["xperm"]).astype(xs.dtype)
    dk = _uncanon(dk, ks.shape, c["kperm"]).astype(ks.dtype)
    # The stock op's meta "gradients": the updated scales and histories (the training loop
    # overwrites the variables of the '_overwrite_with_gradient' collection with them).
    return dx, dk, sx, hx, sk, hk, sg, hg


_fp8_dot.defvjp(_fp8_dot_fwd, _fp8_dot_bwd)


def fp8_dot_general(x, k, dimension_numbers, *, input_scale, input_amax_history, kernel_scale,
                    kernel_amax_history, output_grad_scale, output_grad_amax_history,
                    e4m3_dtype=jnp.float8_e4m3fn, e5m2_dtype=jnp.float8_e5m2):
    """The function behind `Fp8DotGeneralOp`: dot_general(x, k, dimension_numbers) with the
    stock fp8 recipe, the GEMMs through tg.scaled_matmul. Computed in k.dtype (x cast to it).
    Under jax.grad the cotangents of the six meta arrays are their updated values."""
    comp = np.dtype(k.dtype)
    if comp not in FLOAT_OUT:
        raise TypeError(f"jax_tcgemm.layers.Fp8DotGeneralOp: the kernel dtype (the compute "
                        f"dtype) must be bfloat16, float16 or float32; got {comp}")
    e4m3, e5m2 = np.dtype(e4m3_dtype), np.dtype(e5m2_dtype)
    if (e4m3, e5m2) != (np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)):
        raise TypeError(f"jax_tcgemm.layers.Fp8DotGeneralOp: only float8_e4m3fn / float8_e5m2 "
                        f"(not the fnuz types of NANOOFp8DotGeneralOp); got {e4m3} / {e5m2}")
    x = jnp.asarray(x, comp)
    (xc, kc), (xb, kb) = dimension_numbers
    dn = ((tuple(xc), tuple(kc)), (tuple(xb), tuple(kb)))
    return _fp8_dot(dn, comp, e4m3, e5m2, x, k, input_scale, input_amax_history, kernel_scale,
                    kernel_amax_history, output_grad_scale, output_grad_amax_history)


# The stock class name: flax auto-names both Fp8DotGeneralOp_0 (the same variable paths).
class Fp8DotGeneralOp(fp8_ops.Fp8DotGeneralBase):
    """Drop-in for `flax.linen.Fp8DotGeneralOp`: `nn.Dense(..., dot_general_cls=
    layers.Fp8DotGeneralOp)`. Subclasses flax's `Fp8DotGeneralBase`, so its variables are the
    stock op's (collection '_overwrite_with_gradient': input / kernel / output_grad `_scale`
    (1,) float32, ones, and `_amax_history` (amax_history_length,) float32, zeros): a
    checkpoint of either loads into the other. Same recipe: delayed per-tensor scaling from
    the amax history, e4m3 operands forward, e5m2 output gradient backward, straight-through
    gradients, the updated scales / histories returned as those variables' gradients.

    Computation: the stock op fake-quantises (quantise, dequantise, then a dot in the compute
    dtype); this one quantises with flax's `fp8_ops.quantize` and multiplies the fp8 arrays
    with tg.scaled_matmul (per-tensor scales, float32 accumulation, one rounding to the
    compute dtype): forward e4m3 x e4m3, input gradient e5m2 x e4m3, kernel gradient
    e4m3 x e5m2. Same numbers up to float32 (bf16: compute-dtype) rounding. Like the stock op,
    `precision` and `preferred_element_type` are ignored and the result has the kernel's
    dtype."""

    def __call__(self, *args, **kwargs):
        assert len(args) == 3, "called as dot_general(x, kernel, dimension_numbers, ...)"
        x, k, dn = args
        return fp8_dot_general(
            x, k, dn, input_scale=self.input_scale.value,
            input_amax_history=self.input_amax_history.value,
            kernel_scale=self.kernel_scale.value,
            kernel_amax_history=self.kernel_amax_history.value,
            output_grad_scale=self.output_grad_scale.value,
            output_grad_amax_history=self.output_grad_amax_history.value,
            e4m3_dtype=self.e4m3_dtype, e5m2_dtype=self.e5m2_dtype)
