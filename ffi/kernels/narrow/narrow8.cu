// The narrow rows (Kind::kNarrow, ffi/host/gemm_config.inc): 8-bit products of few rows (M up to
// BM = 16 or 32: decode steps, x @ W with a quantised W) whose B is stored N-major ([K][N], as
// x @ W holds W). Such a product is bound by reading B once; the sm90 and sm80 rows read 8-bit
// operands K-major only, so they first copy B K-major (a second pass over it, PlanWorkspace),
// while these read it as stored and turn it K-major in registers (4 x 4 byte transposes), then
// run mma.sync m16n8k32 (int8: s8, exact int32 sums; fp8: the e4m3 / e5m2 pairs, float32 sums,
// sm_89 and newer). (A K-major B stays on the other rows: this loader, 8 bytes per column and
// step, was 1.1-1.5x slower there than they are: benchmarks/NOTES.md v69.)
//
// A block: warps_n x warps_k warps over one BM x BN tile, each warp owning BN / warps_n columns
// (NJ n8 mma tiles: 8 or 4) and every warps_k-th 128-wide k tile of the block's K slice. Per k
// tile a lane (g = lane / 4, q = lane % 4) owns 32 of its 128 k: [64 p + 16 q, +16) for p = 0,
// 1; its k32 step s = 2 p + h takes the 8 k at 64 p + 16 q + 8 h, the first four as mma
// positions 4q..4q+3, the others as 16+4q..16+4q+3. That permutes k within the tile alike for A
// and B (the product is the same) and gives each lane 8 contiguous bytes of each row of A and
// 8 k rows of B. Lane group g holds column n0 + NJ g + j of n8 tile j, so a lane reads NJ
// contiguous bytes of each k row. Each warp streams its steps through a ring of kStages slots
// in shared memory by cp.async (a lane copies and reads back only its own bytes: no barrier),
// kStages - 1 steps ahead, across k tiles.
// fp8: each k tile's sums (four k32 steps: 128 of K) are added into float32 registers apart
// (Hopper's fp8 tensor-core sums keep fewer bits), times the tile's block scales if any.
// The warps' sums meet in shared memory; the block stores the epilogue of its tile into D, or
// (split K) its raw partial sums into the workspace for the split-K reduction.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "host/gemm_config.h"
#include "host/gemm_dispatch.h"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/ldmatrix.cuh"  // cvta_to_shared
#include "ptx/mma.cuh"

