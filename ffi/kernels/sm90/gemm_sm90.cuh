// The Hopper GEMM kernel template (compute capability 9.0, built for sm_90a):
// D[z] = epilogue(A[z] · B[z]) for z < batch, as a persistent, warp-specialized pipeline.
//
//   grid         : one block per SM; each walks the work list (output tile x batch item x K
//                  slice) with stride gridDim.x, grouped rasterization for L2 reuse
//   producer     : warpgroup 0, one thread: TMA bulk tensor copies of the next k tile of A
//                  (BM x 64) and B (64 x BN) into stage s, completing on mbarrier full[s],
//                  after waiting for empty[s] (the consumers are done with that stage)
//   consumers    : warpgroups 1..G, each owns BM/G rows (one or two m64 blocks): per k tile
//                  and m64 block, four wgmma.m64nBNk16 straight from shared memory (no
//                  ldmatrix, no register fragments for A or B), one commit group in flight
//                  while the next k tile is waited for; then the float32 accumulators go to C
//                  through a shared-memory staging panel per warpgroup (coalesced 16-byte row
//                  stores)
//   shared tiles : 128-byte swizzle (TMA writes it, wgmma reads it: conflict-free); a K-major
//                  tile is rows of 64 k (128 bytes); an M/N-major one is 64-element-wide boxes
//                  of 64 k rows, one box per 64 of M or N
//
// Ragged (grouped) products (p.ragged, host/gemm_params.h) walk their groups' tiles with the
// same pipeline: a group's tiles read its B item (rows) or its k range (contraction; the k
// rows past the group's end in its last k tile are zeroed in shared memory before the wgmma
// read them), store only their group's rows, and the rows past the last group are zeroed.
//
// Split-K slices write raw float32 partials to the workspace (p.partial; the dispatcher launches
// the reduction, which runs the epilogue), as the sm80 kernel's workspace path does; a batch item whose stride
// is 0 reads item 0. The producer moves on to the next work item while the consumers store the
// previous one, so prologue and epilogue overlap the neighbouring tiles' main loops.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "host/gemm_config.h"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/ragged.cuh"
#include "host/gemm_params.h"
#include "ptx/ldmatrix.cuh"  // cvta_to_shared
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace tcgemm {

// Epilogue staging: each consumer warpgroup owns one panel of shared memory, 64 rows x 256
// bytes (128 half or 64 float columns of its m64 block). A row's 16-byte chunks are XOR-
// swizzled by the row (by twice the row for float, whose accumulator pairs are 8 bytes) so that
// the accumulator writes (8 rows x 4 threads per warp) and the row-wise reads are both free of
// bank conflicts.
constexpr int kEpiBytes = 64 * 256;

template <int CFG>
struct Sm90Traits {
  static constexpr GemmConfig c = kConfigs[CFG];
  static constexpr int kBM = c.bm, kBN = c.bn, kBK = c.bk, kStages = c.stages;
  static constexpr int kConsumers = c.consumers;
  static constexpr bool kPingPong = c.pingpong;  // a consumer owns whole tiles, in turn
  // m64 blocks per consumer warpgroup: all of the tile's (ping-pong), or its share
  static constexpr int kMB = kPingPong ? kBM / 64 : kBM / (64 * kConsumers);
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kABytes = kBM * kBK * 2;
  static constexpr int kBBytes = kBN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kBox = 64 * kBK * 2;  // one 64-wide box of an M/N-major tile, in bytes
  // Dynamic shared memory: the stages, one epilogue staging panel per consumer warpgroup, plus
  // slack to align the stages to 1024 bytes (the period of the 128-byte swizzle, which the
  // wgmma descriptors assume starts at offset 0).
  static constexpr int kEpiOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = kEpiOffset + kConsumers * kEpiBytes + 1024;
  // Registers per thread after setmaxnreg: the producer gives up what the consumers take.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  static_assert(c.kind == Kind::kSm90, "Sm90Traits describes sm90 rows only");
  static_assert(kBK == 64, "a k tile is one 128-byte swizzle row of 16-bit elements");
  static_assert(kConsumers >= 1 && kBM == 64 * (kPingPong ? 1 : kConsumers) * kMB && kMB >= 1,
                "each consumer warpgroup owns a multiple of 64 rows");
  static_assert(kBN == 128 || kBN == 256, "wgmma n128 or n256");
  static_assert(kMB * kBN / 2 <= 128, "at most 128 float32 accumulators per thread");
  static_assert(kBM <= 256 && kBN <= 256, "a TMA box spans at most 256 rows");
  // The block holds what ptxas allots each thread at entry (65536 / threads, in units of 8)
  // times its threads; setmaxnreg.inc would wait forever for more than that.
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <=
                    kThreads * ((65536 / kThreads) & ~7),
                "setmaxnreg budget exceeds the registers the block holds");
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the sm_90 shared-memory limit per block");
};

