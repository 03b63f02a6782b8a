// The kernel table of one input type: every config x layout x alignment variant, instantiated
// once. Included by exactly one .cu per input type.
#pragma once
#include <array>
#include <utility>

#include "gemm_dispatch.h"
#include "gemm_sm80.cuh"

namespace tcgemm {

template <typename T, int CFG, bool A_KMAJOR, bool B_KMAJOR, bool ALIGNED>
KernelEntry MakeEntry() {
  return {reinterpret_cast<const void*>(&gemm_sm80_kernel<T, CFG, A_KMAJOR, B_KMAJOR, ALIGNED>),
          ConfigTraits<CFG>::kThreads, ConfigTraits<CFG>::kSmemBytes,
          ConfigTraits<CFG>::kPushReduce ? ConfigTraits<CFG>::kClusterBytes : 0};
}

template <typename T, int CFG>
std::array<KernelEntry, kVariants> ConfigEntries() {  // order of VariantIndex
  if constexpr (kConfigs[CFG].kind != Kind::kSm80) {
    return {};  // sm90 rows: gemm_kernels_sm90.cu (the dispatcher runs their fallback here)
  } else {
    return {MakeEntry<T, CFG, false, false, false>(), MakeEntry<T, CFG, false, false, true>(),
            MakeEntry<T, CFG, false, true, false>(),  MakeEntry<T, CFG, false, true, true>(),
            MakeEntry<T, CFG, true, false, false>(),  MakeEntry<T, CFG, true, false, true>(),
            MakeEntry<T, CFG, true, true, false>(),   MakeEntry<T, CFG, true, true, true>()};
  }
}

template <typename T, int... CFGs>
KernelEntry LookupKernel(int config, int variant, std::integer_sequence<int, CFGs...>) {
  static const std::array<KernelEntry, kVariants> table[] = {ConfigEntries<T, CFGs>()...};
  return table[config][variant];
}

template <typename T>
KernelEntry LookupKernel(int config, int variant) {
  return LookupKernel<T>(config, variant, std::make_integer_sequence<int, kNumConfigs>{});
}

}  // namespace tcgemm