namespace tcgemm {
namespace {

template <typename TA, typename TB>
struct NarrowOps {
  static constexpr bool kInt = std::is_same_v<TA, int8_t>;
  using Acc = std::conditional_t<kInt, int, float>;
  static __device__ __forceinline__ void mma(Acc (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    using E4 = __nv_fp8_e4m3;
    using E5 = __nv_fp8_e5m2;
    if constexpr (kInt) ptx::mma_m16n8k32_s32_s8_s8_s32(d, a, b);
    else if constexpr (std::is_same_v<TA, E4> && std::is_same_v<TB, E4>)
      ptx::mma_m16n8k32_f32_e4m3_e4m3_f32(d, a, b);
    else if constexpr (std::is_same_v<TA, E4> && std::is_same_v<TB, E5>)
      ptx::mma_m16n8k32_f32_e4m3_e5m2_f32(d, a, b);
    else ptx::mma_m16n8k32_f32_e5m2_e4m3_f32(d, a, b);
  }
};

// f(i, j, e) for every sum of a warp: m16 tile i, n8 tile j, accumulator e (unrolled).
template <int MT, int NJ, typename F>
__device__ __forceinline__ void each(F&& f) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(i, j, e);
}

template <int CFG>
struct NarrowTraits {
  static constexpr GemmConfig c = kConfigs[CFG];
  static constexpr int kBM = c.bm, kBN = c.bn, kWarpsN = c.warps_n, kWarpsK = c.warps_k;
  static constexpr int kThreads = 32 * kWarpsN * kWarpsK;
  static constexpr int kMT = kBM / 16, kNJ = kBN / kWarpsN / 8;  // m16, n8 mma tiles per warp
  static constexpr int kKTile = KTileElems(CFG, 1);    // 128 of K
  static constexpr int kLd = kBN + 4;                  // shared sums' row pitch (words)
  static constexpr int kRedBytes = kWarpsK * kBM * kLd * 4;
  // Each warp's ring of kStages k32 steps in shared memory, filled by cp.async (nothing held in
  // registers while in flight): per step and lane, 2 MT 8-byte units of A and 8 units of B (k
  // rows of NJ bytes), lane-minor (unit u of lane l at (32 u + l) x its size: conflict-free).
  static constexpr int kStages = 6;
  static constexpr int kStepBytes = 32 * (2 * kMT * 8 + kNJ * 8);
  static constexpr int kRingBytes = kStages * kStepBytes;
  static constexpr int kSmemBytes = std::max(kWarpsN * kWarpsK * kRingBytes, kRedBytes);
  static_assert(c.kind == Kind::kNarrow && kBM % 16 == 0 && (kNJ == 8 || kNJ == 4) &&
                    kKTile == 128 && kBN % 64 == 0 && kMT * kNJ <= 8,
                "narrow rows: BM a multiple of 16, 32 or 64 columns per warp, BN a multiple of "
                "64 (one block scale column), BK 64 (128 8-bit k per tile), <= 128 sums a lane");
  static_assert(kBM * kBN % (4 * kThreads) == 0, "the store takes 4 columns per thread");
  static_assert(3 * (kSmemBytes + 1024) <= 228 * 1024, "three blocks per SM");
};

template <typename TA, typename TB, int CFG>
__global__ void __launch_bounds__(NarrowTraits<CFG>::kThreads,
                                  std::is_same_v<TA, int8_t> ? 3 : 2)  // (fp8: twice the sums)
    narrow8_kernel(const GemmParams p) {
  using T = NarrowTraits<CFG>;
  using Ops = NarrowOps<TA, TB>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  if constexpr (!Ops::kInt) return;  // fp8 mma.sync needs sm_89 (the dispatcher: 9.0 and newer)
#endif
  using Acc = typename Ops::Acc;
  constexpr int MT = T::kMT, NJ = T::kNJ;
  extern __shared__ __align__(16) uint8_t smem[];
  auto& red = *reinterpret_cast<Acc(*)[T::kWarpsK][T::kBM][T::kLd]>(smem);  // after the loop

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int wn = warp % T::kWarpsN, wk = warp / T::kWarpsN;
  const int64_t nb = int64_t(blockIdx.x) * T::kBN, n0 = nb + wn * NJ * 8;  // block's, warp's
  const int slice = blockIdx.y;
  const int64_t k_tiles = (p.k + T::kKTile - 1) / T::kKTile;
  const int64_t t_begin = int64_t(slice) * p.k_tiles_per_split;
  const int64_t t_end = std::min<int64_t>(t_begin + p.k_tiles_per_split, k_tiles);
  const EpiScale es = epi_scale(p);
  const bool vec = p.n % 4 == 0;

  for (int64_t z = blockIdx.z; z < p.batch; z += gridDim.z) {
    const uint8_t* a = static_cast<const uint8_t*>(p.a) + z * p.stride_a;
    const uint8_t* b = static_cast<const uint8_t*>(p.b) + z * p.stride_b;
    // One k32 step's data of a lane, as loaded: A rows g, g + 8 of each m16 tile (8 bytes
    // each), and 8 k rows of B's NJ columns (NJ bytes each).
    struct Raw {
      uint2 a[MT][2];
      uint32_t b[NJ * 2];
    };
    const uint32_t ring = ptx::cvta_to_shared(smem) + warp * T::kRingBytes;
    constexpr int kBUnit = NJ;  // bytes of a B unit: one k row's NJ columns
    auto issue = [&](int slot, int64_t t, int s) {  // step s of k tile t into ring slot `slot`
      const int64_t kk = t * T::kKTile + 64 * (s / 2) + 16 * q + 8 * (s % 2);
      const bool k_ok = kk < p.k;  // K % 16 == 0: 8 bytes all in or all out
      const uint32_t at = ring + slot * T::kStepBytes;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = 16 * i + g + 8 * h;
          const bool ok = k_ok && r < p.m;
          ptx::cp_async_ca_zfill<8>(at + (32 * (2 * i + h) + lane) * 8, ok ? a + r * p.lda + kk : a,
                                   ok ? 8 : 0);
        }
      const uint32_t bat = at + 32 * 2 * MT * 8;
      // k rows kk..kk+7, columns n0 + NJ g .. + NJ - 1 (N % 8 == 0: all in or all out)
      const bool ok = k_ok && n0 + NJ * g < p.n;
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const uint8_t* src = b + (kk + v) * p.ldb + n0 + NJ * g;
        ptx::cp_async_ca_zfill<kBUnit>(bat + (32 * v + lane) * kBUnit, ok ? src : b,
                                       ok ? kBUnit : 0);
      }
    };
    auto read = [&](int slot, Raw& raw) {  // a step's data of this lane, from its ring slot
      const uint8_t* at = smem + warp * T::kRingBytes + slot * T::kStepBytes;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          raw.a[i][h] = *reinterpret_cast<const uint2*>(at + (32 * (2 * i + h) + lane) * 8);
      const uint8_t* bat = at + 32 * 2 * MT * 8;
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        if constexpr (kBUnit == 8) {
          const uint2 y = *reinterpret_cast<const uint2*>(bat + (32 * v + lane) * 8);
          raw.b[2 * v] = y.x; raw.b[2 * v + 1] = y.y;
        } else {
          raw.b[v] = *reinterpret_cast<const uint32_t*>(bat + (32 * v + lane) * 4);
        }
      }
    };
    // The mma fragments of a step's data (B's 4 x 4 byte blocks transposed: K-major words).
    auto fragments = [&](const Raw& raw, uint32_t (&af)[MT][4], uint32_t (&bf)[NJ][2]) {
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        af[i][0] = raw.a[i][0].x; af[i][1] = raw.a[i][1].x;
        af[i][2] = raw.a[i][0].y; af[i][3] = raw.a[i][1].y;
      }
#pragma unroll
      for (int half = 0; half < 2; ++half)  // k rows 4 half .. +3 -> register `half`
#pragma unroll
        for (int w = 0; w < NJ / 4; ++w) {  // columns NJ g + 4 w .. +3
          uint32_t x[4], y[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) x[r] = raw.b[(4 * half + r) * (NJ / 4) + w];
          transpose_4x4_bytes(x, y);
#pragma unroll
          for (int c = 0; c < 4; ++c) bf[4 * w + c][half] = y[c];
        }
    };
    Acc sum[MT][NJ][4] = {};
    // kStages - 1 steps in flight ahead of the one being multiplied: the warp's step u + S - 1
    // (in this k tile or a later one) is issued into the slot that step u - 1 freed.
    constexpr int S = T::kStages;
    const int64_t t0 = t_begin + wk;
    const int tiles = t0 < t_end ? static_cast<int>((t_end - t0 + T::kWarpsK - 1) / T::kWarpsK) : 0;
    auto issue_step = [&](int u) {
      if (u < 4 * tiles) issue(u % S, t0 + int64_t(u / 4) * T::kWarpsK, u % 4);
      ptx::cp_async_commit_group();  // (an empty group past the end: the count stays uniform)
    };