// wgmma shared-memory matrix descriptor (PTX 9.7.15.5.1.2): start address, leading and stride
// byte offsets (all >> 4), 128-byte swizzle. K-major tiles: 8-row core-matrix groups 1024 bytes
// apart (stride), the leading offset unused. M/N-major tiles: 8-k-row groups 1024 bytes apart
// (stride), 64-element boxes kBox apart along M/N (leading).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lead, uint32_t stride) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lead >> 4) << 16) |
         (uint64_t(stride >> 4) << 32) | (uint64_t(1) << 62);
}

template <typename T, int BN, bool A_KMAJOR, bool B_KMAJOR>
__device__ __forceinline__ void wgmma_tile(float (&acc)[BN / 2], uint64_t da, uint64_t db) {
  constexpr int ta = A_KMAJOR ? 0 : 1, tb = B_KMAJOR ? 0 : 1;
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (BN == 256) ptx::wgmma_m64n256k16<ta, tb, bf16>(acc, da, db, 1);
  else ptx::wgmma_m64n128k16<ta, tb, bf16>(acc, da, db, 1);
}

template <typename Out>
__device__ __forceinline__ int epi_offset(int row, int byte) {  // byte: within the row's 256
  constexpr int kShift = sizeof(Out) == 4 ? 1 : 0;
  return row * 256 + (((byte >> 4) ^ ((row & 7) << kShift)) << 4) + (byte & 15);
}

template <typename Out>
__device__ __forceinline__ void put_pair(char* dst, float v0, float v1) {
  if constexpr (std::is_same_v<Out, float>) {
    *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
  } else {
    struct alignas(4) Out2 { Out x[2]; } o{{convert<Out>(v0), convert<Out>(v1)}};
    *reinterpret_cast<Out2*>(dst) = o;
  }
}

// A consumer warpgroup's 64 x BN accumulators (thread layout in ptx/wgmma.cuh), times `scale`,
// to the M x N matrix at `c` (D of one batch item when the epilogue is no more than alpha, or a
// split-K slice's raw partials), converted to Out before staging, one panel at a time through
// its staging panel `epi`: the warpgroup writes the panel, then stores whole
// rows with 16-byte stores (a warp writes two contiguous 256-byte row segments) when C's rows
// are 16-byte multiples, else element by element along the rows (a warp writes 32 contiguous
// elements). Nothing at or past row `row_end` or column N is written. `bar`: the warpgroup's
// named barrier.
template <typename Out, int BN>
__device__ __forceinline__ void store_block(const GemmParams& p, Out* c, const float (&acc)[BN / 2],
                                            float scale, int64_t row0, int64_t col0,
                                            int64_t row_end, int t, char* epi, uint32_t bar) {
  constexpr int kCols = 256 / int(sizeof(Out));  // columns per panel
  constexpr int kVec = 16 / int(sizeof(Out));    // elements per 16-byte chunk
  static_assert(BN % kCols == 0, "whole panels");
  const int lane = t & 31, warp = t >> 5;
  const int r = warp * 16 + (lane >> 2);  // this thread's accumulator rows: r and r + 8
  const bool vec = (p.n * int64_t(sizeof(Out))) % 16 == 0 &&
                   (reinterpret_cast<uintptr_t>(c) & 15) == 0;
#pragma unroll
  for (int panel = 0; panel < BN / kCols; ++panel) {
    ptx::named_barrier_sync(bar, 128);  // the previous panel (or tile) has been read out
#pragma unroll
    for (int jj = 0; jj < kCols / 8; ++jj) {
      const int j = panel * (kCols / 8) + jj;
      const int byte = (8 * jj + 2 * (lane & 3)) * int(sizeof(Out));
      put_pair<Out>(epi + epi_offset<Out>(r, byte), scale * acc[4 * j], scale * acc[4 * j + 1]);
      put_pair<Out>(epi + epi_offset<Out>(r + 8, byte), scale * acc[4 * j + 2],
                    scale * acc[4 * j + 3]);
    }
    ptx::named_barrier_sync(bar, 128);  // the panel is complete
    const int64_t pc = col0 + panel * kCols;
    if (vec) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // 64 rows x 16 chunks over 128 threads
        const int idx = t + 128 * i, row = idx >> 4, q = idx & 15;
        const int64_t gr = row0 + row, gc = pc + q * kVec;
        if (gr >= row_end || gc >= p.n) continue;
        // gc and N are multiples of kVec (col0 of BN, N of 16 bytes): the chunk ends by N
        *reinterpret_cast<uint4*>(c + gr * p.n + gc) =
            *reinterpret_cast<const uint4*>(epi + epi_offset<Out>(row, q * 16));
      }
    } else {
      for (int rr = 0; rr < 16; ++rr) {  // warp w: rows 16 w .. 16 w + 15
        const int row = warp * 16 + rr;
        const int64_t gr = row0 + row;
        if (gr >= row_end) break;
#pragma unroll
        for (int u = 0; u < kCols / 32; ++u) {
          const int e = lane + 32 * u;
          if (pc + e < p.n)
            c[gr * p.n + pc + e] =
                *reinterpret_cast<const Out*>(epi + epi_offset<Out>(row, e * int(sizeof(Out))));
        }
      }
    }
  }
}

