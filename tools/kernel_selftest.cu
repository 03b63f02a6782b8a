// Low-level check of the GEMM kernels without JAX: every config x layout x dtype x output type
// on aligned and unaligned shapes against a float64 host reference, then the time of large
// square products. Build and run (on the GPU machine):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iffi -c \
//        ffi/kernels/sm90/kernels_sm90.cu -o /tmp/sm90.o
//   nvcc -std=c++17 -O3 -arch=sm_90 -Iffi --threads 0 /tmp/sm90.o tools/kernel_selftest.cu \
//        ffi/host/gemm_dispatch.cc ffi/kernels/sm80/kernels_f16.cu ffi/kernels/sm80/kernels_bf16.cu \
//        ffi/kernels/aux/reduce.cu ffi/kernels/aux/pack.cu -o /tmp/selftest
//   (no -x cu: it would apply to sm90.o as well; tools/sanitize.sh builds the same objects)
//   /tmp/selftest              # full case list, then timings
//   /tmp/selftest --timings    # the timings only
//   /tmp/selftest --time B M N K [SPLIT...]  # per-launch time under graph replay (env:
//                              # TIME_NT: layout NT; TIME_PACK: the packing alone too;
//                              # TIME_NOPACK: 16-byte-multiple rows unpacked)
//   /tmp/selftest --clusters   # resident blocks per SM and clusters of 2, 4, 8 per config
//   /tmp/selftest --sanitize   # one small problem per config x layout x dtype x aligned/unaligned
//                              # loader (output types and split-K rotating), no timings: the case
//                              # list that tools/sanitize.sh runs under compute-sanitizer
// Device buffers have exactly the problem's size (no slack), so memcheck sees any overrun.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <cstdio>
#include <random>
#include <vector>

#include "host/gemm_config.h"
#include "host/gemm_dispatch.h"

using namespace tcgemm;

#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

static float to_f(uint16_t bits, InType t) {
  if (t == InType::kF16) { __half h; std::memcpy(&h, &bits, 2); return __half2float(h); }
  __nv_bfloat16 h; std::memcpy(&h, &bits, 2); return __bfloat162float(h);
}
static uint16_t from_f(float x, InType t) {
  uint16_t bits;
  if (t == InType::kF16) { __half h = __float2half_rn(x); std::memcpy(&bits, &h, 2); }
  else { __nv_bfloat16 h = __float2bfloat16_rn(x); std::memcpy(&bits, &h, 2); }
  return bits;
}

// Returns relative Frobenius error of the kernel against a float64 reference.
static void* dev_alloc(size_t bytes) {  // exact size (>= 1 byte: cudaMalloc of 0 gives no buffer)
  void* p = nullptr;
  CK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}

static double check(int cfg, InType it, OutType ot, bool ta, bool tb, int64_t batch, int64_t m,
                    int64_t n, int64_t k, bool share_b, std::mt19937& rng, int split_k = 1,
                    bool pack = false) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t bb = share_b ? 1 : batch;
  std::vector<uint16_t> a(batch * m * k), b(bb * k * n);
  for (auto& x : a) x = from_f(nd(rng), it);
  for (auto& x : b) x = from_f(nd(rng), it);
  const int osz = ot == OutType::kF32 ? 4 : 2;
  void* da = dev_alloc(a.size() * 2);
  void* db = dev_alloc(b.size() * 2);
  void* dc = dev_alloc(batch * m * n * osz);
  CK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dc, 0xFF, batch * m * n * osz));  // poison: NaN in every output type
  GemmProblem pr{};
  pr.params = {da, db, dc, m, n, k, batch, m * k, share_b ? 0 : k * n, ot, 0, 0};
  pr.in_type = it; pr.transpose_a = ta; pr.transpose_b = tb; pr.config = cfg;
  pr.params.split_k = split_k;
  pr.pack = pack;
  float* ws = nullptr;  // split-K partials and packed operands: exactly what the plan says
  const WorkspacePlan wp = PlanWorkspace(pr);
  if (const int64_t f = wp.total(); f > 0) ws = static_cast<float*>(dev_alloc(f * 4));
  pr.workspace = ws;
  std::string err = LaunchGemm(pr, wp, 0);
  if (!err.empty()) { std::printf("launch failed: %s\n", err.c_str()); std::exit(1); }
  CK(cudaDeviceSynchronize());
  std::vector<uint8_t> c(batch * m * n * osz);
  CK(cudaMemcpy(c.data(), dc, c.size(), cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t l = 0; l < k; ++l) {
          const uint16_t av = ta ? a[z * m * k + l * m + i] : a[z * m * k + i * k + l];
          const int64_t zb = share_b ? 0 : z;
          const uint16_t bv = tb ? b[zb * k * n + j * k + l] : b[zb * k * n + l * n + j];
          ref += double(to_f(av, it)) * double(to_f(bv, it));
        }
        const int64_t idx = (z * m + i) * n + j;
        double got;
        if (ot == OutType::kF32) { float f; std::memcpy(&f, &c[idx * 4], 4); got = f; }
        else { uint16_t h; std::memcpy(&h, &c[idx * 2], 2);
               got = to_f(h, ot == OutType::kF16 ? InType::kF16 : InType::kBF16); }
        if (!std::isfinite(got)) return INFINITY;
        num += (got - ref) * (got - ref);
        den += ref * ref;
      }
  CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dc)); CK(cudaFree(ws));
  return std::sqrt(num / (den > 0 ? den : 1));
}