#pragma unroll
    for (int u = 0; u < S - 1; ++u) issue_step(u);
    for (int it = 0; it < tiles; ++it) {
      const int64_t t = t0 + int64_t(it) * T::kWarpsK;
      // int8: the exact int32 sums run on; fp8: this k tile's sums, added in float32 below
      Acc part[MT][NJ][4];
      each<MT, NJ>([&](int i, int j, int e) { part[i][j][e] = Ops::kInt ? sum[i][j][e] : Acc(0); });
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int u = 4 * it + s;
        ptx::cp_async_wait_group<S - 2>();  // step u is in (each lane reads its own units)
        Raw raw;
        read(u % S, raw);
        issue_step(u + S - 1);
        uint32_t af[MT][4], bf[NJ][2];
        fragments(raw, af, bf);
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < NJ; ++j) Ops::mma(part[i][j], af[i], bf[j]);
      }
      if constexpr (Ops::kInt) {
        each<MT, NJ>([&](int i, int j, int e) { sum[i][j][e] = part[i][j][e]; });
      } else if (p.block_sa) {  // the k tile's block scales: a's per row, b's per 128 columns
        const float sb = __ldg(p.block_sb + z * p.block_sb_sb + t * ((p.n + 127) / 128) + nb / 128);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t r = 16 * i + g + 8 * h;
            const float f =
                r < p.m ? sb * __ldg(p.block_sa + z * p.block_sa_sb + t * p.block_sa_ld + r) : 0.0f;
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
              sum[i][j][2 * h] = fmaf(part[i][j][2 * h], f, sum[i][j][2 * h]);
              sum[i][j][2 * h + 1] = fmaf(part[i][j][2 * h + 1], f, sum[i][j][2 * h + 1]);
            }
          }
        }
      } else {
        each<MT, NJ>([&](int i, int j, int e) { sum[i][j][e] += part[i][j][e]; });
      }
    }
    ptx::cp_async_wait_group<0>();
    __syncthreads();  // (red overlays the rings)
    // d[e] of tile (i, j): row 16 i + g (+8 for e >= 2), column NJ (2 q + e % 2) + j of the warp's
    each<MT, NJ>([&](int i, int j, int e) {
      red[wk][16 * i + g + 8 * (e / 2)][wn * NJ * 8 + NJ * (2 * q + e % 2) + j] = sum[i][j][e];
    });
    __syncthreads();
    for (int idx = threadIdx.x; idx < T::kBM * T::kBN / 4; idx += T::kThreads) {
      const int r = idx / (T::kBN / 4), c = idx % (T::kBN / 4) * 4;
      const int64_t col = nb + c;
      if (r >= p.m || col >= p.n) continue;
      Acc v[4] = {};
#pragma unroll
      for (int w = 0; w < T::kWarpsK; ++w)  // in warp order: deterministic
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (Ops::kInt) v[e] = Acc(uint32_t(v[e]) + uint32_t(red[w][r][c + e]));
          else v[e] += red[w][r][c + e];
        }
      const int cols_left = static_cast<int>(std::min<int64_t>(4, p.n - col));
      const int64_t off = (z * p.m + r) * p.n + col;
      if (p.partial || p.d_type == DType::kS32) {  // raw sums: float32, or int32 for int8
        Acc* dst = p.partial ? reinterpret_cast<Acc*>(p.partial) + slice * p.batch * p.m * p.n + off
                             : static_cast<Acc*>(p.d) + off;
        if (vec) {
          if constexpr (Ops::kInt) *reinterpret_cast<int4*>(dst) = make_int4(v[0], v[1], v[2], v[3]);
          else *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (e < cols_left) dst[e] = v[e];
        }
      } else {
        float f[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) f[e] = float(v[e]);
        with_dtype(p.d_type, [&](auto out) {
          epi_store<decltype(out), 4>(p, es, z, r, col, f, off, cols_left, vec);
        });
      }
    }
    __syncthreads();  // (red is written again for the next batch item)
  }
}

