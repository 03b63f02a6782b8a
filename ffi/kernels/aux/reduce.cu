// Split-K reduction: D = epilogue(sum over slices s = 0..S-1 of the float32 partial products;
// int8 products: of their exact int32 sums), summed in slice order (so the result is bitwise
// deterministic) and rounded once: the same epilogue (kernels/common/epilogue.cuh) as the GEMM
// kernels run when they store D themselves.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "host/gemm_dispatch.h"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"

namespace tcgemm {
namespace {

// Block row blockIdx.y (and every gridDim.y-th after it) of each batch item; each thread sums
// VEC consecutive elements of the row over all slices. VEC = 4 needs N % 4 == 0 (then every
// slice and output group is aligned). No index divisions: rows, items and columns are loops.
// Sum: float (float32 partials), or int32_t for int8 products, whose partials are exact int32
// sums (wrapping as one int32 accumulator would), stored as int32 (Out int32_t) or converted
// to float for the epilogue, as the GEMM converts its own int32 sums. At least 4 blocks per SM
// (64 registers): left to itself ptxas held the float32 4-wide kernels to 32 and spilled.
template <typename Out, int VEC, typename Sum>
__global__ void __launch_bounds__(256, 4) splitk_reduce_kernel(const GemmParams p,
                                                               const float* __restrict__ ws,
                                                               int splits) {
  const int64_t mn = p.m * p.n, count = p.batch * mn;
  const EpiScale s = epi_scale(p);
  const Sum* parts = reinterpret_cast<const Sum*>(ws);
  using Vec = std::conditional_t<std::is_same_v<Sum, float>, float4, int4>;
  for (int64_t z = 0; z < p.batch; ++z) {
    for (int64_t r = blockIdx.y; r < p.m; r += gridDim.y) {
      const int64_t row = z * mn + r * p.n;
      for (int64_t col = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; col < p.n;
           col += int64_t(gridDim.x) * blockDim.x * VEC) {
        Sum v[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = Sum(0);
        auto add = [](Sum x, Sum y) {  // int32: two's-complement wrap, no signed overflow
          if constexpr (std::is_same_v<Sum, float>) return x + y;
          else return Sum(uint32_t(x) + uint32_t(y));
        };
        for (int sl = 0; sl < splits; ++sl) {
          const Sum* src = parts + sl * count + row + col;
          if constexpr (VEC == 4) {
            const Vec x = __ldcs(reinterpret_cast<const Vec*>(src));  // read once
            v[0] = add(v[0], x.x); v[1] = add(v[1], x.y); v[2] = add(v[2], x.z);
            v[3] = add(v[3], x.w);
          } else {
            v[0] = add(v[0], __ldcs(src));
          }
        }
        if constexpr (std::is_same_v<Out, int32_t>) {
          int32_t* d = static_cast<int32_t*>(p.d) + row + col;
          if constexpr (VEC == 4) *reinterpret_cast<int4*>(d) = make_int4(v[0], v[1], v[2], v[3]);
          else d[0] = v[0];
        } else if constexpr (std::is_same_v<Sum, float>) {
          epi_store<Out, VEC>(p, s, z, r, col, v, row + col, VEC, true);
        } else {
          float f[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) f[j] = float(v[j]);
          epi_store<Out, VEC>(p, s, z, r, col, f, row + col, VEC, true);
        }
      }
    }
  }
}

template <typename Out, typename Sum>
cudaError_t Launch(const GemmParams& p, const float* ws, int splits, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const bool vec =
      p.n % 4 == 0 && Aligned16(p.d) && Aligned16(ws) && (!p.epi.aux || Aligned16(p.epi.aux));
  const int64_t groups = vec ? p.n / 4 : p.n;  // per row
  const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>((groups + kThreads - 1) / kThreads, 1, 64)),
                  static_cast<unsigned>(std::clamp<int64_t>(p.m, 1, 65535)));
  if (vec)
    splitk_reduce_kernel<Out, 4, Sum><<<grid, kThreads, 0, stream>>>(p, ws, splits);
  else
    splitk_reduce_kernel<Out, 1, Sum><<<grid, kThreads, 0, stream>>>(p, ws, splits);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSplitKReduce(const GemmParams& p, const float* ws, int splits, bool int_sums,
                               cudaStream_t stream) {
  if (p.d_type == DType::kS32)
    return int_sums ? Launch<int32_t, int32_t>(p, ws, splits, stream) : cudaErrorInvalidValue;
  cudaError_t e = cudaErrorInvalidValue;
  with_dtype(p.d_type, [&](auto out) {
    using Out = decltype(out);
    e = int_sums ? Launch<Out, int32_t>(p, ws, splits, stream)
                 : Launch<Out, float>(p, ws, splits, stream);
  });
  return e;
}

}  // namespace tcgemm
