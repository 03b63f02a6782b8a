// The sm90 kernel's epilogue (gemm_sm90.cuh): a consumer warpgroup's 64 x BN accumulators
// through its shared-memory staging panel to D: the short path (store_block: no more than alpha,
// split-K partials, exact int32) and the full one (epi_block: kernels/common/epilogue.cuh's
// epilogue, per 64-column panel).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "host/gemm_config.h"
#include "host/gemm_params.h"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"
#include "ptx/tma.cuh"  // named barriers

namespace tcgemm {

// Epilogue staging: each consumer warpgroup owns one panel of shared memory, 64 rows x 256
// bytes (128 half or 64 float columns of its m64 block). A row's 16-byte chunks are XOR-
// swizzled by the row (by twice the row for float, whose accumulator pairs are 8 bytes) so that
// the accumulator writes (8 rows x 4 threads per warp) and the row-wise reads are both free of
// bank conflicts.
constexpr int kEpiBytes = kSm90PanelBytes;  // (host/gemm_config.h: the kernel's layout)

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

// Exact int32 sums as int32 (int8 operands, an int32 result).
__device__ __forceinline__ void int_pair(char* dst, int v0, int v1) {
  *reinterpret_cast<int2*>(dst) = make_int2(v0, v1);
}

// A consumer warpgroup's 64 x BN accumulators (thread layout in ptx/wgmma.cuh), times `scale`,
// to the M x N matrix at `c` (D of one batch item when the epilogue is no more than alpha, or a
// split-K slice's raw partials), converted to Out before staging, one panel at a time through
// its staging panel `epi`: the warpgroup writes the panel, then stores whole
// rows with 16-byte stores (a warp writes two contiguous 256-byte row segments) when C's rows
// are 16-byte multiples, else element by element along the rows (a warp writes 32 contiguous
// elements). Nothing at or past row `row_end` or column N is written. `bar`: the warpgroup's
// named barrier. Int32 sums go to an int32 C as they are (exact), to a float C as floats.
// SCALED: also the row and column scales of batch item z (an 8-bit product whose epilogue is no
// more than alpha and those: W8A8, per-token / per-channel fp8), each value
// acc * (scale * row's * column's): the scales' product first, as tg.scaled_matmul defines it
// (scaled._impl), without scale_by's range-safe order (which epi_block keeps for f16x3's powers
// of two) and its branches; the thread's two column scales of an 8-column group as one pair
// (benchmarks/NOTES.md v68).
template <typename Out, int BN, typename Acc, bool SCALED = false>
__device__ __forceinline__ void store_block(const GemmParams& p, Out* c, const Acc (&acc)[BN / 2],
                                            float scale, int64_t row0, int64_t col0,
                                            int64_t row_end, int t, char* epi, uint32_t bar,
                                            int64_t z = 0) {
  constexpr int kCols = 256 / int(sizeof(Out));  // columns per panel
  constexpr int kVec = 16 / int(sizeof(Out));    // elements per 16-byte chunk
  static_assert(BN % kCols == 0, "whole panels");
  const int lane = t & 31, warp = t >> 5;
  const int r = warp * 16 + (lane >> 2);  // this thread's accumulator rows: r and r + 8
  const bool vec = (p.n * int64_t(sizeof(Out))) % 16 == 0 &&
                   (reinterpret_cast<uintptr_t>(c) & 15) == 0;
  float ra[2] = {scale, scale};  // alpha times the scales of rows r and r + 8 (1 past the end)
  if constexpr (SCALED) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t gr = row0 + r + 8 * e;
      if (gr < row_end) ra[e] = scale * epi_row_scale(p.epi, p.m, z, gr);
    }
  }
