// The mma.sync GEMM kernel template (sm_80+):  C[z] = A[z] · B[z]  for z < batch.
//
// One loop per layer:
//   kernel       : batch loop (grid z), K slice of split-K (grid y), threadblock rasterization
//                  (grid x)
//   threadblock  : multi-stage global->shared pipeline over K: cp.async (TileLoader), or for
//                  sm90tma rows TMA bulk tensor copies on mbarriers (TmaTiles)
//   warp         : ldmatrix fragments, double-buffered across k16 steps (WarpFragments)
//   instruction  : mma.sync.m16n8k16, float32 accumulation (ptx/mma.cuh)
//   epilogue     : per-warp float32 staging in shared memory, coalesced row stores (store_tile)
//
// Operands are "K-major" (K contiguous: A untransposed, B transposed) or "MN-major" (M or N
// contiguous: A transposed, B untransposed). Shared tiles keep the global orientation, so no
// operand is ever transposed in memory: K-major tiles are read with ldmatrix, MN-major tiles
// with ldmatrix.trans. Rows of a tile are made of 16-byte chunks whose index is XOR-swizzled
// with the row (swizzle_chunk), so the 8 row addresses of every ldmatrix phase and the 8
// chunks of every cp.async phase hit 8 distinct 16-byte bank groups.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "gemm_config.h"
#include "gemm_convert.cuh"
#include "gemm_params.h"
#include "ptx/cp_async.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/mma.cuh"
#include "ptx/tma.cuh"

namespace tcgemm {

namespace cg = cooperative_groups;

// Physical chunk index of logical chunk `ch` in `row` of a tile with CPR 16-byte chunks per row.
template <int CPR>
__device__ __forceinline__ int swizzle_chunk(int row, int ch) {
  static_assert(CPR == 2 || CPR == 4 || CPR % 8 == 0, "rows of 32, 64 or k*128 bytes");
  if constexpr (CPR == 2) {  // four rows share a 128-byte line (M-major A tiles with BM = 16)
    return row * 2 + (ch ^ ((row >> 2) & 1));
  } else if constexpr (CPR == 4) {
    return row * 4 + (ch ^ ((row >> 1) & 3));  // two rows share a 128-byte line
  } else {
    return row * CPR + (ch ^ (row & 7));
  }
}

// Streams ROWS x COLS tiles (COLS contiguous) of a row-major matrix with `rows` x `cols`
// elements and leading dimension `ld` into swizzled shared tiles, one k tile per call; elements
// past the matrix are zero. K_IN_ROWS: successive k tiles are ROWS further down (an M/N-major
// operand), else COLS further right (K-major). Thread t owns chunk column t % kCPR and rows
// t / kCPR + i * kRowsPerIter: everything but two 64-bit adds and two compares per chunk is
// computed once, in init(). ALIGNED: ld is a multiple of 8 and the base is 16-byte aligned, so
// every chunk is one cp.async of 16 bytes (zero-filled past the edge). A chunk that straddles
// `cols` is read whole: cols % 8 != 0 only for a packed copy (gemm_pack.cu), whose padding is
// zeros. Otherwise elements are loaded one by one. Sizes are below 2^31 (the FFI handler checks).
template <typename T, int ROWS, int COLS, int THREADS, bool ALIGNED, bool K_IN_ROWS>
struct TileLoader {
  static constexpr int kCPR = COLS / 8;
  static constexpr int kRowsPerIter = THREADS / kCPR;
  static constexpr int kIters = ROWS / kRowsPerIter;
  static_assert(THREADS % kCPR == 0 && ROWS % kRowsPerIter == 0,
                "chunks must divide evenly among threads");
  static_assert(kRowsPerIter % 8 == 0, "every iteration's rows must share one swizzle pattern");

  const T* base;     // the matrix (a valid address for zero-filled chunks)
  const T* g;        // this thread's chunk, iteration 0, current k tile
  int64_t iter_step;  // elements between iterations (kRowsPerIter rows)
  int64_t tile_step;  // elements between k tiles
  int rows_left;      // rows of the matrix from this thread's iteration-0 row on (may be <= 0)
  int cols_left;      // columns of the matrix from this thread's chunk on (may be <= 0)
  uint32_t dst;       // byte offset of this thread's iteration-0 chunk in a tile

