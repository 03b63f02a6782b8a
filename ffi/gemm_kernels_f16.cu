// float16-input kernels (all configs, layouts, alignments).
#include "gemm_kernels.cuh"

namespace tcgemm {
KernelEntry KernelF16(int config, int variant) { return LookupKernel<__half>(config, variant); }
}  // namespace tcgemm
