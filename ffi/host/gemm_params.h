// Plain-old-data arguments of one GEMM launch, shared by the host (planner, launch) and every
// kernel family: the problem (operands, shape, batch), the plan the dispatcher resolved (tiles,
// split), and the epilogue.
#pragma once
#include <cstdint>

namespace tcgemm {

// Element types of operands, epilogue inputs and outputs (the runtime side of
// kernels/common/element.cuh, which maps each to its CUDA type and traits). Operands: kF16 or
// kBF16 (every kernel family), or the 8-bit types (K-major A and B: wgmma reads 8-bit operands
// K-major only): kE4M3 / kE5M2 (float8_e4m3fn / float8_e5m2, sm90 only, float32 accumulation)
// and kS8 (int8, exact int32 accumulation; sm90, and sm80 rows: mma.sync m16n8k32), or kF32
// (sm90 only, K-major A and B:
// TF32 wgmma, float32 accumulation; the tensor cores read a float32's sign, exponent and 10
// high mantissa bits). Results: kF16, kBF16, kF32, or kS32 (the exact product of int8
// operands).
enum class DType : int { kF16 = 0, kBF16 = 1, kF32 = 2, kE4M3 = 3, kE5M2 = 4, kS8 = 5, kS32 = 6 };
using InType = DType;
inline constexpr int kNumDTypes = 7;
inline constexpr int DTypeBytes(DType t) {
  return t == DType::kF32 || t == DType::kS32 ? 4 : t == DType::kF16 || t == DType::kBF16 ? 2 : 1;
}
inline constexpr bool IsByteOperand(DType t) {
  return t == DType::kE4M3 || t == DType::kE5M2 || t == DType::kS8;
}
// The 8-bit operand pairs the kernels take, by index: int8 x int8, then the fp8 pairs e4m3 x e4m3,
// e4m3 x e5m2 and e5m2 x e4m3 (e5m2 x e5m2 is not a form of ours), or -1. The one rule that the
// FFI's check and every 8-bit kernel family's tables follow (with_byte_pair, element.cuh).
inline constexpr int kNumBytePairs = 4;
inline constexpr int BytePair(DType a, DType b) {
  using D = DType;
  return a == D::kS8 && b == D::kS8       ? 0
         : a == D::kE4M3 && b == D::kE4M3 ? 1
         : a == D::kE4M3 && b == D::kE5M2 ? 2
         : a == D::kE5M2 && b == D::kE4M3 ? 3
                                          : -1;
}
// Operand types the kernels read K-major only: the 8-bit types and float32 (TF32), on the sm90
// kernels (int8 also on the sm80 rows).
inline constexpr bool KMajorOnly(DType t) { return IsByteOperand(t) || t == DType::kF32; }

// Most K slices of a split-K product (grid y); the FFI rejects more.
inline constexpr int kMaxSplitK = 64;
// Most slices reduced inside one thread block cluster (the portable cluster size).
inline constexpr int kMaxClusterSplit = 8;

// The epilogue's activation, applied last (kernels/common/epilogue.cuh has the functions and
// their derivatives; jax_tcgemm/problem.py ACTIVATIONS lists the same names in this order).
enum class Activation : int { kNone = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3, kSilu = 4 };
inline constexpr int kNumActivations = 5;

// D[z][r][c] = act(alpha * rs[z][r] * cs[c] * acc[z][r][c] + beta * C[z][r][c] + bias[z][c]),
// computed in float32 from the accumulator and rounded once to D's type (rs, cs: the optional
// per-row and per-column scales of a scaled product, 1 when absent; 8-bit and promoted float16
// operands only: the sm90 kernels and, for int8, the sm80 ones apply them). C is read through
// element strides (c_sb, c_sr, c_sc) so that one layout serves a full (B, M, N) C, one shared
// by the batch (c_sb = 0), per-row (c_sc = 0) and per-column (c_sr = 0) forms. alpha and beta
// come from `scale` (device float32[2], traced values) when it is set; alpha is then multiplied
// by each of `tensor_scale` that is set (device float32 scalars: an 8-bit product's per-tensor
// scales, read as they are, with no XLA op to fold them into `scale`). `aux`, when set,
// receives the pre-activation value (D's type and layout): what the backward pass needs
// (kernels/aux/dact.cu).
struct EpilogueParams {
  const float* scale = nullptr;  // device [alpha, beta], or nullptr: the two fields below
  float alpha = 1.0f, beta = 0.0f;
  const float* tensor_scale[2] = {nullptr, nullptr};  // device float32 scalars times alpha
  const void* c = nullptr;       // nullptr: no C term
  DType c_type = DType::kF32;
  int64_t c_sb = 0, c_sr = 0, c_sc = 0;
  const void* bias = nullptr;    // nullptr: no bias
  DType bias_type = DType::kF32; // float32, bfloat16 or float16 (added in float32)
  int64_t bias_sb = 0;           // elements between batch items' bias rows (0: shared)
  Activation act = Activation::kNone;
  void* aux = nullptr;           // pre-activation output, or nullptr
  const float* row_scale = nullptr;  // float32 [batch][M] (row r of item z at z * M + r)
  const float* col_scale = nullptr;  // float32 [1 or batch][N] (column c of item z at
  int64_t col_scale_sb = 0;          // z * col_scale_sb + c: 0 shares one row, N per item)
};

// A grouped (ragged) product, lax.ragged_dot's forms: `groups` groups whose sizes are device
// int32s (read by the kernel's tile scheduler: no host sync). A size below 0 counts as 0, and
// the groups are cut where their rows run past the ragged extent (nothing outside is read or
// written).
//   kRows (forward, dgrad): A is M x K (all groups' rows, group g's contiguous after group
//     g - 1's), B holds `groups` K x N matrices (batch items, stride_b apart), D is M x N; rows
//     of group g use B[g] and the bias row g; rows past the sum of the sizes are zeros.
//   kContract (wgrad): the contraction runs over the ragged extent: A is stored [K][M] (the
//     rows of lhs), B [K][N], D holds `groups` M x N matrices, D[g] = op(A) op(B) over group
//     g's k range only (zeros for an empty group).
enum class RaggedMode : int { kNone = 0, kRows = 1, kContract = 2 };
struct RaggedParams {
  RaggedMode mode = RaggedMode::kNone;
  const int32_t* sizes = nullptr;  // device [groups]
  int groups = 0;
};

// C[z] (M x N, row-major, contiguous) = op(A[z]) · op(B[z]) for z < batch, then the epilogue
// into D. transpose_a: A[z] is stored [K][M] (else [M][K]); transpose_b: B[z] is stored [N][K]
// (else [K][N]). Split-K: K is cut into split_k slices of k_tiles_per_split tiles (grid y);
// with `partial` set, slice s writes its raw float32 partial product to partial + (s * batch +
// z) * M * N (no epilogue) and the reduction kernel sums the slices and applies the epilogue;
// or, with cluster_reduce, the slices sum each other's tiles in shared memory and the epilogue
// runs once on the sum.
struct GemmParams {
  const void* a;
  const void* b;
  void* d;                     // the result, of type d_type
  int64_t m, n, k, batch;
  int64_t stride_a, stride_b;  // elements between batch items; 0 broadcasts one matrix
  DType d_type;
  float* partial;              // split-K through the workspace: raw float32 partials here
  int tiles_m, tiles_n;        // set by the dispatcher for the chosen config
  int split_k;                 // K slices (1: no split)
  int k_tiles_per_split;       // BK-wide k tiles per slice (set by the dispatcher)
  int cluster_reduce;          // the split_k slices of a tile are one cluster and reduce
                               // through distributed shared memory into D (sm_90+, no
                               // workspace): 1 each slice sums a share of the tile's rows
                               // (pull), 2 the other slice pushes its tile to the leader (two
                               // slices of a ConfigTraits::kPushReduce config); 0: no cluster
  int64_t lda, ldb;            // leading dimensions (elements between rows as stored; set by
                               // the dispatcher: the contiguous extent, or that of a packed copy)
  EpilogueParams epi;
  RaggedParams ragged;         // mode kNone: a plain (batched) product
  // DeepSeek-V3 block scales of an fp8 product (the sm90 fp8 kernels): the partial product of
  // each 128-slice kb of K of batch item z is scaled by block_sa[z][kb][r] *
  // block_sb[z][kb][c / 128] (float32, row-major (ceil(K/128), M) with rows block_sa_ld >= M
  // apart, and (ceil(K/128), ceil(N/128)); items block_sa_sb / block_sb_sb floats apart, 0:
  // shared by the batch) before it is added to the float32 sums; the epilogue follows.
  // nullptr: no block scales. block_sa's rows and items are 16-byte multiples and aligned
  // (LaunchGemm checks it), so a kernel copies a tile's a scales with one bulk copy; scaled.py
  // pads them.
  const float* block_sa = nullptr;
  const float* block_sb = nullptr;
  int64_t block_sa_ld = 0;
  int64_t block_sa_sb = 0, block_sb_sb = 0;
  // Promoted float16 operands (GemmProblem::promote): each piece of K below piece_scale_k is
  // multiplied by piece_scale as it is added to the float32 sums (f16x3's remainders, stored
  // 2^11 times larger so that float16 holds their bits: jax_tcgemm/f32.py). piece_scale_k is a
  // multiple of kPromotedKTile (no piece straddles it; LaunchGemm checks); 0: no scaled pieces.
  int64_t piece_scale_k = 0;
  float piece_scale = 1.0f;
};

// k tile of the promoted float16 kernels (128 bytes of K): piece_scale_k's unit.
inline constexpr int kPromotedKTile = 64;

struct GemmProblem {
  GemmParams params;
  // Split-K partials (split_k * batch * M * N floats when split_k > 1) from the start; packed
  // operand copies (see PlanWorkspace) at the end.
  float* workspace;
  InType in_type;              // A's element type
  InType b_type;               // B's: in_type, except for the mixed fp8 pairs (e4m3 x e5m2)
  bool transpose_a, transpose_b;
  int config;                  // index into kConfigs
  bool pack;                   // copy the operands whose rows NeedsPack (gemm_dispatch.h: not
                               // 16-byte multiples, or long and not 32-byte multiples) into the
                               // workspace with padded rows (16-byte aligned, 128 bytes when
                               // long: the fast cp.async / TMA path) before the GEMM
  bool promote = false;        // float16 operands (K-major both, an sm90 row with
                               // HasTf32Kernels) summed in pieces: each two k tiles' products
                               // summed apart, then added into the float32 sums with
                               // round-to-nearest adds (float32 HIGHEST as f16x3:
                               // jax_tcgemm/f32.py; a wgmma's float32 sums are truncated)
  // A tail split (16-bit operands on an sm90 row, batch 1, split_k 1): the last tail_rows rows
  // run as a launch of their own in tail_split K slices through the workspace, so that the
  // tiles of a last, mostly empty wave fill the SMs (jax_tcgemm/configs.py tail_plan). 0: none.
  int64_t tail_rows = 0;
  int tail_split = 1;
};

}  // namespace tcgemm
