// The mma.sync GEMM kernel template (sm_80+):  D[z] = epilogue(A[z] · B[z])  for z < batch.
//
// One loop per layer:
//   kernel       : batch loop (grid z), K slice of split-K (grid y), threadblock rasterization
//                  (grid x)
//   threadblock  : cp.async multi-stage global->shared pipeline over K (TileLoader)
//   warp         : ldmatrix fragments, double-buffered across k16 steps (WarpFragments); with
//                  sliced K (kWarpsK > 1) each k group of warps takes its share of every stage's
//                  k16 steps, and the groups sum in shared memory after the loop (sum_k_groups)
//   instruction  : mma.sync.m16n8k16, float32 accumulation (ptx/mma.cuh)
//   epilogue     : each warp parks its float32 tile in shared memory, then streams it out in
//                  coalesced rows through the common epilogue (kernels/common/epilogue.cuh;
//                  store_tile)
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
#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "host/gemm_config.h"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/ragged.cuh"
#include "host/gemm_params.h"
#include "ptx/cluster.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/mma.cuh"
#include "ptx/sreg.cuh"

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

// Copies a warp's parked float32 tile (kWM rows of kWN, kEpiRowBytes apart) out, one 16-byte
// shared read per lane and step: through the epilogue into D (PARTIAL: raw to the split-K
// partials at `partial`). Lane l always takes quad column l % kQuads and rows l / kQuads + i *
// kRowStep: `off` is the output element offset of its first quad (row r, column c of batch
// item z), `rows_left`/`cols_left` the rows and columns of the output from there on (<= 0:
// outside it). Not unrolled: the epilogue's code (C loads, activations) once per kernel.
template <int CFG, typename Out, bool PARTIAL>
__device__ __forceinline__ void copy_rows(const GemmParams& p, EpiScale s, float* partial,
                                          int64_t off, int64_t z, int64_t r, int64_t c,
                                          const char* stage, int rows_left, int cols_left,
                                          int lane) {
  using Tr = ConfigTraits<CFG>;
  constexpr int kQuads = Tr::kWN / 4;  // 4-float groups per row
  static_assert(32 % kQuads == 0, "a lane keeps its quad column");
  constexpr int kRowStep = 32 / kQuads;
  const char* src = stage + (lane / kQuads) * Tr::kEpiRowBytes + (lane % kQuads) * 16;
  const bool vec = p.n % 4 == 0;  // then every quad is aligned and inside its row
  if (cols_left <= 0) return;
#pragma unroll 1
  for (int i = 0; i < Tr::kWM / kRowStep && i * kRowStep < rows_left;
       ++i, off += kRowStep * p.n, src += kRowStep * Tr::kEpiRowBytes) {
    const float4 q = *reinterpret_cast<const float4*>(src);
    float v[4] = {q.x, q.y, q.z, q.w};
    if constexpr (PARTIAL) store_vec<float, 4>(partial + off, v, cols_left, vec);
    else epi_store<Out, 4>(p, s, z, r + i * kRowStep, c, v, off, cols_left, vec);
  }
}

// Epilogue of a warp tile: the warp parks all of its accumulators as float32 in its private
// shared area (kWM rows), then streams them out row by row (coalesced): through the epilogue
// into D's M x N item `item`, or (split-K through the workspace, p.partial set) raw into the
// partials' item `item` (slice * batch + z). z: the batch item of C and the bias row. Rows at
// or past row_end are not stored.
template <int CFG>
__device__ __forceinline__ void store_tile(const GemmParams& p, int64_t item, int64_t z,
                                           float (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4],
                                           char* stage, int64_t row0, int64_t col0,
                                           int64_t row_end, int lane) {
  using Tr = ConfigTraits<CFG>;
  constexpr int kQuads = Tr::kWN / 4;
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < Tr::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < Tr::kNI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(stage + (mi * 16 + g + 8 * h) * Tr::kEpiRowBytes +
                                   (ni * 8 + 2 * q) * 4) =
            make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
  __syncwarp();
  const int64_t r = row0 + lane / kQuads, c = col0 + (lane % kQuads) * 4;
  const int64_t off = item * p.m * p.n + r * p.n + c;  // output offset of the lane's first quad
  const int rows_left = static_cast<int>(min(row_end - r, int64_t(Tr::kWM)));
  const int cols_left = static_cast<int>(min(p.n - c, int64_t(4)));
  const EpiScale s = epi_scale(p);
  if (p.partial) {
    copy_rows<CFG, float, true>(p, s, p.partial, off, z, r, c, stage, rows_left, cols_left, lane);
  } else {
    with_dtype(p.d_type, [&](auto out) {
      copy_rows<CFG, decltype(out), false>(p, s, nullptr, off, z, r, c, stage, rows_left,
                                           cols_left, lane);
    });
  }
  __syncwarp();
}

