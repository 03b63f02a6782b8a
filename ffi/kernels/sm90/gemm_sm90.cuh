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
// Operand types (Sm90Operands): float16 / bfloat16 in any layout (k tiles of 64, wgmma k16, float32
// sums), float32 read K-major as TF32 (k tiles of 32, wgmma k8, float32 sums), or 8-bit
// operands read K-major (wgmma's only form for them; k tiles of 128, wgmma k32):
// int8 (int32 sums, exact; stored as int32 or, through the epilogue, as floats) and fp8 e4m3 /
// e5m2, whose k tile sums start at 0 in registers of their own and are added into the float32
// sums after each k tile (Hopper's fp8 wgmma accumulates with fewer bits than float32; on the
// 64x128 row, which has registers for two such sums, the next k tile's wgmma run meanwhile);
// TF32 sums likewise, after every two k tiles (64 of K).
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
#include "kernels/sm90/epilogue_sm90.cuh"
#include "kernels/sm90/operands_sm90.cuh"  // Sm90Operands
#include "kernels/sm90/sched_sm90.cuh"  // Sm90Work, Sm90Sched
#include "kernels/sm90/traits_sm90.cuh"  // Sm90Traits, smem_desc, tma_load_operand
#include "host/gemm_params.h"
#include "ptx/cp_async.cuh"  // staged b block scales (cp.async)
#include "ptx/ldmatrix.cuh"  // cvta_to_shared
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace tcgemm {

template <typename Ops, int CFG, bool A_KMAJOR, bool B_KMAJOR>
__global__ void __launch_bounds__(Sm90Traits<CFG>::kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ GemmParams p, const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b) {
#if TCGEMM_SM90A
  using Tr = Sm90Traits<CFG>;
  using Acc = typename Ops::Acc;
  constexpr int kKTile = Ops::kKTile;  // elements of a k tile (64 16-bit, 128 8-bit, 32 tf32)
  static_assert((Ops::kBytes == 2 && !Ops::kPromote) || (A_KMAJOR && B_KMAJOR),
                "8-bit, float32 and promoted 16-bit operands are read K-major");
  // promoted float16: pieces below p.piece_scale_k are scaled (GemmParams::piece_scale_k)
  constexpr bool kPieceScales = Ops::kPromote && Ops::kBytes == 2;
  static_assert(!kPieceScales || kKTile == kPromotedKTile, "piece_scale_k's unit is a k tile");
  static_assert(!Ops::kPromote || (Tr::kBN % 128 == 0 && (kKTile == 128 || Ops::kBytes != 1)),
                "fp8: a k tile is one 128-slice of K, pieces of 128 columns (the block scales' "
                "blocks); TF32 and promoted 16-bit: pieces of 128 columns");
  extern __shared__ __align__(1024) char smem_raw[];
  __shared__ __align__(8) uint64_t full[Tr::kStages], empty[Tr::kStages];
  const uint32_t smem = (ptx::cvta_to_shared(smem_raw) + 1023u) & ~1023u;
  auto a_stage = [&](int s) { return smem + s * Tr::kStageBytes; };
  auto b_stage = [&](int s) { return smem + s * Tr::kStageBytes + Tr::kABytes; };
  auto full_bar = [&](int s) { return ptx::cvta_to_shared(&full[s]); };
  auto empty_bar = [&](int s) { return ptx::cvta_to_shared(&empty[s]); };
  // fp8 block scales staged in shared memory (Sm90Traits::StagedScales): stage s's a scales
  // (kBM floats, the tile's rows), then its b scales (the tile's 128-column blocks)
  constexpr bool kStagedScales = Tr::template StagedScales<Ops>();
  auto scale_stage = [&](int s) { return smem + Tr::kScaleOffset + s * Tr::kScaleStride; };
  constexpr int kHalves = Tr::kBN / 128;
  // per consumer warpgroup and stage: its thread 0 after its wgmma_wait_group, or, with staged
  // block scales, each of its threads once done with the stage's scales (a warp's lanes are
  // not ordered by another warp's wait, nor for compute-sanitizer by __syncwarp)
  constexpr int kEmptyArrivals = kStagedScales ? 128 : 1;

  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tr::kStages; ++s) {
      ptx::mbarrier_init(full_bar(s), 1);                // the producer's arrive.expect_tx
      // kEmptyArrivals per consumer warpgroup that reads the stage
      ptx::mbarrier_init(empty_bar(s), (Tr::kPingPong ? 1 : Tr::kConsumers) * kEmptyArrivals);
    }
    ptx::fence_mbarrier_init();
  }
  if constexpr (kStagedScales) {  // the scale slots' rows past M stay finite (bulk copies)
    for (int i = threadIdx.x; i < Tr::kScaleBytes / 16; i += blockDim.x)
      ptx::st_shared_zero16(smem + Tr::kScaleOffset + 16 * i);
    ptx::fence_proxy_async_shared();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    ptx::setmaxnreg_dec<Tr::kProducerRegs>();
    // Thread 0 issues the copies: the stage's operands by TMA and, with staged block scales,
    // its tile's a scales (kBM consecutive floats of block_sa, whose rows the dispatcher
    // requires 16-byte aligned) by one bulk copy and its b scales by cp.async (zero past N),
    // all completing on the stage's full barrier. The slots of rows past M keep the padding's,
    // zeros or another tile's scales, times A's zero rows.
    if (t != 0) return;
    ptx::prefetch_tensormap(&map_a);
    ptx::prefetch_tensormap(&map_b);
    const bool copy_scales = kStagedScales && p.block_sa;
    int s = 0;
    uint32_t phase = 0;
    const Sm90Sched<Tr::kBM, Tr::kBN, kKTile> sched;
    Sm90Work wk;
    for (int64_t w = blockIdx.x; sched.next(p, w, wk); w += gridDim.x) {
      const int m0 = static_cast<int>(wk.m0), n0 = static_cast<int>(wk.n0);
      for (int kt = 0; kt < wk.ktiles; ++kt) {
        ptx::mbarrier_wait(empty_bar(s), phase ^ 1);
        const int k0 = wk.kbase + kt * kKTile;
        uint32_t scale_bytes = 0;
        if constexpr (kStagedScales) {
          if (copy_scales) {  // block kb's a scales are row kb of the item's block_sa
            const int64_t kb = k0 / 128, nb = (p.n + 127) / 128, rows = p.m - m0;
            const float* sb = p.block_sb + wk.z * p.block_sb_sb + kb * nb;
            const uint32_t dst = scale_stage(s);
#pragma unroll
            for (int h = 0; h < kHalves; ++h) {
              const bool in = n0 / 128 + h < nb;
              ptx::cp_async_ca_zfill<4>(dst + 4 * (Tr::kBM + h), in ? sb + n0 / 128 + h : sb,
                                       in ? 4 : 0);
            }
            ptx::cp_async_mbarrier_arrive(full_bar(s));
            // whole 16-byte chunks: up to 3 floats of the padded row past M
            scale_bytes = 16 * uint32_t(rows < Tr::kBM ? (rows + 3) / 4 : Tr::kBM / 4);
            ptx::mbarrier_arrive_expect_tx(full_bar(s), Tr::kStageBytes + scale_bytes);
            ptx::bulk_load(dst, p.block_sa + wk.z * p.block_sa_sb + kb * p.block_sa_ld + m0,
                           scale_bytes, full_bar(s));
          }
        }
        if (scale_bytes == 0) ptx::mbarrier_arrive_expect_tx(full_bar(s), Tr::kStageBytes);
        tma_load_operand<A_KMAJOR, Tr::kBM, Tr::kBox>(a_stage(s), &map_a, full_bar(s), k0, m0, wk.za);
        tma_load_operand<B_KMAJOR, Tr::kBN, Tr::kBox>(b_stage(s), &map_b, full_bar(s), k0, n0, wk.zb);
        if (++s == Tr::kStages) { s = 0; phase ^= 1; }
      }
    }
    return;
  }

  // Consumers.
  ptx::setmaxnreg_inc<Tr::kConsumerRegs>();
  // the consumer warpgroup, through a shuffle from lane 0: ptxas then knows it is warp-uniform
  // and builds the wgmma descriptors of A in uniform registers (8-bit operands)
  const int cw = (Ops::kBytes == 1 ? __shfl_sync(~0u, wg, 0) : wg) - 1;
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
  // TF32 and promoted 16-bit pieces of two cooperative warpgroups are issued in turns (named
  // barriers 5 + c):
  // warpgroup 1 issues a piece once warpgroup 0 has issued its own, warpgroup 0 its next once
  // warpgroup 1 has (all but its first piece; it waits once more after its last, so the
  // barrier's arrivals balance). fp8 pieces issue freely: in turns they were slower
  // (benchmarks/NOTES.md v38).
  constexpr bool kTurns = Ops::kPromote && Ops::kBytes != 1 && !Tr::kPingPong &&
                          Tr::kConsumers == 2;
  const uint32_t piece_wait = 5 + cw, piece_give = 5 + (1 - cw);
  bool piece_first = cw == 0;
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
  // 8-bit operands: stage s's shared addresses (its operands' wgmma descriptor, its staged
  // scales, its full and empty barriers) are carried from one k tile to the next, one add each;
  // rebuilt from s, ptxas recomputes them from the shared window's base every k tile (S2UR, two
  // masks, a multiply per address: benchmarks/NOTES.md v86). Other operands rebuild them.
  constexpr bool kCarry = Ops::kBytes == 1;
  static_assert(!kCarry || !Tr::kPingPong, "ping-pong skips stages by s (no 8-bit kernels)");
  // (the descriptor's low word: its high one, the stride and swizzle, is the same for all)
  uint32_t c_desc = uint32_t(smem_desc(a_stage(0), 16, 1024));  // K-major: A at 0, B kABytes in
  constexpr uint64_t kDescHigh = smem_desc(0, 0, 1024);
  uint32_t c_scales = scale_stage(0), c_full = full_bar(0), c_empty = empty_bar(0);
  // the next stage (s and its phase; the carried addresses with them)
  auto advance = [&] {
    if (++s == Tr::kStages) { s = 0; phase ^= 1; }
    if constexpr (kCarry) {
      const bool wrap = s == 0;
      c_desc += wrap ? -(Tr::kStages - 1) * (Tr::kStageBytes >> 4) : Tr::kStageBytes >> 4;
      c_scales += wrap ? -(Tr::kStages - 1) * Tr::kScaleStride : Tr::kScaleStride;
      c_full += wrap ? -(Tr::kStages - 1) * 8 : 8;
      c_empty += wrap ? -(Tr::kStages - 1) * 8 : 8;
    }
  };
  // stage s's: K-major descriptors of A's m64 block mb and of B's columns 128 h .. (the
  // address field is bits 0-13, in 16-byte units: the offsets add into it), staged scales,
  // barriers
  auto desc_a = [&](int mb) {
    return kCarry ? kDescHigh | (c_desc + ((mb * Tr::kBox) >> 4))
                  : smem_desc(a_stage(s) + mb * Tr::kBox, 16, 1024);
  };
  auto desc_b = [&](int h) {
    return kCarry ? kDescHigh | (c_desc + ((Tr::kABytes + h * 128 * 128) >> 4))
                  : smem_desc(b_stage(s) + h * 128 * 128, 16, 1024);
  };
  auto at_scales = [&] { return kCarry ? c_scales : scale_stage(s); };
  auto at_full = [&] { return kCarry ? c_full : full_bar(s); };
  auto at_empty = [&] { return kCarry ? c_empty : empty_bar(s); };
  Acc acc[Tr::kMB][Tr::kBN / 2];
  // fp8 and TF32: a k tile piece's partial sums
  float part[Ops::kPromote ? 64 : 1];
  // fp8 on a row that stages its block scales, with one 64 x 128 piece per warpgroup and k
  // tile and registers for two (64x128: 232 per consumer): k tile kt + 1's wgmma are issued
  // before kt's sums are scaled and added, so the tensor cores have this warpgroup's next piece
  // while it adds (128x128, whose consumers load the scales themselves, was slower so with
  // block scales: benchmarks/NOTES.md v44).
  constexpr bool kOverlap = kStagedScales && Tr::kMB == 1 && kHalves == 1 &&
                            !Tr::kPingPong && Tr::kConsumerRegs >= 232;
  float part2[kOverlap ? 64 : 1];
  // An epilogue of no more than alpha (a number, or read from the device) takes the short path
  // (store_block); any other the full one (epi_block). The planner's rule for which products
  // have a full epilogue is the same (jax_tcgemm/problem.py, fused_epilogue).
  const bool simple = !p.epi.c && !p.epi.bias && !p.epi.aux && !p.epi.row_scale &&
                      !p.epi.col_scale && p.epi.act == Activation::kNone;
  // 8-bit products with alpha and row / column scales only (W8A8, per-token / per-channel fp8)
  // take the short path too, the scales applied as it converts: their kernels' one short path
  // is store_block's SCALED form (without scales it computes alpha * acc, as the plain form;
  // a second form beside it put the 256x128 int8 kernel's accumulators on the stack)
  constexpr bool kScaledShort = Ops::kBytes == 1;
  const bool scaled_short = kScaledShort && !p.epi.c && !p.epi.bias && !p.epi.aux &&
                            p.epi.act == Activation::kNone;
  const float alpha = simple || scaled_short ? epi_scale(p).alpha : 1.0f;
  const Sm90Sched<Tr::kBM, Tr::kBN, kKTile> sched;
  Sm90Work wk{};  // set by sched.next before any read ({}: the lambdas below capture it)
  // block scales: fp8 only (the FFI passes none with other operands). Staged: read from the
  // stage's shared memory; otherwise loaded from global memory a k tile ahead (bsa: the
  // thread's rows r and r + 8 of each m64 block; bsb: the tile's 128-column blocks).
  constexpr bool kBlockScales = Ops::kBlockScales;
  const int scale_row = (t >> 5) * 16 + ((t & 31) >> 2);  // row r of each m64 block
  float bsa[Tr::kMB][2], bsb[kHalves];
  auto load_block_scales = [&](int kt) {
    const int64_t kb = wk.kbase / 128 + kt, nb = (p.n + 127) / 128;
    const float* sa = p.block_sa + wk.z * p.block_sa_sb + kb * p.block_sa_ld;
    const float* sb = p.block_sb + wk.z * p.block_sb_sb + kb * nb;
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
      bsb[h] = wk.n0 / 128 + h < nb ? __ldg(sb + wk.n0 / 128 + h) : 0.0f;
#pragma unroll
    for (int mb = 0; mb < Tr::kMB; ++mb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t row = wk.m0 + 64 * (mb0 + mb) + scale_row + 8 * e;
        bsa[mb][e] = row < p.m ? __ldg(sa + row) : 0.0f;
      }
  };
  // Stage st's staged scales (Sm90Traits::StagedScales): a's of this thread's rows, b's of the
  // tile's 128-column blocks.
  auto read_staged_scales = [&](uint32_t st, float (&sa)[Tr::kMB][2], float (&sb)[kHalves]) {
#pragma unroll
    for (int i = 0; i < Tr::kMB; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        sa[i][e] = ptx::ld_shared_f32(st + 4 * (64 * (mb0 + i) + scale_row + 8 * e));
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
      sb[h] = ptx::ld_shared_f32(st + 4 * (Tr::kBM + h));
  };
  // A finished piece P (m64 block mb, columns 128 h ..) added into the float32 sums: with
  // `scaled`, times its block scales (sa: rows r and r + 8; sb: the column block's); promoted
  // float16, times piece scale ps; else as is.
  auto add_piece = [&](const auto& P, int mb, int h, bool scaled, const float (&sa)[2],
                       float sb, float ps = 1.0f) {
    if constexpr (kPieceScales) {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[mb][64 * h + i] = fmaf(P[i], ps, acc[mb][64 * h + i]);
    } else if (scaled) {
#pragma unroll
      for (int i = 0; i < 64; ++i)  // accumulators 4j, 4j+1: row r; 4j+2, 4j+3: r+8
        acc[mb][64 * h + i] = fmaf(P[i], sa[(i >> 1) & 1] * sb, acc[mb][64 * h + i]);
    } else {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[mb][64 * h + i] += P[i];
    }
  };
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
      for (int i = 0; i < Tr::kBN / 2; ++i) acc[mb][i] = Acc(0);
    int prev = -1;  // the previous k tile's stage (none yet), its empty barrier
    uint32_t prev_empty = 0;
    if constexpr (Ops::kPromote && !kStagedScales) {
      if (kBlockScales && p.block_sa && wk.ktiles > 0) load_block_scales(0);
    }
    if constexpr (kOverlap) {
      const bool block = p.block_sa != nullptr;
      auto issue_piece = [&](float (&P)[64]) {  // stage s's piece into P
        const uint64_t da = desc_a(mb0), db = desc_b(0);
        ptx::wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j)
          Ops::template mma<128, true, true>(P, da + 2 * j, db + 2 * j, j > 0);
        ptx::wgmma_commit_group();
      };
      // k tile kt, issued into P from stage s: with `more`, issue kt + 1 into Q; then wait for
      // P, release kt's stage and add P times kt's scales into the float32 sums
      auto step = [&](float (&P)[64], float (&Q)[64], auto more) {
        const uint32_t st_scales = at_scales(), st_empty = at_empty();  // k tile kt's stage
        advance();
        if constexpr (more) {
          ptx::mbarrier_wait(at_full(), phase);
          issue_piece(Q);
        }
        float csa[1][2] = {}, csb[1] = {};  // k tile kt's block scales, from its stage
        if (block) read_staged_scales(st_scales, csa, csb);
        ptx::wgmma_wait_group<more ? 1 : 0>();
        ptx::wgmma_fence_operands(P);
        ptx::mbarrier_arrive(st_empty);  // this thread is done with the stage
        add_piece(P, 0, 0, block, csa[0], csb[0]);
      };
      using Next = std::true_type;
      using Last = std::false_type;
      if (wk.ktiles > 0) {
        ptx::mbarrier_wait(at_full(), phase);
        issue_piece(part);
        int kt = 0;
        for (; kt + 2 < wk.ktiles; kt += 2) {  // two steps: P and Q trade places
          step(part, part2, Next{});
          step(part2, part, Next{});
        }
        if (kt + 1 < wk.ktiles) {
          step(part, part2, Next{});
          step(part2, part, Last{});
        } else {
          step(part, part2, Last{});
        }
      }
    } else  // the other operand types and tiles: one k tile after another
    for (int kt = 0; kt < wk.ktiles; ++kt) {
      ptx::mbarrier_wait(at_full(), phase);
      if constexpr (!A_KMAJOR && !B_KMAJOR) {  // (16-bit operands only)
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
      if constexpr (Ops::kPromote) {
        // fp8 and TF32: the k tile in pieces of one m64 block x 128 columns, each summed from 0
        // into `part` (4 wgmma of 32 bytes of K), then, once complete, times its block scales
        // (fp8, DeepSeek-V3; 1 without) added to the float32 sums. The scales of the next k tile are loaded during
        // this one's first piece (a global load's latency exceeds a piece's tensor-core time).
        // TF32 and promoted 16-bit: a piece spans two k tiles (64 / 128 of K, 8 wgmma) where
        // two are left: half the drains. fp8 keeps one (promoted at least every 128 of K).
        constexpr bool kPairs = Ops::kBytes != 1;
        // promoted float16: the piece's scale, and no pair across piece_scale_k
        const int k0 = wk.kbase + kt * kKTile;
        const bool below = kPieceScales && k0 < p.piece_scale_k;
        const float ps = below ? p.piece_scale : 1.0f;
        const bool pair =
            kPairs && kt + 1 < wk.ktiles && !(below && k0 + kKTile >= p.piece_scale_k);
        const int s1 = s + 1 == Tr::kStages ? 0 : s + 1;  // the pair's second stage
        if (pair) ptx::mbarrier_wait(full_bar(s1), phase ^ (s + 1 == Tr::kStages));
        // The second stage's descriptors: the first's plus the stages' distance (>> 4, the
        // descriptors' address unit; the sum stays inside the 14-bit address field).
        const int64_t pair_step = int64_t(s1 - s) * (Tr::kStageBytes >> 4);
        auto issue = [&](uint64_t da, uint64_t db, bool first) {
#pragma unroll
          for (int j = 0; j < 4; ++j)  // a k step: 32 bytes along the rows (2 in 16-byte units)
            Ops::template mma<128, true, true>(part, da + 2 * j, db + 2 * j, !first || j > 0);
        };
        float csa[Tr::kMB][2], csb[kHalves];  // this k tile's scales
        if constexpr (!kStagedScales) {
#pragma unroll
          for (int mb = 0; mb < Tr::kMB; ++mb) {
            csa[mb][0] = bsa[mb][0];
            csa[mb][1] = bsa[mb][1];
          }
#pragma unroll
          for (int h = 0; h < kHalves; ++h) csb[h] = bsb[h];
        }
#pragma unroll
        for (int mb = 0; mb < Tr::kMB; ++mb) {
#pragma unroll
          for (int h = 0; h < kHalves; ++h) {
            if constexpr (kTurns) {
              if (!piece_first) ptx::named_barrier_sync(piece_wait, 256);
              piece_first = false;
            }
            const uint64_t da = desc_a(mb0 + mb), db = desc_b(h);
            // part's last reads (the previous piece) come first. A promoted float16 pair is one
            // straight run: a branch between its two k tiles makes ptxas end the wgmma group
            // there and fence again (C7519). TF32 keeps the branch, the straight run was slower
            // there (benchmarks/NOTES.md v89).
            if (kPieceScales && pair) {
              ptx::wgmma_fence();
              issue(da, db, true);
              issue(da + pair_step, db + pair_step, false);
              ptx::wgmma_commit_group();
            } else {
              ptx::wgmma_fence();
              issue(da, db, true);
              if (pair) issue(da + pair_step, db + pair_step, false);
              ptx::wgmma_commit_group();
            }
            if constexpr (kTurns) ptx::named_barrier_arrive(piece_give, 256);
            if (kBlockScales && mb == 0 && h == 0 && p.block_sa) {
              if constexpr (kStagedScales) {  // this k tile's, from its stage
                read_staged_scales(at_scales(), csa, csb);
              } else if (kt + 1 < wk.ktiles) {
                load_block_scales(kt + 1);
              }
            }
            ptx::wgmma_wait_group<0>();
            if (mb == Tr::kMB - 1 && h == kHalves - 1 && (kStagedScales || t == 0)) {
              ptx::mbarrier_arrive(at_empty());  // the stage is read
              if (pair) ptx::mbarrier_arrive(empty_bar(s1));
            }
            add_piece(part, mb, h, kBlockScales && p.block_sa, csa[mb], csb[h], ps);
          }
        }
        if (pair) {  // the pair's first stage; the loop's step below moves past the second
          ++kt;
          advance();
        }
      } else {
        ptx::wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          // A k step (k16 of 16-bit, k32 of 8-bit, k8 of tf32) is 32 bytes along a K-major row,
          // 16 rows of 128 bytes down an M/N-major box. m64 block b of A is box b (M-major) or
          // rows 64 b.. (K-major): kBox * b bytes in.
          // (8-bit: K-major both, from the carried descriptor)
          const uint64_t db = kCarry     ? desc_b(0) + 2 * j
                              : B_KMAJOR ? smem_desc(b_stage(s) + 32 * j, 16, 1024)
                                         : smem_desc(b_stage(s) + 2048 * j, kMnLead, kMnStride);
#pragma unroll
          for (int mb = 0; mb < Tr::kMB; ++mb) {
            const uint32_t a = a_stage(s) + (mb0 + mb) * Tr::kBox;
            const uint64_t da = kCarry     ? desc_a(mb0 + mb) + 2 * j
                                : A_KMAJOR ? smem_desc(a + 32 * j, 16, 1024)
                                           : smem_desc(a + 2048 * j, kMnLead, kMnStride);
            Ops::template mma<Tr::kBN, A_KMAJOR, B_KMAJOR>(acc[mb], da, db, 1);
          }
        }
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<1>();  // the previous k tile's wgmma are done with their stage
        if (prev >= 0 && t == 0) ptx::mbarrier_arrive(kCarry ? prev_empty : empty_bar(prev));
        prev = s;
        prev_empty = at_empty();
      }
      advance();
    }
    if constexpr (Tr::kPingPong) {  // the other warpgroup's next item may start its loop
      Sm90Work other;
      if (sched.next(p, w + gridDim.x, other)) ptx::named_barrier_arrive(their_turn, 256);
    }
    ptx::wgmma_wait_group<0>();
    if (prev >= 0 && t == 0) ptx::mbarrier_arrive(kCarry ? prev_empty : empty_bar(prev));

