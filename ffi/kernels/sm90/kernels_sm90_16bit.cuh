// The 16-bit operand kernels of type T: every sm90 config with Has16BitKernels x 4 layouts,
// looked up by Sm90Entry16<T> (sm90_entry.h). Included by one translation unit per type
// (kernels_sm90_f16.cu, kernels_sm90_bf16.cu), which the build compiles in parallel.
#pragma once
#include <array>
#include <utility>

#include "host/gemm_config.h"
#include "kernels/sm90/sm90_entry.h"  // and gemm_sm90.cuh

namespace tcgemm {
namespace sm90_16bit {

// Entries of config CFG in layout order (a_kmajor * 2 + b_kmajor); sm80 rows have none.
template <typename T, int CFG>
std::array<Sm90Entry, 4> Entries() {
  if constexpr (kConfigs[CFG].kind == Kind::kSm90 && Has16BitKernels(CFG)) {
    using O = Sm90Operands<T>;
    return {MakeSm90<O, CFG, false, false>(), MakeSm90<O, CFG, false, true>(),
            MakeSm90<O, CFG, true, false>(), MakeSm90<O, CFG, true, true>()};
  } else {
    return {};
  }
}

template <typename T, int... CFGs>
Sm90Entry Lookup(int config, int layout, std::integer_sequence<int, CFGs...>) {
  static const std::array<Sm90Entry, 4> table[] = {Entries<T, CFGs>()...};
  return table[config][layout];
}

}  // namespace sm90_16bit

template <typename T>
Sm90Entry Sm90Entry16(int config, int layout) {
  if (config < 0 || config >= kNumConfigs || layout < 0 || layout > 3) return {};
  return sm90_16bit::Lookup<T>(config, layout, std::make_integer_sequence<int, kNumConfigs>{});
}

}  // namespace tcgemm
