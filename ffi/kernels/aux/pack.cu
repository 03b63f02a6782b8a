// Operand packing: with packing requested, an operand whose rows are not 16-byte multiples
// (contiguous extent % 8 != 0, e.g. K = 4093), or that has rows of 512 elements or more that are
// not 32-byte multiples (% 16 != 0, e.g. 3000: they stream 1.2-2.7x slower per flop), is copied
// into rows padded to a multiple of 8 elements (64 for long rows), zeros in the padding
// (NeedsPack and PlanWorkspace, gemm_dispatch.h), so that the GEMM streams it with 16-byte
// cp.async (the aligned kernel variant) or TMA from rows that start on 16 (128) bytes instead of
// element-by-element loads or rows at an odd pitch. The padding is never multiplied with
// anything but zeros or discarded rows: padded K columns meet the other operand's zero-filled K
// rows (or its own zero padding), padded M/N columns produce output rows/columns that are not
// stored.
#include <algorithm>
#include <cstdint>

#include "host/gemm_dispatch.h"
#include "kernels/common/element.cuh"

namespace tcgemm {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxRowBlocks = 65535;  // gridDim.y limit; row groups past it are looped over

struct PackJobs {
  PackJob job[2];
};

// The 8 elements starting `sh` (0..7) halves into the 16 halves lo:hi, as one 16-byte value:
// word selects and 16-bit funnel shifts, no register array indexed at run time.
__device__ __forceinline__ uint4 ShiftHalves(uint4 lo, uint4 hi, int sh) {
  uint32_t w0 = lo.x, w1 = lo.y, w2 = lo.z, w3 = lo.w, w4 = hi.x, w5 = hi.y, w6 = hi.z,
           w7 = hi.w;
  if (sh & 4) { w0 = w2; w1 = w3; w2 = w4; w3 = w5; w4 = w6; w5 = w7; }  // 2 words
  if (sh & 2) { w0 = w1; w1 = w2; w2 = w3; w3 = w4; w4 = w5; }            // 1 word
  const uint32_t bits = (sh & 1) * 16;
  return make_uint4(__funnelshift_r(w0, w1, bits), __funnelshift_r(w1, w2, bits),
                    __funnelshift_r(w2, w3, bits), __funnelshift_r(w3, w4, bits));
}

// One thread per 16-byte chunk of a destination row. A block's 256 threads cover `width` (a
// power of two, at least the widest row's chunks up to 256) chunks of 256 / width rows, so
// narrow rows (e.g. 32 chunks for 250 elements) keep the whole block busy: rows
// blockIdx.y * rows_per_block + threadIdx.x / width, chunks blockIdx.x * width + threadIdx.x %
// width. The source is
// rows x cols contiguous elements, so a chunk's 8 elements are contiguous there too, though not
// necessarily 16-byte aligned: with a 16-byte aligned base the thread reads the one or two
// aligned 16-byte segments that hold them (a warp reads one contiguous span) and shifts (by 0
// for rows that are 16-byte multiples: one segment, copied as is); otherwise (and for a segment
// that would reach past the source's last element) 8 two-byte loads. Elements past the row's
// end are zeros; chunks wholly past it (ld rounded up to 64 can exceed cols by up to 63) load
// nothing.
__global__ void __launch_bounds__(kThreads) pack_rows_kernel(PackJobs jobs, int log2_width) {
  const PackJob j = blockIdx.z == 0 ? jobs.job[0] : jobs.job[1];  // no local-memory copy
  const int width = 1 << log2_width, rows_per_block = kThreads >> log2_width;
  const int64_t c = (int64_t(blockIdx.x) * width + (threadIdx.x & (width - 1))) * 8;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_block + (threadIdx.x >> log2_width);
  const int64_t row_step = int64_t(gridDim.y) * rows_per_block;
  if (c >= j.ld) return;
  if (c >= j.cols) {  // padding only
    for (int64_t r = r0; r < j.rows; r += row_step)
      *reinterpret_cast<uint4*>(j.dst + r * j.ld + c) = make_uint4(0, 0, 0, 0);
    return;
  }
  const int valid = static_cast<int>(j.cols - c < 8 ? j.cols - c : 8);  // 1..8
  const bool vec = (reinterpret_cast<uintptr_t>(j.src) & 15) == 0;
  const auto* seg = reinterpret_cast<const uint4*>(j.src);
  const int64_t total = j.rows * j.cols;
  for (int64_t r = r0; r < j.rows; r += row_step) {
    const int64_t e = r * j.cols + c;  // first source element of the chunk
    union {
      uint4 v;
      uint16_t h[8];
    } u;
    const int sh = static_cast<int>(e & 7);
    const bool two = sh + valid > 8;  // the chunk reaches into the next segment
    // Segments wholly inside the source only (the last one may end mid-segment: scalar loads).
    if (vec && ((e >> 3) + (two ? 2 : 1)) * 8 <= total) {
      const uint4 lo = __ldg(seg + (e >> 3));
      const uint4 hi = two ? __ldg(seg + (e >> 3) + 1) : make_uint4(0, 0, 0, 0);
      u.v = ShiftHalves(lo, hi, sh);
      if (valid < 8) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (i >= valid) u.h[i] = 0;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) u.h[i] = i < valid ? __ldg(j.src + e + i) : uint16_t(0);
    }
    *reinterpret_cast<uint4*>(j.dst + r * j.ld + c) = u.v;
  }
}

