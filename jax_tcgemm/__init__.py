"""jax_tcgemm: tensor-core GEMM kernels (cp.async + ldmatrix + mma.sync; TMA + wgmma on compute
capability 9.0) as a JAX primitive.

Public API::

    tg.matmul(a, b, *, out_dtype=None, precision=None)    # jnp.matmul semantics
    tg.dot_general(lhs, rhs, dimension_numbers, precision=None,
                   preferred_element_type=None, *, out_sharding=None,
                   reduction_order=None)              # lax.dot_general semantics
    tg.gemm(a, b, c=None, *, alpha=1.0, beta=0.0, bias=None, activation=None,
            transpose_a=False, transpose_b=False, out_dtype=None, precision=None)
                                              # activation(alpha * a @ b + beta * c + bias)
    tg.ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None,
                  group_offset=None, out_sharding=None, *,
                  reduction_order=None)                # lax.ragged_dot semantics
    tg.ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, ...)
    tg.ragged_gemm(lhs, rhs, group_sizes, *, bias=None, activation=None, transpose_b=False,
                   out_dtype=None)            # activation(lhs[rows of g] @ rhs[g] + bias[g])
    tg.scaled_matmul(a, b, a_scale, b_scale, *, out_dtype=jnp.bfloat16, bias=None,
                     activation=None, c=None, beta=0.0, transpose_b=False)
                                              # fp8 / int8 with per-tensor, per-row / column or
                                              # 128-block scales (the sm90 8-bit kernels)

Operands float16 / bfloat16, or float32 run by their precision as lax does on GPU (one TF32
pass at DEFAULT, f16x3 at HIGHEST: float32 accuracy, the TF32 / BF16 presets; problem.py).
"""
from .ops import dot_general, gemm, matmul
from .ragged import ragged_dot, ragged_dot_general, ragged_gemm
from .scaled import scaled_matmul

__version__ = "0.1.0"
__all__ = ["matmul", "dot_general", "gemm", "ragged_dot", "ragged_dot_general", "ragged_gemm",
           "scaled_matmul", "__version__"]
