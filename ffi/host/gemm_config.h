// Typed view of gemm_config.inc plus the derived quantities every layer uses.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace tcgemm {

enum class Kind : int {
  kSm80 = 0,  // cp.async + ldmatrix + mma.sync (sm_80 and newer)
  kSm90 = 1,  // TMA + mbarrier + wgmma, warp-specialized (compute capability 9.0 only)
  kNarrow = 2,  // 8-bit products of few rows: mma.sync on fragments loaded from global memory
};

struct GemmConfig {
  int bm, bn, bk;      // threadblock tile
  int stages;          // pipeline depth (cp.async groups, or TMA stages)
  int warps_m, warps_n;  // sm80: warp layout; sm90: 0, 0; narrow: 1, warps across the columns
  Kind kind = Kind::kSm80;
  int consumers = 0;   // sm90: consumer warpgroups, each owning bm / consumers rows
  int warps_k = 1;     // sm80: warp groups splitting every stage's K (sliced K); sm90: 1;
                       // narrow: the warps of a block, each taking every warps_k-th k tile
  bool pingpong = false;  // sm90: each consumer warpgroup owns whole tiles (every consumers-th
                          // item), so one's epilogue overlaps the other's main loop
  bool fp8_only = false;  // sm90: kernels for the fp8 pairs only (HasByteKernels), none else
};

inline constexpr GemmConfig kConfigs[] = {
#define TCGEMM_CONFIG(BM, BN, BK, S, WM, WN, WK) \
  GemmConfig{BM, BN, BK, S, WM, WN, Kind::kSm80, 0, WK},
#define TCGEMM_SM90_CONFIG(BM, BN, BK, S, G) GemmConfig{BM, BN, BK, S, 0, 0, Kind::kSm90, G},
#define TCGEMM_SM90_PINGPONG_CONFIG(BM, BN, BK, S) \
  GemmConfig{BM, BN, BK, S, 0, 0, Kind::kSm90, 2, 1, true},
#define TCGEMM_SM90_FP8_CONFIG(BM, BN, BK, S, G) \
  GemmConfig{BM, BN, BK, S, 0, 0, Kind::kSm90, G, 1, false, true},
#define TCGEMM_NARROW_CONFIG(BM, BN, BK, WN, WK) \
  GemmConfig{BM, BN, BK, 1, 1, WN, Kind::kNarrow, 0, WK},
#include "gemm_config.inc"
#undef TCGEMM_NARROW_CONFIG
#undef TCGEMM_SM90_FP8_CONFIG
#undef TCGEMM_SM90_PINGPONG_CONFIG
#undef TCGEMM_SM90_CONFIG
#undef TCGEMM_CONFIG
};
inline constexpr int kNumConfigs = static_cast<int>(sizeof(kConfigs) / sizeof(kConfigs[0]));

inline std::string ConfigName(const GemmConfig& c) {
  const std::string tile = std::to_string(c.bm) + "x" + std::to_string(c.bn) + "x" +
                           std::to_string(c.bk) + "_s" + std::to_string(c.stages);
  if (c.kind == Kind::kNarrow)
    return "narrow_" + std::to_string(c.bm) + "x" + std::to_string(c.bn) + "x" +
           std::to_string(c.bk) + "_w" + std::to_string(c.warps_n) + "x" +
           std::to_string(c.warps_k);
  if (c.kind == Kind::kSm90)
    return "sm90_" + tile + (c.pingpong ? "_p" : "_g") + std::to_string(c.consumers) +
           (c.fp8_only ? "_f8" : "");
  return "sm80_" + tile + "_w" + std::to_string(c.warps_m) + "x" + std::to_string(c.warps_n) +
         (c.warps_k > 1 ? "x" + std::to_string(c.warps_k) : "");
}

// The sm80 config that runs in place of sm90 config `cfg` where that cannot (another GPU,
// operands TMA cannot address): the first sm80 row with the same BK, so that k tiles, split-K
// slices and the workspace the caller sized stay the same. Every other config maps to itself.
constexpr int Sm80Fallback(int cfg) {
  if (kConfigs[cfg].kind != Kind::kSm90) return cfg;  // (narrow rows run on every GPU)
  for (int i = 0; i < kNumConfigs; ++i)
    if (kConfigs[i].kind == Kind::kSm80 && kConfigs[i].bk == kConfigs[cfg].bk) return i;
  return -1;
}