// 8-bit B stored N-major ([K][N] rows, the layout of x @ W) copied K-major ([N][K]) for the
// sm90 8-bit kernels, whose wgmma reads 8-bit operands K-major only. A block transposes a
// tile of 128 k x 128 n bytes through shared memory. Loads: 16-byte row chunks, 4 per thread (a
// warp reads 4 rows of 128 bytes). Then thread (warp w, lane: k chunk kc = lane % 8, n group
// ng = lane / 8) takes the 4 n columns 16 w + 4 ng .. + 3 of the 16 k rows 16 kc .. + 15 as 16
// words, transposes them 4 x 4 bytes at a time with byte permutes, and stores its 4 n rows' 16
// k bytes: each store instruction of a warp writes 4 whole 128-byte row segments. The tile's
// words are XOR-swizzled by k row group ((row / 16) * 4) so that a warp's 32 word reads hit 32
// banks. Rows of N bytes that are not 16-byte multiples (or an unaligned base) load byte by
// byte; K is a multiple of 16 (the GEMM's own requirement), so stores are whole 16-byte chunks.
constexpr int kTr = 128;  // tile: kTr k rows x kTr n bytes

__device__ __forceinline__ int TrWord(int row, int word) {
  return row * (kTr / 4) + (word ^ ((row >> 4) << 2));
}

__global__ void __launch_bounds__(kThreads) transpose_bytes_kernel(TransposeJob j, bool vec) {
  __shared__ uint32_t tile[kTr * kTr / 4];
  const int t = threadIdx.x;
  const int64_t k0 = int64_t(blockIdx.y) * kTr, n0 = int64_t(blockIdx.x) * kTr;
  const uint8_t* src = j.src + int64_t(blockIdx.z) * j.k * j.n;
  uint8_t* dst = j.dst + int64_t(blockIdx.z) * j.k * j.n;
#pragma unroll
  for (int i = 0; i < kTr * kTr / 16 / kThreads; ++i) {
    const int row = t / 8 + 32 * i, chunk = t % 8;
    const int64_t k = k0 + row, n = n0 + 16 * chunk;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (k < j.k && n < j.n) {
      const uint8_t* at = src + k * j.n + n;
      if (vec) {
        v = __ldg(reinterpret_cast<const uint4*>(at));
      } else {
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int e = 0; e < 16; ++e)
          if (n + e < j.n) w[e / 4] |= uint32_t(__ldg(at + e)) << (8 * (e % 4));
        v = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    *reinterpret_cast<uint4*>(tile + TrWord(row, 4 * chunk)) = v;  // (4-word groups stay whole)
  }
  __syncthreads();
  const int lane = t % 32, w = t / 32, kc = lane % 8, ng = lane / 8;
  const int word = 4 * w + ng;  // n columns 4 word .. 4 word + 3
  uint32_t out[4][4];           // [n column][k word]
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    uint32_t x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = tile[TrWord(16 * kc + 4 * g + i, word)];
    // x[i] byte c: (k 16 kc + 4 g + i, n 4 word + c) -> out[c][g] byte i
    uint32_t y[4];
    transpose_4x4_bytes(x, y);
#pragma unroll
    for (int c = 0; c < 4; ++c) out[c][g] = y[c];
  }
  const int64_t k = k0 + 16 * kc;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int64_t n = n0 + 4 * word + c;
    if (n < j.n && k < j.k)
      *reinterpret_cast<uint4*>(dst + n * j.k + k) =
          make_uint4(out[c][0], out[c][1], out[c][2], out[c][3]);
  }
}

}  // namespace

cudaError_t LaunchPack(const PackJob* jobs, int count, cudaStream_t stream) {
  if (count < 1 || count > 2) return cudaErrorInvalidValue;
  PackJobs js{};
  int64_t chunks = 0, rows = 0;
  for (int i = 0; i < count; ++i) {
    js.job[i] = jobs[i];
    chunks = std::max(chunks, jobs[i].ld / 8);
    rows = std::max(rows, jobs[i].rows);
  }
  int log2_width = 0;  // chunks per block row: the widest row's, rounded up to a power of two
  while ((int64_t(1) << log2_width) < chunks && (1 << log2_width) < kThreads) ++log2_width;
  const int64_t width = int64_t(1) << log2_width, rows_per_block = kThreads / width;
  const dim3 grid(static_cast<unsigned>((chunks + width - 1) / width),
                  static_cast<unsigned>(std::clamp<int64_t>(
                      (rows + rows_per_block - 1) / rows_per_block, 1, kMaxRowBlocks)),
                  static_cast<unsigned>(count));
  pack_rows_kernel<<<grid, kThreads, 0, stream>>>(js, log2_width);
  return cudaGetLastError();
}

cudaError_t LaunchTransposeBytes(const TransposeJob& job, cudaStream_t stream) {
  if (job.n == 0 || job.k == 0 || job.batch == 0) return cudaSuccess;
  const int64_t tiles_n = (job.n + kTr - 1) / kTr, tiles_k = (job.k + kTr - 1) / kTr;
  if (job.k % 16 != 0 || job.batch < 0 || tiles_n > INT32_MAX || tiles_k > 65535 ||
      (reinterpret_cast<uintptr_t>(job.dst) & 15) != 0)
    return cudaErrorInvalidValue;
  const bool vec = job.n % 16 == 0 && (reinterpret_cast<uintptr_t>(job.src) & 15) == 0;
  // batch items in launches of at most 65535 (grid z), each from its own item on
  constexpr int64_t kMaxZ = 65535;
  for (int64_t z0 = 0; z0 < job.batch; z0 += kMaxZ) {
    TransposeJob part = job;
    part.src += z0 * job.k * job.n;
    part.dst += z0 * job.k * job.n;
    part.batch = std::min(kMaxZ, job.batch - z0);
    const dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_k),
                    static_cast<unsigned>(part.batch));
    transpose_bytes_kernel<<<grid, kThreads, 0, stream>>>(part, vec);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace tcgemm