  __device__ __forceinline__ void init(const T* m, int64_t rows, int64_t cols, int64_t ld,
                                       int64_t r0, int64_t c0, int tid) {
    const int r = tid / kCPR, ch = tid % kCPR;
    base = m;
    g = m + (r0 + r) * ld + c0 + ch * 8;
    iter_step = int64_t(kRowsPerIter) * ld;
    tile_step = K_IN_ROWS ? int64_t(ROWS) * ld : int64_t(COLS);
    rows_left = static_cast<int>(rows - r0 - r);
    cols_left = static_cast<int>(cols - c0 - ch * 8);
    dst = swizzle_chunk<kCPR>(r, ch) * 16;
  }

  // Copies the current k tile into the tile at shared address `tile`, then moves to the next.
  __device__ __forceinline__ void load_next(uint32_t tile) {
    const T* src = g;
#pragma unroll
    for (int i = 0; i < kIters; ++i, src += iter_step) {
      const uint32_t d = tile + dst + i * (kRowsPerIter * kCPR * 16);
      const bool row_ok = i * kRowsPerIter < rows_left;
      if constexpr (ALIGNED) {
        ptx::cp_async_cg_16_or_zero(d, src, !(row_ok && cols_left > 0));
      } else {
        union {
          T e[8];
          uint32_t w[4];
        } v;
#pragma unroll
        for (int e = 0; e < 8; ++e) v.e[e] = row_ok && e < cols_left ? src[e] : T(0.0f);
        ptx::st_shared_v4_b32(d, v.w);
      }
    }
    g += tile_step;
    if constexpr (K_IN_ROWS) rows_left -= ROWS;
    else cols_left -= COLS;
  }
};

template <typename T>
__device__ __forceinline__ void mma_f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __half>) {
    ptx::mma_m16n8k16_f32_f16_f16_f32(d, a, b);
  } else {
    ptx::mma_m16n8k16_f32_bf16_bf16_f32(d, a, b);
  }
}

// A warp's fragments for one k16 step: MI A fragments (16x16) and NI B fragments (16x8).
template <int CFG, bool A_KMAJOR, bool B_KMAJOR>
struct WarpFragments {
  using Tr = ConfigTraits<CFG>;
  uint32_t a[Tr::kMI][4];
  uint32_t b[Tr::kNI][2];

  // a_tile/b_tile: shared addresses of this stage's A and B tiles; wm0/wn0: warp tile origin.
  __device__ __forceinline__ void load(uint32_t a_tile, uint32_t b_tile, int kk, int wm0, int wn0,
                                       int lane) {
#pragma unroll
    for (int mi = 0; mi < Tr::kMI; ++mi) {
      if constexpr (A_KMAJOR) {  // tile [BM][BK]: matrices (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) (m8-15,k8-15)
        const int row = wm0 + mi * 16 + (lane & 15);
        const int ch = kk * 2 + (lane >> 4);
        ptx::ldmatrix_x4(a[mi], a_tile + swizzle_chunk<Tr::kBK / 8>(row, ch) * 16);
      } else {  // tile [BK][BM], transposed on load
        const int row = kk * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int ch = (wm0 + mi * 16) / 8 + ((lane >> 3) & 1);
        ptx::ldmatrix_x4_trans(a[mi], a_tile + swizzle_chunk<Tr::kBM / 8>(row, ch) * 16);
      }
    }
#pragma unroll
    for (int nj = 0; nj < Tr::kNI / 2; ++nj) {
      uint32_t r[4];
      if constexpr (B_KMAJOR) {  // tile [BN][BK]: (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15)
        const int row = wn0 + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int ch = kk * 2 + ((lane >> 3) & 1);
        ptx::ldmatrix_x4(r, b_tile + swizzle_chunk<Tr::kBK / 8>(row, ch) * 16);
      } else {  // tile [BK][BN], transposed on load
        const int row = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
        const int ch = (wn0 + nj * 16) / 8 + (lane >> 4);
        ptx::ldmatrix_x4_trans(r, b_tile + swizzle_chunk<Tr::kBN / 8>(row, ch) * 16);
      }
      b[2 * nj][0] = r[0];
      b[2 * nj][1] = r[1];
      b[2 * nj + 1][0] = r[2];
      b[2 * nj + 1][1] = r[3];
    }
  }
};

