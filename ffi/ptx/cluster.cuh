// Thread block cluster primitives (sm_90): the block's rank in its cluster, the split cluster
// barrier, distributed shared memory addressing and stores.
// PTX ISA 8.x, sections 10.13 (%cluster_ctarank), 9.7.13.3
// "barrier.cluster", 9.7.9.22 "mapa" and 9.7.9.10 "st" (.shared::cluster).
#pragma once
#include <cstdint>

namespace tcgemm::ptx {

// This block's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}

// Arrival on the cluster barrier without ordering any memory access.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#endif
}

// Arrival on the cluster barrier, releasing this thread's earlier memory accesses (the other
// half of cluster_wait; every thread of the cluster arrives once per phase).
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive;\n" ::: "memory");
#endif
}

// Waits until every non-exited thread of the cluster has arrived (acquire).
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
#endif
}

// The shared::cluster address of shared byte address `addr` (of this block's shared window) in
// block `rank` of the cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
#endif
  return r;
}

// 8-byte store of two floats to a shared::cluster address (possibly another block's).
__device__ __forceinline__ void st_cluster_v2_f32(uint32_t addr, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y)
               : "memory");
#endif
}

}  // namespace tcgemm::ptx
