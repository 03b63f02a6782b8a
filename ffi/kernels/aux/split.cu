// The float32 operand splits of the multi-pass float32 algorithms (host/split.h; their
// specification is jax_tcgemm/f32.py, which tests/test_split_gpu.py holds these kernels to bit
// for bit): one pass that reads the operand once, in either layout, and writes every part where
// the layout puts it along K' of K-major rows, so that XLA's transposes, split fusions and
// concatenations in front of the product become one memory-bound kernel.
//
// The split kernel: a block loads a 32-row x 128-k tile into shared memory (16-byte loads along
// k for a K-major operand, 128-byte row segments along the rows otherwise), then each lane of a
// warp splits four consecutive elements of a row and stores each part's four with one store. f16x3's rows are first scaled by a
// power of two from their largest finite magnitude: a max pass writes it into inv (a warp per
// K-major row; a thread per row and atomicMax over chunks of k otherwise), the split kernel
// reads it, and a last pass turns it into 1 / the power of two.
//
// Every float operation is one rounded IEEE operation as the specification's XLA ops do it:
// the roundings to TF32 / bfloat16 are integer ops, the products and differences are
// __fmul_rn / __fsub_rn (never contracted into an FMA), no flush to zero.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "host/split.h"
#include "kernels/common/element.cuh"

