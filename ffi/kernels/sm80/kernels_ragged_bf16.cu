// bfloat16-input sm80 grouped (ragged) kernels: the rows with HasRaggedKernels,
// rows and contraction layouts, aligned operands.
#include "kernels/sm80/kernels.cuh"

namespace tcgemm {
TCGEMM_SM80_ALIGNED_KERNELS(RaggedKernelBF16, __nv_bfloat16, true)
}  // namespace tcgemm
