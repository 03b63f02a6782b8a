// The mma.sync GEMM kernel template (sm_80+):  D[z] = epilogue(A[z] · B[z])  for z < batch.
//
// One loop per layer:
//   kernel       : batch loop (grid z), K slice of split-K (grid y), threadblock rasterization
//                  (grid x)
//   threadblock  : cp.async multi-stage global->shared pipeline over K (TileLoader)
//   warp         : ldmatrix fragments, double-buffered across k16 steps (WarpFragments); with
//                  sliced K (kWarpsK > 1) each k group of warps takes its share of every stage's
//                  k16 steps, and the groups sum in shared memory after the loop (sum_k_groups)
//   instruction  : mma.sync.m16n8k16, float32 accumulation; int8 operands: m16n8k32, exact
//                  int32 accumulation (ptx/mma.cuh)
//   epilogue     : each warp parks its tile in shared memory (float32, or int32 words: raw
//                  sums of int8), then streams it out in coalesced rows through the common
//                  epilogue (kernels/common/epilogue.cuh); split-K in a cluster and sliced K
//                  sum there first (kernels/sm80/epilogue_sm80.cuh)
//
// int8 operands (T = int8_t: K-major A and B, aligned rows only) run the 16-bit kernel on
// pairs of bytes: each pair of K is one 16-bit element to the loaders, the swizzle and
// ldmatrix (K/2 of them), and the fragments of a k16 step of pairs are, byte for byte, those of
// an m16n8k32 step of int8 (ptx/mma.cuh). A k tile is BK pairs, 2 BK of K (KTileElems).
//
// Operands are "K-major" (K contiguous: A untransposed, B transposed) or "MN-major" (M or N
// contiguous: A transposed, B untransposed). Shared tiles keep the global orientation, so no
// operand is ever transposed in memory: K-major tiles are read with ldmatrix, MN-major tiles
// with ldmatrix.trans. Rows of a tile are made of 16-byte chunks whose index is XOR-swizzled
// with the row (swizzle_chunk), so the 8 row addresses of every ldmatrix phase and the 8
// chunks of every cp.async phase hit 8 distinct 16-byte bank groups.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "host/gemm_config.h"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/ragged.cuh"
#include "kernels/sm80/epilogue_sm80.cuh"
#include "host/gemm_params.h"
#include "ptx/cluster.cuh"  // the kernel's cluster barriers (push reduction)
#include "ptx/cp_async.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/mma.cuh"
#include "ptx/sreg.cuh"

namespace tcgemm {

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
// zeros. Otherwise elements are loaded one by one (ptx::ld_global_8xb16_zfill) and stored with
// st.shared, all of a k tile at once (load_next), or in parts (fetch, store) where a k tile's
// chunks do not fit in registers next to the accumulators (ConfigTraits::kSplitElementLoads).
// Sizes are below 2^31 (the FFI handler checks).
template <typename T, int ROWS, int COLS, int THREADS, bool ALIGNED, bool K_IN_ROWS>
struct TileLoader {
  static constexpr int kCPR = COLS / 8;
  static constexpr int kRowsPerIter = THREADS / kCPR;
  static constexpr int kIters = ROWS / kRowsPerIter;
  static constexpr int kIterBytes = kRowsPerIter * kCPR * 16;  // of a shared tile
  static_assert(THREADS % kCPR == 0 && ROWS % kRowsPerIter == 0,
                "chunks must divide evenly among threads");
  static_assert(kRowsPerIter % 8 == 0, "every iteration's rows must share one swizzle pattern");

  const T* g;         // this thread's chunk, iteration 0, current k tile
  int64_t iter_step;  // elements between iterations (kRowsPerIter rows)
  int64_t tile_step;  // elements between k tiles
  int rows_left;      // rows of the matrix from this thread's iteration-0 row on (may be <= 0)
  int cols_left;      // columns of the matrix from this thread's chunk on (may be <= 0)
  uint32_t dst;       // byte offset of this thread's iteration-0 chunk in a tile