#pragma unroll
  for (int panel = 0; panel < BN / kCols; ++panel) {
    constexpr int kGroups = kCols / 8;  // 8-column groups per panel
    ptx::named_barrier_sync(bar, 128);  // the previous panel (or tile) has been read out
    // (each branch reads the panel's accumulators once, so that they die as they are staged)
    if constexpr (std::is_same_v<Out, int32_t>) {
      static_assert(std::is_same_v<Acc, int>, "int32 results hold exact int32 sums");
#pragma unroll
      for (int jj = 0; jj < kGroups; ++jj) {
        const int j = panel * kGroups + jj, byte = (8 * jj + 2 * (lane & 3)) * 4;
        int_pair(epi + epi_offset<Out>(r, byte), acc[4 * j], acc[4 * j + 1]);
        int_pair(epi + epi_offset<Out>(r + 8, byte), acc[4 * j + 2], acc[4 * j + 3]);
      }
    } else if constexpr (!SCALED) {
#pragma unroll
      for (int jj = 0; jj < kGroups; ++jj) {
        const int j = panel * kGroups + jj;
        const int byte = (8 * jj + 2 * (lane & 3)) * int(sizeof(Out));
        put_pair<Out>(epi + epi_offset<Out>(r, byte), scale * float(acc[4 * j]),
                      scale * float(acc[4 * j + 1]));
        put_pair<Out>(epi + epi_offset<Out>(r + 8, byte), scale * float(acc[4 * j + 2]),
                      scale * float(acc[4 * j + 3]));
      }
    } else {  // acc * (alpha * row's * column's), the scales' product first (as scaled.py's)
      // the panel's column scales loaded before any is used: the panel waits for one memory
      // round trip, not one per 8-column group (benchmarks/NOTES.md v75)
      float2 cb[kGroups];
#pragma unroll
      for (int jj = 0; jj < kGroups; ++jj)
        cb[jj] = epi_col_scales2(p.epi, p.n, z, col0 + panel * kCols + 8 * jj + 2 * (lane & 3));
#pragma unroll
      for (int jj = 0; jj < kGroups; ++jj) {
        const int j = panel * kGroups + jj;
        const int byte = (8 * jj + 2 * (lane & 3)) * int(sizeof(Out));
        put_pair<Out>(epi + epi_offset<Out>(r, byte), float(acc[4 * j]) * (ra[0] * cb[jj].x),
                      float(acc[4 * j + 1]) * (ra[0] * cb[jj].y));
        put_pair<Out>(epi + epi_offset<Out>(r + 8, byte),
                      float(acc[4 * j + 2]) * (ra[1] * cb[jj].x),
                      float(acc[4 * j + 3]) * (ra[1] * cb[jj].y));
      }
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
// cols4: the chunk's column scales (epi_col_scale); z: the batch item (its row scales).
// SCALED: the kernel's products may carry row and column scales (Sm90Operands::kScaled: 8-bit
// and promoted 16-bit operands; the others compile without them: ptxas then kept 8 bytes of
// stack in the 128x256 M-major 16-bit kernel), applied by scale_by (kernels/common/epilogue.cuh).
template <typename Out, bool SCALED>
__device__ __forceinline__ void epi_copy_out(const GemmParams& p, EpiScale s, char* epi,
                                             const float (&cv)[8][4], const float (&colv)[4],
                                             const float (&cols4)[4], int64_t z,
                                             int64_t d_item, int64_t row0, int64_t gc,
                                             int64_t row_end, int cols, int t) {
  const int q = t & 15, rb = t >> 4;
  const bool vec = p.n % 4 == 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // pre-activation, in place (this thread's chunks only)
    float4* const at = reinterpret_cast<float4*>(epi + epi_offset<float>(rb + 8 * i, q * 16));
    const int64_t gr = row0 + rb + 8 * i;
    const float ra = SCALED && gr < row_end ? s.alpha * epi_row_scale(p.epi, p.m, z, gr) : s.alpha;
    const float4 x = *at;
    auto sc = [&](float v, int j) { return SCALED ? scale_by(v, ra, cols4[j]) : ra * v; };
    *at = make_float4(sc(x.x, 0) + s.beta * cv[i][0] + colv[0],
                      sc(x.y, 1) + s.beta * cv[i][1] + colv[1],
                      sc(x.z, 2) + s.beta * cv[i][2] + colv[2],
                      sc(x.w, 3) + s.beta * cv[i][3] + colv[3]);
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

template <typename Out, int BN, typename Acc, bool SCALED>
__device__ __forceinline__ void epi_block(const GemmParams& p, const Acc (&acc)[BN / 2],
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
    float colv[4] = {}, cols4[4];  // bias and scales of the chunk's columns (0, 1 past N)
    if (ep.bias) {
      with_dtype(ep.bias_type, [&](auto b0) {
        using Bias = decltype(b0);
        const Bias* bias = static_cast<const Bias*>(ep.bias) + z * ep.bias_sb + gc;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (j < cols) colv[j] = to_float(__ldg(bias + j));
      });
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) cols4[j] = SCALED ? epi_col_scale(ep, p.n, z, gc + j) : 1.0f;
    ptx::named_barrier_sync(bar, 128);  // the previous panel (or tile) has been read out
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int j = panel * 8 + jj;
      const int byte = (8 * jj + 2 * (lane & 3)) * 4;
      put_pair<float>(epi + epi_offset<float>(r, byte), float(acc[4 * j]), float(acc[4 * j + 1]));
      put_pair<float>(epi + epi_offset<float>(r + 8, byte), float(acc[4 * j + 2]),
                      float(acc[4 * j + 3]));
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
    epi_copy_out<Out, SCALED>(p, s, epi, cv, colv, cols4, z, d_item, row0, gc, row_end, cols, t);
  }
}

}  // namespace tcgemm