// Whether sm80 row `cfg` has kernels for operands that are not 16-byte aligned (element-wise
// loads). Rows of more than 128 x 256 x 32 tile elements do not: their element-wise variants
// would spill registers. There such operands run on ElementLoadsRow: the first sm80 row with
// the same BK that has them (same k tiles, split and workspace).
constexpr bool HasElementLoads(int cfg) {
  return kConfigs[cfg].kind == Kind::kSm80 &&
         int64_t(kConfigs[cfg].bm) * kConfigs[cfg].bn * kConfigs[cfg].bk <= 128 * 256 * 32;
}
constexpr int ElementLoadsRow(int cfg) {
  if (HasElementLoads(cfg)) return cfg;
  for (int i = 0; i < kNumConfigs; ++i)
    if (HasElementLoads(i) && kConfigs[i].bk == kConfigs[cfg].bk) return i;
  return -1;
}

// Whether config cfg runs grouped (ragged) products (host/gemm_params.h, RaggedParams): every
// sm90 row (its persistent scheduler), and the sm80 rows with BK = 32, BM >= 64 and BM <= BN
// (128x256, 128x128, 64x64: one of each tile size the cost model tells apart; BK = 32 wastes
// less of a contraction group's last k tile), whose grouped kernels
// (kernels/sm80/kernels_ragged_*.cu) run on every GPU from sm_80 on. The planner picks among
// these rows (configs.plan_ragged reads this through the config table).
constexpr bool HasRaggedKernels(int cfg) {
  const GemmConfig& c = kConfigs[cfg];
  return (c.kind == Kind::kSm90 && !c.fp8_only) ||
         (c.kind == Kind::kSm80 && c.warps_k == 1 && c.bk == 32 && c.bm >= 64 && c.bm <= c.bn);
}

// Whether config cfg has kernels for 8-bit operands (K-major A and B). sm90 rows
// (kernels/sm90/kernels_sm90_byte.cu): int8 on the cooperative rows (a consumer thread holds at
// most 128 sums), the fp8 pairs on those whose consumers own one m64 block each (fp8 adds 64
// registers for the partial sums of one 64 x 128 piece of a k tile; with two m64 blocks,
// 256x128, ptxas spilled 44 bytes in the main loop). sm80 rows: int8 on every row
// (kernels/sm80/kernels_s8.cu: mma.sync m16n8k32, one aligned variant each), the rows of
// GPUs other than compute capability 9.0 and the fallback of the sm90 rows there. Narrow rows:
// int8 and the fp8 pairs (kernels/narrow/narrow8.cu; fp8 from compute capability 9.0), B
// N-major only. The planner picks among these rows (plan8.plan_byte).
constexpr bool HasByteKernels(int cfg, bool fp8) {
  const GemmConfig& c = kConfigs[cfg];
  if (c.kind == Kind::kNarrow) return true;
  if (c.kind == Kind::kSm80) return !fp8;
  return !c.pingpong && (fp8 ? c.bm == 64 * c.consumers : !c.fp8_only);
}

// Whether sm90 config cfg has kernels for float32 operands (TF32 wgmma, K-major A and B;
// kernels/sm90/kernels_sm90_tf32.cu): the cooperative rows whose consumers own one m64 block
// each (128x256, 128x128, 64x128), as for fp8. The planner picks among these (configs.plan_f32).
constexpr bool HasTf32Kernels(int cfg) {
  const GemmConfig& c = kConfigs[cfg];
  return c.kind == Kind::kSm90 && !c.pingpong && !c.fp8_only && c.bm == 64 * c.consumers;
}

