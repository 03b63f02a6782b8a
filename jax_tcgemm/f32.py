"""float32 products on the tensor cores (issue 25): the operand splits of the algorithms of
problem.f32_algorithm and the one concatenated product each becomes, in XLA ops. These are the
specification: on the GPU the tcgemm_split kernel computes the same parts in the same layout
(layout; lowering.f32_parts), held to these ops bit for bit by tests/test_split_gpu.py; the
CPU tests check the algorithms' accuracy through them.

A multi-pass algorithm is one GEMM over a longer K: the operands' parts are laid side by side
along K so that one accumulator sums every product of parts (sum_k a_i[m, k] b_j[k, n] for the
algorithm's pairs (i, j), smaller terms first), e.g. 3xTF32:

    a' = [a_lo | a_hi | a_hi]    b' = [b_hi | b_lo | b_hi]    a' @ b' = a_lo b_hi + a_hi b_lo + a_hi b_hi

TF32 parts stay float32 (the TF32 kernels read float32 and use its 10 high mantissa bits: the
parts are rounded to exactly those); bfloat16 parts run on the bfloat16 kernels; f16x3's
float16 parts of rows scaled by powers of two (f16_parts, operand_parts) on the float16 kernels
that sum each 128 of K apart, the powers of two undone by the epilogue's row and column scales.
Splitting rounds to nearest, so each part is the operand's best approximation at that width
and the remainder is exact in float32 (Markidis et al., "NVIDIA Tensor Core Programmability,
Performance & Precision", 2018; CUTLASS example 27). Non-finite values stay in the big part
(their remainders are 0), and the big part meets the other operand's remainders with them
zeroed (layout): only the product of the two big parts sees them, so infinities and NaNs
propagate as in float32 (inf x a remainder of 0 would make a NaN float32 never had).
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
    "f16x3": ((1, 0), (0, 1), (0, 0)),
}
# f16x3: float16 parts of each operand's rows scaled by powers of two (f16_parts): the largest
# finite magnitude of a row (of a: along K; of b: a column) becomes [2^14, 2^15), and the
# product's float32 result is scaled back by the two powers of two (exact) in the kernels'
# epilogue (row and column scales). The remainders are stored 2^F16_LO_SHIFT times larger
# (no larger than the element or 2^-14, so inside float16's range): they keep their 11 bits for
# elements down to 2^-27 of their row's largest instead of 2^-17, and float16's subnormals
# bound what is lost below at 2^-50 of it instead of 2^-39. The kernels multiply the pieces of
# the two terms with a remainder by 2^-F16_LO_SHIFT as they add them (GemmParams::
# piece_scale_k): those terms come first along K, padded to F16_LO_ALIGN (a k tile of the
# promoted kernels, kPromotedKTile) so that no piece straddles the boundary.
F16_TOP = 15
F16_LO_SHIFT = 11
F16_LO_ALIGN = 64


def _round(x, half, mask):
    """float32 x rounded to nearest at the bits of `mask` (half: half a unit, or a function of
    the bits giving it), in float32; truncated where rounding would overflow; infinities and
    NaNs as they are (decided on x: a NaN's payload plus half a unit may wrap past the sign
    bit, as the GPU's own NaN 0x7FFFFFFF does, to -0). Integer ops, not a convert pair: XLA
    may remove float32 -> bfloat16 -> float32 round trips (excess precision), which would make
    every remainder 0."""
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    m = jnp.uint32(mask)
    y = lax.bitcast_convert_type((bits + half(bits)) & m, jnp.float32)
    cut = lax.bitcast_convert_type(bits & m, jnp.float32)
    return jnp.where(jnp.isfinite(x), jnp.where(jnp.isfinite(y), y, cut), x)


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


def f16_parts(x, k_axis):
    """(hi, lo, inv) for float32 x: hi + lo * 2^-F16_LO_SHIFT = x * s to 22 bits, both float16,
    where s is the power of two per slice along k_axis (a row of a, a column of b) that puts its
    largest finite magnitude in [2^14, 2^15) (1 for a slice of zeros; at most 2^126 up: float32
    subnormals keep what float16 holds of them); inv = 1 / s, float32, with k_axis dropped. hi
    is x * s rounded to float16 (to 10 mantissa bits by tf32_round over float16's normal range,
    to its subnormals' grid below: exact in float16), lo the remainder (exact in float32) times
    2^F16_LO_SHIFT, rounded to float16; non-finite values stay in hi (lo 0)."""
    finite = jnp.isfinite(x)
    top = jnp.max(jnp.where(finite, jnp.abs(x), 0.0), axis=k_axis, keepdims=True, initial=0.0)
    _, e = jnp.frexp(top)  # top < 2^e
    shift = jnp.clip(jnp.where(top > 0, F16_TOP - e, 0), -126, 126)
    y = x * _pow2(shift)  # exact
    sub = jnp.abs(y) < 2.0 ** -14  # float16's subnormals: multiples of 2^-24
    hi = jnp.where(sub, jnp.round(y * 2.0 ** 24) * 2.0 ** -24, tf32_round(y))
    lo = jnp.where(finite, (y - hi) * 2.0 ** F16_LO_SHIFT, 0.0)
    inv = _pow2(-jnp.squeeze(shift, k_axis))
    return hi.astype(jnp.float16), lo.astype(jnp.float16), inv


def _pow2(e):
    """2^e as float32 for int32 e in [-126, 127] (exact)."""
    return lax.bitcast_convert_type((e + 127) << 23, jnp.float32)


def layout(algo, role, k):
    """Where the parts of operand `role` ("a" or "b") of a product over K go along K' (the one
    rule of operand_parts and of the tcgemm_split kernel, lowering.split_operand):
    (blocks, zeros, K'): blocks[t] = (offset, part, masked) for term t of TERMS[algo], part 0
    the biggest; masked: a big part that meets the other operand's remainder, its non-finite
    values zeroed (only the product of the two big parts sees them: inf x a remainder of 0
    would make a NaN float32 never had); zeros: the (begin, end) ranges of K' between and
    after the blocks (f16x3's padding to f16x3_lo_k, concat_k's to 16-byte rows)."""
    blocks = []
    for t, (i, j) in enumerate(TERMS[algo]):
        part, other = (i, j) if role == "a" else (j, i)
        blocks.append((t * k, part, part == 0 and other > 0))
    if algo == "f16x3":  # the big parts' term after the remainders', at f16x3_lo_k
        blocks[2] = (f16x3_lo_k(k),) + blocks[2][1:]
    kk, zeros, at = concat_k(k, algo), [], 0
    for offset, _, _ in sorted(blocks) + [(kk, 0, False)]:
        if offset > at:
            zeros.append((at, offset))
        at = offset + k
    return blocks, zeros, kk


def _lay_out(ps, algo, role, k, axis):
    """An operand's parts ps side by side along `axis`, as layout places them."""
    blocks, zeros, _ = layout(algo, role, k)
    pieces = []
    for offset, part, masked in blocks:
        p = ps[part]
        pieces.append((offset, jnp.where(jnp.isfinite(p), p, jnp.zeros((), p.dtype))
                       if masked else p))
    for begin, end in zeros:
        shape = list(ps[0].shape)
        shape[axis] = end - begin
        pieces.append((begin, jnp.zeros(shape, ps[0].dtype)))
    return jnp.concatenate([p for _, p in sorted(pieces, key=lambda x: x[0])], axis=axis)


# operand_parts writes the parts once (an optimization barrier) before it lays them out: left
# to itself, XLA fused their rounding into the concatenation and materialised a masked float32
# operand between (H100, BF16_BF16_F32_X3 at 8192^3: the parts 1.06 ms -> 0.80, one fusion per
# operand and one concatenation each; f32_bf16x3_8192 1.01x -> 1.05x; 3xTF32, whose time goes
# to transposing the float32 operand first, unchanged: benchmarks/NOTES.md v52, v53).
# On the GPU the tcgemm_split kernel computes the same parts and layout (lowering.f32_parts;
# tests/test_split_gpu.py checks it bit for bit against these XLA ops, the specification).


def operand_parts(x, algo, role, k_axis):
    """One operand's parts (role "a" or "b") side by side along its K axis as layout places
    them, K' = concat_k, so that a' @ b' is the algorithm's sum; f16x3: (x', inv), inv its
    powers of two's inverses (f16_parts) with k_axis dropped (a's per row, b's per column), and
    with L = f16x3_lo_k(K)
    inv_a[..., m] * (2^-F16_LO_SHIFT a'[:L] @ b'[:L] + a'[L:] @ b'[L:])[..., m, n] * inv_b[..., n]
    is the product. What one tcgemm_split call computes (lowering.split_operand)."""
    k = x.shape[k_axis]
    if algo == "f16x3":
        hi, lo, inv = f16_parts(x, k_axis)
        return _lay_out((hi, lo), algo, role, k, k_axis), inv
    ps = parts(x, algo)
    if len(ps) > 1:
        ps = lax.optimization_barrier(ps)
    return _lay_out(ps, algo, role, k, k_axis)


def f16x3_lo_k(k):
    """Where f16x3's big-part term starts along K' for a product over K (layout): the
    pieces before it are scaled by 2^-F16_LO_SHIFT (GemmParams::piece_scale_k)."""
    return -(-2 * k // F16_LO_ALIGN) * F16_LO_ALIGN


def concat_k(k, algo):
    """K of the product an algorithm's parts make of a product over K (layout, operand_parts):
    one block of K per term (f16x3: the first two padded to f16x3_lo_k), padded
    for the TF32 and promoted float16 kernels to 16-byte rows (a multiple of 4, 8)."""
    kk = f16x3_lo_k(k) + k if algo == "f16x3" else k * len(TERMS[algo])
    row16 = {"tf32": 4, "tf32x3": 4, "f16x3": 8}.get(algo, 1)
    return kk + -kk % row16