// Calls f(mi, ni, h, i) for each pair of accumulators (acc[mi][ni][2h], acc[mi][ni][2h + 1])
// a thread holds: i is the pair's float index in the block's [BM][kClusterLd] float32 tile.
template <int CFG, typename F>
__device__ __forceinline__ void for_each_acc_pair(int wm0, int wn0, int lane, F&& f) {
  using Tr = ConfigTraits<CFG>;
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < Tr::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < Tr::kNI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        f(mi, ni, h, (wm0 + mi * 16 + g + 8 * h) * Tr::kClusterLd + wn0 + ni * 8 + 2 * q);
}

// Stores a warp's accumulators into a float32 [BM][kClusterLd] tile in shared memory (the
// layout of for_each_acc_pair), for another warp or block to add.
template <int CFG>
__device__ __forceinline__ void park_acc(
    float* tile, const float (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4], int wm0,
    int wn0, int lane) {
  for_each_acc_pair<CFG>(wm0, wn0, lane, [&](int mi, int ni, int h, int i) {
    *reinterpret_cast<float2*>(tile + i) = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
  });
}

// Sliced K (kWarpsK > 1), after the main loop: k groups 1.. park their accumulators as float32
// tiles ([BM][kClusterLd] each) at the start of shared memory, and group 0 adds them in group
// order (deterministic); from then on only group 0's warps hold the block's sums. Shared
// memory is free again on return.
template <int CFG>
__device__ __forceinline__ void sum_k_groups(
    float (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4], char* smem, int wk, int wm0,
    int wn0, int lane) {
  using Tr = ConfigTraits<CFG>;
  auto park = [&](int g) {  // k group g's (>= 1) float32 tile
    return reinterpret_cast<float*>(smem) + (g - 1) * Tr::kBM * Tr::kClusterLd;
  };
  if (wk > 0) park_acc<CFG>(park(wk), acc, wm0, wn0, lane);
  __syncthreads();
  if (wk == 0)
#pragma unroll
    for (int g = 1; g < Tr::kWarpsK; ++g)
      for_each_acc_pair<CFG>(wm0, wn0, lane, [&](int mi, int ni, int h, int i) {
        const float2 v = *reinterpret_cast<const float2*>(park(g) + i);
        acc[mi][ni][2 * h] += v.x;
        acc[mi][ni][2 * h + 1] += v.y;
      });
  __syncthreads();
}

// Split-K inside a thread block cluster (sm_90+; the dispatcher launches the split_k slices of
// an output tile as one cluster along grid y and sets p.cluster_reduce = 1): every CTA parks its
// float32 accumulators in its own shared memory ([BM][BN + 4] floats), and after a cluster
// barrier CTA r sums rows r, r + S, r + 2S, ... of the tile over the S CTAs' shared memory
// (distributed shared memory), always in rank order (bitwise deterministic, the same order as
// the workspace reduction), and writes them to C. A second barrier keeps every CTA's shared
// memory alive until the others have read it. No workspace, no second launch. `holds`: this
// thread's warp holds the block's sums (sliced K: k group 0); every thread takes part.
template <int CFG>
__device__ __forceinline__ void cluster_reduce_store(
    const GemmParams& p, int64_t z, float (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4],
    char* smem, int64_t m0, int64_t n0, bool holds, int wm0, int wn0, int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Tr = ConfigTraits<CFG>;
  constexpr int kLd = Tr::kClusterLd;
  float* tile = reinterpret_cast<float*>(smem);
  if (holds) park_acc<CFG>(tile, acc, wm0, wn0, tid & 31);
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank());
  const int slices = static_cast<int>(cluster.num_blocks());
  constexpr int kQuads = Tr::kBN / 4;
  const EpiScale es = epi_scale(p);
  const bool vec = p.n % 4 == 0;
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
    float v[4] = {sum.x, sum.y, sum.z, sum.w};
    with_dtype(p.d_type, [&](auto out) {
      epi_store<decltype(out), 4>(p, es, z, gr, gc, v, (z * p.m + gr) * p.n + gc,
                                  static_cast<int>(p.n - gc), vec);
    });
  }
  cluster.sync();
#endif
}

