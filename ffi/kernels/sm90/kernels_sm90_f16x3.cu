// Hopper kernels for the float16 parts of float32 operands (f16x3, float32 HIGHEST:
// jax_tcgemm/f32.py): float16 wgmma, K-major A and B, each piece of two k tiles summed apart and
// added into the float32 sums (Sm90Operands' PROMOTED), row and column scales in the epilogue,
// on the rows with float32 kernels (HasTf32Kernels). A translation unit of its own, compiled in
// parallel with the others; LaunchSm90 launches them for GemmProblem::promote.
#include "host/gemm_config.h"
#include "kernels/sm90/sm90_entry.h"  // and gemm_sm90.cuh

namespace tcgemm {
namespace {

template <int CFG>
struct F16x3 {
  static Sm90Entry Make() {
    if constexpr (HasTf32Kernels(CFG))
      return MakeSm90<Sm90Operands<__half, __half, true>, CFG, true, true>();
    else
      return Sm90Entry{};
  }
};

}  // namespace

Sm90Entry Sm90F16x3Entry(int config) {
  return Sm90Lookup<F16x3>(config, std::make_integer_sequence<int, kNumConfigs>{});
}

}  // namespace tcgemm
