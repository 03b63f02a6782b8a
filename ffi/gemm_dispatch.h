// Host side of the GEMM: kernel tables per input type, config choice, launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "gemm_params.h"

namespace tcgemm {

struct KernelEntry {
  const void* fn;  // __global__ gemm_sm80_kernel<...>
  int threads;
  int smem_bytes;
};

// Kernel variants per config: index (a_kmajor * 2 + b_kmajor) * 2 + aligned.
inline constexpr int kVariants = 8;
inline int VariantIndex(bool a_kmajor, bool b_kmajor, bool aligned) {
  return (int(a_kmajor) * 2 + int(b_kmajor)) * 2 + int(aligned);
}

// Defined in gemm_kernels_f16.cu / gemm_kernels_bf16.cu (compiled in parallel).
KernelEntry KernelF16(int config, int variant);
KernelEntry KernelBF16(int config, int variant);

// Split-K slices actually used for `split_k` requested ones (no empty slice): at most split_k.
int EffectiveSplitK(const GemmProblem& pr);

// Launches problem `pr` on `stream` (with split-K: the sliced GEMM into pr.workspace, then the
// reduction into C). Returns an empty string on success, else what went wrong.
std::string LaunchGemm(const GemmProblem& pr, cudaStream_t stream);

// Defined in gemm_reduce.cu: c[i] = sum_{s < splits} ws[s * count + i] in slice order.
cudaError_t LaunchSplitKReduce(const float* ws, void* c, OutType out_type, int splits,
                               int64_t count, cudaStream_t stream);

}  // namespace tcgemm
