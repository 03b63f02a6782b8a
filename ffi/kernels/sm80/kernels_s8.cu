// int8-input sm80 kernels (mma.sync m16n8k32, exact int32 sums): the sm80 rows with
// HasByteKernels(cfg, false), A and B K-major, 16-byte aligned rows.
#include "kernels/sm80/kernels.cuh"

namespace tcgemm {
TCGEMM_SM80_ALIGNED_KERNELS(KernelS8, int8_t, false)
}  // namespace tcgemm
