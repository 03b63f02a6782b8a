// The sm90 kernel's tile shape, shared-memory layout and register split (Sm90Traits, from its
// config row; the operand types enter only through whether block scales are staged), the wgmma
// shared-memory descriptor, and the TMA load of one operand's k tile into its stage: the parts
// of gemm_sm90.cuh's kernel that its main loop does not own.
#pragma once
#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "host/gemm_config.h"
#include "kernels/sm90/epilogue_sm90.cuh"  // kEpiBytes
#include "ptx/tma.cuh"

namespace tcgemm {

template <int CFG>
struct Sm90Traits {
  static constexpr GemmConfig c = kConfigs[CFG];
  static constexpr int kBM = c.bm, kBN = c.bn, kBK = c.bk, kStages = c.stages;
  static constexpr int kConsumers = c.consumers;
  static constexpr bool kPingPong = c.pingpong;  // a consumer owns whole tiles, in turn
  // m64 blocks per consumer warpgroup: all of the tile's (ping-pong), or its share
  static constexpr int kMB = kPingPong ? kBM / 64 : kBM / (64 * kConsumers);
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kABytes = kBM * kBK * 2;
  static constexpr int kBBytes = kBN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kBox = 64 * kBK * 2;  // one 64-wide box of an M/N-major tile, in bytes
  // Dynamic shared memory (Sm90SmemBytes): the stages, one epilogue staging panel per
  // consumer warpgroup, plus slack to align the stages to 1024 bytes (the period of the
  // 128-byte swizzle, which the wgmma descriptors assume starts at offset 0).
  static constexpr int kEpiOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = Sm90SmemBytes(c);
  // fp8 block scales, per stage (Sm90StagesScales): the tile's kBM rows' scales of a and up
  // to 4 column blocks' of b, copied by the producer with the stage's operands, after the
  // staging panels; the other rows' consumers load them from global memory themselves.
  static constexpr int kScaleStride = Sm90ScaleStride(c);
  static constexpr int kScaleOffset = kEpiOffset + kConsumers * kEpiBytes;
  static constexpr int kScaleBytes = Sm90ScaleBytes(c);
  static constexpr bool kScalesFit = Sm90StagesScales(CFG);
  template <typename Ops>
  static constexpr bool StagedScales() { return Ops::kBlockScales && kScalesFit; }
  template <typename Ops>
  static constexpr int SmemBytes() { return kSmemBytes + (StagedScales<Ops>() ? kScaleBytes : 0); }
  // Registers per thread after setmaxnreg: the producer gives up what the consumers take.
  // Three consumer warpgroups (512 threads, 128 registers each at entry) share 65536: 160
  // each, 24 for the producer (its loop holds a tile's coordinates and the tensor maps' address).
  static constexpr int kProducerRegs = kConsumers == 3 ? 24 : 40;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 232;

  static_assert(c.kind == Kind::kSm90, "Sm90Traits describes sm90 rows only");
  static_assert(kBK == 64, "a k tile is one 128-byte swizzle row of 16-bit elements");
  static_assert(kConsumers >= 1 && kBM == 64 * (kPingPong ? 1 : kConsumers) * kMB && kMB >= 1,
                "each consumer warpgroup owns a multiple of 64 rows");
  static_assert(kBN == 128 || kBN == 256, "wgmma n128 or n256");
  static_assert(kMB * kBN / 2 <= 128, "at most 128 float32 accumulators per thread");
  static_assert(kBM <= 256 && kBN <= 256, "a TMA box spans at most 256 rows");
  // The block holds what ptxas allots each thread at entry (65536 / threads, in units of 8)
  // times its threads; setmaxnreg.inc would wait forever for more than that.
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <=
                    kThreads * ((65536 / kThreads) & ~7),
                "setmaxnreg budget exceeds the registers the block holds");
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the sm_90 shared-memory limit per block");
  static_assert(kSmemBytes == kScaleOffset + 1024, "the layout Sm90SmemBytes describes");
};

// wgmma shared-memory matrix descriptor (PTX 9.7.15.5.1.2): start address, leading and stride
// byte offsets (all >> 4), 128-byte swizzle. K-major tiles: 8-row core-matrix groups 1024 bytes
// apart (stride), the leading offset unused. M/N-major tiles: 8-k-row groups 1024 bytes apart
// (stride), 64-element boxes kBox apart along M/N (leading).
__device__ __forceinline__ constexpr uint64_t smem_desc(uint32_t addr, uint32_t lead, uint32_t stride) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lead >> 4) << 16) |
         (uint64_t(stride >> 4) << 32) | (uint64_t(1) << 62);
}

// The next k tile (k0) of one operand into its stage at `dst`: a K-major tile is one box of
// 64 k x ROWS rows at (k0, mn0); an M/N-major one is ROWS/64 boxes of 64 (M or N) x 64 k rows
// at (mn0 + 64 i, k0), kBox bytes apart.
template <bool KMAJOR, int ROWS, int BOX_BYTES>
__device__ __forceinline__ void tma_load_operand(uint32_t dst, const CUtensorMap* map,
                                                 uint32_t bar, int k0, int mn0, int z) {
  if constexpr (KMAJOR) {
    ptx::tma_load_3d(dst, map, bar, k0, mn0, z);
  } else {
#pragma unroll
    for (int i = 0; i < ROWS / 64; ++i)
      ptx::tma_load_3d(dst + i * BOX_BYTES, map, bar, mn0 + 64 * i, k0, z);
  }
}

}  // namespace tcgemm
