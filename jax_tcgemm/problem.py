"""The GEMM problem as the primitives see it: operand shapes and layouts, the dtype table, the
epilogue's static description, and the precision param in lax's canonical form. Pure functions
of avals and params; no JAX tracing here.

    D = act(alpha * op(A) @ op(B) + beta * C + bias)      (float32, rounded once to out_dtype)

Operands are rank 3: a is (Ba, M, K), or (Ba, K, M) with transpose_a; b is (Bb, K, N), or
(Bb, N, K) with transpose_b; Ba, Bb are the batch B or 1 (a batch-1 operand is shared: stride 0
in the kernel). c is (Bc, Mc, Nc) with each dim 1 or the result's (full, per-row, per-column,
shared by the batch); bias is float32 (Bbias, N) with Bbias 1 or B; scale is float32 [alpha,
beta] when they are traced (else they are the static params alpha, beta).
"""
from __future__ import annotations

import enum
import inspect

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
IN_DTYPES = (F16, BF16)                 # 16-bit operand types (every kernel family)
OPERAND_DTYPES = IN_DTYPES + (F32,)     # tcgemm_p's operand types: float32 runs by its
#                                         precision (f32_algorithm)
OUT_DTYPES = (F16, BF16, F32)           # result types they write
C_DTYPES = OUT_DTYPES                   # epilogue C types they read

# Activation names in the order of Activation in ffi/host/gemm_params.h (the FFI passes the
# index); None is "none".
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")


def activation_index(name) -> int:
    return ACTIVATIONS.index("none" if name is None else name)


def fused_epilogue(has_c: bool, has_bias: bool, has_scale: bool, aux: bool, activation) -> bool:
    """Whether a product's epilogue does more than scale by alpha (a number or, has_scale, one
    read from the device; beta matters only with C): the planner's `epilogue` (configs.plan);
    the sm90 kernels' full epilogue path (epi_block), the rule of their `simple` in C++."""
    del has_scale  # alpha alone, from the device or not, takes the short path (store_block)
    return bool(has_c or has_bias or aux or activation_index(activation))


def dims(a_shape, b_shape, transpose_a, transpose_b):
    """(batch, M, N, K of a, K of b) of operand shapes."""
    m, ka = (a_shape[2], a_shape[1]) if transpose_a else (a_shape[1], a_shape[2])
    kb, n = (b_shape[2], b_shape[1]) if transpose_b else (b_shape[1], b_shape[2])
    batch = b_shape[0] if a_shape[0] == 1 else a_shape[0]  # a batch-1 operand is shared
    return batch, m, n, ka, kb


def symbolic(*dims) -> bool:
    """Whether any of the dims is symbolic (shape polymorphism, jax.export): such a product
    is planned at run time by no one, so it lowers through lax (sharding.symbolic_or)."""
    return any(jax.export.is_symbolic_dim(d) for d in dims)


def layout_name(transpose_a: bool, transpose_b: bool) -> str:
    return ("T" if transpose_a else "N") + ("T" if transpose_b else "N")


def split_operands(args, has_c, has_bias, has_scale):
    """(a, b, c or None, bias or None, scale or None) from the primitive's operand list."""
    a, b, *rest = args
    it = iter(rest)
    c = next(it) if has_c else None
    bias = next(it) if has_bias else None
    scale = next(it) if has_scale else None
    return a, b, c, bias, scale


# The names lax.Precision takes (lax.Precision("highest") is Precision.HIGHEST).
PRECISION_NAMES = ("highest", "float32", "high", "bfloat16_3x", "tensorfloat32", "default",
                   "bfloat16", "fastest")


def canonical_precision(precision):
    """`precision` as lax.dot_general keeps it in its params: None, a pair (lhs, rhs) of
    lax.Precision, a lax.DotAlgorithmPreset or a lax.DotAlgorithm. A string or a single
    lax.Precision applies to both operands; a string may also name a preset; None is the
    jax_default_matmul_precision in effect (None where unset). lax's canonicalisation, through
    the public API, with its exceptions: ValueError for what it does not know, TypeError for a
    list of two lax.Precision (lax keeps it, and a list is no hashable param)."""
    if precision is None:
        default = jax.config.jax_default_matmul_precision
        return None if default is None else canonical_precision(default)
    if isinstance(precision, str):
        try:
            p = lax.Precision(precision)
            return p, p
        except ValueError:
            pass
        try:
            return lax.DotAlgorithmPreset[precision]
        except KeyError:
            pass
    elif isinstance(precision, lax.Precision):
        return precision, precision
    elif isinstance(precision, (lax.DotAlgorithm, lax.DotAlgorithmPreset)):
        return precision
    elif isinstance(precision, (list, tuple)) and len(precision) == 2:
        if all(isinstance(p, lax.Precision) for p in precision):
            if isinstance(precision, list):
                raise TypeError(f"jax_tcgemm: precision must be hashable (as a param of lax's "
                                f"dot_general): a tuple, not the list {precision!r}")
            return tuple(precision)
        if all(isinstance(p, str) for p in precision):
            # as lax: a preset's name in a pair is a TypeError (a preset is not a pair)
            return tuple(canonical_precision(p)[0] for p in precision)
    raise ValueError(f"jax_tcgemm: precision must be None, a string in {list(PRECISION_NAMES)}, "
                     f"a lax.Precision, a pair of lax.Precision values or strings, a "
                     f"lax.DotAlgorithmPreset or its name, or a lax.DotAlgorithm (as in lax); got "
                     f"{precision!r}")


