// float32 -> output element conversion (round to nearest even), shared by every kernel.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace tcgemm {

template <typename Out>
__device__ __forceinline__ Out convert(float x) {
  if constexpr (std::is_same_v<Out, __half>) return __float2half_rn(x);
  else if constexpr (std::is_same_v<Out, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return x;
}

}  // namespace tcgemm