// Random (batch x) M x N x K operands (A stored M x K; B K x N, or N x K with tb), C of the
// input type, and the workspace PlanWorkspace asks for: the problem the timings launch.
struct TimedProblem {
  GemmProblem pr{};
  WorkspacePlan wp;
  TimedProblem(int cfg, InType it, int64_t batch, int64_t m, int64_t n, int64_t k, int split,
               bool pack, bool tb) {
    void *da, *db, *dc;
    CK(cudaMalloc(&da, batch * m * k * 2)); CK(cudaMalloc(&db, batch * k * n * 2));
    CK(cudaMalloc(&dc, batch * m * n * 2));
    std::vector<uint16_t> h(batch * std::max(m, n) * k);
    std::mt19937 rng(1); std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& x : h) x = from_f(nd(rng), it);
    CK(cudaMemcpy(da, h.data(), batch * m * k * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, h.data(), batch * k * n * 2, cudaMemcpyHostToDevice));
    pr.params = {da, db, dc, m, n, k, batch, m * k, k * n,
                 it == InType::kF16 ? OutType::kF16 : OutType::kBF16, 0, 0};
    pr.params.split_k = split;
    pr.in_type = it; pr.config = cfg; pr.pack = pack; pr.transpose_b = tb;
    wp = PlanWorkspace(pr);
    if (const int64_t w = wp.total(); w > 0) CK(cudaMalloc(&pr.workspace, w * 4));
  }
  ~TimedProblem() {
    cudaFree(const_cast<void*>(pr.params.a)); cudaFree(const_cast<void*>(pr.params.b));
    cudaFree(pr.params.c); cudaFree(pr.workspace);
  }
  void launch(cudaStream_t st) const {
    std::string err = LaunchGemm(pr, wp, st);
    if (!err.empty()) { std::printf("launch failed: %s\n", err.c_str()); std::exit(1); }
  }
};

// Median milliseconds of `run(st)` on stream st over `reps` runs after 2 warm-up runs (CUDA
// events around each run).
template <typename F>
static double median_ms(cudaStream_t st, int reps, F run) {
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < reps + 2; ++r) {
    CK(cudaEventRecord(e0, st));
    run(st);
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float t; cudaEventElapsedTime(&t, e0, e1);
    if (r >= 2) ms.push_back(t);
  }
  CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Median milliseconds of one LaunchGemm (after 2 warm-up launches) on random M x N x K operands
// (NN); with `pack`, misaligned operands are first packed in the workspace.
static double time_gemm(int cfg, InType it, int64_t m, int64_t n, int64_t k, bool pack, int reps) {
  const TimedProblem tp(cfg, it, 1, m, n, k, 1, pack, false);
  return median_ms(0, reps, [&](cudaStream_t st) { tp.launch(st); });
}