// The full epilogue (kernels/common/epilogue.cuh) on a consumer warpgroup's 64 x BN
// accumulators of batch item z (D's item at element d_item; rows below row_end): the raw
// float32 accumulators go through the staging panel 64 columns at a time; in the copy-out a
// thread owns one 16-byte chunk (4 columns, coalesced with its neighbours') of 8 rows of the
// panel. Everything it reads from global memory for the panel (the columns' bias, and C's 8 x 4
// values) is loaded before any of it is used, so a panel waits for one memory round trip, not
// one per row (under the other warpgroup's TMA traffic a round trip is long: 32 of them per
// tile made the epilogue longer than a ping-pong main loop, benchmarks/NOTES.md v32). The
// pre-activation values go back to the thread's own places in the panel (unrolled: FMAs only);
// the activation and the stores then run in a loop that is not unrolled, reading the panel.
// The panel loop is unrolled, so that each panel's accumulators die once staged.
template <typename Out>
__device__ __forceinline__ void epi_copy_out(const GemmParams& p, EpiScale s, char* epi,
                                             const float (&cv)[8][4], const float (&colv)[4],
                                             int64_t d_item, int64_t row0, int64_t gc,
                                             int64_t row_end, int cols, int t) {
  const int q = t & 15, rb = t >> 4;
  const bool vec = p.n % 4 == 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // pre-activation, in place (this thread's chunks only)
    float4* const at = reinterpret_cast<float4*>(epi + epi_offset<float>(rb + 8 * i, q * 16));
    const float4 x = *at;
    *at = make_float4(s.alpha * x.x + s.beta * cv[i][0] + colv[0],
                      s.alpha * x.y + s.beta * cv[i][1] + colv[1],
                      s.alpha * x.z + s.beta * cv[i][2] + colv[2],
                      s.alpha * x.w + s.beta * cv[i][3] + colv[3]);
  }
  // One loop per activation (the switch outside it): the loop that runs is small and
  // straight, beside the other warpgroup's main loop (a switch per element made any
  // activation cost ~10% of a ping-pong product, relu as much as gelu_tanh: v32).
  with_activation(p.epi.act, [&](auto act) {
#pragma unroll 1
    for (int i = 0; i < 8; ++i) {
      const int row = rb + 8 * i;
      const int64_t gr = row0 + row;
      if (gr >= row_end || cols == 0) continue;
      const float4 x = *reinterpret_cast<const float4*>(epi + epi_offset<float>(row, q * 16));
      float v[4] = {x.x, x.y, x.z, x.w};
      const int64_t off = d_item + gr * p.n + gc;
      if (p.epi.aux) store_vec<Out, 4>(static_cast<Out*>(p.epi.aux) + off, v, cols, vec);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = activate_for<Out>(decltype(act)::value, v[j]);
      store_vec<Out, 4>(static_cast<Out*>(p.d) + off, v, cols, vec);
    }
  });
}

