// bfloat16-input kernels (all configs, layouts, alignments).
#include "gemm_kernels.cuh"

namespace tcgemm {
KernelEntry KernelBF16(int config, int variant) {
  return LookupKernel<__nv_bfloat16>(config, variant);
}
}  // namespace tcgemm