// Microseconds per call of `launch` as the GPU runs it back to back: 20 calls captured into a
// CUDA graph (no host launch cost between them, as under XLA's command buffers), the median of
// 7 replays / 20.
template <typename F>
static double graph_us(F launch) {
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  launch(st);  // first call outside the capture (sets function attributes)
  CK(cudaStreamSynchronize(st));
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 20; ++i) launch(st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  const double ms = median_ms(st, 7, [&](cudaStream_t s) { CK(cudaGraphLaunch(ge, s)); });
  CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g)); CK(cudaStreamDestroy(st));
  return ms * 1e3 / 20;
}

// Graph-timed (batch x) M x N x K f16 product, NN (NT with $TIME_NT set), split_k slices,
// misaligned operands packed (unless $TIME_NOPACK is set: rows that are 16-byte multiples then
// run as stored); config -1: the packing alone (what LaunchGemm would copy).
static double time_graph(int cfg, int64_t batch, int64_t m, int64_t n, int64_t k, int split) {
  const TimedProblem tp(cfg < 0 ? 0 : cfg, InType::kF16, batch, m, n, k, split,
                        std::getenv("TIME_NOPACK") == nullptr, std::getenv("TIME_NT") != nullptr);
  if (cfg >= 0) return graph_us([&](cudaStream_t st) { tp.launch(st); });
  PackJob jobs[2];
  GemmParams packed = tp.pr.params;  // PackOperands points it at the copies (unused here)
  const int count = PackOperands(tp.pr, tp.wp, packed, jobs);
  return count ? graph_us([&](cudaStream_t st) { CK(LaunchPack(jobs, count, st)); }) : 0.0;
}

static double tflops(int64_t m, int64_t n, int64_t k, double ms) {
  return 2.0 * m * n * k / (ms * 1e-3) / 1e12;
}

// Configs whose name contains $SELFTEST_CONFIGS (all when unset): a quicker run for one kind.
static bool selected(int cfg) {
  const char* f = std::getenv("SELFTEST_CONFIGS");
  return !f || ConfigName(kConfigs[cfg]).find(f) != std::string::npos;
}

static const char* kLayouts[] = {"NN", "NT", "TN", "TT"};

static bool within_bound(double e, int ot) { return e <= (ot == 2 ? 1e-5 : ot == 0 ? 1e-3 : 5e-3); }

// The small case list for compute-sanitizer: per config, every layout x input type on an
// aligned shape (cp.async path) and an unaligned one (element loads), with K spanning more
// k tiles than pipeline stages (so stages are reused: racecheck sees the WAR hazards) and M, N
// more than one tile; output type, a shared (stride-0) B, split-K and packing rotate over the
// cases;
// plus K = 0 and 1x1x1 per config, and one packed product whose rows of 520 elements are 16-byte
// but not 32-byte multiples (copied into rows of 576 as they are; layout and input type rotate).
static int sanitize_cases() {
  std::mt19937 rng(4321);
  int failures = 0, cases = 0;
  // unaligned, aligned (K: 10 k tiles of 64, more than any row's stages: every stage reused)
  const int64_t shapes[2][4] = {{2, 131, 67, 389}, {2, 136, 264, 584}};
  for (int cfg = 0; cfg < kNumConfigs; ++cfg) {
    if (!selected(cfg)) continue;
    for (int it = 0; it < 2; ++it)
      for (int l = 0; l < 4; ++l)
        for (int al = 0; al < 2; ++al) {
          const int64_t* s = shapes[al];
          const int ot = (l + it + al) % 3, split = (l + it + al) % 4 == 3 ? 3 : 1;
          const bool share = (cfg + l + al) % 2, pack = (cfg + it + l) % 2;
          const double e = check(cfg, InType(it), OutType(ot), l >> 1, l & 1, s[0], s[1], s[2],
                                 s[3], share, rng, split, pack);
          ++cases;
          if (!within_bound(e, ot)) {
            ++failures;
            std::printf("FAIL %s in=%d out=%d %s b=%ld %ldx%ldx%ld share_b=%d split_k=%d pack=%d "
                        "err=%.3g\n", ConfigName(kConfigs[cfg]).c_str(), it, ot, kLayouts[l], s[0],
                        s[1], s[2], s[3], share, split, pack, e);
          }
        }
    for (const int64_t k : {0, 1}) {
      const double e = check(cfg, InType::kBF16, OutType::kF32, false, true, 1, k ? 1 : 70,
                             k ? 1 : 33, k, false, rng);
      ++cases;
      if (!within_bound(e, 2)) {
        ++failures;
        std::printf("FAIL %s K=%ld err=%.3g\n", ConfigName(kConfigs[cfg]).c_str(), k, e);
      }
    }
    {  // rows of 520 in every layout (NN, NT: both operands; TN, TT: B; A has rows of 72)
      const int l = cfg % 4;
      const double e = check(cfg, InType(cfg % 2), OutType::kF32, l >> 1, l & 1, 1, 72, 520, 520,
                             false, rng, 1, true);
      ++cases;
      if (!within_bound(e, 2)) {
        ++failures;
        std::printf("FAIL %s %s 72x520x520 pack=1 err=%.3g\n", ConfigName(kConfigs[cfg]).c_str(),
                    kLayouts[l], e);
      }
    }
  }
  std::printf("selftest --sanitize: %d cases, %d failures\n", cases, failures);
  CK(cudaDeviceReset());  // lets memcheck's leak check see every allocation released
  return failures ? 1 : 0;
}

