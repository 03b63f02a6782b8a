// float16-input sm80 kernels with A K-major (stored [M][K]): every config,
// layout of B and alignment.
#include "kernels/sm80/kernels.cuh"

namespace tcgemm {
TCGEMM_SM80_KERNELS(KernelF16A1, __half, true)
}  // namespace tcgemm
