// cp.async: asynchronous global -> shared copies (sm_80+).
// PTX ISA 8.x, section 9.7.9.25 "Data Movement and Conversion Instructions: cp.async",
// 9.7.9.25.3.2 cp.async.commit_group, 9.7.9.25.3.3 cp.async.wait_group.
#pragma once
#include <cstdint>

namespace tcgemm::ptx {

// 16-byte copy, L1-bypassing (.cg), zero-filling the bytes past `src_bytes`
// (src_bytes = 0 writes 16 zero bytes and reads nothing).
__device__ __forceinline__ void cp_async_cg_16_zfill(uint32_t smem_addr, const void* gmem,
                                                     uint32_t src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_addr),
               "l"(gmem), "r"(src_bytes)
               : "memory");
#endif
}

// 16-byte copy, L1-bypassing (.cg); when `zero` is true the source is ignored (never read, so
// `gmem` may point anywhere) and 16 zero bytes are written (the ignore-src operand).
__device__ __forceinline__ void cp_async_cg_16_or_zero(uint32_t smem_addr, const void* gmem,
                                                       bool zero) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "{\n .reg .pred z;\n setp.ne.b32 z, %2, 0;\n"
      " cp.async.cg.shared.global.L2::128B [%0], [%1], 16, z;\n}\n" ::"r"(smem_addr),
      "l"(gmem), "r"(int(zero))
      : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until at most N of this thread's committed groups are still pending.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace tcgemm::ptx

namespace tcgemm::ptx {

// 16-byte shared store of four 32-bit words (st.shared.v4.b32), PTX ISA 9.7.9.10 "st"; the
// synchronous fallback of cp_async_cg_16_zfill for operands that are not 16-byte aligned.
__device__ __forceinline__ void st_shared_v4_b32(uint32_t smem_addr, const uint32_t (&v)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3])
               : "memory");
}

}  // namespace tcgemm::ptx
