// An sm90 kernel as the launch sees it (kernels_sm90.cu, LaunchSm90): its function, block size,
// dynamic shared memory and tile, made from a kernel instance by MakeSm90. The 8-bit operand
// kernels live in their own translation unit (kernels_sm90_byte.cu, compiled in parallel) and
// reach the launch through Sm90ByteEntry.
#pragma once
#include "host/gemm_params.h"
#include "kernels/sm90/gemm_sm90.cuh"

namespace tcgemm {

struct Sm90Entry {
  const void* fn;
  int threads, smem_bytes, bm, bn;
};

template <typename Ops, int CFG, bool AK, bool BK>
Sm90Entry MakeSm90() {
  using Tr = Sm90Traits<CFG>;
  return {reinterpret_cast<const void*>(&gemm_sm90_kernel<Ops, CFG, AK, BK>), Tr::kThreads,
          Tr::kSmemBytes, Tr::kBM, Tr::kBN};
}

// The kernel of sm90 config `config` for 8-bit operands of types a x b (K-major both), or an
// entry without fn where there is none (HasByteKernels, or a pair that is not an fp8 or int8
// form).
Sm90Entry Sm90ByteEntry(int config, DType a, DType b);

}  // namespace tcgemm
