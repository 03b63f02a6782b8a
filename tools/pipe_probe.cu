// How the tensor pipe serves the promoted fp8 pieces of several consumer warpgroups
// (benchmarks/NOTES.md v99): one block per SM, 1-3 warpgroups, each issuing pieces of
// 4 x wgmma m64n128k32 e4m3 (a k tile of the g3 row) from shared memory, no TMA, no barriers
// but an optional named-barrier re-sync every `tile` pieces (a tile's start), in modes:
//   0 chain: the pieces accumulate into one sum, no wait per piece (the pipe's own rate)
//   1 drain: each piece summed from 0 and waited for (wait_group 0), not added
//   2 promote: as 1, then its 64 partial sums added into float32 sums (the g3 loop)
//   3 ring: as 2, the warpgroups issuing in turn (c waits for c - 1's issue, 0 for the last's)
//   4 first: as 2, warpgroup c's first piece of a tile waits for c - 1's first to complete
//   5 spaced ring: as 3, and a warpgroup issues no earlier than `stagger` SM cycles after the
//     previous one issued (its clock64 stamp in shared memory, passed with the ring's arrival)
//   6 half: as 2, only 32 of the 64 partial sums added (timing only: is the add the cost?)
//   7 long: as 2, pieces of 8 wgmma (the stage's 4 twice; timing only: a piece of twice the
//     pipe time for the same 64 adds)
// `stagger` (modes other than 5): warpgroup c spins c * stagger cycles before its first piece
// (after each re-sync).
// Prints SM cycles per piece per warpgroup (median over blocks), the pipe's share against
// mode 0 with three warpgroups (mode 7: per 4 wgmma), and block 0's SM clock (clock64 over
// %globaltimer). Not a test: a measuring tool, built and run by hand:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I ffi tools/pipe_probe.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/sm90/traits_sm90.cuh"  // smem_desc
#include "ptx/sreg.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

using namespace tcgemm;

// a stage: 192 rows of A + 128 of B, 128 bytes each; block 0's first kTrace pieces are traced
// (per piece: issue, completion, the last add's issue)
constexpr int kStage = 40960, kStages = 4, kTrace = 256, kStamps = 3;