// Writes four float32 values to C[row][col..col+3] (row-major, ldc = N) as Out: one 8- or
// 16-byte store when N % 4 == 0 (then every quad is aligned), else element by element up to N.
template <typename Out>
__device__ __forceinline__ void store_quad(const GemmParams& p, Out* __restrict__ c, int64_t row,
                                           int64_t col, float4 v) {
  Out* dst = c + row * p.n + col;
  if (p.n % 4 == 0) {
    if constexpr (std::is_same_v<Out, float>) {
      *reinterpret_cast<float4*>(dst) = v;
    } else {
      struct alignas(8) Out4 { Out x[4]; } o{{convert<Out>(v.x), convert<Out>(v.y),
                                              convert<Out>(v.z), convert<Out>(v.w)}};
      *reinterpret_cast<Out4*>(dst) = o;
    }
  } else {
    const float e[4] = {v.x, v.y, v.z, v.w};
    for (int j = 0; j < 4 && col + j < p.n; ++j) dst[j] = convert<Out>(e[j]);
  }
}

// Copies 16 staged float32 rows of a warp tile to C as Out, one 16-byte shared read and one
// store_quad per lane and step, predicated on M, N.
template <int WN, int ROW_BYTES, typename Out>
__device__ __forceinline__ void copy_rows(const GemmParams& p, Out* __restrict__ c,
                                          const char* stage, int64_t row0, int64_t col0, int lane) {
  constexpr int kQuads = WN / 4;  // 4-float groups per row
#pragma unroll
  for (int idx = lane; idx < 16 * kQuads; idx += 32) {
    const int r = idx / kQuads, qd = idx % kQuads;
    const int64_t gr = row0 + r, gc = col0 + qd * 4;
    if (gr >= p.m || gc >= p.n) continue;
    store_quad(p, c, gr, gc, *reinterpret_cast<const float4*>(stage + r * ROW_BYTES + qd * 16));
  }
}

// Epilogue: the warp stages its accumulators 16 rows at a time as float32 in its private
// shared area, then copies them out row by row (coalesced), converting to the output type.
template <int CFG>
__device__ __forceinline__ void store_tile(const GemmParams& p, int64_t c_off,
                                           float (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4],
                                           char* stage, int64_t row0, int64_t col0, int lane) {
  using Tr = ConfigTraits<CFG>;
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < Tr::kMI; ++mi) {
#pragma unroll
    for (int ni = 0; ni < Tr::kNI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(stage + (g + 8 * h) * Tr::kEpiRowBytes + (ni * 8 + 2 * q) * 4) =
            make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
    __syncwarp();
    const int64_t r0 = row0 + mi * 16;
    with_out_type(p.out_type, [&](auto out) {
      using Out = decltype(out);
      copy_rows<Tr::kWN, Tr::kEpiRowBytes>(p, static_cast<Out*>(p.c) + c_off, stage, r0, col0, lane);
    });
    __syncwarp();
  }
}

// Split-K inside a thread block cluster (sm_90+; the dispatcher launches the split_k slices of
// an output tile as one cluster along grid y and sets p.cluster_reduce): every CTA parks its
// float32 accumulators in its own shared memory ([BM][BN + 4] floats), and after a cluster
// barrier CTA r sums rows r, r + S, r + 2S, ... of the tile over the S CTAs' shared memory
// (distributed shared memory), always in rank order (bitwise deterministic, the same order as
// the workspace reduction), and writes them to C. A second barrier keeps every CTA's shared
// memory alive until the others have read it. No workspace, no second launch.
template <int CFG>
__device__ __forceinline__ void cluster_reduce_store(
    const GemmParams& p, int64_t c_off, float (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4],
    char* smem, int64_t m0, int64_t n0, int wm0, int wn0, int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Tr = ConfigTraits<CFG>;
  constexpr int kLd = Tr::kClusterLd;
  float* tile = reinterpret_cast<float*>(smem);
  const int lane = tid & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < Tr::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < Tr::kNI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(tile + (wm0 + mi * 16 + g + 8 * h) * kLd + wn0 + ni * 8 + 2 * q) =
            make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank());
  const int slices = static_cast<int>(cluster.num_blocks());
  constexpr int kQuads = Tr::kBN / 4;
  for (int idx = tid;; idx += Tr::kThreads) {
    const int row = rank + (idx / kQuads) * slices, qd = idx % kQuads;
    if (row >= Tr::kBM) break;
    const int64_t gr = m0 + row, gc = n0 + qd * 4;
    if (gr >= p.m || gc >= p.n) continue;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < slices; ++s) {
      const float4 v = *reinterpret_cast<const float4*>(
          cluster.map_shared_rank(tile + row * kLd + qd * 4, s));
      sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
    }
    with_out_type(p.out_type, [&](auto out) {
      store_quad(p, static_cast<decltype(out)*>(p.c) + c_off, gr, gc, sum);
    });
  }
  cluster.sync();
