// Special registers read with volatile inline PTX: %tid.x, %ctaid.x, %ctaid.y, %globaltimer
// (PTX ISA 8.x, section 10 "Special Registers"). Unlike threadIdx / blockIdx, a volatile read
// is neither merged with another nor hoisted out of a loop by the compiler, so what is derived
// from it is computed where it is used instead of being kept live in registers in between.
#pragma once

namespace tcgemm::ptx {

__device__ __forceinline__ int tid_x() {
  int r;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
  return r;
}

__device__ __forceinline__ int ctaid_x() {
  int r;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(r));
  return r;
}

__device__ __forceinline__ int ctaid_y() {
  int r;
  asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(r));
  return r;
}

// nanoseconds (tools/pipe_probe.cu: SM cycles per ns)
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long r;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(r));
  return r;
}

}  // namespace tcgemm::ptx
