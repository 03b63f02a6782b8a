// The backward pass of the epilogue's activation and bias in one pass over the cotangent:
// g = ct * act'(pre) (rounded once to g's type) and dbias = the column sums of g in float32,
// rows summed in order (bitwise deterministic, no atomics). A block owns 32 columns and walks
// all rows (of every batch item when the bias is shared); its 8 row groups sum in shared memory
// in a fixed order at the end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "host/gemm_dispatch.h"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"

namespace tcgemm {
namespace {

constexpr int kCols = 32, kRowGroups = 8;

__global__ void __launch_bounds__(kCols * kRowGroups) dact_kernel(const DactJob j) {
  __shared__ float part[kRowGroups][kCols];
  const int tx = threadIdx.x % kCols, ty = threadIdx.x / kCols;
  const int64_t col = int64_t(blockIdx.x) * kCols + tx;
  const bool in = col < j.cols;
  // The batch items this block covers: its own (bias per item), or all of them (shared bias).
  const int64_t z0 = j.bias_batched ? blockIdx.y : 0;
  const int64_t z1 = j.bias_batched ? z0 + 1 : j.batch;
  float sum = 0.0f;
  for (int64_t z = z0; z < z1; ++z) {
    for (int64_t r = ty; r < j.rows && in; r += kRowGroups) {
      const int64_t i = (z * j.rows + r) * j.cols + col;
      float g = load_as_float(j.ct, j.ct_type, i);
      if (j.act != Activation::kNone) g *= activate_grad(j.act, load_as_float(j.pre, j.pre_type, i));
      if (j.g) {
        with_dtype(j.g_type, [&](auto t) {
          using G = decltype(t);
          const G gv = convert<G>(g);
          static_cast<G*>(j.g)[i] = gv;
          g = to_float(gv);  // the bias gradient sums what the products will read
        });
      }
      sum += g;
    }
  }
  if (!j.dbias) return;
  part[ty][tx] = sum;
  __syncthreads();
  if (ty == 0 && in) {
    float total = 0.0f;
#pragma unroll
    for (int y = 0; y < kRowGroups; ++y) total += part[y][tx];
    j.dbias[z0 * j.cols * (j.bias_batched ? 1 : 0) + col] = total;
  }
}

}  // namespace

cudaError_t LaunchDact(const DactJob& job, cudaStream_t stream) {
  if (job.cols <= 0 || (job.bias_batched && job.batch <= 0)) return cudaSuccess;
  const int64_t col_blocks = (job.cols + kCols - 1) / kCols;
  if (col_blocks > INT32_MAX || (job.bias_batched && job.batch > 65535)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>(job.bias_batched ? job.batch : 1));
  dact_kernel<<<grid, kCols * kRowGroups, 0, stream>>>(job);
  return cudaGetLastError();
}

}  // namespace tcgemm
