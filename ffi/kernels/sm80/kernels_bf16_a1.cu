// bfloat16-input sm80 kernels with A K-major (stored [M][K]): every config,
// layout of B and alignment.
#include "kernels/sm80/kernels.cuh"

namespace tcgemm {
TCGEMM_SM80_KERNELS(KernelBF16A1, __nv_bfloat16, true)
}  // namespace tcgemm
