// Split-K reduction: C = sum over slices s = 0..S-1 of the float32 partial products, in slice
// order (so the result is bitwise deterministic), rounded once to the output type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gemm_convert.cuh"
#include "gemm_dispatch.h"

namespace tcgemm {
namespace {

// Each thread sums VEC consecutive elements over all slices. VEC = 4 needs count % 4 == 0
// (then every slice and every output group is 16- / 8-byte aligned).
template <typename Out, int VEC>
__global__ void __launch_bounds__(256) splitk_reduce_kernel(const float* __restrict__ ws,
                                                            Out* __restrict__ c, int splits,
                                                            int64_t count) {
  const int64_t groups = count / VEC;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += int64_t(gridDim.x) * blockDim.x) {
    float sum[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) sum[v] = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* src = ws + s * count + g * VEC;
      if constexpr (VEC == 4) {
        const float4 x = __ldcs(reinterpret_cast<const float4*>(src));  // read once: streaming
        sum[0] += x.x; sum[1] += x.y; sum[2] += x.z; sum[3] += x.w;
      } else {
        sum[0] += __ldcs(src);
      }
    }
    if constexpr (VEC == 4 && !std::is_same_v<Out, float>) {
      struct alignas(8) Out4 { Out x[4]; } o{{convert<Out>(sum[0]), convert<Out>(sum[1]),
                                              convert<Out>(sum[2]), convert<Out>(sum[3])}};
      *reinterpret_cast<Out4*>(c + g * VEC) = o;
    } else if constexpr (VEC == 4) {
      *reinterpret_cast<float4*>(c + g * VEC) = make_float4(sum[0], sum[1], sum[2], sum[3]);
    } else {
      c[g] = convert<Out>(sum[0]);
    }
  }
}

template <typename Out>
cudaError_t Launch(const float* ws, void* c, int splits, int64_t count, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const bool vec = count % 4 == 0 && (reinterpret_cast<uintptr_t>(c) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(ws) & 15) == 0;
  const int64_t groups = vec ? count / 4 : count;
  const unsigned blocks =
      static_cast<unsigned>(std::clamp<int64_t>((groups + kThreads - 1) / kThreads, 1, 65535));
  if (vec)
    splitk_reduce_kernel<Out, 4><<<blocks, kThreads, 0, stream>>>(ws, static_cast<Out*>(c), splits, count);
  else
    splitk_reduce_kernel<Out, 1><<<blocks, kThreads, 0, stream>>>(ws, static_cast<Out*>(c), splits, count);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSplitKReduce(const float* ws, void* c, OutType out_type, int splits,
                               int64_t count, cudaStream_t stream) {
  switch (out_type) {
    case OutType::kF16: return Launch<__half>(ws, c, splits, count, stream);
    case OutType::kBF16: return Launch<__nv_bfloat16>(ws, c, splits, count, stream);
    case OutType::kF32: return Launch<float>(ws, c, splits, count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace tcgemm
