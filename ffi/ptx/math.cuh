// Approximate transcendental instructions (PTX ISA, "Floating Point Instructions: tanh"):
// tanh.approx.f32 (sm_75+), one MUFU operation, maximum relative error about 2^-11: used by
// the epilogue only where the result is rounded to bfloat16 (8 significant bits) anyway.
#pragma once

namespace tcgemm::ptx {

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace tcgemm::ptx
