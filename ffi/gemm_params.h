// Plain-old-data arguments of one GEMM launch, shared by the dispatcher and the kernels.
#pragma once
#include <cstdint>

namespace tcgemm {

enum class InType : int { kF16 = 0, kBF16 = 1 };
enum class OutType : int { kF16 = 0, kBF16 = 1, kF32 = 2 };

// Most K slices of a split-K product (grid y); the FFI rejects more.
inline constexpr int kMaxSplitK = 64;
// Most slices reduced inside one thread block cluster (the portable cluster size).
inline constexpr int kMaxClusterSplit = 8;

// C[z] (M x N, row-major, contiguous) = op(A[z]) · op(B[z]) for z < batch.
// transpose_a: A[z] is stored [K][M] (else [M][K]); transpose_b: B[z] is stored [N][K] (else [K][N]).
// Split-K: K is cut into split_k slices of k_tiles_per_split tiles (grid y); slice s writes its
// float32 partial product to c + (s * batch + z) * M * N, and a reduction kernel sums them;
// or, with cluster_reduce, the slices sum each other's tiles in shared memory and write C.
struct GemmParams {
  const void* a;
  const void* b;
  void* c;
  int64_t m, n, k, batch;
  int64_t stride_a, stride_b;  // elements between batch items; 0 broadcasts one matrix
  OutType out_type;
  int tiles_m, tiles_n;        // set by the dispatcher for the chosen config
  int split_k;                 // K slices (1: no split)
  int k_tiles_per_split;       // BK-wide k tiles per slice (set by the dispatcher)
  int cluster_reduce;          // the split_k slices of a tile are one cluster and reduce
                               // through distributed shared memory into C (sm_90+, no
                               // workspace): 1 each slice sums a share of the tile's rows
                               // (pull), 2 the other slice pushes its tile to the leader (two
                               // slices of a ConfigTraits::kPushReduce config); 0: no cluster
  int64_t lda, ldb;            // leading dimensions (elements between rows as stored; set by
                               // the dispatcher: the contiguous extent, or that of a packed copy)
};

struct GemmProblem {
  GemmParams params;
  // Split-K partials (split_k * batch * M * N floats when split_k > 1) from the start; packed
  // operand copies (see PlanWorkspace) at the end.
  float* workspace;
  InType in_type;
  bool transpose_a, transpose_b;
  int config;                  // index into kConfigs
  bool pack;                   // copy the operands whose rows NeedsPack (gemm_dispatch.h: not
                               // 16-byte multiples, or long and not 32-byte multiples) into the
                               // workspace with padded rows (16-byte aligned, 128 bytes when
                               // long: the fast cp.async / TMA path) before the GEMM
};

}  // namespace tcgemm
