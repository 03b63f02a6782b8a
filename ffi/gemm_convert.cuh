// float32 -> output element conversion (round to nearest even), shared by every kernel.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "gemm_params.h"

namespace tcgemm {

template <typename Out>
__device__ __forceinline__ Out convert(float x) {
  if constexpr (std::is_same_v<Out, __half>) return __float2half_rn(x);
  else if constexpr (std::is_same_v<Out, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return x;
}

// Calls f(Out{}) with Out the element type of output type t: the one switch over OutType that
// every epilogue goes through.
template <typename F>
__device__ __forceinline__ void with_out_type(OutType t, F&& f) {
  switch (t) {
    case OutType::kF16: f(__half{}); break;
    case OutType::kBF16: f(__nv_bfloat16{}); break;
    case OutType::kF32: f(float{}); break;
  }
}

}  // namespace tcgemm