template <typename TA, typename TB, int CFG>
const void* NarrowKernel() {
  if constexpr (kConfigs[CFG].kind == Kind::kNarrow)
    return reinterpret_cast<const void*>(&narrow8_kernel<TA, TB, CFG>);
  else return nullptr;
}

// The kernels of operand pair (TA, TB), one per config (nullptr: not narrow).
template <typename TA, typename TB, int... CFGs>
const void* Lookup(int config, std::integer_sequence<int, CFGs...>) {
  static const void* const table[] = {NarrowKernel<TA, TB, CFGs>()...};
  return table[config];
}

template <int CFG>
std::pair<int, int> ShapeOf() {  // (threads, dynamic shared memory bytes)
  if constexpr (kConfigs[CFG].kind == Kind::kNarrow)
    return {NarrowTraits<CFG>::kThreads, NarrowTraits<CFG>::kSmemBytes};
  else return {0, 0};
}
template <int... CFGs>
std::pair<int, int> Shape(int config, std::integer_sequence<int, CFGs...>) {
  static const std::pair<int, int> table[] = {ShapeOf<CFGs>()...};
  return table[config];
}

// cudaFuncAttributeMaxDynamicSharedMemorySize set, per (config, operand types), one bit per
// device (RaiseSmemLimit).
std::atomic<uint64_t> g_smem_done[kNumConfigs][kNumBytePairs];

}  // namespace

std::string LaunchNarrow(const GemmParams& p, int config, InType a_type, InType b_type,
                         int device, cudaStream_t stream) {
  const auto cfgs = std::make_integer_sequence<int, kNumConfigs>{};
  const int pair = BytePair(a_type, b_type);
  const void* fn = nullptr;
  if (config >= 0 && config < kNumConfigs)
    with_byte_pair(pair, [&](auto ta, auto tb) {
      fn = Lookup<decltype(ta), decltype(tb)>(config, cfgs);
    });
  if (!fn)
    return "no narrow kernel for config " +
           (config >= 0 && config < kNumConfigs ? ConfigNames()[config] : std::to_string(config)) +
           " and these operand types";
  const auto [threads, smem] = Shape(config, cfgs);
  if (std::string err = RaiseSmemLimit(fn, smem, g_smem_done[config][pair], device);
      !err.empty())
    return err;
  const dim3 grid(static_cast<unsigned>(p.tiles_n), static_cast<unsigned>(p.split_k),
                  static_cast<unsigned>(std::min<int64_t>(p.batch, 65535)));
  void* args[] = {const_cast<GemmParams*>(&p)};
  cudaError_t e = cudaLaunchKernel(fn, grid, dim3(threads), args, smem, stream);
  if (e == cudaSuccess) e = cudaGetLastError();
  return e == cudaSuccess ? std::string()
                          : std::string("narrow kernel launch: ") + cudaGetErrorName(e);
}

}  // namespace tcgemm