  __device__ __forceinline__ void init(const T* m, int64_t rows, int64_t cols, int64_t ld,
                                       int64_t r0, int64_t c0, int tid) {
    const int r = tid / kCPR, ch = tid % kCPR;
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
      const uint32_t d = tile + dst + i * kIterBytes;
      const bool row_ok = i * kRowsPerIter < rows_left;
      if constexpr (ALIGNED) {
        ptx::cp_async_cg_16_or_zero(d, src, !(row_ok && cols_left > 0));
      } else {
        uint32_t w[4];
        ptx::ld_global_8xb16_zfill(w, src, row_ok ? cols_left : 0);
        ptx::st_shared_v4_b32(d, w);
      }
    }
    next();
  }

  // Element-wise loads of a k tile in `parts` parts (chunks i with i * parts / kIters == part):
  // fetch() reads part `part` of the current k tile into registers, store() writes them to the
  // tile at shared address `tile`; next() moves on after the last part. The branch around the
  // loads skips a part that lies below the matrix, and keeps the compiler from moving them into
  // the preceding mma (where their registers are not to be had).
  using Regs = uint32_t[kIters][4];
  __device__ __forceinline__ void fetch(Regs& w, int part, int parts) const {
    const int first = (part * kIters + parts - 1) / parts;  // the part's first chunk
#pragma unroll
    for (int i = 0; i < kIters; ++i)
      if (i * parts / kIters == part) w[i][0] = w[i][1] = w[i][2] = w[i][3] = 0u;
    if (first * kRowsPerIter < rows_left && cols_left > 0) {
      const T* src = g;
#pragma unroll
      for (int i = 0; i < kIters; ++i, src += iter_step)
        if (i * parts / kIters == part)
          ptx::ld_global_8xb16_zfill(w[i], src, i * kRowsPerIter < rows_left ? cols_left : 0);
    }
  }
  __device__ __forceinline__ void store(uint32_t tile, const Regs& w, int part, int parts) const {
#pragma unroll
    for (int i = 0; i < kIters; ++i)
      if (i * parts / kIters == part) ptx::st_shared_v4_b32(tile + dst + i * kIterBytes, w[i]);
  }

  __device__ __forceinline__ void next() {
    g += tile_step;
    if constexpr (K_IN_ROWS) rows_left -= ROWS;
    else cols_left -= COLS;
  }
};

// The accumulator of operand type T (int8: exact int32 sums), the element type its loaders and
// fragments move (int8: a pair of bytes as one 16-bit element), and the operand elements per
// loaded element.
template <typename T>
struct Sm80Operand {
  static constexpr bool kInt = std::is_same_v<T, int8_t>;
  using Acc = std::conditional_t<kInt, int, float>;
  using Load = std::conditional_t<kInt, uint16_t, T>;
  static constexpr int kPack = kInt ? 2 : 1;
};