#endif
}

// Where each k tile comes from. cp.async (sm80 rows): every thread copies its 16-byte chunks
// (TileLoader) and waits on its own commit groups, then a barrier publishes them. TMA (sm90tma
// rows): thread 0 issues one bulk tensor copy per operand tile (the tensor map's 32/64/128-byte
// swizzle writes exactly swizzle_chunk's layout), completing on the stage's mbarrier; every
// thread waits on that barrier's phase. Tiles past the slice are not fetched at all (the maps
// span all of K), and nothing waits for them.
template <typename T, int CFG, bool A_KMAJOR, bool B_KMAJOR>
struct TmaTiles {
  using Tr = ConfigTraits<CFG>;
  const CUtensorMap* map_a;
  const CUtensorMap* map_b;
  uint32_t bars;  // shared address of the kStages mbarriers (8 bytes each)
  int m0, n0, za, zb;
  int64_t k_begin;

  __device__ __forceinline__ uint32_t bar(uint32_t g) const { return bars + (g % Tr::kStages) * 8; }
  // Global tile g (counted over the block's whole life) = local tile t of this slice, into
  // stage g % kStages.
  __device__ __forceinline__ void issue(uint32_t g, int t, uint32_t a_dst, uint32_t b_dst) const {
    const int k0 = static_cast<int>(k_begin + int64_t(t) * Tr::kBK);
    ptx::mbarrier_arrive_expect_tx(bar(g), Tr::kStageBytes);
    ptx::tma_load_3d(a_dst, map_a, bar(g), A_KMAJOR ? k0 : m0, A_KMAJOR ? m0 : k0, za);
    ptx::tma_load_3d(b_dst, map_b, bar(g), B_KMAJOR ? k0 : n0, B_KMAJOR ? n0 : k0, zb);
  }
  __device__ __forceinline__ void wait(uint32_t g) const {
    ptx::mbarrier_wait(bar(g), (g / Tr::kStages) & 1);
  }
};