namespace tcgemm {
namespace {

constexpr int kThreads = 256, kTileR = 32, kTileK = 128;
constexpr int kColChunk = 256;      // k per thread of the column max
constexpr int64_t kMaxGridY = 65535;

// f32._round: x rounded to nearest at the bits of mask (half a unit added), truncated where
// that overflows; non-finite x as it is.
__device__ __forceinline__ float round_at(float x, uint32_t half, uint32_t mask) {
  const uint32_t bits = __float_as_uint(x);
  const float y = __uint_as_float((bits + half) & mask);
  if (!isfinite(x)) return x;
  return isfinite(y) ? y : __uint_as_float(bits & mask);
}
__device__ __forceinline__ float tf32_round(float x) { return round_at(x, 0x1000u, 0xFFFFE000u); }
__device__ __forceinline__ float bf16_round(float x) {
  return round_at(x, 0x7FFFu + ((__float_as_uint(x) >> 16) & 1u), 0xFFFF0000u);
}

__device__ __forceinline__ float pow2(int e) {  // 2^e, e in [-126, 127]
  return __uint_as_float(uint32_t(e + 127) << 23);
}

// f32.f16_parts's shift of a row whose largest finite magnitude is top (>= 0): 2^shift puts
// top in [2^(top_exp - 1), 2^top_exp); 0 for a row of zeros; clipped to [-126, 126].
__device__ __forceinline__ int row_shift(float top, int top_exp) {
  if (!(top > 0.0f)) return 0;
  const uint32_t b = __float_as_uint(top);
  const int biased = int(b >> 23);
  const int e = biased ? biased - 126 : (32 - __clz(int(b))) - 149;  // frexp: top < 2^e
  return min(max(top_exp - e, -126), 126);
}

__device__ __forceinline__ float finite_abs(float v) { return isfinite(v) ? fabsf(v) : 0.0f; }

// The parts of element x (f32.parts, f32.f16_parts): p[0] the biggest.
template <SplitKind kKind>
__device__ __forceinline__ void split_element(float x, float scale, const SplitJob& j,
                                              float (&p)[3]) {
  const bool finite = isfinite(x);
  if constexpr (kKind == SplitKind::kF16Scaled) {
    const float y = __fmul_rn(x, scale);  // exact but where it falls below float32's normals
    p[0] = fabsf(y) < 0x1p-14f ? __fmul_rn(rintf(__fmul_rn(y, 0x1p24f)), 0x1p-24f)
                               : tf32_round(y);  // float16's subnormal grid, or 10 bits
    p[1] = finite ? __fmul_rn(__fsub_rn(y, p[0]), j.lo_scale) : 0.0f;
    p[2] = 0.0f;
  } else {
    float rest = x;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      float w = 0.0f;
      if (i < j.parts) {
        w = kKind == SplitKind::kBf16 ? bf16_round(rest)
            : j.parts == 1            ? rest  // one TF32 pass: the kernels read x as it is
                                      : tf32_round(rest);
        rest = finite ? __fsub_rn(rest, w) : 0.0f;
      }
      p[i] = w;
    }
  }
}

// Four elements of T, stored with one 8- or 16-byte store.
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

template <SplitKind kKind, bool kKMajor, typename T>
__global__ void __launch_bounds__(kThreads) split_kernel(const SplitJob j, bool vec) {
  __shared__ __align__(16) float tile[kTileR][kTileK + 4];
  __shared__ float scale[kTileR];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t k0 = int64_t(blockIdx.x) * kTileK;
  const int64_t rtiles = (j.rows + kTileR - 1) / kTileR;
  T* out = static_cast<T*>(j.out);
  for (int64_t y = blockIdx.y; y < j.batch * rtiles; y += gridDim.y) {
    const int64_t z = y / rtiles, r0 = (y - z * rtiles) * kTileR;
    const float* x = j.x + z * j.rows * j.k;
    if constexpr (kKMajor) {  // a warp per row: lane l loads k 4l .. 4l + 3
#pragma unroll
      for (int i = 0; i < kTileR / 8; ++i) {
        const int r = warp + 8 * i;
        const int64_t row = r0 + r, kx = k0 + 4 * lane;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row < j.rows) {
          const float* src = x + row * j.k + kx;
          if (vec) {
            if (kx < j.k) v = *reinterpret_cast<const float4*>(src);
          } else {
            v.x = kx < j.k ? src[0] : 0.0f;
            v.y = kx + 1 < j.k ? src[1] : 0.0f;
            v.z = kx + 2 < j.k ? src[2] : 0.0f;
            v.w = kx + 3 < j.k ? src[3] : 0.0f;
          }
        }
        *reinterpret_cast<float4*>(&tile[r][4 * lane]) = v;
      }
    } else {  // a warp per 128-byte row segment of x (batch, k, rows)
#pragma unroll
      for (int i = 0; i < kTileK / 8; ++i) {
        const int c = warp + 8 * i;
        const int64_t row = r0 + lane, kx = k0 + c;
        tile[lane][c] = row < j.rows && kx < j.k ? x[kx * j.rows + row] : 0.0f;
      }
    }
    if constexpr (kKind == SplitKind::kF16Scaled) {
      if (t < kTileR)
        scale[t] = r0 + t < j.rows ? pow2(row_shift(j.inv[z * j.rows + r0 + t], j.top_exp)) : 1.0f;
    }
    __syncthreads();
    // A warp per row: lane l splits k 4l .. 4l + 3 and stores each block's four parts at once
    // (vec: K, K' and the offsets multiples of 4) or one by one.
#pragma unroll 1
    for (int i = 0; i < kTileR / 8; ++i) {
      const int r = warp + 8 * i;
      const int64_t row = r0 + r, kx = k0 + 4 * lane;
      if (row >= j.rows || kx >= j.k) continue;
      const float4 v4 = *reinterpret_cast<const float4*>(&tile[r][4 * lane]);
      const float v[4] = {v4.x, v4.y, v4.z, v4.w};
      float p[4][3];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        split_element<kKind>(v[e], kKind == SplitKind::kF16Scaled ? scale[r] : 1.0f, j, p[e]);
      T* o = out + (z * j.rows + row) * j.kk + kx;
      for (int b = 0; b < j.nblocks; ++b) {
        const int q = j.part[b];
        Vec4<T> w;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float pe = q == 0 ? p[e][0] : q == 1 ? p[e][1] : p[e][2];
          if (j.masked[b] && !isfinite(v[e])) pe = 0.0f;
          w.v[e] = convert<T>(pe);
        }
        if (vec) {
          *reinterpret_cast<Vec4<T>*>(o + j.offset[b]) = w;
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (kx + e < j.k) o[j.offset[b] + e] = w.v[e];
        }
      }
    }
    if (blockIdx.x == 0) {  // the zero ranges of these rows
      for (int zr = 0; zr < j.nzeros; ++zr)
        for (int64_t c = j.zero_begin[zr] + lane; c < j.zero_end[zr]; c += 32)
          for (int r = warp; r < kTileR; r += 8)
            if (r0 + r < j.rows) out[(z * j.rows + r0 + r) * j.kk + c] = convert<T>(0.0f);
    }
    __syncthreads();
  }
}