template <typename Out, int BN>
__device__ __forceinline__ void epi_block(const GemmParams& p, const float (&acc)[BN / 2],
                                          int64_t z, int64_t d_item, int64_t row0, int64_t col0,
                                          int64_t row_end, int t, char* epi, uint32_t bar) {
  constexpr int kPanels = BN / 64;  // of 64 float32 columns
  const int lane = t & 31, warp = t >> 5;
  const int r = warp * 16 + (lane >> 2);
  const EpiScale s = epi_scale(p);
  const EpilogueParams& ep = p.epi;
  const int q = t & 15, rb = t >> 4;  // copy-out: chunk q of rows rb, rb + 8, ..., rb + 56
#pragma unroll
  for (int panel = 0; panel < kPanels; ++panel) {
    const int64_t gc = col0 + panel * 64 + q * 4;
    const int cols = static_cast<int>(max(int64_t(0), min(p.n - gc, int64_t(4))));
    float colv[4];  // bias of the chunk's columns (0 past N)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      colv[j] = ep.bias && j < cols ? __ldg(ep.bias + z * ep.bias_sb + gc + j) : 0.0f;
    ptx::named_barrier_sync(bar, 128);  // the previous panel (or tile) has been read out
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int j = panel * 8 + jj;
      const int byte = (8 * jj + 2 * (lane & 3)) * 4;
      put_pair<float>(epi + epi_offset<float>(r, byte), acc[4 * j], acc[4 * j + 1]);
      put_pair<float>(epi + epi_offset<float>(r + 8, byte), acc[4 * j + 2], acc[4 * j + 3]);
    }
    // loaded once the panel's accumulators are staged (their registers free), in flight while
    // the barrier waits for the other threads' staging
    float cv[8][4] = {};  // C of the chunk's rows (0 past M and N)
    if (ep.c) {
      with_dtype(ep.c_type, [&](auto c0) {
        using C = decltype(c0);
        const C* const c = static_cast<const C*>(ep.c) + z * ep.c_sb + gc * ep.c_sc;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int64_t gr = row0 + rb + 8 * i;
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (gr < row_end && j < cols) cv[i][j] = to_float(c[gr * ep.c_sr + j * ep.c_sc]);
        }
      });
    }
    ptx::named_barrier_sync(bar, 128);  // the panel is complete
    epi_copy_out<Out>(p, s, epi, cv, colv, d_item, row0, gc, row_end, cols, t);
  }
}

// The next k tile (k0) of one operand into its stage at `dst`: a K-major tile is one box of
// 64 k x ROWS rows at (k0, mn0); an M/N-major one is ROWS/64 boxes of 64 (M or N) x 64 k rows
// at (mn0 + 64 i, k0), kBox bytes apart.
template <bool KMAJOR, int ROWS, int BOX_BYTES>
__device__ __forceinline__ void tma_load_operand(uint32_t dst, const CUtensorMap* map,
                                                 uint32_t bar, int k0, int mn0, int z) {
  if constexpr (KMAJOR) {
    ptx::tma_load_3d(dst, map, bar, k0, mn0, z);
  } else {
#pragma unroll
    for (int i = 0; i < ROWS / 64; ++i)
      ptx::tma_load_3d(dst + i * BOX_BYTES, map, bar, mn0 + 64 * i, k0, z);
  }
}

// One work item of a block: an output tile, what it reads and where it writes.
// (32-bit fields: M, N, K and the batch are below 2^31; the consumers keep this live across
// their main loop, beside the accumulators.)
struct Sm90Work {
  int m0, n0;        // tile origin in D's item
  int z;             // batch item: D's (d_item()), C's and the bias row's
  int row_end;       // rows at or past it are not stored
  int za, zb;        // operand items (TMA coordinate 2)
  int slice;         // split-K slice
  int kbase;         // first k of the item's range (TMA coordinate); k tiles from there
  int ktiles;        // k tiles of the item (0: the tile is zeros)
  int kvalid;        // valid k of its last tile (< kBK: the rest is another group's, zeroed)

  // Element offset of D's item: the batch item's, or the group's (ragged contraction); ragged
  // rows write the one M x N result.
  __device__ int64_t d_item(const GemmParams& p) const {
    return p.ragged.mode == RaggedMode::kRows ? 0 : int64_t(z) * p.m * p.n;
  }
};

