"""float32 products on the tensor cores (issue 25): the operand splits of the algorithms of
problem.f32_algorithm, in XLA ops, and the one concatenated product each becomes.

A multi-pass algorithm is one GEMM over a longer K: the operands' parts are laid side by side
along K so that one accumulator sums every product of parts (sum_k a_i[m, k] b_j[k, n] for the
algorithm's pairs (i, j), smaller terms first), e.g. 3xTF32:

    a' = [a_lo | a_hi | a_hi]    b' = [b_hi | b_lo | b_hi]    a' @ b' = a_lo b_hi + a_hi b_lo + a_hi b_hi

TF32 parts stay float32 (the TF32 kernels read float32 and use its 10 high mantissa bits: the
parts are rounded to exactly those); bfloat16 parts run on the bfloat16 kernels. Splitting
rounds to nearest, so each part is the operand's best approximation at that width and the
remainder is exact in float32 (Markidis et al., "NVIDIA Tensor Core Programmability,
Performance & Precision", 2018; CUTLASS example 27). Non-finite values stay in the big part
(their remainders are 0), so infinities and NaNs propagate as in float32.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

# (part of a, part of b) per product, 0 = the biggest part, smaller terms first.
TERMS = {
    "tf32": ((0, 0),),
    "tf32x3": ((1, 0), (0, 1), (0, 0)),
    "bf16": ((0, 0),),
    "bf16x3": ((1, 0), (0, 1), (0, 0)),
    "bf16x6": ((2, 0), (1, 1), (0, 2), (1, 0), (0, 1), (0, 0)),
    "bf16x9": ((2, 2), (2, 1), (1, 2), (2, 0), (1, 1), (0, 2), (1, 0), (0, 1), (0, 0)),
}


def _round(x, half, mask):
    """float32 x rounded to nearest at the bits of `mask` (half: half a unit, or a function of
    the bits giving it), in float32; truncated where rounding would overflow; infinities and
    NaNs as they are. Integer ops, not a convert pair: XLA may remove float32 -> bfloat16 ->
    float32 round trips (excess precision), which would make every remainder 0."""
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    m = jnp.uint32(mask)
    y = lax.bitcast_convert_type((bits + half(bits)) & m, jnp.float32)
    cut = lax.bitcast_convert_type(bits & m, jnp.float32)
    return jnp.where(jnp.isfinite(y), y, jnp.where(jnp.isfinite(x), cut, x))


def tf32_round(x):
    """float32 x rounded to the nearest TF32 value (10 mantissa bits; ties away from zero)."""
    return _round(x, lambda bits: jnp.uint32(0x1000), 0xFFFFE000)


def bf16_round(x):
    """float32 x rounded to the nearest bfloat16 value (ties to even)."""
    return _round(x, lambda bits: jnp.uint32(0x7FFF) + ((bits >> 16) & jnp.uint32(1)),
                  0xFFFF0000)


def parts(x, algo):
    """The parts of float32 operand x that algorithm `algo` multiplies, biggest first: TF32
    values in float32 for "tf32*", bfloat16 arrays for "bf16*"."""
    count = 1 + max(i for t in TERMS[algo] for i in t)
    finite = jnp.isfinite(x)
    out, rest = [], x
    for i in range(count):
        if algo.startswith("tf32"):
            p = rest if count == 1 else tf32_round(rest)  # one pass: the kernel reads x as is
            wide = p
        else:  # exact in bfloat16: the conversion only narrows the type
            wide = bf16_round(rest)
            p = wide.astype(jnp.bfloat16)
        out.append(p)
        if i + 1 < count:
            rest = jnp.where(finite, rest - wide, 0.0)  # exact in float32
    return out


def concat_operands(a, b, algo, k_axis_a, k_axis_b):
    """(a', b'): the parts of a and b side by side along their K axes, one block of K per
    product of TERMS[algo], so that a' @ b' is the algorithm's sum."""
    pa, pb = parts(a, algo), parts(b, algo)
    terms = TERMS[algo]
    if len(terms) == 1:
        return pa[0], pb[0]
    return (jnp.concatenate([pa[i] for i, _ in terms], axis=k_axis_a),
            jnp.concatenate([pb[j] for _, j in terms], axis=k_axis_b))


def concat_k(k, algo):
    """K of the product an algorithm's parts make of a product over K (concat_operands): one
    block of K per term, padded for the TF32 kernels to a multiple of 4 (16-byte rows)."""
    kk = k * len(TERMS[algo])
    return kk + (-kk % 4 if algo.startswith("tf32") else 0)
