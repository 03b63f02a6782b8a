// bfloat16-input sm80 kernels with A M-major (stored [K][M]): every config,
// layout of B and alignment.
#include "kernels/sm80/kernels.cuh"

namespace tcgemm {
TCGEMM_SM80_KERNELS(KernelBF16A0, __nv_bfloat16, false)
}  // namespace tcgemm
