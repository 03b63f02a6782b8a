// mbarrier, the tensor memory accelerator (TMA) bulk tensor copy (sm_90), and the named
// barrier the sm90 kernel's warpgroups synchronize their epilogue with.
// PTX ISA 8.x, section 9.7.13.15 "Parallel Synchronization and Communication Instructions:
// mbarrier" (init, arrive, arrive.expect_tx, try_wait.parity) and 9.7.9.27
// "cp.async.bulk.tensor" (tile mode, completion through mbarrier::complete_tx::bytes).
// Addresses are shared-state-space byte addresses (cvta_to_shared).
#pragma once
#include <cstdint>

namespace tcgemm::ptx {

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

// Makes mbarrier.init visible to the async proxy (the TMA unit) and to the other threads.
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival on `bar`.
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
               : "memory");
#endif
}

// One arrival on `bar` that also expects `bytes` more of transaction count (the TMA copies
// issued against it complete that many).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
      "r"(bytes)
      : "memory");
#endif
}

// Blocks until the phase of `bar` with parity `parity` has completed. On a freshly initialised
// barrier parity 1 counts as completed (the phase "before" phase 0).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// Fetches the tensor map (a __grid_constant__ kernel parameter) into the descriptor cache.
__device__ __forceinline__ void prefetch_tensormap(const void* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// Copies the box of 3-D tensor map `map` at element coordinates (c0 innermost, c1, c2) into
// shared memory at `dst`, completing its bytes on mbarrier `bar`. Elements outside the tensor
// are written as zeros (and still count towards the transaction bytes).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint32_t bar, int c0,
                                            int c1, int c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

// Copies `bytes` (a multiple of 16) contiguous bytes at `src` (16-byte aligned) into shared
// memory at `dst` (16-byte aligned) with the bulk-copy unit (cp.async.bulk, PTX 9.7.9.25.4.1),
// completing them on mbarrier `bar` (count them in its expect_tx).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}

// fence.proxy.async.shared::cta (PTX 9.7.13.4.20, "membar/fence"): orders this thread's
// generic-proxy writes to shared memory before later async-proxy reads of it (wgmma operands,
// TMA stores), once a barrier has published them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// st.shared.v4.u32 of zeros (PTX 9.7.9.10): 16 zero bytes at shared address `addr`.
__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

// ld.shared.f32 (PTX 9.7.9.8): the float at shared address `addr`.
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads (a multiple of 32): one
// warpgroup synchronizes without stalling the others.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// bar.arrive (PTX 9.7.13.1): this warp arrives at named barrier `id` (of `count` threads)
// without waiting; those that bar.sync on it wait for the arrivals.
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

}  // namespace tcgemm::ptx
