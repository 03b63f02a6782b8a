// Hopper kernels for 8-bit operands (K-major A and B): int8 x int8 on the sm90 rows with
// HasByteKernels(cfg, false), the fp8 pairs e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3 on those with
// HasByteKernels(cfg, true). Compiled for sm_90a only, beside kernels_sm90.cu, whose
// LaunchSm90 launches them.
#include <cuda_fp8.h>

#include <cstdint>
#include <utility>

#include "host/gemm_config.h"
#include "kernels/common/element.cuh"
#include "kernels/sm90/sm90_entry.h"  // and gemm_sm90.cuh

namespace tcgemm {
namespace {

template <typename TA, typename TB, int CFG>
Sm90Entry ByteEntry() {
  constexpr bool fp8 = !std::is_same_v<TA, int8_t>;
  if constexpr (kConfigs[CFG].kind == Kind::kSm90 && HasByteKernels(CFG, fp8))
    return MakeSm90<Sm90Operands<TA, TB>, CFG, true, true>();
  else return Sm90Entry{};
}

template <typename TA, typename TB, int... CFGs>
Sm90Entry Lookup(int config, std::integer_sequence<int, CFGs...>) {
  static const Sm90Entry table[] = {ByteEntry<TA, TB, CFGs>()...};
  return table[config];
}

}  // namespace

Sm90Entry Sm90ByteEntry(int config, DType a, DType b) {
  const auto cfgs = std::make_integer_sequence<int, kNumConfigs>{};
  Sm90Entry entry{};
  if (config < 0 || config >= kNumConfigs) return entry;
  with_byte_pair(BytePair(a, b), [&](auto ta, auto tb) {
    entry = Lookup<decltype(ta), decltype(tb)>(config, cfgs);
  });
  return entry;
}

}  // namespace tcgemm