// A block's work list: items blockIdx.x, + gridDim.x, ... in ascending order (the producer and
// every consumer walk it alike). Plain: output tile x batch item x K slice (the slice
// outermost, then the batch item, then the tiles). Ragged (p.ragged): each group's tiles in
// turn, the group of an item found by walking the device group sizes (ragged_tile in
// kernels/common/ragged.cuh: the rule both kernel families share).
template <int BM, int BN, int BK>
struct Sm90Sched {
  // Item w into r; false past the end of the list. Grouped lists walk the group sizes from
  // the first group on every call: no state is kept across the main loop, where the
  // consumers' accumulators leave no registers for it (kept in registers, a cursor made ptxas
  // spill; the walk costs O(groups) cached loads per item). (p is passed, not kept: a
  // reference member would hold the kernel parameter's generic address.)
  __device__ bool next(const GemmParams& p, int64_t w, Sm90Work& r) const {
    const int ktiles_all = static_cast<int>((p.k + BK - 1) / BK);
    if (p.ragged.mode == RaggedMode::kNone) {
      const int64_t tiles = int64_t(p.tiles_m) * p.tiles_n;
      if (w >= tiles * p.batch * p.split_k) return false;
      int64_t mt, nt;
      raster(w % tiles, p.tiles_m, p.tiles_n, mt, nt);
      const int64_t rest = w / tiles;
      r.m0 = static_cast<int>(mt * BM);
      r.n0 = static_cast<int>(nt * BN);
      r.z = static_cast<int>(rest % p.batch);
      r.row_end = static_cast<int>(p.m);
      r.za = p.stride_a ? static_cast<int>(r.z) : 0;
      r.zb = p.stride_b ? static_cast<int>(r.z) : 0;
      r.slice = static_cast<int>(rest / p.batch);
      const int kt0 = r.slice * p.k_tiles_per_split;
      r.kbase = kt0 * BK;
      r.ktiles = max(0, min(ktiles_all - kt0, p.k_tiles_per_split));
      r.kvalid = BK;  // past K, TMA reads zeros
      return true;
    }
    RaggedTile t;
    if (!ragged_tile<BM, BN, BK>(p, w, t)) return false;
    const bool rows_mode = p.ragged.mode == RaggedMode::kRows;
    r.m0 = t.m0;
    r.n0 = t.n0;
    r.z = t.g;
    r.row_end = t.row_end;
    r.za = 0;
    r.zb = rows_mode ? t.g : 0;
    r.slice = 0;
    r.kbase = t.kbase;
    r.ktiles = t.ktiles;
    r.kvalid = t.kvalid;
    return true;
  }
};