template <bool TRACE, bool LONG>
__global__ void __launch_bounds__(384, 1)
    probe(int mode, int iters, int wgs, int stagger, int tile, float* out, long long* cyc,
          long long* trace) {
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023u) & ~1023u;
  char* gbase = smem_raw + (base - raw);
  for (int i = threadIdx.x; i < kStage * kStages / 4; i += blockDim.x) {
    uint32_t x = (i + 1) * 2654435761u ^ (blockIdx.x * 97u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    reinterpret_cast<uint32_t*>(gbase)[i] = x & 0xBFBFBFBFu;  // e4m3 exponents <= 7: finite
  }
  __syncthreads();
  // warp-uniform through a shuffle, as in the kernel: descriptors in uniform registers
  const int wg = __shfl_sync(~0u, int(threadIdx.x / 128), 0);
  if (wg >= wgs) return;
  // mode 5: each warpgroup's last issue (SM cycles), read by the next one in the ring (whose
  // arrival, after all its threads read it, orders the slot's next write)
  __shared__ long long stamp[3];
  float acc[64], part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.0f;
  auto spin_until = [](long long t) {
    while (clock64() < t) {
    }
  };
  long long spun = 0;
  auto wait_stagger = [&] {
    const long long t = clock64();
    if (stagger && mode != 5) spin_until(t + wg * stagger);
    spun += clock64() - t;
  };
  // (no division in the loop: a runtime modulo put ~20 instructions and a MUFU on every
  // warpgroup's path from one piece to the next)
  const uint32_t ring_next = 4 + (wg + 1 == wgs ? 0 : wg + 1);
  int left = tile;  // pieces to the next re-sync (tile > 0)
  const long long t0 = clock64();
  const unsigned long long ns0 = ptx::globaltimer();
  wait_stagger();
  for (int it = 0; it < iters; ++it) {
    bool first = it == 0;
    if (tile && left-- == 0) {
      left = tile - 1;
      first = true;
      ptx::wgmma_wait_group<0>();
      ptx::named_barrier_sync(1, 128 * wgs);
      wait_stagger();
    }
    const bool tr = TRACE && blockIdx.x == 0 && threadIdx.x % 128 == 0 && it < kTrace;
    const bool ring = (mode == 3 || mode == 5) && wgs > 1;
    if (ring && !(wg == 0 && it == 0)) {
      ptx::named_barrier_sync(4 + wg, 256);
      if (mode == 5) spin_until(stamp[wg == 0 ? wgs - 1 : wg - 1] + stagger);
    }
    if (mode == 5) stamp[wg] = clock64();  // every thread: no divergent branch here (C7515)
    if (mode == 4 && wg > 0 && first) ptx::named_barrier_sync(4 + wg, 256);
    if (tr) trace[(wg * kTrace + it) * kStamps] = clock64();
    const uint32_t st = base + (it % kStages) * kStage;
    // K-major, 128-byte swizzle: the kernel's descriptors (traits_sm90.cuh)
    const uint64_t da = smem_desc(st + wg * 8192, 16, 1024), db = smem_desc(st + 24576, 16, 1024);
    ptx::wgmma_fence();
#pragma unroll
    for (int j = 0; j < (LONG ? 8 : 4); ++j)  // (LONG: the stage's 4 k steps twice)
      ptx::wgmma_m64n128k32_fp8<false, false>(part, da + 2 * (j % 4), db + 2 * (j % 4),
                                              mode == 0 ? 1 : int(j > 0));
    ptx::wgmma_commit_group();
    if (ring) ptx::named_barrier_arrive(ring_next, 256);
    if (!TRACE && mode == 0) {
      ptx::wgmma_wait_group<1>();
    } else {
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operands(part);
      if (tr) trace[(wg * kTrace + it) * kStamps + 1] = clock64();
      if (mode == 4 && wg + 1 < wgs && first) ptx::named_barrier_arrive(5 + wg, 256);
      if (mode >= 2) {
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[i] += part[i];
        if (mode != 6) {
#pragma unroll
          for (int i = 32; i < 64; ++i) acc[i] += part[i];
        }
        if (tr) trace[(wg * kTrace + it) * kStamps + 2] = clock64();
      }
    }
  }
  ptx::wgmma_wait_group<0>();
  ptx::wgmma_fence_operands(part);
  const long long t1 = clock64();
  const unsigned long long ns1 = ptx::globaltimer();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 64; ++i) s += acc[i] + part[i];
  out[blockIdx.x * 384 + threadIdx.x] = s;
  if (threadIdx.x % 128 == 0) cyc[blockIdx.x * 3 + wg] = t1 - t0 - spun;
  if (threadIdx.x == 0 && blockIdx.x == 0) cyc[gridDim.x * 3] = (t1 - t0) * 1000 / (ns1 - ns0);
}

