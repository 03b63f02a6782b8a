// Hopper kernels for float32 operands read as TF32 (K-major A and B) on the sm90 rows with
// HasTf32Kernels(cfg). Compiled for sm_90a only, in a translation unit of their own (built in
// parallel with kernels_sm90.cu, whose LaunchSm90 launches them).
#include "host/gemm_config.h"
#include "kernels/sm90/sm90_entry.h"  // and gemm_sm90.cuh

namespace tcgemm {
namespace {

template <int CFG>
struct Tf32 {
  static Sm90Entry Make() {
    if constexpr (HasTf32Kernels(CFG)) return MakeSm90<Sm90Operands<float>, CFG, true, true>();
    else return Sm90Entry{};
  }
};

}  // namespace

Sm90Entry Sm90Tf32Entry(int config) {
  return Sm90Lookup<Tf32>(config, std::make_integer_sequence<int, kNumConfigs>{});
}

}  // namespace tcgemm
