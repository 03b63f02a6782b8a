// Split-K reduction: D = epilogue(sum over slices s = 0..S-1 of the float32 partial products),
// summed in slice order (so the result is bitwise deterministic) and rounded once: the same
// epilogue (kernels/common/epilogue.cuh) as the GEMM kernels run when they store D themselves.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "host/gemm_dispatch.h"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"

namespace tcgemm {
namespace {

// Block row blockIdx.y (and every gridDim.y-th after it) of each batch item; each thread sums
// VEC consecutive elements of the row over all slices. VEC = 4 needs N % 4 == 0 (then every
// slice and output group is aligned). No index divisions: rows, items and columns are loops.
template <typename Out, int VEC>
__global__ void __launch_bounds__(256) splitk_reduce_kernel(const GemmParams p,
                                                            const float* __restrict__ ws,
                                                            int splits) {
  const int64_t mn = p.m * p.n, count = p.batch * mn;
  const EpiScale s = epi_scale(p);
  for (int64_t z = 0; z < p.batch; ++z) {
    for (int64_t r = blockIdx.y; r < p.m; r += gridDim.y) {
      const int64_t row = z * mn + r * p.n;
      for (int64_t col = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; col < p.n;
           col += int64_t(gridDim.x) * blockDim.x * VEC) {
        float v[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = 0.0f;
        for (int sl = 0; sl < splits; ++sl) {
          const float* src = ws + sl * count + row + col;
          if constexpr (VEC == 4) {
            const float4 x = __ldcs(reinterpret_cast<const float4*>(src));  // read once
            v[0] += x.x; v[1] += x.y; v[2] += x.z; v[3] += x.w;
          } else {
            v[0] += __ldcs(src);
          }
        }
        epi_store<Out, VEC>(p, s, z, r, col, v, row + col, VEC, true);
      }
    }
  }
}

template <typename Out>
cudaError_t Launch(const GemmParams& p, const float* ws, int splits, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const bool vec =
      p.n % 4 == 0 && Aligned16(p.d) && Aligned16(ws) && (!p.epi.aux || Aligned16(p.epi.aux));
  const int64_t groups = vec ? p.n / 4 : p.n;  // per row
  const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>((groups + kThreads - 1) / kThreads, 1, 64)),
                  static_cast<unsigned>(std::clamp<int64_t>(p.m, 1, 65535)));
  if (vec)
    splitk_reduce_kernel<Out, 4><<<grid, kThreads, 0, stream>>>(p, ws, splits);
  else
    splitk_reduce_kernel<Out, 1><<<grid, kThreads, 0, stream>>>(p, ws, splits);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSplitKReduce(const GemmParams& p, const float* ws, int splits,
                               cudaStream_t stream) {
  cudaError_t e = cudaErrorInvalidValue;
  with_dtype(p.d_type, [&](auto out) { e = Launch<decltype(out)>(p, ws, splits, stream); });
  return e;
}

}  // namespace tcgemm