// Shared memory of a Hopper row's kernel (kernels/sm90/gemm_sm90.cuh, Sm90Traits): its stages
// (BM + BN rows of one 128-byte k tile row each), one staging panel per consumer warpgroup
// (64 rows x 256 bytes), 1 KB of alignment slack; and the DeepSeek-V3 block scales of its fp8
// kernels' stages, (BM + 4) floats each, where those fit beside ~1 KB of static shared memory
// (Sm90StagesScales: the producer copies them with each stage; elsewhere the consumers load
// them from global memory, ~30% slower with block scales: benchmarks/NOTES.md v43).
inline constexpr int kSm90PanelBytes = 64 * 256;
constexpr int Sm90SmemBytes(const GemmConfig& c) {
  return c.stages * (c.bm + c.bn) * c.bk * 2 + c.consumers * kSm90PanelBytes + 1024;
}
constexpr int Sm90ScaleStride(const GemmConfig& c) { return (c.bm + 4) * 4; }  // per stage
constexpr int Sm90ScaleBytes(const GemmConfig& c) { return c.stages * Sm90ScaleStride(c); }
constexpr bool Sm90StagesScales(int cfg) {
  const GemmConfig& c = kConfigs[cfg];
  return c.kind == Kind::kSm90 && Sm90SmemBytes(c) + Sm90ScaleBytes(c) <= 226 * 1024;
}

// Whether config cfg has kernels for 16-bit operands: every row but the fp8-only and narrow ones.
constexpr bool Has16BitKernels(int cfg) {
  return !kConfigs[cfg].fp8_only && kConfigs[cfg].kind != Kind::kNarrow;
}

// Elements of one k tile of config cfg for operands of `bytes` bytes: BK counts 16-bit
// elements, a k tile is 2 BK bytes of K (sm90: one 128-byte swizzle row; sm80: BK 16-bit
// elements, or BK pairs of int8), so 8-bit operands take twice BK and float32 ones half.
constexpr int KTileElems(int cfg, int bytes) { return kConfigs[cfg].bk * 2 / bytes; }

// Names of all configs, in table order; built once.
inline const std::array<std::string, kNumConfigs>& ConfigNames() {
  static const std::array<std::string, kNumConfigs> names = [] {
    std::array<std::string, kNumConfigs> n;
    for (int i = 0; i < kNumConfigs; ++i) n[i] = ConfigName(kConfigs[i]);
    return n;
  }();
  return names;
}

// Index of the config called `name`, or -1. No allocation (runs on every launch).
inline int FindConfig(std::string_view name) {
  const auto& names = ConfigNames();
  for (int i = 0; i < kNumConfigs; ++i)
    if (names[i] == name) return i;
  return -1;
}

namespace detail {
constexpr bool EveryHopperRowHasFallback() {
  for (int i = 0; i < kNumConfigs; ++i)
    if (Sm80Fallback(i) < 0) return false;
  return true;
}
}  // namespace detail
static_assert(detail::EveryHopperRowHasFallback(), "an sm90 row needs an sm80 row with its BK");
namespace detail {
constexpr bool EveryRowHasElementLoads() {
  for (int i = 0; i < kNumConfigs; ++i)
    if (kConfigs[i].kind == Kind::kSm80 && ElementLoadsRow(i) < 0) return false;
  return true;
}
}  // namespace detail
static_assert(detail::EveryRowHasElementLoads(),
              "an sm80 row without element-wise loads needs a row with its BK that has them");

