// Programmatic dependent launch (PTX ISA 8.x, "griddepcontrol"; sm_90+): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel before it in the
// stream still runs, and waits for that kernel's completion and memory with griddep_wait before
// it touches global memory; the kernel before it lets it launch early with
// griddep_launch_dependents. Both are no-ops in a kernel launched without the attribute, and
// compile to nothing below sm_90.
#pragma once

namespace tcgemm::ptx {

// Blocks until every prerequisite grid has completed and its memory operations are visible.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the dependent grid launch once every block of this grid has executed it (or exited).
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace tcgemm::ptx