template <typename T, typename Acc>
__device__ __forceinline__ void mma(Acc (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, int8_t>) {
    ptx::mma_m16n8k32_s32_s8_s8_s32(d, a, b);
  } else if constexpr (std::is_same_v<T, __half>) {
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

  // Byte offsets, within an A and a B tile, of k16 step kk0 as seen by load(): load(a_tile +
  // a, b_tile + b, kk, ...) reads step kk0 + kk. K-major rows: the swizzle permutes a row's
  // 16-byte chunks only within groups of eight, so a step that starts such a group (kk0 % 4 ==
  // 0, checked by ConfigTraits) moves whole rows' chunks by 2 * kk0; MN-major tiles: the
  // swizzle depends on row bits below 16 only, so the step moves by 16 * kk0 whole rows.
  static __device__ __forceinline__ uint2 kgroup_offset(int kk0) {
    constexpr uint32_t kARow = Tr::kBM * Tr::kElem, kBRow = Tr::kBN * Tr::kElem;  // MN-major rows
    return make_uint2(A_KMAJOR ? kk0 * 32 : kk0 * 16 * kARow, B_KMAJOR ? kk0 * 32 : kk0 * 16 * kBRow);
  }

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

// RAGGED: a grouped product (p.ragged; split 1, no cluster): block x runs item x of the
// grouped work list (kernels/common/ragged.cuh; blocks past its end only zero), and the rows
// past the last group are zeroed by all blocks.
template <typename T, int CFG, bool A_KMAJOR, bool B_KMAJOR, bool ALIGNED, bool RAGGED = false>
__global__ void __launch_bounds__(ConfigTraits<CFG>::kThreads, 1) gemm_sm80_kernel(GemmParams p) {
  using Tr = ConfigTraits<CFG>;
  using Op = Sm80Operand<T>;
  using Acc = typename Op::Acc;
  static_assert(!Op::kInt || (A_KMAJOR && B_KMAJOR && ALIGNED && !RAGGED),
                "int8 operands: K-major A and B with 16-byte aligned rows, no grouping");
  extern __shared__ __align__(128) char smem[];
  const uint32_t smem_base = ptx::cvta_to_shared(smem);
  const bool push = !RAGGED && Tr::kPushReduce && p.cluster_reduce == 2;
  if (push) ptx::cluster_arrive_relaxed();  // waited for before the first push (the main loop
                                            // hides it): every block of the cluster has started
  auto a_tile = [&](int s) { return smem_base + s * Tr::kStageBytes; };
  auto b_tile = [&](int s) { return smem_base + s * Tr::kStageBytes + Tr::kBM * Tr::kBK * Tr::kElem; };
  using LoadA = TileLoader<typename Op::Load, A_KMAJOR ? Tr::kBM : Tr::kBK,
                           A_KMAJOR ? Tr::kBK : Tr::kBM,
                           Tr::kThreads, ALIGNED, !A_KMAJOR>;
  using LoadB = TileLoader<typename Op::Load, B_KMAJOR ? Tr::kBN : Tr::kBK,
                           B_KMAJOR ? Tr::kBK : Tr::kBN,
                           Tr::kThreads, ALIGNED, !B_KMAJOR>;
  constexpr bool kSplitLoads = !ALIGNED && Tr::kSplitElementLoads;

  for (int64_t z = blockIdx.z; z < (RAGGED ? 1 : p.batch); z += gridDim.z) {
    // Everything derived from the thread and block indices is computed here, for every batch
    // item, from special registers read with volatile PTX (ptx/sreg.cuh): the compiler would
    // otherwise hoist it out of this loop and keep it live across the main loop, where the
    // accumulators and fragments need every register (large tiles spilled it to local memory).
    const int tid = ptx::tid_x(), lane = tid & 31, warp = tid >> 5;
    const int wk = Tr::kWarpsK > 1 ? warp / Tr::kWarpsMN : 0;  // k group (sliced K)
    const int wmn = Tr::kWarpsK > 1 ? warp % Tr::kWarpsMN : warp;  // warp within its k group
    const int wm0 = (wmn % Tr::kWarpsM) * Tr::kWM;
    const int wn0 = (wmn / Tr::kWarpsM) * Tr::kWN;

    // Threadblock rasterization: column-major within groups of kGroupM tile rows, so that
    // consecutive blocks share A row-panels and B column-panels in L2.
    // Evaluated again for the epilogue (from the block index, read anew): the tile origin is
    // not held in registers across the main loop.
    auto tile_origin = [&p]() {
      constexpr int kGroupM = 8;
      const int pid = ptx::ctaid_x();
      const int group_size = kGroupM * p.tiles_n;
      const int first_m = (pid / group_size) * kGroupM;
      const int group_m = min(p.tiles_m - first_m, kGroupM);
      return make_longlong2((first_m + (pid % group_size) % group_m) * int64_t(Tr::kBM),
                            ((pid % group_size) / group_m) * int64_t(Tr::kBN));
    };
    const longlong2 origin = tile_origin();
    RaggedTile rt{};  // RAGGED: this block's item (the epilogue reads it from ragged_tile_slot)
    if constexpr (RAGGED) {
      if (!ragged_tile<Tr::kBM, Tr::kBN, Tr::kBK>(p, ptx::ctaid_x(), rt)) break;
      if (tid == 0) ragged_tile_slot() = rt;
    }
    const int64_t m0 = RAGGED ? rt.m0 : origin.x, n0 = RAGGED ? rt.n0 : origin.y;

    // This block's K slice (grid y): k tiles [kt_begin, kt_begin + ktiles), elements
    // [k_begin, k_end). The loaders see K as ending at k_end: the main loop fetches S-1 tiles
    // past the slice unconditionally, and those come back as zeros without reading memory.
    // Counted in loaded elements (int8: pairs; K, the leading dimensions and the batch strides
    // are even, checked by the host).
    const int64_t k_all = p.k / Op::kPack;
    const int split = ptx::ctaid_y();
    const int ktiles_all = static_cast<int>((k_all + Tr::kBK - 1) / Tr::kBK);
    const int kt_begin = split * p.k_tiles_per_split;
    // RAGGED: the item's k range (a contraction group's rows: zeros past its end).
    const int ktiles = RAGGED ? rt.ktiles : max(0, min(ktiles_all - kt_begin, p.k_tiles_per_split));
    const int64_t k_begin = RAGGED ? rt.kbase : int64_t(kt_begin) * Tr::kBK;
    const int64_t k_end = RAGGED ? rt.kend : min(k_all, k_begin + int64_t(ktiles) * Tr::kBK);
    const int64_t zo = RAGGED ? rt.g : z;  // operand item (ragged: B's group; stride_a is 0)

    // Global views: A is [M][K] (K-major) or [K][M]; B is [N][K] (K-major) or [K][N]; rows are
    // p.lda / p.ldb elements apart (the contiguous extent, or a packed copy's padded one).
    const int64_t a_rows = A_KMAJOR ? p.m : k_end, a_cols = A_KMAJOR ? k_end : p.m;
    const int64_t b_rows = B_KMAJOR ? p.n : k_end, b_cols = B_KMAJOR ? k_end : p.n;
    LoadA load_a;
    LoadB load_b;
    using Load = typename Op::Load;
    load_a.init(static_cast<const Load*>(p.a) + zo * (p.stride_a / Op::kPack), a_rows, a_cols,
                p.lda / Op::kPack, A_KMAJOR ? m0 : k_begin, A_KMAJOR ? k_begin : m0, tid);
    load_b.init(static_cast<const Load*>(p.b) + zo * (p.stride_b / Op::kPack), b_rows, b_cols,
                p.ldb / Op::kPack, B_KMAJOR ? n0 : k_begin, B_KMAJOR ? k_begin : n0, tid);
    auto load_stage = [&](int s) {  // the next k tile of A and B into stage s
      load_a.load_next(a_tile(s));
      load_b.load_next(b_tile(s));
    };

    Acc acc[Tr::kMI][Tr::kNI][4];
#pragma unroll
    for (int mi = 0; mi < Tr::kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < Tr::kNI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = Acc(0);

    // Prologue: stages 0..S-2 in flight, one commit group each (empty past the last k tile).
#pragma unroll
    for (int s = 0; s < Tr::kStages - 1; ++s) {
      if (s < ktiles) load_stage(s);
      ptx::cp_async_commit_group();
    }
    ptx::cp_async_wait_group<Tr::kStages - 2>();  // tile 0 has landed
    __syncthreads();

    // Main loop. Stage kt%S is consumed while tile kt+S-1 streams into stage (kt-1)%S, whose
    // last reader finished before the barrier at the end of iteration kt-1. Fragments are
    // double-buffered: step kk+1 (after the last step's barrier: the next stage's first step)
    // is read from shared memory while step kk's mma run. A warp runs its k group's kKStepsW
    // steps of every stage (all of them without sliced K), from tile offsets `ko`. Element-wise
    // loads that do not fit next to the fragments (kSplitLoads) bring tile kt+S-1 in over the
    // steps instead, each step's share after its mma (when one fragment buffer is free): the
    // last share lands after this iteration's barrier, and S >= 3 keeps its stage unread until
    // the next one's.
    using Frag = WarpFragments<CFG, A_KMAJOR, B_KMAJOR>;
    const uint2 ko = Frag::kgroup_offset(wk * Tr::kKStepsW);
    Frag frag[2];
    frag[0].load(a_tile(0) + ko.x, b_tile(0) + ko.y, 0, wm0, wn0, lane);
    for (int kt = 0; kt < ktiles; ++kt) {
      const int s = kt % Tr::kStages;
#pragma unroll
      for (int kk = 0; kk < Tr::kKStepsW; ++kk) {
        if (kk == Tr::kKStepsW - 1) {
          ptx::cp_async_wait_group<Tr::kStages - 2>();  // tile kt+1 has landed
          __syncthreads();
        }
        const int s_next = kk == Tr::kKStepsW - 1 ? (kt + 1) % Tr::kStages : s;
        frag[(kk + 1) & 1].load(a_tile(s_next) + ko.x, b_tile(s_next) + ko.y,
                                (kk + 1) % Tr::kKStepsW, wm0, wn0, lane);
        if constexpr (!kSplitLoads) {
          if (kk == 0) {  // unconditional: past the slice's last k tile the loaders zero-fill
            load_stage((kt + Tr::kStages - 1) % Tr::kStages);
            ptx::cp_async_commit_group();
          }
        }
        const auto& f = frag[kk & 1];
#pragma unroll
        for (int mi = 0; mi < Tr::kMI; ++mi)
#pragma unroll
          for (int nj = 0; nj < Tr::kNI; ++nj) {
            const int ni = (mi & 1) ? Tr::kNI - 1 - nj : nj;  // serpentine: reuse B registers
            mma<T>(acc[mi][ni], f.a[mi], f.b[ni]);
          }
        if constexpr (kSplitLoads) {
          const int s_load = (kt + Tr::kStages - 1) % Tr::kStages;
          typename LoadA::Regs ra;
          typename LoadB::Regs rb;
          load_a.fetch(ra, kk, Tr::kKStepsW);
          load_b.fetch(rb, kk, Tr::kKStepsW);
          load_a.store(a_tile(s_load), ra, kk, Tr::kKStepsW);
          load_b.store(b_tile(s_load), rb, kk, Tr::kKStepsW);
          if (kk == Tr::kKStepsW - 1) {
            load_a.next();
            load_b.next();
          }
        }
      }
    }
    ptx::cp_async_wait_group<0>();
    __syncthreads();  // the pipeline buffers become the epilogue's staging area
    if constexpr (Tr::kWarpsK > 1) sum_k_groups<CFG>(acc, smem, wk, wm0, wn0, lane);
    longlong2 tile;  // RAGGED: from the slot (read after the barrier above), else recomputed
    if constexpr (RAGGED) tile = make_longlong2(ragged_tile_slot().m0, ragged_tile_slot().n0);
    else tile = tile_origin();
    const bool holds = wk == 0;  // this warp holds the block's sums

    if (push) {
      if (z == blockIdx.z) ptx::cluster_wait();
      if (cluster_push_reduce<CFG>(acc, smem, z + gridDim.z < p.batch, holds, wm0, wn0, lane))
        store_tile<CFG>(p, z, z, acc, smem + wmn * Tr::kWM * Tr::kEpiRowBytes, tile.x + wm0,
                        tile.y + wn0, p.m, lane);
    } else if (!RAGGED && p.cluster_reduce) {
      cluster_reduce_store<CFG>(p, z, acc, smem, tile.x, tile.y, holds, wm0, wn0, tid);
    } else if (holds) {
      char* stage = smem + wmn * Tr::kWM * Tr::kEpiRowBytes;  // this warp's parking area
      if constexpr (RAGGED) {  // rows: the one M x N result; contraction: D's item g
        const RaggedTile& r = ragged_tile_slot();
        store_tile<CFG>(p, p.ragged.mode == RaggedMode::kRows ? 0 : r.g, r.g, acc, stage,
                        tile.x + wm0, tile.y + wn0, r.row_end, lane);
      } else {
        store_tile<CFG>(p, p.partial ? int64_t(split) * p.batch + z : z, z, acc, stage,
                        tile.x + wm0, tile.y + wn0, p.m, lane);
      }
    }
    __syncthreads();  // staging area is the next batch item's pipeline
  }
  if constexpr (RAGGED) {  // rows past the last group: zeros, written by all blocks
    if (p.ragged.mode == RaggedMode::kRows)
      ragged_zero_tail(p, int64_t(ptx::ctaid_x()) * Tr::kThreads + ptx::tid_x(),
                       int64_t(gridDim.x) * Tr::kThreads);
  }
}

}  // namespace tcgemm