// Split-K in a cluster of two by push (ConfigTraits::kPushReduce: small tiles; the dispatcher
// sets p.cluster_reduce = 2), where only the leader waits. Slice 1 stores its float32
// accumulators straight into the receive slot of the leader's (rank 0's) shared memory, which
// lies past the block's own kSmemBytes and is never touched by the leader's pipeline, arrives
// on the cluster barrier (release) and is done; the leader arrives, waits (acquire), adds the
// slot to its own accumulators (0 + own + slot: bitwise the sums of cluster_reduce_store and
// of the workspace reduction) and stores C through the usual staged epilogue. The kernel's
// first cluster barrier phase (arrived at its start) must have completed: both blocks run.
// With another batch item to come (`more`), a second phase keeps the slot until the leader
// has read it. Every thread takes part; those whose warp `holds` the block's sums (sliced K:
// k group 0) move them. Returns whether this thread stores C (the leader's that hold them).
template <int CFG>
__device__ __forceinline__ bool cluster_push_reduce(
    float (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4], char* smem, bool more,
    bool holds, int wm0, int wn0, int lane) {
  using Tr = ConfigTraits<CFG>;
  const float* slot = reinterpret_cast<const float*>(smem + Tr::kSmemBytes);
  if (ptx::cluster_rank() != 0) {
    const uint32_t leader_slot = ptx::map_to_rank(ptx::cvta_to_shared(slot), 0);
    if (holds)
      for_each_acc_pair<CFG>(wm0, wn0, lane, [&](int mi, int ni, int h, int i) {
        ptx::st_cluster_v2_f32(leader_slot + 4 * i, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
      });
    ptx::cluster_arrive();
    if (more) {  // this phase, then the one in which the leader has read the slot
      ptx::cluster_wait();
      ptx::cluster_arrive();
      ptx::cluster_wait();
    }
    return false;
  }
  ptx::cluster_arrive();
  ptx::cluster_wait();
  if (holds)
    for_each_acc_pair<CFG>(wm0, wn0, lane, [&](int mi, int ni, int h, int i) {
      const float2 v = *reinterpret_cast<const float2*>(slot + i);
      acc[mi][ni][2 * h] = 0.0f + acc[mi][ni][2 * h] + v.x;
      acc[mi][ni][2 * h + 1] = 0.0f + acc[mi][ni][2 * h + 1] + v.y;
    });
  if (more) {
    ptx::cluster_arrive();
    ptx::cluster_wait();
  }
  return holds;
}

// RAGGED: a grouped product (p.ragged; split 1, no cluster): block x runs item x of the
// grouped work list (kernels/common/ragged.cuh; blocks past its end only zero), and the rows
// past the last group are zeroed by all blocks.
template <typename T, int CFG, bool A_KMAJOR, bool B_KMAJOR, bool ALIGNED, bool RAGGED = false>
__global__ void __launch_bounds__(ConfigTraits<CFG>::kThreads, 1) gemm_sm80_kernel(GemmParams p) {
  using Tr = ConfigTraits<CFG>;
  extern __shared__ __align__(128) char smem[];
  const uint32_t smem_base = ptx::cvta_to_shared(smem);
  const bool push = !RAGGED && Tr::kPushReduce && p.cluster_reduce == 2;
  if (push) ptx::cluster_arrive_relaxed();  // waited for before the first push (the main loop
                                            // hides it): every block of the cluster has started
  auto a_tile = [&](int s) { return smem_base + s * Tr::kStageBytes; };
  auto b_tile = [&](int s) { return smem_base + s * Tr::kStageBytes + Tr::kBM * Tr::kBK * Tr::kElem; };
  using LoadA = TileLoader<T, A_KMAJOR ? Tr::kBM : Tr::kBK, A_KMAJOR ? Tr::kBK : Tr::kBM,
                           Tr::kThreads, ALIGNED, !A_KMAJOR>;
  using LoadB = TileLoader<T, B_KMAJOR ? Tr::kBN : Tr::kBK, B_KMAJOR ? Tr::kBK : Tr::kBN,
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
    const int split = ptx::ctaid_y();
    const int ktiles_all = static_cast<int>((p.k + Tr::kBK - 1) / Tr::kBK);
    const int kt_begin = split * p.k_tiles_per_split;
    // RAGGED: the item's k range (a contraction group's rows: zeros past its end).
    const int ktiles = RAGGED ? rt.ktiles : max(0, min(ktiles_all - kt_begin, p.k_tiles_per_split));
    const int64_t k_begin = RAGGED ? rt.kbase : int64_t(kt_begin) * Tr::kBK;
    const int64_t k_end = RAGGED ? rt.kend : min(p.k, k_begin + int64_t(ktiles) * Tr::kBK);
    const int64_t zo = RAGGED ? rt.g : z;  // operand item (ragged: B's group; stride_a is 0)

    // Global views: A is [M][K] (K-major) or [K][M]; B is [N][K] (K-major) or [K][N]; rows are
    // p.lda / p.ldb elements apart (the contiguous extent, or a packed copy's padded one).
    const int64_t a_rows = A_KMAJOR ? p.m : k_end, a_cols = A_KMAJOR ? k_end : p.m;
    const int64_t b_rows = B_KMAJOR ? p.n : k_end, b_cols = B_KMAJOR ? k_end : p.n;
    LoadA load_a;
    LoadB load_b;
    load_a.init(static_cast<const T*>(p.a) + zo * p.stride_a, a_rows, a_cols, p.lda,
                A_KMAJOR ? m0 : k_begin, A_KMAJOR ? k_begin : m0, tid);
    load_b.init(static_cast<const T*>(p.b) + zo * p.stride_b, b_rows, b_cols, p.ldb,
                B_KMAJOR ? n0 : k_begin, B_KMAJOR ? k_begin : n0, tid);
    auto load_stage = [&](int s) {  // the next k tile of A and B into stage s
      load_a.load_next(a_tile(s));
      load_b.load_next(b_tile(s));
    };

    float acc[Tr::kMI][Tr::kNI][4];
#pragma unroll
    for (int mi = 0; mi < Tr::kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < Tr::kNI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

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
            mma_f32<T>(acc[mi][ni], f.a[mi], f.b[ni]);
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