template <bool TRACE>
static bool launch(int mode, int iters, int sms, int smem, int wgs, int stagger, int tile,
                   float* out, long long* cyc, long long* trace) {
  if (mode == 7)
    probe<TRACE, true><<<sms, 384, smem>>>(mode, iters, wgs, stagger, tile, out, cyc, trace);
  else
    probe<TRACE, false><<<sms, 384, smem>>>(mode, iters, wgs, stagger, tile, out, cyc, trace);
  if (cudaDeviceSynchronize() == cudaSuccess) return true;
  printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
  return false;
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? atoi(argv[1]) : 20000;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int smem = kStage * kStages + 1024;
  cudaFuncSetAttribute(probe<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(probe<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(probe<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(probe<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  float* out;
  long long* cyc;
  cudaMalloc(&out, sms * 384 * sizeof(float));
  cudaMalloc(&cyc, (sms * 3 + 1) * sizeof(long long));
  struct Run { int mode, wgs, stagger, tile; };
  const Run runs[] = {
      {0, 3, 0, 0}, {0, 2, 0, 0}, {0, 1, 0, 0}, {1, 1, 0, 0}, {2, 1, 0, 0}, {6, 1, 0, 0},
      {7, 1, 0, 0}, {1, 3, 0, 0}, {2, 3, 0, 0}, {6, 3, 0, 0}, {7, 3, 0, 0}, {2, 3, 0, 64},
      {7, 3, 0, 64}, {2, 2, 0, 0}, {7, 2, 0, 0}, {3, 3, 0, 0}, {4, 3, 0, 0}, {5, 3, 256, 64},
  };
  double base_rate = 0;  // cycles per piece of mode 0, three warpgroups (the pipe's rate)
  for (const Run& r : runs) {
    std::vector<long long> h(sms * 3 + 1);
    double best = 1e30;
    long long mhz = 0;
    for (int rep = 0; rep < 3; ++rep) {
      cudaMemset(cyc, 0, h.size() * sizeof(long long));
      if (!launch<false>(r.mode, iters, sms, smem, r.wgs, r.stagger, r.tile, out, cyc, nullptr))
        return 1;
      cudaMemcpy(h.data(), cyc, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
      std::vector<double> per;  // the slowest warpgroup of each block, cycles per piece
      for (int b = 0; b < sms; ++b) {
        long long m = 0;
        for (int w = 0; w < r.wgs; ++w) m = std::max(m, h[b * 3 + w]);
        per.push_back(double(m) / iters);
      }
      std::sort(per.begin(), per.end());
      best = std::min(best, per[per.size() / 2]);
      mhz = h[sms * 3];
    }
    // pieces of all warpgroups per cycle -> cycles per piece of the SM (mode 7: per 4 wgmma)
    const double sm_per_piece = best / r.wgs / (r.mode == 7 ? 2 : 1);
    if (r.mode == 0 && r.wgs == 3) base_rate = sm_per_piece;
    printf("mode %d wgs %d stagger %3d tile %2d: %7.1f cycles per piece per warpgroup, "
           "%6.1f per 4 wgmma of the SM, pipe %5.1f%%, SM clock %lld MHz\n",
           r.mode, r.wgs, r.stagger, r.tile, best, sm_per_piece, 100.0 * base_rate / sm_per_piece,
           mhz);
  }
  // Traces of block 0 (each piece waited for): per piece, warpgroups 1 and 2's issue relative
  // to warpgroup 0's, warpgroup 0's issue to completion, completion to its last add's issue,
  // and that to its next issue; then the medians of those over pieces 16 and on.
  long long* dtr;
  cudaMalloc(&dtr, 3 * kTrace * kStamps * sizeof(long long));
  const Run traced[] = {{2, 3, 0, 0}, {6, 3, 0, 0}, {7, 3, 0, 0}, {2, 1, 0, 0}, {2, 3, 0, 64}};
  for (const Run& r : traced) {
    std::vector<long long> h(3 * kTrace * kStamps);
    cudaMemset(dtr, 0, h.size() * sizeof(long long));
    if (!launch<true>(r.mode, 2000, sms, smem, r.wgs, r.stagger, r.tile, out, cyc, dtr)) return 1;
    cudaMemcpy(h.data(), dtr, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
    printf("trace mode %d wgs %d tile %d: piece: issue1-issue0 issue2-issue0 | wg0: issue to "
           "completion, to last add, to next issue\n", r.mode, r.wgs, r.tile);
    auto at = [&](int w, int i, int e) { return h[(w * kTrace + i) * kStamps + e]; };
    std::vector<long long> lat, add, gap;
    for (int i = 0; i + 1 < kTrace; ++i) {
      const long long l = at(0, i, 1) - at(0, i, 0), a = at(0, i, 2) - at(0, i, 1),
                      g = at(0, i + 1, 0) - at(0, i, 2);
      if (i >= 16) lat.push_back(l), add.push_back(a), gap.push_back(g);
      if (!(i < 8 || (i >= 60 && i < 68))) continue;
      printf("  %3d: %6lld %6lld | %5lld %5lld %5lld\n", i,
             r.wgs > 1 ? at(1, i, 0) - at(0, i, 0) : 0, r.wgs > 2 ? at(2, i, 0) - at(0, i, 0) : 0,
             l, a, g);
    }
    for (auto* v : {&lat, &add, &gap}) std::sort(v->begin(), v->end());
    printf("  median: issue to completion %lld, to last add %lld, to next issue %lld\n",
           lat[lat.size() / 2], add[add.size() / 2], gap[gap.size() / 2]);
  }
  return 0;
}