// Compile-time traits of sm80 config CFG: derived sizes, checked by static_assert.
template <int CFG>
struct ConfigTraits {
  static constexpr GemmConfig c = kConfigs[CFG];
  static constexpr int kBM = c.bm, kBN = c.bn, kBK = c.bk, kStages = c.stages;
  static constexpr int kWarpsM = c.warps_m, kWarpsN = c.warps_n, kWarpsK = c.warps_k;
  static constexpr int kWarpsMN = kWarpsM * kWarpsN;  // warps of one k group: the output tile
  static constexpr int kWarps = kWarpsMN * kWarpsK;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWM = kBM / kWarpsM;  // warp tile rows
  static constexpr int kWN = kBN / kWarpsN;  // warp tile cols
  static constexpr int kMI = kWM / 16;       // m16 mma tiles per warp
  static constexpr int kNI = kWN / 8;        // n8 mma tiles per warp
  static constexpr int kKSteps = kBK / 16;   // k16 mma steps per stage
  static constexpr int kKStepsW = kKSteps / kWarpsK;  // of them, per warp (its k group's)
  static constexpr int kElem = 2;            // bytes per operand element: the sm80 rows are
                                             // built for 16-bit operands (mma m16n8k16)
  static constexpr int kStageBytes = (kBM * kBK + kBK * kBN) * kElem;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  // Epilogue: each warp of k group 0 parks its whole warp tile as float32 (+ 16 B per row), so
  // that its accumulators are dead before the epilogue streams the tile out.
  static constexpr int kEpiRowBytes = kWN * 4 + 16;
  static constexpr int kEpiBytes = kWarpsMN * kWM * kEpiRowBytes;
  // Split-K reduced inside a cluster parks the whole float32 tile in shared memory, its rows
  // padded by 4 floats (conflict-free float2 stores).
  static constexpr int kClusterLd = kBN + 4;
  static constexpr int kClusterBytes = kBM * kClusterLd * 4;
  // Sliced K: k groups 1.. park their float32 tiles in the same layout for group 0 to add.
  static constexpr int kSliceBytes = (kWarpsK - 1) * kClusterBytes;
  static constexpr int kSmemBytes = std::max({kPipeBytes, kEpiBytes, kClusterBytes, kSliceBytes});
  // Small tiles (up to 32 KB of float32) reduce a two-slice cluster split by push
  // (gemm_sm80.cuh, cluster_push_reduce): the second slice stores its tile into a receive slot
  // of the leader's shared memory, past kSmemBytes; the launch adds kClusterBytes for it.
  static constexpr bool kPushReduce = kClusterBytes <= 32 * 1024;
  // Element-wise loads (operands that are not 16-byte aligned) hold every 16-byte chunk in 8
  // registers until it is in shared memory. Where a k tile's chunks do not fit next to the
  // accumulators and both fragment buffers with 63 registers to spare, the main loop loads
  // each k16 step's share of them after that step's mma, else it loads the whole tile at the
  // first step (one load latency per k tile).
  static constexpr int kChunksPerThread = (kBM + kBN) * kBK / 8 / kThreads;
  static constexpr bool kSplitElementLoads =
      kMI * kNI * 4 + 2 * (kMI * 4 + kNI * 2) + 8 * kChunksPerThread > 192;

  static_assert(kBM % (16 * kWarpsM) == 0, "warp tile rows must be a multiple of 16");
  static_assert(kBN % (16 * kWarpsN) == 0, "warp tile cols must be a multiple of 16 (x4 B loads)");
  static_assert(kBK % 32 == 0, "BK must be a multiple of 32 (4 swizzled 16-byte chunks per row)");
  // A k group's first step must start a group of eight 16-byte chunks of a K-major row (the
  // swizzle permutes within such groups; gemm_sm80.cuh, kgroup_offset).
  static_assert(kWarpsK == 1 || (kKSteps % kWarpsK == 0 && kKStepsW % 4 == 0),
                "sliced K needs 64 or more of every stage's K per k group");
  // M/N-contiguous tiles: rows of k*128 bytes, or (A only, for skinny M) of 32 or 64 bytes
  static_assert((kBM % 64 == 0 || kBM == 16 || kBM == 32) && kBN % 64 == 0,
                "M/N-contiguous tiles need 128-byte rows (BM may also be 16 or 32)");
  static_assert(c.kind == Kind::kSm80, "ConfigTraits describes sm80 (mma.sync) rows only");
  static_assert(kStages >= 2, "a pipeline needs at least two stages");
  static_assert((kBM * kBK / 8) % kThreads == 0 && (kBN * kBK / 8) % kThreads == 0,
                "every thread copies the same number of 16-byte chunks per stage");
  static_assert(!kSplitElementLoads || kStages >= 3,
                "a k tile loaded across the main loop's steps needs a stage in between");
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the sm_90 shared-memory limit per block");
  static_assert(!kPushReduce || (kSmemBytes % 16 == 0 && kSmemBytes + kClusterBytes <= 227 * 1024),
                "the push receive slot must fit after the block's shared memory");
};

}  // namespace tcgemm
