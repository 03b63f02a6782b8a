// The backward pass of the epilogue's activation and bias in one pass over the cotangent:
// g = ct * act'(pre) (rounded once to g's type) and dbias = the column sums of g in float32,
// summed in a fixed order (bitwise deterministic, no atomics).
//
// Two kernels. The vector kernel (ct, pre and g of one type, rows of 16-byte multiples, the
// usual case: all three are the forward's output type) moves 16-byte chunks: a block owns
// `tc` chunks of columns (tc x 16 bytes of every row: a whole 128-byte line at tc = 8) and
// its 256 / tc row groups stride down the rows, several rows' loads in flight per thread; the
// activation is a template argument. Without a bias gradient the rows are split over blocks
// too. 16-bit g takes gelu_tanh's derivative from one fast exponential (activate_grad<true>).
// The scalar kernel serves every other combination: a block owns 32 columns, its 8 row
// groups walk all rows.
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

constexpr int kVecThreads = 256, kVecUnroll = 4;

// One 16-byte chunk of T as floats, and back.
template <typename T>
union Chunk {
  static constexpr int kN = 16 / int(sizeof(T));
  uint4 raw;
  T v[kN];
};

// Block (blockIdx.x: column chunks, blockIdx.y: batch item when bias_batched, else row slice
// of `slice_rows` rows of the batch x rows row space: a shared bias sums over every item).
template <typename T, Activation kAct>
__global__ void __launch_bounds__(kVecThreads) dact_vec_kernel(const DactJob j, int tc,
                                                                int64_t slice_rows) {
  using C = Chunk<T>;
  constexpr int kN = C::kN;
  __shared__ float part[kVecThreads * kN];
  const int tx = threadIdx.x % tc, ty = threadIdx.x / tc, groups = kVecThreads / tc;
  const int64_t col = (int64_t(blockIdx.x) * tc + tx) * kN;
  const int64_t space = j.bias_batched ? j.rows : j.batch * j.rows;
  const int64_t base = j.bias_batched ? int64_t(blockIdx.y) * j.rows * j.cols : 0;
  const int64_t r0 = j.bias_batched ? 0 : int64_t(blockIdx.y) * slice_rows;
  const int64_t r1 = j.bias_batched ? j.rows : std::min(space, r0 + slice_rows);
  const uint4* ct = static_cast<const uint4*>(j.ct);
  const uint4* pre = static_cast<const uint4*>(j.pre);
  uint4* g = static_cast<uint4*>(j.g);
  float sum[kN] = {};
  if (col < j.cols) {
    for (int64_t r = r0 + ty; r < r1; r += int64_t(groups) * kVecUnroll) {
      C c[kVecUnroll], p[kVecUnroll];
#pragma unroll
      for (int u = 0; u < kVecUnroll; ++u) {
        const int64_t row = r + int64_t(u) * groups;
        if (row < r1) {
          const int64_t at = (base + row * j.cols + col) / kN;
          c[u].raw = __ldcs(ct + at);
          if constexpr (kAct != Activation::kNone) p[u].raw = __ldcs(pre + at);
        }
      }
#pragma unroll
      for (int u = 0; u < kVecUnroll; ++u) {
        const int64_t row = r + int64_t(u) * groups;
        if (row >= r1) break;
        C out;
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          float x = to_float(c[u].v[e]);
          if constexpr (kAct != Activation::kNone)
            x *= activate_grad<sizeof(T) == 2>(kAct, to_float(p[u].v[e]));
          out.v[e] = convert<T>(x);
          sum[e] += j.g ? to_float(out.v[e]) : x;  // the products read g as stored
        }
        if (j.g) __stcs(g + (base + row * j.cols + col) / kN, out.raw);
      }
    }
  }
  if (!j.dbias) return;
  // The row groups' sums, pairwise in a fixed tree order.
