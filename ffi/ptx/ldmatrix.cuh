// ldmatrix: warp-cooperative shared -> register loads of 8x8 b16 matrices (sm_75+).
// PTX ISA 8.x, section 9.7.14.5.15 "Warp-level matrix load instruction: ldmatrix".
// Lanes 8i..8i+7 give the row addresses of matrix i; lane t receives, for each matrix,
// row t/4, elements 2*(t%4) and 2*(t%4)+1 (of the transposed matrix with .trans).
#pragma once
#include <cstdint>

namespace tcgemm::ptx {

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
#endif
}

// Generic-to-shared address conversion (cvta.to.shared), PTX ISA 9.7.9.21.
__device__ __forceinline__ uint32_t cvta_to_shared(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace tcgemm::ptx