template <typename T, int CFG, bool A_KMAJOR, bool B_KMAJOR>
__global__ void __launch_bounds__(Sm90Traits<CFG>::kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ GemmParams p, const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b) {
#if TCGEMM_SM90A
  using Tr = Sm90Traits<CFG>;
  extern __shared__ __align__(1024) char smem_raw[];
  __shared__ __align__(8) uint64_t full[Tr::kStages], empty[Tr::kStages];
  const uint32_t smem = (ptx::cvta_to_shared(smem_raw) + 1023u) & ~1023u;
  auto a_stage = [&](int s) { return smem + s * Tr::kStageBytes; };
  auto b_stage = [&](int s) { return smem + s * Tr::kStageBytes + Tr::kABytes; };
  auto full_bar = [&](int s) { return ptx::cvta_to_shared(&full[s]); };
  auto empty_bar = [&](int s) { return ptx::cvta_to_shared(&empty[s]); };

  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tr::kStages; ++s) {
      ptx::mbarrier_init(full_bar(s), 1);                // the producer's arrive.expect_tx
      // one arrival per consumer warpgroup that reads the stage
      ptx::mbarrier_init(empty_bar(s), Tr::kPingPong ? 1 : Tr::kConsumers);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    ptx::setmaxnreg_dec<Tr::kProducerRegs>();
    if (t != 0) return;
    ptx::prefetch_tensormap(&map_a);
    ptx::prefetch_tensormap(&map_b);
    int s = 0;
    uint32_t phase = 0;
    const Sm90Sched<Tr::kBM, Tr::kBN, Tr::kBK> sched;
    Sm90Work wk;
    for (int64_t w = blockIdx.x; sched.next(p, w, wk); w += gridDim.x) {
      const int m0 = static_cast<int>(wk.m0), n0 = static_cast<int>(wk.n0);
      for (int kt = 0; kt < wk.ktiles; ++kt) {
        ptx::mbarrier_wait(empty_bar(s), phase ^ 1);
        ptx::mbarrier_arrive_expect_tx(full_bar(s), Tr::kStageBytes);
        const int k0 = wk.kbase + kt * Tr::kBK;
        tma_load_operand<A_KMAJOR, Tr::kBM, Tr::kBox>(a_stage(s), &map_a, full_bar(s), k0, m0, wk.za);
        tma_load_operand<B_KMAJOR, Tr::kBN, Tr::kBox>(b_stage(s), &map_b, full_bar(s), k0, n0, wk.zb);
        if (++s == Tr::kStages) { s = 0; phase ^= 1; }
      }
    }
    return;
  }

  // Consumers.
  ptx::setmaxnreg_inc<Tr::kConsumerRegs>();
  const int cw = wg - 1;
  // Cooperative: every item, m64 blocks [mb0, mb0 + kMB) of its tile. Ping-pong: items cw,
  // cw + kConsumers, ... of the block's list, whole tiles; the stages of the items in between
  // (the other warpgroups') are skipped.
  const int mb0 = Tr::kPingPong ? 0 : cw * Tr::kMB;
  const int64_t w_first = blockIdx.x + (Tr::kPingPong ? int64_t(cw) * gridDim.x : 0);
  const int64_t w_step = int64_t(gridDim.x) * (Tr::kPingPong ? Tr::kConsumers : 1);
  // Ping-pong: the warpgroups' main loops take turns. Warpgroup c starts a main loop only once
  // the other has issued its previous one (named barrier 3 + c): the full barriers are waited
  // on by phase parity, which tells apart only neighbouring phases, so a warpgroup must never
  // wait on a stage two fills ahead (it would take the other's tile for its own).
  const uint32_t my_turn = 3 + cw, their_turn = 3 + (1 - cw);
  // k-tile zeroing (ragged contraction): the threads that read the stage, their barrier
  constexpr int kZeroThreads = Tr::kPingPong ? 128 : 128 * Tr::kConsumers;
  const int zero_id = Tr::kPingPong ? t : threadIdx.x - 128;
  const uint32_t zero_bar = Tr::kPingPong ? 1 + cw : 1 + Tr::kConsumers;
  char* const epi = smem_raw + (smem - ptx::cvta_to_shared(smem_raw)) + Tr::kEpiOffset +
                    cw * kEpiBytes;  // this warpgroup's staging panel
  // M/N-major tiles: 64-element boxes kBox bytes apart (leading), 8-k-row groups 1 KB apart
  constexpr uint32_t kMnLead = Tr::kBox, kMnStride = 1024;
  int s = 0;
  uint32_t phase = 0;
  float acc[Tr::kMB][Tr::kBN / 2];
  // An epilogue of no more than alpha takes the short path (store_block); any other the full
  // one (epi_block).
  const bool simple = !p.epi.c && !p.epi.bias && !p.epi.aux && !p.epi.scale &&
                      p.epi.act == Activation::kNone;
  const float alpha = p.epi.alpha;
  const Sm90Sched<Tr::kBM, Tr::kBN, Tr::kBK> sched;
  Sm90Work wk;
  int64_t w_seen = blockIdx.x;  // ping-pong: the block's next item not accounted for
  for (int64_t w = w_first;; w += w_step) {
    if constexpr (Tr::kPingPong) {
      for (; w_seen < w; w_seen += gridDim.x) {  // another warpgroup's item: skip its stages
        Sm90Work other;
        if (!sched.next(p, w_seen, other)) break;
        s += other.ktiles;
        phase ^= (s / Tr::kStages) & 1;
        s %= Tr::kStages;
      }
      w_seen = w + gridDim.x;
    }
    if (!sched.next(p, w, wk)) break;
    if constexpr (Tr::kPingPong) {
      if (w >= int64_t(blockIdx.x) + gridDim.x) ptx::named_barrier_sync(my_turn, 256);
    }
#pragma unroll
    for (int mb = 0; mb < Tr::kMB; ++mb)
#pragma unroll
      for (int i = 0; i < Tr::kBN / 2; ++i) acc[mb][i] = 0.0f;
    int prev = -1;
    for (int kt = 0; kt < wk.ktiles; ++kt) {
      ptx::mbarrier_wait(full_bar(s), phase);
      if constexpr (!A_KMAJOR && !B_KMAJOR) {
        // Ragged contraction: the last k tile of a group ends inside the stage; its other k
        // rows (another group's) are zeroed in both operands, by the warpgroups that read the
        // stage, before any wgmma reads them. A k row of an M/N-major box is one 128-byte line (the swizzle
        // permutes within lines).
        if (kt == wk.ktiles - 1 && wk.kvalid < Tr::kBK) {
          constexpr int kBoxes = (Tr::kBM + Tr::kBN) / 64, kLines = Tr::kBK;
          const int lines = kLines - wk.kvalid;
          for (int i = zero_id; i < kBoxes * lines * 8; i += kZeroThreads) {
            const int box = i / (lines * 8), line = wk.kvalid + (i / 8) % lines, q = i % 8;
            const uint32_t at = (box < Tr::kBM / 64 ? a_stage(s) + box * Tr::kBox
                                                    : b_stage(s) + (box - Tr::kBM / 64) * Tr::kBox) +
                                line * 128 + q * 16;
            ptx::st_shared_zero16(at);
          }
          ptx::fence_proxy_async_shared();
          ptx::named_barrier_sync(zero_bar, kZeroThreads);
        }
      }
      ptx::wgmma_fence();
#pragma unroll
      for (int j = 0; j < Tr::kBK / 16; ++j) {
        // A k16 step is 32 bytes along a K-major row, 16 rows of 128 bytes down an M/N-major
        // box. m64 block b of A is box b (M-major) or rows 64 b.. (K-major): kBox * b bytes in.
        const uint64_t db = B_KMAJOR ? smem_desc(b_stage(s) + 32 * j, 16, 1024)
                                     : smem_desc(b_stage(s) + 2048 * j, kMnLead, kMnStride);
#pragma unroll
        for (int mb = 0; mb < Tr::kMB; ++mb) {
          const uint32_t a = a_stage(s) + (mb0 + mb) * Tr::kBox;
          const uint64_t da = A_KMAJOR ? smem_desc(a + 32 * j, 16, 1024)
                                       : smem_desc(a + 2048 * j, kMnLead, kMnStride);
          wgmma_tile<T, Tr::kBN, A_KMAJOR, B_KMAJOR>(acc[mb], da, db);
        }
      }
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<1>();  // the previous k tile's wgmma are done with their stage
      if (prev >= 0 && t == 0) ptx::mbarrier_arrive(empty_bar(prev));
      prev = s;
      if (++s == Tr::kStages) { s = 0; phase ^= 1; }
    }
    if constexpr (Tr::kPingPong) {  // the other warpgroup's next item may start its loop
      Sm90Work other;
      if (sched.next(p, w + gridDim.x, other)) ptx::named_barrier_arrive(their_turn, 256);
    }
    ptx::wgmma_wait_group<0>();
    if (prev >= 0 && t == 0) ptx::mbarrier_arrive(empty_bar(prev));

#pragma unroll
    for (int mb = 0; mb < Tr::kMB; ++mb) {
      const int64_t row0 = wk.m0 + 64 * (mb0 + mb);
      if (p.partial) {  // split-K through the workspace: raw float32, the reduction finishes
        store_block<float, Tr::kBN>(
            p, p.partial + (int64_t(wk.slice) * p.batch + wk.z) * p.m * p.n, acc[mb], 1.0f,
            row0, wk.n0, wk.row_end, t, epi, 1 + cw);
      } else if (simple) {  // no more than alpha: convert before staging (half the panels)
        with_dtype(p.d_type, [&](auto out) {
          using Out = decltype(out);
          store_block<Out, Tr::kBN>(p, static_cast<Out*>(p.d) + wk.d_item(p), acc[mb], alpha, row0,
                                    wk.n0, wk.row_end, t, epi, 1 + cw);
        });
      } else {
        with_dtype(p.d_type, [&](auto out) {
          epi_block<decltype(out), Tr::kBN>(p, acc[mb], wk.z, wk.d_item(p), row0, wk.n0,
                                            wk.row_end, t, epi, 1 + cw);
        });
      }
    }
  }
  if (p.ragged.mode == RaggedMode::kRows) {
    // Rows past the last group are zeros, written by all blocks' consumers.
    ragged_zero_tail(p, int64_t(blockIdx.x) * 128 * Tr::kConsumers + threadIdx.x - 128,
                     int64_t(gridDim.x) * 128 * Tr::kConsumers);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a target without wgmma (not sm_90a): never launched; fail loudly if so
#endif
}

}  // namespace tcgemm