#pragma unroll
  for (int e = 0; e < kN; ++e) part[threadIdx.x * kN + e] = sum[e];
  __syncthreads();
  for (int half = groups / 2; half > 0; half /= 2) {
    if (ty < half)
#pragma unroll
      for (int e = 0; e < kN; ++e) part[threadIdx.x * kN + e] += part[(threadIdx.x + half * tc) * kN + e];
    __syncthreads();
  }
  if (ty == 0 && col < j.cols)
#pragma unroll
    for (int e = 0; e < kN; ++e)
      j.dbias[(j.bias_batched ? int64_t(blockIdx.y) * j.cols : 0) + col + e] = part[tx * kN + e];
}

// Launches the vector kernel where it applies (false: it does not; the scalar kernel runs).
cudaError_t LaunchDactVec(const DactJob& j, cudaStream_t stream, bool* launched) {
  *launched = false;
  const bool act = j.act != Activation::kNone;
  if (j.ct_type != DType::kF16 && j.ct_type != DType::kBF16 && j.ct_type != DType::kF32)
    return cudaSuccess;  // (the FFI passes float types only; with_dtype would launch nothing)
  if (act && j.pre_type != j.ct_type) return cudaSuccess;
  if (j.g && j.g_type != j.ct_type) return cudaSuccess;
  const int bytes = DTypeBytes(j.ct_type), n = 16 / bytes;
  if (j.cols % n || !Aligned16(j.ct) || (act && !Aligned16(j.pre)) || (j.g && !Aligned16(j.g)))
    return cudaSuccess;
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const int sms = std::max(1, DeviceSms(dev));  // (asked once per device)
  const int64_t chunks = j.cols / n, items = j.bias_batched ? j.batch : 1;
  // Whole 128-byte lines per row where that still gives every SM a block (narrower rows
  // otherwise): half lines cost DRAM efficiency, and twice the blocks a second wave.
  int tc = 8;
  while (tc > 1 && (chunks + tc - 1) / tc * items < sms) tc /= 2;
  const int64_t xblocks = (chunks + tc - 1) / tc;
  int64_t slices = 1;
  const int64_t space = j.batch * j.rows;
  if (!j.dbias && !j.bias_batched) {  // no sums to combine: split the rows too
    const int64_t min_rows = int64_t(kVecThreads / tc) * kVecUnroll;
    slices = std::max<int64_t>(1, std::min((2 * sms + xblocks - 1) / xblocks,
                                           (space + min_rows - 1) / min_rows));
  }
  const int64_t ys = j.bias_batched ? j.batch : slices;
  if (xblocks > INT32_MAX || ys > 65535) return cudaSuccess;
  const int64_t slice_rows = (space + slices - 1) / slices;
  const dim3 grid(static_cast<unsigned>(xblocks), static_cast<unsigned>(ys));
  with_dtype(j.ct_type, [&](auto t) {
    with_activation(j.act, [&](auto act) {
      dact_vec_kernel<decltype(t), decltype(act)::value>
          <<<grid, kVecThreads, 0, stream>>>(j, tc, slice_rows);
    });
  });
  *launched = true;
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchDact(const DactJob& job, cudaStream_t stream) {
  if (job.cols <= 0 || (job.bias_batched && job.batch <= 0)) return cudaSuccess;
  if (job.batch <= 0 || job.rows <= 0) {
    if (!job.dbias) return cudaSuccess;  // no rows: the sums are 0 (the scalar kernel writes them)
  } else {
    bool launched = false;
    if (cudaError_t e = LaunchDactVec(job, stream, &launched); e != cudaSuccess || launched)
      return e;
  }
  const int64_t col_blocks = (job.cols + kCols - 1) / kCols;
  if (col_blocks > INT32_MAX || (job.bias_batched && job.batch > 65535)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>(job.bias_batched ? job.batch : 1));
  dact_kernel<<<grid, kCols * kRowGroups, 0, stream>>>(job);
  return cudaGetLastError();
}

}  // namespace tcgemm
