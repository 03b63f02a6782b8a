// Operand packing: a matrix whose rows are not 16-byte multiples (contiguous extent % 8 != 0,
// e.g. K = 4093) is copied into rows padded to a multiple of 8 elements, zeros in the padding, so
// that the GEMM can stream it with 16-byte cp.async (the aligned kernel variant) instead of
// element-by-element loads. The padding is never multiplied with anything but zeros or discarded
// rows: padded K columns meet the other operand's zero-filled K rows (or its own zero padding),
// padded M/N columns produce output rows/columns that are not stored.
#include <algorithm>
#include <cstdint>

#include "gemm_dispatch.h"

namespace tcgemm {
namespace {

constexpr int kThreads = 256;

struct PackJobs {
  PackJob job[2];
};

// One thread per 16-byte chunk of the destination: 8 two-byte loads (the source rows have no
// alignment to speak of; a warp's loads cover 512 contiguous bytes), one 16-byte store.
__global__ void __launch_bounds__(kThreads) pack_rows_kernel(PackJobs jobs) {
  const PackJob& j = jobs.job[blockIdx.y];
  const int64_t chunks_per_row = j.ld / 8, chunks = j.rows * chunks_per_row;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < chunks;
       i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / chunks_per_row, c = (i - r * chunks_per_row) * 8;
    const uint16_t* src = j.src + r * j.cols + c;
    union {
      uint16_t e[8];
      uint4 v;
    } u;
#pragma unroll
    for (int e = 0; e < 8; ++e) u.e[e] = c + e < j.cols ? __ldg(src + e) : uint16_t(0);
    *reinterpret_cast<uint4*>(j.dst + r * j.ld + c) = u.v;
  }
}

}  // namespace

cudaError_t LaunchPack(const PackJob* jobs, int count, cudaStream_t stream) {
  if (count < 1 || count > 2) return cudaErrorInvalidValue;
  PackJobs js{};
  int64_t most = 0;
  for (int i = 0; i < count; ++i) {
    js.job[i] = jobs[i];
    most = std::max(most, jobs[i].rows * (jobs[i].ld / 8));
  }
  // Enough blocks to fill the GPU several times over; the grid-stride loop covers the rest.
  const unsigned blocks =
      static_cast<unsigned>(std::clamp<int64_t>((most + kThreads - 1) / kThreads, 1, 8192));
  pack_rows_kernel<<<dim3(blocks, static_cast<unsigned>(count)), kThreads, 0, stream>>>(js);
  return cudaGetLastError();
}

}  // namespace tcgemm