#pragma unroll
    for (int mb = 0; mb < Tr::kMB; ++mb) {
      const int64_t row0 = wk.m0 + 64 * (mb0 + mb);
      if (p.partial) {  // split-K through the workspace: raw sums, the reduction finishes
        const int64_t at = (int64_t(wk.slice) * p.batch + wk.z) * p.m * p.n;
        if constexpr (Ops::kInt)  // int8: exact int32 sums (bits in the float workspace)
          store_block<int32_t, Tr::kBN>(p, reinterpret_cast<int32_t*>(p.partial) + at, acc[mb],
                                        1.0f, row0, wk.n0, wk.row_end, t, epi, 1 + cw);
        else
          store_block<float, Tr::kBN>(p, p.partial + at, acc[mb], 1.0f, row0, wk.n0,
                                      wk.row_end, t, epi, 1 + cw);
      } else if (Ops::kInt && p.d_type == DType::kS32) {  // the exact int8 product
        if constexpr (Ops::kInt)
          store_block<int32_t, Tr::kBN>(p, static_cast<int32_t*>(p.d) + wk.d_item(p), acc[mb],
                                        1.0f, row0, wk.n0, wk.row_end, t, epi, 1 + cw);
      } else if (simple || scaled_short) {  // convert before staging (half the panels)
        with_dtype(p.d_type, [&](auto out) {
          using Out = decltype(out);
          store_block<Out, Tr::kBN, Acc, kScaledShort>(p, static_cast<Out*>(p.d) + wk.d_item(p),
                                                       acc[mb], alpha, row0, wk.n0, wk.row_end,
                                                       t, epi, 1 + cw, wk.z);
        });
      } else {
        with_dtype(p.d_type, [&](auto out) {
          epi_block<decltype(out), Tr::kBN, Acc, Ops::kScaled>(
              p, acc[mb], wk.z, wk.d_item(p), row0, wk.n0, wk.row_end, t, epi, 1 + cw);
        });
      }
    }
  }
  if constexpr (kTurns) {  // warpgroup 1's arrival after its last piece
    if (cw == 0 && !piece_first) ptx::named_barrier_sync(piece_wait, 256);
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
