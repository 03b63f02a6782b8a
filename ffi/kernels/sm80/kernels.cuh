// The kernel table of one input type: every config x layout x alignment variant, instantiated
// once. Included by one .cu per input type and layout of A.
#pragma once
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "host/gemm_dispatch.h"
#include "kernels/sm80/gemm_sm80.cuh"

namespace tcgemm {

template <typename T, int CFG, bool A_KMAJOR, bool B_KMAJOR, bool ALIGNED, bool RAGGED = false>
KernelEntry MakeEntry() {
  return {reinterpret_cast<const void*>(
              &gemm_sm80_kernel<T, CFG, A_KMAJOR, B_KMAJOR, ALIGNED, RAGGED>),
          ConfigTraits<CFG>::kThreads, ConfigTraits<CFG>::kSmemBytes,
          ConfigTraits<CFG>::kPushReduce ? ConfigTraits<CFG>::kClusterBytes : 0};
}

// The four variants of config CFG with A's layout AK (A K-major or not), in VariantIndex order.
template <typename T, int CFG, bool AK>
std::array<KernelEntry, kVariants / 2> ConfigEntries() {
  if constexpr (kConfigs[CFG].kind != Kind::kSm80) {
    return {};  // sm90 rows: kernels/sm90 (the dispatcher runs their fallback here)
  } else {
    if constexpr (!HasElementLoads(CFG)) {  // aligned variants only (ElementLoadsRow)
      return {KernelEntry{}, MakeEntry<T, CFG, AK, false, true>(), KernelEntry{},
              MakeEntry<T, CFG, AK, true, true>()};
    } else {
      return {MakeEntry<T, CFG, AK, false, false>(), MakeEntry<T, CFG, AK, false, true>(),
              MakeEntry<T, CFG, AK, true, false>(), MakeEntry<T, CFG, AK, true, true>()};
    }
  }
}

template <typename T, bool AK, int... CFGs>
KernelEntry LookupKernel(int config, int variant, std::integer_sequence<int, CFGs...>) {
  static const std::array<KernelEntry, kVariants / 2> table[] = {ConfigEntries<T, CFGs, AK>()...};
  return table[config][variant % (kVariants / 2)];
}

// The kernels of config CFG in a family that runs aligned operands only, indexed by
// VariantIndex (an entry without fn elsewhere):
// - grouped (RAGGED), on the rows with HasRaggedKernels: rows (A K-major, B N-major or
//   K-major) and the contraction (A M-major, B N-major); the caller pads K and N to multiples
//   of 8;
// - int8 (T int8_t), on the sm80 rows with HasByteKernels(CFG, false): A and B K-major (int8
//   pairs read as 16-bit elements: gemm_sm80.cuh).
template <typename T, int CFG, bool RAGGED>
std::array<KernelEntry, kVariants> AlignedEntries() {
  std::array<KernelEntry, kVariants> t{};
  if constexpr (kConfigs[CFG].kind != Kind::kSm80) {
    return t;
  } else if constexpr (RAGGED) {
    if constexpr (HasRaggedKernels(CFG)) {
      t[VariantIndex(true, false, true)] = MakeEntry<T, CFG, true, false, true, true>();
      t[VariantIndex(true, true, true)] = MakeEntry<T, CFG, true, true, true, true>();
      t[VariantIndex(false, false, true)] = MakeEntry<T, CFG, false, false, true, true>();
    }
  } else if constexpr (std::is_same_v<T, int8_t> && HasByteKernels(CFG, false)) {
    t[VariantIndex(true, true, true)] = MakeEntry<T, CFG, true, true, true>();
  }
  return t;
}

template <typename T, bool RAGGED, int... CFGs>
KernelEntry LookupAlignedKernel(int config, int variant, std::integer_sequence<int, CFGs...>) {
  static const std::array<KernelEntry, kVariants> table[] = {AlignedEntries<T, CFGs, RAGGED>()...};
  return table[config][variant];
}

// The grouped kernels of one operand type, and the int8 kernels: one translation unit each
// (kernels_ragged_*.cu, kernels_s8.cu).
#define TCGEMM_SM80_ALIGNED_KERNELS(NAME, T, RAGGED)                                     \
  KernelEntry NAME(int config, int variant) {                                           \
    return LookupAlignedKernel<T, RAGGED>(config, variant,                              \
                                          std::make_integer_sequence<int, kNumConfigs>{}); \
  }

// The kernels of one operand type and one layout of A: one translation unit each
// (kernels_{f16,bf16}_a{0,1}.cu), so that a parallel build compiles them side by side.
#define TCGEMM_SM80_KERNELS(NAME, T, AK)                                                 \
  KernelEntry NAME(int config, int variant) {                                           \
    return LookupKernel<T, AK>(config, variant,                                         \
                               std::make_integer_sequence<int, kNumConfigs>{});          \
  }

}  // namespace tcgemm