// f16x3: the largest finite magnitude of each K-major row into inv, a warp per row.
__global__ void __launch_bounds__(kThreads) row_max_kernel(const SplitJob j) {
  const int lane = threadIdx.x % 32;
  const int64_t nrows = j.batch * j.rows;
  const int64_t step = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t row = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32; row < nrows;
       row += step) {
    const float* x = j.x + row * j.k;
    float m = 0.0f;
    int64_t c = lane;
    for (; c + 96 < j.k; c += 128) {
      const float v0 = x[c], v1 = x[c + 32], v2 = x[c + 64], v3 = x[c + 96];
      m = fmaxf(fmaxf(m, fmaxf(finite_abs(v0), finite_abs(v1))),
                fmaxf(finite_abs(v2), finite_abs(v3)));
    }
    for (; c < j.k; c += 32) m = fmaxf(m, finite_abs(x[c]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if (lane == 0) j.inv[row] = m;
  }
}

// f16x3: the same for rows stored along the fast axis (x (batch, k, rows)): a thread per row and
// chunk of k, merged by atomicMax on the bits (inv zeroed first; magnitudes order as uints).
__global__ void __launch_bounds__(kThreads) col_max_kernel(const SplitJob j) {
  const int64_t r = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t chunks = (j.k + kColChunk - 1) / kColChunk;
  if (r >= j.rows) return;
  for (int64_t y = blockIdx.y; y < j.batch * chunks; y += gridDim.y) {
    const int64_t z = y / chunks, c0 = (y - z * chunks) * kColChunk;
    const int64_t c1 = min(c0 + kColChunk, j.k);
    const float* x = j.x + z * j.k * j.rows + r;
    float m = 0.0f;
    int64_t c = c0;
    for (; c + 4 <= c1; c += 4) {
      const float v0 = x[c * j.rows], v1 = x[(c + 1) * j.rows], v2 = x[(c + 2) * j.rows],
                  v3 = x[(c + 3) * j.rows];
      m = fmaxf(fmaxf(m, fmaxf(finite_abs(v0), finite_abs(v1))),
                fmaxf(finite_abs(v2), finite_abs(v3)));
    }
    for (; c < c1; ++c) m = fmaxf(m, finite_abs(x[c * j.rows]));
    atomicMax(reinterpret_cast<unsigned*>(j.inv) + z * j.rows + r, __float_as_uint(m));
  }
}

// f16x3: each row's largest magnitude in inv becomes 1 / its power of two.
__global__ void __launch_bounds__(kThreads) row_inv_kernel(const SplitJob j) {
  const int64_t n = j.batch * j.rows;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    j.inv[i] = pow2(-row_shift(j.inv[i], j.top_exp));
}

unsigned Blocks(int64_t n, int64_t per) {
  return unsigned(std::min<int64_t>((n + per - 1) / per, int64_t(1) << 30));
}

template <SplitKind kKind, typename T>
void LaunchSplitKernel(const SplitJob& j, cudaStream_t stream) {
  const dim3 grid(unsigned(std::max<int64_t>(1, (j.k + kTileK - 1) / kTileK)),
                  unsigned(std::min(j.batch * ((j.rows + kTileR - 1) / kTileR), kMaxGridY)));
  // Four elements per load and store where every row, block and operand row starts on a
  // multiple of 4 (XLA's buffers are aligned further).
  bool vec = j.k % 4 == 0 && j.kk % 4 == 0;
  for (int b = 0; b < j.nblocks; ++b) vec = vec && j.offset[b] % 4 == 0;
  if (j.k_major)
    split_kernel<kKind, true, T><<<grid, kThreads, 0, stream>>>(j, vec);
  else
    split_kernel<kKind, false, T><<<grid, kThreads, 0, stream>>>(j, vec);
}

}  // namespace

cudaError_t LaunchSplit(const SplitJob& j, cudaStream_t stream) {
  const int64_t nrows = j.batch * j.rows;
  if (nrows == 0) return cudaSuccess;
  const bool scaled = j.kind == SplitKind::kF16Scaled;
  if (scaled) {
    if (j.k_major) {
      row_max_kernel<<<Blocks(nrows, kThreads / 32), kThreads, 0, stream>>>(j);
    } else {
      if (cudaError_t e = cudaMemsetAsync(j.inv, 0, nrows * sizeof(float), stream);
          e != cudaSuccess)
        return e;
      const int64_t chunks = std::max<int64_t>(1, (j.k + kColChunk - 1) / kColChunk);
      const dim3 grid(Blocks(j.rows, kThreads), unsigned(std::min(j.batch * chunks, kMaxGridY)));
      col_max_kernel<<<grid, kThreads, 0, stream>>>(j);
    }
  }
  if (j.kk > 0) {
    switch (j.kind) {
      case SplitKind::kTf32: LaunchSplitKernel<SplitKind::kTf32, float>(j, stream); break;
      case SplitKind::kBf16: LaunchSplitKernel<SplitKind::kBf16, __nv_bfloat16>(j, stream); break;
      case SplitKind::kF16Scaled: LaunchSplitKernel<SplitKind::kF16Scaled, __half>(j, stream); break;
    }
  }
  if (scaled) row_inv_kernel<<<Blocks(nrows, kThreads), kThreads, 0, stream>>>(j);
  return cudaGetLastError();
}

}  // namespace tcgemm