// The kernel body: sm80 rows call it from gemm_sm80_kernel (cp.async loads), sm90tma rows from
// gemm_sm80_tma_kernel with their tensor maps (TMA loads). Everything but the loads is shared.
template <typename T, int CFG, bool A_KMAJOR, bool B_KMAJOR, bool ALIGNED>
__device__ __forceinline__ void gemm_sm80_body(const GemmParams& p, const CUtensorMap* map_a,
                                               const CUtensorMap* map_b) {
  using Tr = ConfigTraits<CFG>;
  constexpr bool kTma = Tr::kTma;
  extern __shared__ __align__(128) char smem_raw[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp % Tr::kWarpsM) * Tr::kWM;
  const int wn0 = (warp / Tr::kWarpsM) * Tr::kWN;

  // Threadblock rasterization: column-major within groups of kGroupM tile rows, so that
  // consecutive blocks share A row-panels and B column-panels in L2.
  constexpr int kGroupM = 8;
  const int pid = blockIdx.x;
  const int group_size = kGroupM * p.tiles_n;
  const int first_m = (pid / group_size) * kGroupM;
  const int group_m = min(p.tiles_m - first_m, kGroupM);
  const int64_t m0 = int64_t(first_m + (pid % group_size) % group_m) * Tr::kBM;
  const int64_t n0 = int64_t((pid % group_size) / group_m) * Tr::kBN;

  // This block's K slice (grid y): k tiles [kt_begin, kt_begin + ktiles), elements
  // [k_begin, k_end). The cp.async loaders see K as ending at k_end: the main loop fetches S-1
  // tiles past the slice unconditionally, and those come back as zeros without reading memory.
  const int ktiles_all = static_cast<int>((p.k + Tr::kBK - 1) / Tr::kBK);
  const int kt_begin = blockIdx.y * p.k_tiles_per_split;
  const int ktiles = max(0, min(ktiles_all - kt_begin, p.k_tiles_per_split));
  const int64_t k_begin = int64_t(kt_begin) * Tr::kBK;
  const int64_t k_end = min(p.k, k_begin + int64_t(ktiles) * Tr::kBK);

  // Global views: A is [M][K] (K-major) or [K][M]; B is [N][K] (K-major) or [K][N]; rows are
  // p.lda / p.ldb elements apart (the contiguous extent, or a packed copy's padded one).
  const int64_t a_rows = A_KMAJOR ? p.m : k_end, a_cols = A_KMAJOR ? k_end : p.m;
  const int64_t b_rows = B_KMAJOR ? p.n : k_end, b_cols = B_KMAJOR ? k_end : p.n;
  using LoadA = TileLoader<T, A_KMAJOR ? Tr::kBM : Tr::kBK, A_KMAJOR ? Tr::kBK : Tr::kBM,
                           Tr::kThreads, ALIGNED, !A_KMAJOR>;
  using LoadB = TileLoader<T, B_KMAJOR ? Tr::kBN : Tr::kBK, B_KMAJOR ? Tr::kBK : Tr::kBN,
                           Tr::kThreads, ALIGNED, !B_KMAJOR>;
  // TMA rows: the stages start on the next 1024-byte boundary (kLaunchSmemBytes has the slack).
  const uint32_t raw_base = ptx::cvta_to_shared(smem_raw);
  const uint32_t smem_base = kTma ? (raw_base + 1023) & ~1023u : raw_base;
  char* smem = smem_raw + (smem_base - raw_base);
  auto a_tile = [&](int s) { return smem_base + s * Tr::kStageBytes; };
  auto b_tile = [&](int s) { return smem_base + s * Tr::kStageBytes + Tr::kBM * Tr::kBK * Tr::kElem; };

  TmaTiles<T, CFG, A_KMAJOR, B_KMAJOR> tma;
  uint32_t used = 0;  // TMA: k tiles this block consumed before the current batch item
  if constexpr (kTma) {
    tma.map_a = map_a;
    tma.map_b = map_b;
    tma.bars = smem_base + Tr::kTmaBarOffset;
    tma.m0 = static_cast<int>(m0);
    tma.n0 = static_cast<int>(n0);
    tma.k_begin = k_begin;
    if (tid == 0) {
      ptx::prefetch_tensormap(map_a);
      ptx::prefetch_tensormap(map_b);
      for (int s = 0; s < Tr::kStages; ++s) ptx::mbarrier_init(tma.bars + s * 8, 1);
      ptx::fence_mbarrier_init();
    }
    __syncthreads();
  }

  for (int64_t z = blockIdx.z; z < p.batch; z += gridDim.z) {
    // Stage of local k tile t: (base + t) % kStages (TMA: the barriers' phases run on across
    // batch items; cp.async: from 0 for each).
    const uint32_t base = used;
    auto stage = [&](int t) { return static_cast<int>((base + t) % Tr::kStages); };
    LoadA load_a;
    LoadB load_b;
    if constexpr (kTma) {
      tma.za = p.stride_a ? static_cast<int>(z) : 0;
      tma.zb = p.stride_b ? static_cast<int>(z) : 0;
    } else {
      load_a.init(static_cast<const T*>(p.a) + z * p.stride_a, a_rows, a_cols, p.lda,
                  A_KMAJOR ? m0 : k_begin, A_KMAJOR ? k_begin : m0, tid);
      load_b.init(static_cast<const T*>(p.b) + z * p.stride_b, b_rows, b_cols, p.ldb,
                  B_KMAJOR ? n0 : k_begin, B_KMAJOR ? k_begin : n0, tid);
    }
    // Fetches local k tile t (cp.async: always the loaders' next one, zeros past the slice, and
    // a commit group; TMA: only tiles of the slice, from thread 0).
    auto fetch = [&](int t) {
      if constexpr (kTma) {
        if (tid == 0 && t < ktiles) tma.issue(base + t, t, a_tile(stage(t)), b_tile(stage(t)));
      } else {
        load_a.load_next(a_tile(stage(t)));
        load_b.load_next(b_tile(stage(t)));
        ptx::cp_async_commit_group();
      }
    };
    // Waits until local k tile t (the oldest in flight) has landed, for every thread.
    auto landed = [&](int t) {
      if constexpr (kTma) {
        if (t < ktiles) tma.wait(base + t);
      } else {
        ptx::cp_async_wait_group<Tr::kStages - 2>();
      }
      __syncthreads();
    };

    float acc[Tr::kMI][Tr::kNI][4];
#pragma unroll
    for (int mi = 0; mi < Tr::kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < Tr::kNI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    // Prologue: tiles 0..S-2 in flight (cp.async: one commit group each, empty past the last
    // k tile). TMA: the epilogue's generic writes of the previous batch item come first.
    if constexpr (kTma) {
      if (tid == 0) ptx::fence_proxy_async_shared_cta();
    }
#pragma unroll
    for (int s = 0; s < Tr::kStages - 1; ++s) {
      if constexpr (kTma) {
        fetch(s);
      } else {
        if (s < ktiles) {
          load_a.load_next(a_tile(stage(s)));
          load_b.load_next(b_tile(stage(s)));
        }
        ptx::cp_async_commit_group();
      }
    }
    landed(0);

    // Main loop. Stage of tile kt is consumed while tile kt+S-1 streams into the stage of tile
    // kt-1, whose last reader finished before the barrier at the end of iteration kt-1.
    // Fragments are double-buffered: step kk+1 (after the last step's barrier: the next stage's
    // first step) is read from shared memory while step kk's mma run.
    WarpFragments<CFG, A_KMAJOR, B_KMAJOR> frag[2];
    frag[0].load(a_tile(stage(0)), b_tile(stage(0)), 0, wm0, wn0, lane);
    for (int kt = 0; kt < ktiles; ++kt) {
      const int s = stage(kt);
#pragma unroll
      for (int kk = 0; kk < Tr::kKSteps; ++kk) {
        if (kk == Tr::kKSteps - 1) landed(kt + 1);
        const int s_next = kk == Tr::kKSteps - 1 ? stage(kt + 1) : s;
        frag[(kk + 1) & 1].load(a_tile(s_next), b_tile(s_next), (kk + 1) % Tr::kKSteps, wm0, wn0,
                                lane);
        if (kk == 0) fetch(kt + Tr::kStages - 1);
        const auto& f = frag[kk & 1];
#pragma unroll
        for (int mi = 0; mi < Tr::kMI; ++mi)
#pragma unroll
          for (int nj = 0; nj < Tr::kNI; ++nj) {
            const int ni = (mi & 1) ? Tr::kNI - 1 - nj : nj;  // serpentine: reuse B registers
            mma_f32<T>(acc[mi][ni], f.a[mi], f.b[ni]);
          }
      }
    }
    if constexpr (!kTma) ptx::cp_async_wait_group<0>();  // TMA: every fetched tile was waited
    __syncthreads();  // the pipeline buffers become the epilogue's staging area
    if constexpr (kTma) used += ktiles;

    if (p.cluster_reduce) {
      cluster_reduce_store<CFG>(p, z * p.m * p.n, acc, smem, m0, n0, wm0, wn0, tid);
    } else {
      char* stage_area = smem + warp * 16 * Tr::kEpiRowBytes;
      store_tile<CFG>(p, (int64_t(blockIdx.y) * p.batch + z) * p.m * p.n, acc, stage_area,
                      m0 + wm0, n0 + wn0, lane);
    }
    __syncthreads();  // staging area is the next batch item's pipeline
  }
}

template <typename T, int CFG, bool A_KMAJOR, bool B_KMAJOR, bool ALIGNED>
__global__ void __launch_bounds__(ConfigTraits<CFG>::kThreads, 1) gemm_sm80_kernel(GemmParams p) {
  gemm_sm80_body<T, CFG, A_KMAJOR, B_KMAJOR, ALIGNED>(p, nullptr, nullptr);
}

// sm90tma rows (compute capability 9.0; instantiated in gemm_kernels_sm90.cu only): the maps
// describe A and B as stored (3-D: columns, rows, batch items), boxes of one tile each.
template <typename T, int CFG, bool A_KMAJOR, bool B_KMAJOR>
__global__ void __launch_bounds__(ConfigTraits<CFG>::kThreads, 1)
    gemm_sm80_tma_kernel(const __grid_constant__ GemmParams p,
                         const __grid_constant__ CUtensorMap map_a,
                         const __grid_constant__ CUtensorMap map_b) {
  gemm_sm80_body<T, CFG, A_KMAJOR, B_KMAJOR, true>(p, &map_a, &map_b);
}

}  // namespace tcgemm
