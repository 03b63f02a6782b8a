// Host side of the GEMM: kernel tables per input type, config choice, launch.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "host/gemm_params.h"  // DType, Activation, GemmParams

namespace tcgemm {

struct KernelEntry {
  const void* fn;  // __global__ gemm_sm80_kernel<...> (nullptr: no such variant, see
                   // HasElementLoads)
  int threads;
  int smem_bytes;
  int push_slot_bytes;  // ConfigTraits::kPushReduce: the leader's receive slot, which a
                        // two-slice cluster split adds to smem_bytes; else 0
};

// Kernel variants per config: index (a_kmajor * 2 + b_kmajor) * 2 + aligned.
inline constexpr int kVariants = 8;
inline int VariantIndex(bool a_kmajor, bool b_kmajor, bool aligned) {
  return (int(a_kmajor) * 2 + int(b_kmajor)) * 2 + int(aligned);
}

// Defined in kernels/sm80/kernels_{f16,bf16}_a{0,1}.cu (compiled in parallel): the variants
// with A M-major (a0) and K-major (a1).
KernelEntry KernelF16A0(int config, int variant);
KernelEntry KernelF16A1(int config, int variant);
KernelEntry KernelBF16A0(int config, int variant);
KernelEntry KernelBF16A1(int config, int variant);
// Defined in kernels/sm80/kernels_s8.cu: the int8 kernels (A and B K-major, aligned).
KernelEntry KernelS8(int config, int variant);
inline KernelEntry Sm80Kernel(InType t, int config, int variant) {
  const bool ak = variant >= kVariants / 2;  // VariantIndex: A's layout is the top bit
  if (t == InType::kS8) return KernelS8(config, variant);
  if (t == InType::kF16) return ak ? KernelF16A1(config, variant) : KernelF16A0(config, variant);
  return ak ? KernelBF16A1(config, variant) : KernelBF16A0(config, variant);
}

// Defined in kernels/sm80/kernels_ragged_{f16,bf16}.cu: the grouped (ragged) kernels of the
// sm80 rows with HasRaggedKernels (aligned variants of the rows and contraction layouts; an
// entry without fn elsewhere).
KernelEntry RaggedKernelF16(int config, int variant);
KernelEntry RaggedKernelBF16(int config, int variant);
inline KernelEntry Sm80RaggedKernel(InType t, int config, int variant) {
  return t == InType::kF16 ? RaggedKernelF16(config, variant) : RaggedKernelBF16(config, variant);
}

// Whether p is 16-byte aligned (the vector loads and stores of the launchers' fast paths).
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Multiprocessor count of `device`, asked of the runtime once per device (0 if it cannot say).
int DeviceSms(int device);

// Raises kernel fn's dynamic shared-memory limit to `bytes` on `device` once: bit `device` of
// `done` records it (devices past 63 ask every time). Empty string, or what went wrong.
std::string RaiseSmemLimit(const void* fn, int bytes, std::atomic<uint64_t>& done, int device);

// Defined in kernels/sm90/kernels_sm90.cu (sm_90a): launches sm90 config `config` with params
// p as LaunchGemm prepared them (tiles, split, leading dimensions, packed operands; for split-K,
// C redirected to the float32 workspace), one persistent block per SM of the `sms`. Operands:
// 16-bit of in_type (b_type ignored), or 8-bit of types in_type x b_type, K-major both;
// `promote`: the promoted float16 kernels (GemmProblem::promote).
std::string LaunchSm90(const GemmParams& p, int config, InType in_type, InType b_type,
                       bool a_kmajor, bool b_kmajor, bool promote, int device, int sms,
                       cudaStream_t stream);

// Defined in kernels/narrow/narrow8.cu: launches narrow config `config` (Kind::kNarrow) with p
// as LaunchGemm prepared it (tiles_n, split, leading dimensions; for split-K, p.partial set):
// 8-bit operands of types a_type x b_type, A K-major, B N-major ([K][N]) as stored; `device`:
// the current one (its shared-memory limit raised once).
std::string LaunchNarrow(const GemmParams& p, int config, InType a_type, InType b_type,
                         int device, cudaStream_t stream);

// Split-K slices actually used for `split_k` requested ones (no empty slice): at most split_k.
int EffectiveSplitK(const GemmProblem& pr);

// Whether a problem that asks for packing (GemmProblem::pack) copies an operand whose rows have
// `cols` contiguous elements: rows that are not 16-byte multiples (cols % 8 != 0: no 16-byte
// cp.async or TMA on them as stored), and rows of 512 or more that are not 32-byte multiples
// (cols % 16 != 0: the GEMM streams them 1.2-2.7x slower per flop than aligned rows on an H100,
// e.g. 3000^3 on sm90 128x256 152.6 us vs 3072^3 101.9; benchmarks/NOTES.md, "Row pitch").
// Python's configs.needs_pack is the same rule; configs.should_pack decides whether to pack.
inline constexpr bool NeedsPack(int64_t cols) {
  return cols % 8 != 0 || (cols >= 512 && cols % 16 != 0);
}

// Row length of a packed copy of rows of `cols` elements: a multiple of 8 (16 bytes, for
// cp.async and TMA), of 64 (128 bytes: TMA reads rows that start mid-line 15% slower,
// 4096x4104x4096 245 us vs 4096x4224 211) for rows of 512 or more, where that adds at most 1/8.
inline constexpr int64_t PackedLd(int64_t cols) {
  const int64_t align = cols >= 512 ? 64 : 8;
  return (cols + align - 1) / align * align;
}

// Where the workspace of problem `pr` holds what: split-K partials from float 0 (split_floats:
// effective split x batch x M x N, rounded up to 32 floats; with a tail split, the tail's:
// its effective split x tail_rows x N), then (pack_a / pack_b: with pr.pack,
// the operands whose rows NeedsPack) the operand copies with rows padded to a multiple of 8
// elements (64 for rows of 512 or more: 128-byte rows stream faster through TMA), each starting
// 16-byte aligned. total() is what the FFI handler asks of XLA, and what Python asks of the
// module (workspace_floats) to size the call's workspace result.
// 8-bit operands are never padded; instead (with pr.pack) a B stored N-major ([K][N], as x @ W
// holds it) is copied K-major ([N][K]: rows = batch items x N, cols = ld = K), which their
// wgmma and mma.sync rows need (`transposed`); the narrow rows read it as stored.
struct PackedOperand {
  bool packed = false;
  bool transposed = false;
  int64_t rows = 0;     // rows as stored, all batch items stacked (batch_items * outer extent)
  int64_t cols = 0;     // contiguous extent
  int64_t ld = 0;       // leading dimension of the copy: cols rounded up to 8 (or 64)
  int64_t floats = 0;   // size of the copy in floats (a multiple of 4: 16-byte aligned)
};
struct WorkspacePlan {
  int64_t split_floats = 0;
  PackedOperand a, b;
  int64_t total() const { return split_floats + a.floats + b.floats; }
};
WorkspacePlan PlanWorkspace(const GemmProblem& pr);

// Defined in kernels/aux/pack.cu: dst[r][0..ld) = src[r][0..cols), zeros past cols, for r <
// rows, for each of `count` (1 or 2) jobs, in one launch (ld: a multiple of 8, ld >= cols; cols
// any).
struct PackJob {
  const uint16_t* src;
  uint16_t* dst;
  int64_t rows, cols, ld;
};
cudaError_t LaunchPack(const PackJob* jobs, int count, cudaStream_t stream);

// Defined in kernels/aux/pack.cu: dst[z][n][k] = src[z][k][n] for 8-bit elements, z < batch (any
// batch; K a multiple of 16, dst 16-byte aligned; src any alignment, N any).
struct TransposeJob {
  const uint8_t* src;
  uint8_t* dst;
  int64_t batch, k, n;
};
cudaError_t LaunchTransposeBytes(const TransposeJob& job, cudaStream_t stream);

// The copies plan wp (PlanWorkspace(pr)) packs, as jobs for LaunchPack into pr.workspace after
// the split-K partials; points p's operands, leading dimensions (p.lda / p.ldb as stored on
// entry) and batch strides at the copies. Returns the number of jobs (0, 1 or 2).
int PackOperands(const GemmProblem& pr, const WorkspacePlan& wp, GemmParams& p,
                 PackJob (&jobs)[2]);

// Launches problem `pr` on `stream` with its workspace laid out by wp = PlanWorkspace(pr) (the
// plan the caller sized pr.workspace with): packing, if wp says so, then the GEMM (with split-K
// into the workspace, then the reduction into C; with a tail split, the head rows, then the
// tail rows' slices and their reduction). Returns an empty string on success, else
// what went wrong.
std::string LaunchGemm(const GemmProblem& pr, const WorkspacePlan& wp, cudaStream_t stream);

// Defined in kernels/aux/reduce.cu: D = epilogue(sum_{s < splits} ws[s * count + i]), the
// slices summed in order, for the problem p describes (its d, d_type and epi); int_sums: the
// partials are int32 (int8 products), summed exactly, stored as int32 or converted to float.
cudaError_t LaunchSplitKReduce(const GemmParams& p, const float* ws, int splits, bool int_sums,
                               cudaStream_t stream);

// Defined in kernels/aux/dact.cu: the backward pass of the epilogue's activation and bias, in
// one pass over the (batch x) rows x cols cotangent ct (row-major, ct_type):
//   g = ct * act'(pre)   (to g, of g_type; pre: the forward's aux, of pre_type; unread for
//                         Activation::kNone, where g may be nullptr: only the bias gradient)
//   dbias[z][c] = sum over rows r of g[z][r][c]  (float32, rows in order: deterministic; with
//                 bias_batched false also summed over the batch items; nullptr: not computed)
struct DactJob {
  const void* ct; DType ct_type;
  const void* pre; DType pre_type;
  void* g; DType g_type;
  float* dbias;
  bool bias_batched;
  Activation act;
  int64_t batch, rows, cols;
};
cudaError_t LaunchDact(const DactJob& job, cudaStream_t stream);

}  // namespace tcgemm
