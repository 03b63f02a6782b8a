// Launch of one GEMM: picks the kernel variant for the layout and alignment, raises its
// shared-memory limit once per device, and launches it on the caller's stream.
#include "host/gemm_dispatch.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "host/gemm_config.h"

namespace tcgemm {
namespace {

constexpr int kMaxDevices = 64;

// One bit per device: cudaFuncAttributeMaxDynamicSharedMemorySize already set for the kernel.
std::atomic<uint64_t> g_smem_configured[kNumDTypes][kNumConfigs][kVariants];  // by operand type
std::atomic<uint64_t> g_ragged_smem_configured[kNumDTypes][kNumConfigs][kVariants];  // grouped

std::string CudaError(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

int64_t KTiles(const GemmProblem& pr) {  // k tiles of the whole K
  const int64_t bk = KTileElems(pr.config, DTypeBytes(pr.in_type));
  return (pr.params.k + bk - 1) / bk;
}

// k tiles per slice when K is cut into (at most) split_k slices.
int64_t KTilesPerSplit(const GemmProblem& pr) {
  const int64_t split = std::max(pr.params.split_k, 1);
  return std::max<int64_t>(1, (KTiles(pr) + split - 1) / split);
}

// Compute capability (major * 10 + minor) and multiprocessor count of `device`, asked once per
// device; {0, 0} if the runtime cannot say.
struct DeviceInfo {
  int cc = 0, sms = 0;
};
DeviceInfo Info(int device) {
  static std::atomic<int> cc[kMaxDevices] = {}, sms[kMaxDevices] = {};  // 0: not asked yet
  auto ask = [device](cudaDeviceAttr a) {
    int v = 0;
    return cudaDeviceGetAttribute(&v, a, device) == cudaSuccess ? v : 0;
  };
  if (device < 0 || device >= kMaxDevices)
    return {ask(cudaDevAttrComputeCapabilityMajor) * 10 + ask(cudaDevAttrComputeCapabilityMinor),
            ask(cudaDevAttrMultiProcessorCount)};
  if (cc[device].load(std::memory_order_relaxed) == 0) {
    const int s = ask(cudaDevAttrMultiProcessorCount);
    const int c = ask(cudaDevAttrComputeCapabilityMajor) * 10 +
                  ask(cudaDevAttrComputeCapabilityMinor);
    if (s <= 0 || c <= 0) return {c, s};  // a failed query is asked again next time
    sms[device].store(s, std::memory_order_relaxed);
    cc[device].store(c, std::memory_order_release);  // published after sms
  }
  const int c = cc[device].load(std::memory_order_acquire);
  return {c, sms[device].load(std::memory_order_relaxed)};
}

// The split-K reduction of `split` float32 partials (in pr.workspace) through the epilogue
// into D, for the product p describes (pr's, or its tail's).
std::string ReduceSplits(const GemmProblem& pr, const GemmParams& p, int split,
                         cudaStream_t stream) {
  const cudaError_t e = LaunchSplitKReduce(p, pr.workspace, split, pr.in_type == DType::kS8,
                                           stream);
  return e == cudaSuccess ? std::string() : CudaError("split-K reduction launch", e);
}

// The tail of a tail-split problem (GemmProblem::tail_rows): its last tail_rows rows in
// tail_split slices, as a problem of its own (for EffectiveSplitK and KTilesPerSplit).
GemmProblem TailProblem(const GemmProblem& pr) {
  GemmProblem t = pr;
  t.params.m = pr.tail_rows;
  t.params.split_k = pr.tail_split;
  t.tail_rows = 0;
  t.tail_split = 1;
  return t;
}

// A tail-split problem on its sm90 row, p as LaunchGemm prepared it for the whole product
// (split 1): the head rows [0, M - tail_rows) in one launch, then the tail rows, offset in A, D,
// C and aux, in their slices through the workspace, and the reduction of those slices.
std::string LaunchSm90Tail(const GemmProblem& pr, const GemmParams& p, int config,
                           const GemmConfig& cfg, bool a_kmajor, bool b_kmajor, int device,
                           int sms, cudaStream_t stream) {
  const int64_t head = p.m - pr.tail_rows;
  GemmParams h = p;
  h.m = head;
  h.tiles_m = static_cast<int>((head + cfg.bm - 1) / cfg.bm);
  if (std::string err = LaunchSm90(h, config, pr.in_type, pr.in_type, a_kmajor, b_kmajor, false,
                                   device, sms, stream);
      !err.empty())
    return err;
  const GemmProblem tp = TailProblem(pr);
  const int split = EffectiveSplitK(tp);
  GemmParams t = p;
  t.m = pr.tail_rows;
  t.tiles_m = static_cast<int>((t.m + cfg.bm - 1) / cfg.bm);
  t.split_k = split;
  t.k_tiles_per_split = static_cast<int>(KTilesPerSplit(tp));
  t.partial = split > 1 ? pr.workspace : nullptr;
  const int64_t d_bytes = DTypeBytes(p.d_type);
  t.a = static_cast<const char*>(p.a) + head * (a_kmajor ? p.lda : 1) * DTypeBytes(pr.in_type);
  t.d = static_cast<char*>(p.d) + head * p.n * d_bytes;
  if (t.epi.c)
    t.epi.c = static_cast<const char*>(t.epi.c) + head * t.epi.c_sr * DTypeBytes(t.epi.c_type);
  if (t.epi.aux) t.epi.aux = static_cast<char*>(t.epi.aux) + head * p.n * d_bytes;
  if (std::string err = LaunchSm90(t, config, pr.in_type, pr.in_type, a_kmajor, b_kmajor, false,
                                   device, sms, stream);
      !err.empty())
    return err;
  return split > 1 ? ReduceSplits(pr, t, split, stream) : std::string();
}

}  // namespace

int DeviceSms(int device) { return Info(device).sms; }

std::string RaiseSmemLimit(const void* fn, int bytes, std::atomic<uint64_t>& done, int device) {
  const uint64_t bit = device >= 0 && device < kMaxDevices ? uint64_t(1) << device : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return {};
  const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return CudaError("cudaFuncSetAttribute", e);
  done.fetch_or(bit, std::memory_order_release);
  return {};
}

int EffectiveSplitK(const GemmProblem& pr) {
  const int64_t per = KTilesPerSplit(pr);
  return static_cast<int>(std::max<int64_t>(1, (KTiles(pr) + per - 1) / per));
}

WorkspacePlan PlanWorkspace(const GemmProblem& pr) {
  const GemmParams& p = pr.params;
  WorkspacePlan w;
  // Rounded up to 32 floats: the packed copies after the partials start on 128 bytes (the pack
  // kernel's 16-byte stores, cp.async and TMA need 16) whatever split * batch * M * N is.
  // A tail split: the tail's partials (its head runs in one slice).
  const GemmProblem& sp = pr.tail_rows > 0 ? TailProblem(pr) : pr;
  if (const int split = EffectiveSplitK(sp); split > 1)
    w.split_floats = (int64_t(split) * p.batch * sp.params.m * p.n + 31) / 32 * 32;
  auto operand = [&](bool kmajor, int64_t outer_km, int64_t stride) {
    PackedOperand o;
    o.cols = kmajor ? p.k : outer_km;           // contiguous extent
    const int64_t outer = kmajor ? outer_km : p.k;
    o.rows = (stride == 0 ? 1 : p.batch) * outer;
    o.packed = pr.pack && NeedsPack(o.cols) && o.rows > 0;
    if (o.packed) {
      o.ld = PackedLd(o.cols);
      o.floats = o.rows * o.ld / 2;  // 2-byte elements; ld % 8 == 0 keeps it a multiple of 4
    }
    return o;
  };
  if (IsByteOperand(pr.in_type)) {
    if (pr.pack && !pr.transpose_b && kConfigs[pr.config].kind != Kind::kNarrow) {
      PackedOperand& b = w.b;
      b.transposed = true;
      b.rows = (p.stride_b == 0 ? 1 : p.batch) * p.n;
      b.cols = b.ld = p.k;
      b.floats = (b.rows * b.cols + 127) / 128 * 32;  // bytes, in floats, 128-byte multiples
    }
    return w;
  }
  w.a = operand(!pr.transpose_a, p.m, p.stride_a);
  w.b = operand(pr.transpose_b, p.n, p.stride_b);
  return w;
}

int PackOperands(const GemmProblem& pr, const WorkspacePlan& wp, GemmParams& p,
                 PackJob (&jobs)[2]) {
  int count = 0;
  char* at = reinterpret_cast<char*>(pr.workspace + wp.split_floats);
  auto pack = [&](const PackedOperand& o, const void*& data, int64_t& ld, int64_t& stride) {
    auto* dst = reinterpret_cast<uint16_t*>(at);
    jobs[count++] = {static_cast<const uint16_t*>(data), dst, o.rows, o.cols, o.ld};
    if (stride != 0) stride = stride / o.cols * o.ld;  // outer extent x padded row
    data = dst;
    ld = o.ld;
    at += o.floats * sizeof(float);
  };
  if (wp.a.packed) pack(wp.a, p.a, p.lda, p.stride_a);
  if (wp.b.packed) pack(wp.b, p.b, p.ldb, p.stride_b);
  return count;
}

std::string LaunchGemm(const GemmProblem& pr, const WorkspacePlan& wp,
                       cudaStream_t stream) {
  GemmParams p = pr.params;
  const bool a_kmajor = !pr.transpose_a, b_kmajor = pr.transpose_b || wp.b.transposed;
  p.lda = a_kmajor ? p.k : p.m;  // as stored: the contiguous extent (B: as the GEMM reads it)
  p.ldb = b_kmajor ? p.k : p.n;
  // 8-bit B stored N-major: the GEMM reads the K-major copy (launched once the problem passed
  // the checks below); same batch stride (N x K either way)
  TransposeJob transpose{static_cast<const uint8_t*>(p.b), nullptr,
                         p.stride_b == 0 ? 1 : p.batch, p.k, p.n};
  if (wp.b.transposed)
    p.b = transpose.dst = reinterpret_cast<uint8_t*>(pr.workspace + wp.split_floats);

  // Operands with rows that are not 16-byte multiples: padded copies in the workspace first.
  PackJob jobs[2];
  if (const int count = PackOperands(pr, wp, p, jobs); count > 0)
    if (cudaError_t e = LaunchPack(jobs, count, stream); e != cudaSuccess)
      return CudaError("operand packing launch", e);

  // 16-byte cp.async needs every row (and batch item) of both operands to start on 16 bytes:
  // leading dimensions that are multiples of 8 elements, 16-byte aligned bases.
  const bool aligned = p.lda % 8 == 0 && p.ldb % 8 == 0 && Aligned16(p.a) && Aligned16(p.b);
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return CudaError("cudaGetDevice", e);
  const DeviceInfo dev = Info(device);

  // An sm90 row runs the Hopper kernel on compute capability 9.0 when TMA can address both
  // operands (16-byte aligned rows and batch items); otherwise its sm80 fallback (same BK).
  int config = pr.config;
  const bool ragged = p.ragged.mode != RaggedMode::kNone;
  const bool byte = IsByteOperand(pr.in_type);
  const bool kmajor_only = KMajorOnly(pr.in_type) || pr.promote;
  if (kmajor_only) {
    // 8-bit, float32 (TF32) and promoted float16 operands: the sm90 kernels (wgmma reads them
    // K-major; promoted kernels exist so only), and for int8 also the sm80 rows (mma.sync
    // m16n8k32, K-major; an sm90 row with int8 kernels runs as its sm80 fallback off compute
    // capability 9.0, as 16-bit products do); A and B of the same family, 16-byte aligned rows
    // (TMA, and the int8 sm80 kernels' cp.async), no grouping; no packing but 8-bit B's K-major
    // copy (PlanWorkspace); their rows (HasByteKernels, HasTf32Kernels). The Python layer routes
    // every other case through lax (or makes the operands so).
    const std::string what = byte ? "8-bit" : pr.promote ? "promoted float16" : "float32";
    if (pr.promote ? pr.in_type != DType::kF16 || pr.b_type != DType::kF16
                   : IsByteOperand(pr.b_type) != byte || !KMajorOnly(pr.b_type))
      return pr.promote ? "promoted operands are float16 x float16" : what + " A needs " + what + " B";
    const bool int8 = pr.in_type == DType::kS8;
    const bool narrow = kConfigs[config].kind == Kind::kNarrow;
    if (int8 && kConfigs[config].kind == Kind::kSm90 && HasByteKernels(config, false) &&
        dev.cc != 90)
      config = Sm80Fallback(config);
    if (narrow) {
      // mma.sync m16n8k32: int8 from sm_80, the fp8 pairs from sm_89 (built for 9.0 and newer)
      if (!byte || dev.cc < (int8 ? 80 : 90))
        return "narrow rows run 8-bit operands: int8 from compute capability 8.0, fp8 from 9.0 "
               "(this GPU: " + std::to_string(dev.cc) + ", config " + ConfigNames()[config] + ")";
      if (p.m > kConfigs[config].bm)
        return "narrow row " + ConfigNames()[config] + " takes at most " +
               std::to_string(kConfigs[config].bm) + " rows (M = " + std::to_string(p.m) + ")";
      if (b_kmajor || p.n % 8 != 0)
        return "narrow rows read B N-major ([K][N], as stored) with N a multiple of 8 (got " +
               std::string(b_kmajor ? "B K-major" : "N = " + std::to_string(p.n)) + ")";
    } else if (!(int8 && kConfigs[config].kind == Kind::kSm80) &&
               (kConfigs[config].kind != Kind::kSm90 || dev.cc != 90)) {
      return what + " operands run on the sm90 kernels on compute capability 9.0 only" +
             (byte ? std::string(" (int8 also on the sm80 and narrow rows)") : std::string()) +
             " (this GPU: " + std::to_string(dev.cc) + ", config " + ConfigNames()[config] + ")";
    }
    if (!a_kmajor || (!b_kmajor && !narrow))
      return what + " operands are read K-major: A [M][K], B [N][K]";
    if (ragged || (pr.pack && !byte))
      return what + " operands run without grouping" + (byte ? "" : " or packing");
    const int64_t row16 = 16 / DTypeBytes(pr.in_type);  // elements in 16 bytes
    if (p.k % row16 != 0 || p.stride_a % row16 != 0 || p.stride_b % row16 != 0 ||
        !Aligned16(p.a) || !Aligned16(p.b))
      return what + " operands need 16-byte aligned rows (K a multiple of " +
             std::to_string(row16) + ") and bases";
  }
  if (!kmajor_only && !Has16BitKernels(config))
    return "config " + ConfigNames()[config] + " has kernels for " +
           (kConfigs[config].kind == Kind::kNarrow ? "8-bit" : "fp8") + " operands only";
  if (p.d_type == DType::kS32 && pr.in_type != DType::kS8)
    return "an int32 result is the product of int8 operands";
  if (!byte && !pr.promote && (p.epi.row_scale || p.epi.col_scale))
    return "row and column scales go with 8-bit or promoted float16 operands";
  if (!byte && (p.block_sa || p.block_sb)) return "block scales go with 8-bit operands";
  if (p.piece_scale_k != 0 &&
      (!pr.promote || p.piece_scale_k < 0 || p.piece_scale_k > p.k ||
       p.piece_scale_k % kPromotedKTile != 0 || !std::isfinite(p.piece_scale)))
    return "scaled pieces go with promoted float16 operands, below a multiple of " +
           std::to_string(kPromotedKTile) + " in [0, K] (got piece_scale_k = " +
           std::to_string(p.piece_scale_k) + " for K = " + std::to_string(p.k) +
           ") with a finite scale";
  if (p.block_sa && (p.block_sa_ld < p.m || p.block_sa_ld % 4 != 0 || !Aligned16(p.block_sa)))
    return "block scales of a need 16-byte aligned rows of at least M floats (a multiple of 4; "
           "got " + std::to_string(p.block_sa_ld) + " for M = " + std::to_string(p.m) + ")";
  if (ragged) {
    // Grouped products run on the rows with grouped kernels (HasRaggedKernels): sm90 rows on
    // compute capability 9.0 (the persistent scheduler), sm80 rows on any GPU (one block per
    // item of the work list); both read the group sizes on the device.
    if (!HasRaggedKernels(config))
      return "config " + ConfigNames()[config] + " has no grouped (ragged) kernel";
    if (kConfigs[config].kind == Kind::kSm90 && dev.cc != 90)
      return "an sm90 config runs grouped products on compute capability 9.0 only (this GPU: " +
             std::to_string(dev.cc) + "); name an sm80 config";
    if (!aligned) return "ragged products need operands whose rows are 16-byte multiples";
    if (EffectiveSplitK(pr) > 1) return "ragged products run without a K split";
    if (p.ragged.mode == RaggedMode::kContract && (a_kmajor || b_kmajor))
      return "a ragged contraction reads M-major A and N-major B";
    if (p.ragged.mode == RaggedMode::kRows && !a_kmajor)
      return "ragged rows read K-major A";
  }
  // (the handler checks a tail's range against M, batch 1 and split_k 1, as it checks split_k)
  if (pr.tail_rows != 0 &&
      ((p.m - pr.tail_rows) % 8 != 0 || pr.tail_split < 2 || kmajor_only || ragged ||
       kConfigs[config].kind != Kind::kSm90))
    return "a tail split takes 16-bit operands on an sm90 row, batch 1, split_k 1, head rows "
           "(M - tail_rows) a positive multiple of 8 and tail_split in [2, " +
           std::to_string(kMaxSplitK) + "] (got tail_rows " + std::to_string(pr.tail_rows) +
           ", tail_split " + std::to_string(pr.tail_split) + " for M = " + std::to_string(p.m) +
           ")";
  if (!kmajor_only && kConfigs[config].kind == Kind::kSm90 &&
      !(dev.cc == 90 && aligned && p.stride_a % 8 == 0 && p.stride_b % 8 == 0))
    config = Sm80Fallback(config);
  if (!kmajor_only && !aligned) config = ElementLoadsRow(config);  // (sm90: aligned or fell back)
  const GemmConfig& cfg = kConfigs[config];

  const int64_t tiles_m = (p.m + cfg.bm - 1) / cfg.bm, tiles_n = (p.n + cfg.bn - 1) / cfg.bn;
  if (tiles_m * tiles_n > INT32_MAX) return "problem too large: more than 2^31 output tiles";
  p.tiles_m = static_cast<int>(tiles_m);
  p.tiles_n = static_cast<int>(tiles_n);
  const int split = EffectiveSplitK(pr);
  p.split_k = split;
  p.k_tiles_per_split = static_cast<int>(KTilesPerSplit(pr));
  // Split-K: on sm_90+ with at most kMaxClusterSplit slices, the slices of an sm80 tile form one
  // thread block cluster and reduce through distributed shared memory; otherwise they write
  // float32 partials to the workspace and a second kernel sums them into C.
  p.cluster_reduce =
      cfg.kind == Kind::kSm80 && split > 1 && split <= kMaxClusterSplit && dev.cc >= 90;
  // Slices through the workspace store raw partials; the reduction runs the epilogue.
  p.partial = split > 1 && !p.cluster_reduce ? pr.workspace : nullptr;
  if (wp.b.transposed)
    if (cudaError_t e = LaunchTransposeBytes(transpose, stream); e != cudaSuccess)
      return CudaError("8-bit B transpose launch", e);
  if (cfg.kind == Kind::kNarrow) {
    if (std::string err = LaunchNarrow(p, config, pr.in_type, pr.b_type, device, stream);
        !err.empty())
      return err;
    return split > 1 ? ReduceSplits(pr, p, split, stream) : std::string();
  }
  if (cfg.kind == Kind::kSm90) {
    if (pr.tail_rows > 0)
      return LaunchSm90Tail(pr, p, config, cfg, a_kmajor, b_kmajor, device, dev.sms, stream);
    if (std::string err = LaunchSm90(p, config, pr.in_type, kmajor_only ? pr.b_type : pr.in_type,
                                     a_kmajor, b_kmajor, pr.promote, device, dev.sms, stream);
        !err.empty())
      return err;
    return split > 1 ? ReduceSplits(pr, p, split, stream) : std::string();
  }

  const int variant = VariantIndex(a_kmajor, b_kmajor, aligned);
  const KernelEntry k = ragged ? Sm80RaggedKernel(pr.in_type, config, variant)
                               : Sm80Kernel(pr.in_type, config, variant);
  if (!k.fn)
    return "no " + std::string(ragged ? "grouped " : "") + "kernel for config " +
           ConfigNames()[config] + " and this operand layout and alignment";
  // Two slices of a push-reducing config: the other slice stores its tile into the leader's
  // receive slot (8.3 vs 8.6 us for 16 x 4096^2; with 3 to 8 slices the leader alone adding
  // them all is slower than every slice summing a share, 9.9 / 11.3 / 19.1 vs 9.7 / 10.8 /
  // 14.5 us: benchmarks/NOTES.md v20).
  if (p.cluster_reduce && split == 2 && k.push_slot_bytes) p.cluster_reduce = 2;
  const int push_bytes = p.cluster_reduce == 2 ? k.push_slot_bytes : 0;
  auto& smem_done = ragged ? g_ragged_smem_configured[int(pr.in_type)][config][variant]
                           : g_smem_configured[int(pr.in_type)][config][variant];
  if (std::string err = RaiseSmemLimit(k.fn, k.smem_bytes + k.push_slot_bytes, smem_done, device);
      !err.empty())
    return err;

  // Grouped: one block per item of the work list (kernels/common/ragged.cuh), for the most
  // items any group sizes can give: rows, at most tiles_m + (groups with rows) tile rows per
  // tile column (each such group adds at most one partly filled tile row); the contraction,
  // every group's tiles_m x tiles_n tiles. Blocks past the real list only zero.
  int64_t blocks = tiles_m * tiles_n;
  if (p.ragged.mode == RaggedMode::kRows)
    blocks = (tiles_m + std::min<int64_t>(p.ragged.groups, p.m)) * tiles_n;
  else if (p.ragged.mode == RaggedMode::kContract)
    blocks = tiles_m * tiles_n * p.ragged.groups;
  if (blocks > INT32_MAX) return "problem too large: more than 2^31 thread blocks";
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(split),
                  static_cast<unsigned>(ragged ? 1 : std::min<int64_t>(p.batch, 65535)));
  void* args[] = {&p};
  cudaLaunchConfig_t launch{};
  launch.gridDim = grid;
  launch.blockDim = dim3(k.threads);
  launch.dynamicSmemBytes = static_cast<size_t>(k.smem_bytes + push_bytes);
  launch.stream = stream;
  cudaLaunchAttribute cluster[1];
  if (p.cluster_reduce) {
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = 1;
    cluster[0].val.clusterDim.y = static_cast<unsigned>(split);
    cluster[0].val.clusterDim.z = 1;
    launch.attrs = cluster;
    launch.numAttrs = 1;
  }
  cudaError_t e = cudaLaunchKernelExC(&launch, k.fn, args);
  if (e != cudaSuccess) return CudaError("cudaLaunchKernelExC", e);
  e = cudaGetLastError();
  if (e != cudaSuccess) return CudaError("kernel launch", e);
  return split > 1 && !p.cluster_reduce ? ReduceSplits(pr, p, split, stream) : std::string();
}

}  // namespace tcgemm
