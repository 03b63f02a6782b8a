// Read-rate ceiling of the decode row's weight (`nvcc -O3 -arch=sm_90a tools/read_ceiling.cu`,
// then run it): a 4096 x 14336 bfloat16 weight (117 MB, rows of 28672 bytes) read by plain
// kernels that only load it (streaming 16-byte loads, U of them in flight per thread), linearly
// by G blocks, and as column strips of W bytes (one block per strip and K slice, the access
// pattern of a GEMM's N-major weight tiles). Back-to-back launches of the same buffer, CUDA
// events, median of 30. What a GEMM that must read the weight once can reach
// (benchmarks/NOTES.md v50). Not a test; a measuring tool.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

constexpr int64_t ROWS = 4096, ROWB = 28672;

template <int U>
__global__ void read_linear(const int4* p, int64_t n, int* sink) {
  int acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride * U) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = (i + u * stride < n) ? __ldcs(p + i + u * stride) : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678) sink[0] = acc;
}

// Block (strip, slice): W bytes wide strip, rows [slice*rows_per, ...).
template <int WB, int U>
__global__ void read_strips(const char* base, int rows_per, int* sink) {
  constexpr int CPR = WB / 16;
  const int strip = blockIdx.x, slice = blockIdx.y;
  const int r0 = slice * rows_per;
  const int tr = threadIdx.x / CPR, ch = threadIdx.x % CPR;
  constexpr int RPI = 256 / CPR;
  int acc = 0;
  const char* p = base + int64_t(r0 + tr) * ROWB + strip * WB + ch * 16;
  for (int r = tr; r < rows_per; r += RPI * U) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = (r + u * RPI < rows_per) ? __ldcs(reinterpret_cast<const int4*>(p + int64_t(u * RPI) * ROWB)) : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    p += int64_t(RPI * U) * ROWB;
  }
  if (acc == 0x12345678) sink[0] = acc;
}

template <typename F>
float timeit(F f, int reps = 30) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ts;
  for (int i = 0; i < reps; ++i) { cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms); }
  std::sort(ts.begin(), ts.end());
  return ts[reps / 2] * 1000.f;
}

int main() {
  const int64_t bytes = ROWS * ROWB;
  char* w; int* sink;
  CK(cudaMalloc(&w, bytes)); CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(w, 1, bytes));
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto report = [&](const char* name, float us) { printf("%-34s %8.2f us  %6.3f TB/s\n", name, us, bytes / (us * 1e6)); };
  for (int g : {sms, 2 * sms, 4 * sms, 8 * sms}) {
    char nm[64];
    snprintf(nm, 64, "linear g=%d u4", g); report(nm, timeit([&] { read_linear<4><<<g, 256>>>((const int4*)w, bytes / 16, sink); }));
    snprintf(nm, 64, "linear g=%d u8", g); report(nm, timeit([&] { read_linear<8><<<g, 256>>>((const int4*)w, bytes / 16, sink); }));
  }
  for (int s : {1, 2, 4}) {
    char nm[64];
    snprintf(nm, 64, "strips 128B x%d (%d blk) u4", s, int(ROWB / 128 * s)); report(nm, timeit([&] { read_strips<128, 4><<<dim3(ROWB / 128, s), 256>>>(w, ROWS / s, sink); }));
    snprintf(nm, 64, "strips 128B x%d u8", s); report(nm, timeit([&] { read_strips<128, 8><<<dim3(ROWB / 128, s), 256>>>(w, ROWS / s, sink); }));
    snprintf(nm, 64, "strips 256B x%d (%d blk) u4", s, int(ROWB / 256 * s)); report(nm, timeit([&] { read_strips<256, 4><<<dim3(ROWB / 256, s), 256>>>(w, ROWS / s, sink); }));
    snprintf(nm, 64, "strips 512B x%d (%d blk) u4", s, int(ROWB / 512 * s)); report(nm, timeit([&] { read_strips<512, 4><<<dim3(ROWB / 512, s), 256>>>(w, ROWS / s, sink); }));
    snprintf(nm, 64, "strips 1024B x%d (%d blk) u4", s, int(ROWB / 1024 * s)); report(nm, timeit([&] { read_strips<1024, 4><<<dim3(ROWB / 1024, s), 256>>>(w, ROWS / s, sink); }));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