def lax_reduction_order(reduction_order, lax_fn, name) -> dict:
    """For the lax-signature entry points (`name`, in the error): {} where the kernels may run
    the contraction, i.e. reduction_order None or 'unordered' (a string or lax's enum member),
    which leave the order of the sum to the implementation (lax lowers them to the same dot);
    else the keyword that hands the order on to lax_fn, which sums exactly as asked (linear,
    unreduced, tiled, cast, ...) and validates the value itself. Any order but None needs
    jax >= 0.12.1: with an older jax it is a TypeError naming that jax, as lax's call would be."""
    if reduction_order is None:
        return {}
    if "reduction_order" not in inspect.signature(lax_fn).parameters:
        raise TypeError(f"{name}: reduction_order={reduction_order!r} needs jax >= 0.12.1 "
                        f"(lax.{lax_fn.__name__} of jax {jax.__version__} takes none)")
    unordered = (reduction_order.name == "unordered" if isinstance(reduction_order, enum.Enum)
                 else isinstance(reduction_order, str) and reduction_order == "unordered")
    return {} if unordered else {"reduction_order": reduction_order}


def is_canonical_precision(precision):
    """Whether `precision` is in the form canonical_precision gives (what tcgemm_p takes)."""
    return (precision is None or isinstance(precision, (lax.DotAlgorithm, lax.DotAlgorithmPreset))
            or (type(precision) is tuple and len(precision) == 2
                and all(isinstance(p, lax.Precision) for p in precision)))


def swap_precision(precision):
    """The canonical precision with its lhs and rhs parts exchanged: for a product whose
    operands are another's, exchanged (a pair swapped, a DotAlgorithm's lhs / rhs types and
    component counts swapped; None and the presets, symmetric, as they are)."""
    if isinstance(precision, lax.DotAlgorithm):
        return precision._replace(
            lhs_precision_type=precision.rhs_precision_type,
            rhs_precision_type=precision.lhs_precision_type,
            lhs_component_count=precision.rhs_component_count,
            rhs_component_count=precision.lhs_component_count)
    if type(precision) is tuple:
        return precision[1], precision[0]
    return precision


# How a float32 x float32 product runs on the tensor cores, by its precision (issue 25):
#   "tf32"    one TF32 pass (what XLA does on GPU at DEFAULT / HIGH)
#   "tf32x3"  each operand split into a TF32 part and a TF32 remainder, three products summed in
#             float32 (a_hi b_hi + a_hi b_lo + a_lo b_hi: the preset TF32_TF32_F32_X3)
#   "f16x3"   the same three products of float16 parts, each operand's rows (a) and columns (b)
#             scaled by powers of two into float16's range first and the result scaled back in
#             the epilogue (f32.f16_parts; the remainders stored 2^11 larger, their pieces
#             scaled back in the kernel), on the float16 kernels that sum each 128 of K apart
#             (GemmProblem::promote): float32 accuracy at twice 3xTF32's speed (HIGHEST;
#             benchmarks/NOTES.md v47, v48)
#   "bf16", "bf16x3", "bf16x6", "bf16x9"  the lax.DotAlgorithmPreset BF16_BF16_F32[_Xn]: each
#             operand split into 1-3 bfloat16 parts, n products of the bfloat16 kernels
# None: lax computes it (F32_F32_F32, the 8- and 16-bit presets, a lax.DotAlgorithm: what our
# kernels do not implement).
F32_ALGORITHMS = ("tf32", "tf32x3", "f16x3", "bf16", "bf16x3", "bf16x6", "bf16x9")
# The algorithms our kernels run unless a config is forced. One TF32 pass is XLA's: on an H100
# (benchmarks/NOTES.md v35) our TF32 kernel, which sums each k tile apart for 3xTF32's float32
# accuracy, ran 8192^3 at 239 TFLOP/s against cuBLAS's 359 (0.67x; 0.97x when it chained its
# sums over all of K), and XLA rounds the operands to TF32 where the tensor cores truncate them
# (max error 2.9e-4 against 7.7e-4).
F32_ON_KERNELS = ("tf32x3", "f16x3", "bf16", "bf16x3", "bf16x6", "bf16x9")
_PRESET_ALGORITHMS = {"DEFAULT": "tf32", "TF32_TF32_F32": "tf32", "TF32_TF32_F32_X3": "tf32x3",
                      "BF16_BF16_F32": "bf16", "BF16_BF16_F32_X3": "bf16x3",
                      "BF16_BF16_F32_X6": "bf16x6", "BF16_BF16_F32_X9": "bf16x9"}
_RANK = {lax.Precision.DEFAULT: 0, lax.Precision.HIGH: 1, lax.Precision.HIGHEST: 2}


def f32_algorithm(precision):
    """The algorithm (F32_ALGORITHMS, or None: lax) of a float32 product of canonical
    `precision`: None (no jax_default_matmul_precision), DEFAULT and HIGH run one TF32 pass as
    XLA does on GPU; HIGHEST (either operand's: the higher of a pair, as XLA takes it) runs
    f16x3; a preset runs as named where F32_ALGORITHMS has it."""
    if precision is None:
        return "tf32"
    if isinstance(precision, lax.DotAlgorithmPreset):
        return _PRESET_ALGORITHMS.get(precision.name)
    if isinstance(precision, tuple):
        return "f16x3" if max(_RANK[p] for p in precision) == 2 else "tf32"
    return None  # a lax.DotAlgorithm
