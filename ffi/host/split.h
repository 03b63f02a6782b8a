// The float32 operand splits of the multi-pass float32 algorithms (jax_tcgemm/f32.py is their
// specification: parts, f16_parts, layout), run by kernels/aux/split.cu for the "tcgemm_split"
// call (xla/split_ffi.cc): each element of a float32 operand becomes its parts (TF32 values in
// float32, bfloat16, or f16x3's float16 hi and lo of its row scaled by a power of two), written
// where the layout puts them along K' of one K-major row per row of the operand.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace tcgemm {

// How an element splits (f32.parts / f32.f16_parts): kTf32, parts rounded to TF32 (one part:
// the element as it is); kBf16, rounded to bfloat16; kF16Scaled, f16x3's hi and lo of the
// element times its row's power of two.
enum class SplitKind : int32_t { kTf32 = 0, kBf16 = 1, kF16Scaled = 2 };
constexpr int kNumSplitKinds = 3;
constexpr int kMaxSplitBlocks = 9;  // terms of the longest algorithm (BF16x9)
constexpr int kMaxSplitZeros = 10;  // zero ranges: one before, between or after each block

struct SplitJob {
  const float* x;   // (batch, rows, k) if k_major, else (batch, k, rows)
  void* out;        // (batch, rows, kk): float32 (kTf32), bfloat16 (kBf16), float16 (kF16Scaled)
  float* inv;       // kF16Scaled: (batch, rows), 1 / the row's power of two; else nullptr
  int64_t batch, rows, k, kk;
  bool k_major;
  SplitKind kind;
  int parts;        // parts per element: 1 + the largest part index of the blocks
  int top_exp;      // kF16Scaled: a row's largest finite magnitude goes to [2^(top_exp-1), 2^top_exp)
  float lo_scale;   // kF16Scaled: the remainder is stored times this (2^F16_LO_SHIFT)
  int nblocks;      // out[z][r][offset[j] + kx] = part part[j] of x[z][r][kx] (masked[j]: 0 if
  int64_t offset[kMaxSplitBlocks];  //   x[z][r][kx] is not finite)
  int part[kMaxSplitBlocks];
  bool masked[kMaxSplitBlocks];
  int nzeros;       // out[z][r][c] = 0 for c in [zero_begin[i], zero_end[i])
  int64_t zero_begin[kMaxSplitZeros], zero_end[kMaxSplitZeros];
};
cudaError_t LaunchSplit(const SplitJob& job, cudaStream_t stream);

}  // namespace tcgemm
