"""jax_tcgemm: tensor-core GEMM kernels (cp.async + ldmatrix + mma.sync; TMA + wgmma on compute
capability 9.0) as a JAX primitive.

Public API::

    tg.matmul(a, b, *, out_dtype=None)        # jnp.matmul semantics
    tg.dot_general(lhs, rhs, dimension_numbers, precision=None,
                   preferred_element_type=None, *, out_sharding=None)
"""
from .ops import dot_general, matmul

__version__ = "0.1.0"
__all__ = ["matmul", "dot_general", "__version__"]