// How many thread block clusters of each split-K size can be resident at once, per config
// (cudaOccupancyMaxActiveClusters): the waves of a cluster split-K launch, for the cost model.
static int cluster_occupancy() {
  for (int cfg = 0; cfg < kNumConfigs; ++cfg) {
    if (kConfigs[cfg].kind != Kind::kSm80) continue;  // sm90 rows: no cluster launches
    const KernelEntry k = KernelF16(cfg, VariantIndex(false, false, true));
    CK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem_bytes));
    int blocks = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.fn, k.threads, k.smem_bytes));
    cudaFuncAttributes fa{};
    CK(cudaFuncGetAttributes(&fa, k.fn));
    std::printf("%s %d registers, %zu B local; blocks/SM %d; max active clusters:",
                ConfigName(kConfigs[cfg]).c_str(), fa.numRegs, fa.localSizeBytes, blocks);
    for (int s : {2, 4, 8}) {
      cudaLaunchConfig_t launch{};
      launch.gridDim = dim3(1024, s, 1);
      launch.blockDim = dim3(k.threads);
      launch.dynamicSmemBytes = k.smem_bytes;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = 1; attr[0].val.clusterDim.y = s; attr[0].val.clusterDim.z = 1;
      launch.attrs = attr; launch.numAttrs = 1;
      int clusters = 0;
      CK(cudaOccupancyMaxActiveClusters(&clusters, k.fn, &launch));
      std::printf(" %d x %d", clusters, s);
    }
    std::printf("\n");
  }
  return 0;
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout's kill
  if (argc > 1 && std::strcmp(argv[1], "--sanitize") == 0) return sanitize_cases();
  if (argc > 1 && std::strcmp(argv[1], "--clusters") == 0) return cluster_occupancy();
  if (argc > 5 && std::strcmp(argv[1], "--time") == 0) {  // --time B M N K SPLIT...
    const int64_t b = std::atoll(argv[2]), m = std::atoll(argv[3]), n = std::atoll(argv[4]),
                  k = std::atoll(argv[5]);
    if (std::getenv("TIME_PACK"))
      std::printf("pack %ldx%ldx%ldx%ld: %.2f us\n", b, m, n, k, time_graph(-1, b, m, n, k, 1));
    for (int cfg = 0; cfg < kNumConfigs; ++cfg)
      for (int i = 6; i < std::max(argc, 7) && selected(cfg); ++i) {
        const int split = i < argc ? std::atoi(argv[i]) : 1;
        const double us = time_graph(cfg, b, m, n, k, split);
        std::printf("%s %ldx%ldx%ldx%ld split %d: %.2f us (%.1f TFLOP/s)\n",
                    ConfigName(kConfigs[cfg]).c_str(), b, m, n, k, split, us,
                    2.0 * b * m * n * k / us * 1e-6);
      }
    return 0;
  }
  std::mt19937 rng(1234);
  int failures = 0, cases = 0;
  const char* const* ln = kLayouts;
  const bool timings_only = argc > 1 && std::strcmp(argv[1], "--timings") == 0;
  const int64_t shapes[][4] = {{1, 1, 1, 1}, {1, 17, 33, 65}, {1, 128, 256, 64}, {3, 127, 129, 255},
                               {2, 256, 128, 96}, {1, 200, 72, 0}};
  for (int cfg = 0; cfg < (timings_only ? 0 : kNumConfigs); ++cfg)
    for (int it = 0; it < (selected(cfg) ? 2 : 0); ++it)
      for (int ot = 0; ot < 3; ++ot)
        for (int l = 0; l < 4; ++l)
          for (const auto& s : shapes) {
            const bool share = s[0] > 1 && (l & 1), pack = (cfg + ot + l) % 2;
            double e = check(cfg, InType(it), OutType(ot), l >> 1, l & 1, s[0], s[1], s[2], s[3],
                             share, rng, 1, pack);
            ++cases;
            if (!within_bound(e, ot)) {
              ++failures;
              std::printf("FAIL %s in=%d out=%d %s b=%ld %ldx%ldx%ld share_b=%d pack=%d err=%.3g\n",
                          ConfigName(kConfigs[cfg]).c_str(), it, ot, ln[l], s[0], s[1], s[2],
                          s[3], share, pack, e);
            }
          }
  // sm90 rows past their stages, over more work items than SMs (the persistent loop), batched
  // with a shared B, split-K through the workspace; every layout, input and output type.
  for (int cfg = 0; cfg < (timings_only ? 0 : kNumConfigs); ++cfg) {
    if (kConfigs[cfg].kind != Kind::kSm90 || !selected(cfg)) continue;
    for (int it = 0; it < 2; ++it)
      for (int l = 0; l < 4; ++l) {
        // Multiples of 8 (TMA-addressable) but not of the tiles; layout TT: K = 393, packed.
        const int ot = (it + l) % 3, split = l == 1 ? 2 : 1;
        const bool share = l & 1, pack = l == 3;
        const int64_t s[4] = {36, 136, 264, pack ? 393 : 392};  // 144+ work items, 7 k tiles
        const double e = check(cfg, InType(it), OutType(ot), l >> 1, l & 1, s[0], s[1], s[2],
                               s[3], share, rng, split, pack);
        ++cases;
        if (!within_bound(e, ot)) {
          ++failures;
          std::printf("FAIL %s in=%d out=%d %s b=%ld %ldx%ldx%ld share_b=%d split_k=%d err=%.3g\n",
                      ConfigName(kConfigs[cfg]).c_str(), it, ot, ln[l], s[0], s[1], s[2], s[3],
                      share, split, e);
        }
      }
  }
  if (!timings_only) std::printf("selftest: %d cases, %d failures\n", cases, failures);
  for (int cfg = 0; cfg < kNumConfigs; ++cfg)
    for (int64_t s : {4096, 8192}) if (selected(cfg))
      std::printf("%s f16 %ld^3: %.1f TFLOP/s | bf16: %.1f TFLOP/s\n",
                  ConfigName(kConfigs[cfg]).c_str(), s,
                  tflops(s, s, s, time_gemm(cfg, InType::kF16, s, s, s, false, 7)),
                  tflops(s, s, s, time_gemm(cfg, InType::kBF16, s, s, s, false, 7)));
  // The unaligned case of the benchmark, packed and element-wise, next to its padded shape.
  for (int cfg = 0; cfg < kNumConfigs; ++cfg)
    if (selected(cfg)) std::printf("%s f16 4095x4097x4093: packed %.1f us, element-wise %.1f us; "
                "4096x4104x4096: %.1f us\n", ConfigName(kConfigs[cfg]).c_str(),
                1e3 * time_gemm(cfg, InType::kF16, 4095, 4097, 4093, true, 7),
                1e3 * time_gemm(cfg, InType::kF16, 4095, 4097, 4093, false, 7),
                1e3 * time_gemm(cfg, InType::kF16, 4096, 4104, 4096, false, 7));
  return failures ? 1 : 0;
}
