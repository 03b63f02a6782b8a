// Plain-old-data arguments of one GEMM launch, shared by the dispatcher and the kernels.
#pragma once
#include <cstdint>

namespace tcgemm {

enum class InType : int { kF16 = 0, kBF16 = 1 };
enum class OutType : int { kF16 = 0, kBF16 = 1, kF32 = 2 };

// C[z] (M x N, row-major, contiguous) = op(A[z]) · op(B[z]) for z < batch.
// transpose_a: A[z] is stored [K][M] (else [M][K]); transpose_b: B[z] is stored [N][K] (else [K][N]).
struct GemmParams {
  const void* a;
  const void* b;
  void* c;
  int64_t m, n, k, batch;
  int64_t stride_a, stride_b;  // elements between batch items; 0 broadcasts one matrix
  OutType out_type;
  int tiles_m, tiles_n;        // set by the dispatcher for the chosen config
};

struct GemmProblem {
  GemmParams params;
  InType in_type;
  bool transpose_a, transpose_b;
  int config;                  // index into kConfigs
};

}  // namespace tcgemm
