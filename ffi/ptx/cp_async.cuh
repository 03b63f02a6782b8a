// cp.async: asynchronous global -> shared copies (sm_80+), and their synchronous fallback for
// operands that are not 16-byte aligned (element-wise loads, st.shared).
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

// BYTES-byte copy (.ca: 4 or 8 bytes, below .cg's 16), zero-filling the bytes past `src_bytes`
// (0: writes BYTES zero bytes and reads nothing). Completion is tracked by an mbarrier
// (cp_async_mbarrier_arrive) or by commit / wait groups.
template <int BYTES>
__device__ __forceinline__ void cp_async_ca_zfill(uint32_t smem_addr, const void* gmem,
                                                  uint32_t src_bytes) {
  static_assert(BYTES == 4 || BYTES == 8, "cp.async.ca of 4 or 8 bytes (16: the .cg forms)");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr), "l"(gmem),
               "n"(BYTES), "r"(src_bytes)
               : "memory");
#endif
}

// cp.async.mbarrier.arrive (PTX 9.7.9.25.3.1, without .noinc): the mbarrier at shared address
// `bar` gets one more pending arrival now and that arrival once all of this thread's earlier
// cp.async copies are complete, so a phase that waits for it sees their data. (Net zero
// arrivals: the barrier's expected count stays as initialised.)
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
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

// The eight 16-bit elements at `gmem` (2-byte aligned), element e read (ld.global.u16, PTX ISA
// 9.7.9.8 "ld") only when e < n and zero otherwise, packed two per word (element 2j in the low
// half of w[j], prmt); with st_shared_v4_b32, the synchronous fallback of cp_async_cg_16_zfill
// for operands that are not 16-byte aligned. Every element's register is zeroed and then
// loaded under a predicate: in C++ (a select of a conditional 16-bit load) the zero was
// merged into the register the load writes, which then carried its old contents around the
// main loop, so all of a k tile's elements were live across it (8 registers per chunk).
// Not volatile: it reads the operands, which nothing writes while a kernel runs.
__device__ __forceinline__ void ld_global_8xb16_zfill(uint32_t (&w)[4], const void* gmem, int n) {
  asm("{\n .reg .pred p<8>;\n .reg .b32 t<8>;\n"
      " setp.gt.s32 p0, %5, 0;\n setp.gt.s32 p1, %5, 1;\n setp.gt.s32 p2, %5, 2;\n"
      " setp.gt.s32 p3, %5, 3;\n setp.gt.s32 p4, %5, 4;\n setp.gt.s32 p5, %5, 5;\n"
      " setp.gt.s32 p6, %5, 6;\n setp.gt.s32 p7, %5, 7;\n"
      " mov.b32 t0, 0;\n mov.b32 t1, 0;\n mov.b32 t2, 0;\n mov.b32 t3, 0;\n"
      " mov.b32 t4, 0;\n mov.b32 t5, 0;\n mov.b32 t6, 0;\n mov.b32 t7, 0;\n"
      " @p0 ld.global.u16 t0, [%4];\n @p1 ld.global.u16 t1, [%4+2];\n"
      " @p2 ld.global.u16 t2, [%4+4];\n @p3 ld.global.u16 t3, [%4+6];\n"
      " @p4 ld.global.u16 t4, [%4+8];\n @p5 ld.global.u16 t5, [%4+10];\n"
      " @p6 ld.global.u16 t6, [%4+12];\n @p7 ld.global.u16 t7, [%4+14];\n"
      " prmt.b32 %0, t0, t1, 0x5410;\n prmt.b32 %1, t2, t3, 0x5410;\n"
      " prmt.b32 %2, t4, t5, 0x5410;\n prmt.b32 %3, t6, t7, 0x5410;\n}\n"
      : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
      : "l"(gmem), "r"(n));
}

// 16-byte shared store of four 32-bit words (st.shared.v4.b32), PTX ISA 9.7.9.10 "st".
__device__ __forceinline__ void st_shared_v4_b32(uint32_t smem_addr, const uint32_t (&v)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3])
               : "memory");
}

}  // namespace tcgemm::ptx
