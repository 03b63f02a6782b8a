// An sm90 kernel as the launch sees it (kernels_sm90.cu, LaunchSm90): its function, block size,
// dynamic shared memory and tile, made from a kernel instance by MakeSm90. The kernels of each
// operand type live in translation units of their own (kernels_sm90_f16.cu, _bf16.cu, _byte.cu,
// _tf32.cu, _f16x3.cu, compiled in parallel) and reach the launch through Sm90Entry16,
// Sm90ByteEntry, Sm90Tf32Entry and Sm90F16x3Entry.
#pragma once
#include <utility>

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
          Tr::template SmemBytes<Ops>(), Tr::kBM, Tr::kBN};
}

// Entry<CFG>::Make() of config `config` among CFGs (0 .. kNumConfigs - 1), from a table built
// once; an entry without fn past the table.
template <template <int> class Entry, int... CFGs>
Sm90Entry Sm90Lookup(int config, std::integer_sequence<int, CFGs...>) {
  static const Sm90Entry table[] = {Entry<CFGs>::Make()...};
  return config >= 0 && config < int(sizeof...(CFGs)) ? table[config] : Sm90Entry{};
}

// The kernel of sm90 config `config` in `layout` (a_kmajor * 2 + b_kmajor) for 16-bit operands
// of type T (__half: kernels_sm90_f16.cu, __nv_bfloat16: kernels_sm90_bf16.cu), or an entry
// without fn where there is none (an sm80 row, or no 16-bit kernels: Has16BitKernels).
template <typename T>
Sm90Entry Sm90Entry16(int config, int layout);

// The kernel of sm90 config `config` for 8-bit operands of types a x b (K-major both), or an
// entry without fn where there is none (HasByteKernels, or a pair that is not an fp8 or int8
// form).
Sm90Entry Sm90ByteEntry(int config, DType a, DType b);

// The kernel of sm90 config `config` for float32 operands read as TF32 (K-major both;
// kernels_sm90_tf32.cu), or an entry without fn where there is none (HasTf32Kernels).
Sm90Entry Sm90Tf32Entry(int config);

// The promoted float16 kernel of sm90 config `config` (f16x3: K-major both, pieces summed apart;
// kernels_sm90_f16x3.cu), or an entry without fn where there is none (HasTf32Kernels' rows).
Sm90Entry Sm90F16x3Entry(int config);

}  // namespace tcgemm
