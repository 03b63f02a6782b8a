// Low-level check of the GEMM kernels without JAX, against float64 host references: every
// config x layout x input type x output type on aligned and unaligned shapes; every config x
// split (1, 2, 4, 16: sm_90 reduces 2 and 4 in a cluster, 16 through the workspace) x fused
// epilogue (C in every broadcast form and type, bias, activations, alpha / beta as attributes
// or from device memory, the pre-activation to aux); the dact kernel; grouped (ragged)
// products on both kernel families (tools/selftest_ragged.cu); 8-bit products on the sm90
// rows and int8 on the sm80 rows (tools/selftest_byte.cu); then the time of large square
// products. Build: tools/sanitize.sh (SANITIZE_TOOLS="" to skip compute-sanitizer)
// compiles ffi/kernels/*/*.cu (kernels_sm90*.cu with -gencode=arch=compute_90a,code=sm_90a, the
// others -arch=sm_90), ffi/host/gemm_dispatch.cc and tools/*.cu, each with
// `nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Iffi -x cu -c`, in parallel, and links them
// with `nvcc -arch=sm_90` into build/sanitize/selftest.
// Modes (the checks end with a line `N passed, M failed`; exit status 1 on any failure):
//   selftest                  every check (plain, epilogue, dact, coverage), then the timings
//   selftest --checks         every check, no timings
//   selftest --quick          the reduced list that tools/sanitize.sh runs under compute-
//                             sanitizer (~250 small GEMM launches + 14 dact): every config x
//                             layout x input type x aligned/unaligned loader (every kernel
//                             variant) once, split / epilogue kind / packing / output type
//                             rotating so that every kernel path (sm80, sm90, cluster pull and
//                             push, workspace + reduce on sm80 and sm90 rows, pack) meets every
//                             epilogue kind; K = 0, 1x1x1 and 520-element rows per config; the
//                             dact kernel; grouped (ragged) products on every row with grouped
//                             kernels (tools/selftest_ragged.cu); 8-bit products (int8, fp8,
//                             every scale form) on every row with 8-bit kernels
//                             (tools/selftest_byte.cu). (--sanitize: the same.)
//   selftest --timings        the timings only
//   selftest --time B M N K [SPLIT...]  per-launch time under graph replay (env: TIME_NT: layout
//                             NT; TIME_PACK: the packing alone too; TIME_NOPACK: 16-byte-multiple
//                             rows unpacked; TIME_EPI=<kind name or index>: with that epilogue)
//   selftest --clusters       resident blocks per SM and clusters of 2, 4, 8 per config
// env: SELFTEST_CONFIGS=<substring>: only the configs whose name has it; SELFTEST_VERBOSE=1:
// a line for every case, with the kernel path it took.
// Device buffers have exactly the problem's size (no slack), so memcheck sees any overrun.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "selftest.cuh"

using namespace selftest;

namespace {

int device_cc() {
  int dev = 0, major = 0, minor = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major * 10 + minor;
}

// The plain product (no epilogue) of fresh random operands, checked against float64.
bool check(int cfg, InType it, DType ot, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
           int64_t k, bool share_b, int split, bool pack, int cc, std::mt19937& rng, Tally& t) {
  const Operands ops(it, ta, tb, batch, m, n, k, share_b, rng);
  return run_gemm(ops, cfg, split, pack, 0, ot, cc, rng, t);
}

// Every config x input type x output type x layout on shapes from 1x1x1 to several tiles
// (K = 0 included); then the sm90 rows past their stages over more work items than SMs.
void plain_cases(int cc, Tally& t) {
  std::mt19937 rng(1234);
  const int before = t.failed, total = t.passed + t.failed;
  const int64_t shapes[][4] = {{1, 1, 1, 1},      {1, 17, 33, 65},   {1, 128, 256, 64},
                               {3, 127, 129, 255}, {2, 256, 128, 96}, {1, 200, 72, 0}};
  for (int cfg = 0; cfg < kNumConfigs; ++cfg)
    for (int it = 0; it < (selected16(cfg) ? 2 : 0); ++it)
      for (int ot = 0; ot < 3; ++ot)
        for (int l = 0; l < 4; ++l)
          for (const auto& s : shapes) {
            const bool share = s[0] > 1 && (l & 1), pack = (cfg + ot + l) % 2;
            check(cfg, InType(it), DType(ot), l >> 1, l & 1, s[0], s[1], s[2], s[3], share, 1,
                  pack, cc, rng, t);
          }
  // sm90 rows past their stages, over more work items than SMs (the persistent loop), batched
  // with a shared B, split-K through the workspace; every layout, input and output type.
  for (int cfg = 0; cfg < kNumConfigs; ++cfg) {
    if (kConfigs[cfg].kind != Kind::kSm90 || !selected16(cfg)) continue;
    for (int it = 0; it < 2; ++it)
      for (int l = 0; l < 4; ++l) {
        // Multiples of 8 (TMA-addressable) but not of the tiles; layout TT: K = 393, packed.
        const int ot = (it + l) % 3, split = l == 1 ? 2 : 1;
        const bool share = l & 1, pack = l == 3;
        check(cfg, InType(it), DType(ot), l >> 1, l & 1, 36, 136, 264, pack ? 393 : 392, share,
              split, pack, cc, rng, t);  // 144+ work items, 7 k tiles
      }
  }
  std::printf("plain: %d cases, %d failures\n", t.passed + t.failed - total, t.failed - before);
}

// Epilogue kind named (or numbered) by $TIME_EPI; 0 (plain) when unset.
int timed_kind() {
  const char* s = std::getenv("TIME_EPI");
  if (!s || !*s) return 0;
  for (int k = 0; k < kNumEpiKinds; ++k)
    if (std::strcmp(s, kEpiKinds[k].name) == 0) return k;
  const int k = std::atoi(s);
  if (k < 0 || k >= kNumEpiKinds) {
    std::printf("TIME_EPI=%s: no such epilogue kind\n", s);
    std::exit(2);
  }
  return k;
}

// Random (batch x) M x N x K operands (A stored M x K; B K x N, or N x K with tb), D of the
// input type with epilogue `kind`, and the workspace PlanWorkspace asks for: the problem the
// timings launch.
struct TimedProblem {
  GemmProblem pr{};
  WorkspacePlan wp;
  DevBuf a, b, d, ws;
  EpiBuffers epi;
  TimedProblem(int cfg, InType it, int64_t batch, int64_t m, int64_t n, int64_t k, int split,
               bool pack, bool tb, int kind = 0) {
    std::mt19937 rng(1);
    const DType out = it == InType::kF16 ? DType::kF16 : DType::kBF16;
    a = DevBuf(batch * m * k * 2);
    b = DevBuf(batch * k * n * 2);
    d = DevBuf(batch * m * n * DTypeBytes(out));
    // 2^20 random values repeated (for timing only: fast to make for 8192^2 operands)
    const int64_t count = batch * std::max(m, n) * k, chunk = std::min<int64_t>(count, 1 << 20);
    std::vector<uint8_t> h = random_buffer(it, chunk, rng);
    h.resize(count * 2);
    for (int64_t i = chunk * 2; i < count * 2; i += chunk * 2)
      std::memcpy(h.data() + i, h.data(), std::min<int64_t>(chunk * 2, count * 2 - i));
    CK(cudaMemcpy(a.p, h.data(), a.bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.p, h.data(), b.bytes, cudaMemcpyHostToDevice));
    epi = make_epilogue(kind, out, batch, m, n, rng);
    GemmParams& p = pr.params;
    p.a = a.p;
    p.b = b.p;
    p.d = d.p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.batch = batch;
    p.stride_a = m * k;
    p.stride_b = k * n;
    p.d_type = out;
    p.split_k = split;
    p.epi = epi.ep;
    pr.in_type = it;
    pr.b_type = it;
    pr.config = cfg;
    pr.pack = pack;
    pr.transpose_b = tb;
    wp = PlanWorkspace(pr);
    if (const int64_t w = wp.total(); w > 0) {
      ws = DevBuf(w * sizeof(float));
      pr.workspace = static_cast<float*>(ws.p);
    }
  }
  void launch(cudaStream_t st) const {
    const std::string err = LaunchGemm(pr, wp, st);
    if (!err.empty()) { std::printf("launch failed: %s\n", err.c_str()); std::exit(1); }
  }
};

// Median milliseconds of `run(st)` on stream st over `reps` runs after 2 warm-up runs (CUDA
// events around each run).
template <typename F>
double median_ms(cudaStream_t st, int reps, F run) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < reps + 2; ++r) {
    CK(cudaEventRecord(e0, st));
    run(st);
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (r >= 2) ms.push_back(t);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Median milliseconds of one LaunchGemm (after 2 warm-up launches) on random M x N x K operands
// (NN); with `pack`, misaligned operands are first packed in the workspace.
double time_gemm(int cfg, InType it, int64_t m, int64_t n, int64_t k, bool pack, int reps) {
  const TimedProblem tp(cfg, it, 1, m, n, k, 1, pack, false);
  return median_ms(0, reps, [&](cudaStream_t st) { tp.launch(st); });
}

// Microseconds per call of `launch` as the GPU runs it back to back: 20 calls captured into a
// CUDA graph (no host launch cost between them, as under XLA's command buffers), the median of
// 7 replays / 20.
template <typename F>
double graph_us(F launch) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  launch(st);  // first call outside the capture (sets function attributes)
  CK(cudaStreamSynchronize(st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 20; ++i) launch(st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  const double ms = median_ms(st, 7, [&](cudaStream_t s) { CK(cudaGraphLaunch(ge, s)); });
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  return ms * 1e3 / 20;
}

// Graph-timed (batch x) M x N x K f16 product, NN (NT with $TIME_NT set), split_k slices,
// misaligned operands packed (unless $TIME_NOPACK is set: rows that are 16-byte multiples then
// run as stored), epilogue $TIME_EPI; config -1: the packing alone (what LaunchGemm would copy).
double time_graph(int cfg, int64_t batch, int64_t m, int64_t n, int64_t k, int split) {
  const TimedProblem tp(cfg < 0 ? 0 : cfg, InType::kF16, batch, m, n, k, split,
                        std::getenv("TIME_NOPACK") == nullptr, std::getenv("TIME_NT") != nullptr,
                        timed_kind());
  if (cfg >= 0) return graph_us([&](cudaStream_t st) { tp.launch(st); });
  PackJob jobs[2];
  GemmParams packed = tp.pr.params;  // PackOperands points it at the copies (unused here)
  const int count = PackOperands(tp.pr, tp.wp, packed, jobs);
  return count ? graph_us([&](cudaStream_t st) { CK(LaunchPack(jobs, count, st)); }) : 0.0;
}

double tflops(int64_t m, int64_t n, int64_t k, double ms) {
  return 2.0 * m * n * k / (ms * 1e-3) / 1e12;
}

void timings() {
  for (int cfg = 0; cfg < kNumConfigs; ++cfg)
    for (int64_t s : {4096, 8192})
      if (selected16(cfg))
        std::printf("%s f16 %ld^3: %.1f TFLOP/s | bf16: %.1f TFLOP/s\n",
                    ConfigName(kConfigs[cfg]).c_str(), long(s),
                    tflops(s, s, s, time_gemm(cfg, InType::kF16, s, s, s, false, 7)),
                    tflops(s, s, s, time_gemm(cfg, InType::kBF16, s, s, s, false, 7)));
  // The unaligned case of the benchmark, packed and element-wise, next to its padded shape.
  for (int cfg = 0; cfg < kNumConfigs; ++cfg)
    if (selected16(cfg))
      std::printf("%s f16 4095x4097x4093: packed %.1f us, element-wise %.1f us; "
                  "4096x4104x4096: %.1f us\n", ConfigName(kConfigs[cfg]).c_str(),
                  1e3 * time_gemm(cfg, InType::kF16, 4095, 4097, 4093, true, 7),
                  1e3 * time_gemm(cfg, InType::kF16, 4095, 4097, 4093, false, 7),
                  1e3 * time_gemm(cfg, InType::kF16, 4096, 4104, 4096, false, 7));
}

// How many thread block clusters of each split-K size can be resident at once, per config
// (cudaOccupancyMaxActiveClusters): the waves of a cluster split-K launch, for the cost model.
int cluster_occupancy() {
  for (int cfg = 0; cfg < kNumConfigs; ++cfg) {
    if (kConfigs[cfg].kind != Kind::kSm80) continue;  // sm90 rows: no cluster launches
    const KernelEntry k = Sm80Kernel(InType::kF16, cfg, VariantIndex(false, false, true));
    CK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            k.smem_bytes + k.push_slot_bytes));
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
      // two slices of a push-reducing config: the leader's receive slot too
      launch.dynamicSmemBytes = k.smem_bytes + (s == 2 ? k.push_slot_bytes : 0);
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = 1;
      attr[0].val.clusterDim.y = s;
      attr[0].val.clusterDim.z = 1;
      launch.attrs = attr;
      launch.numAttrs = 1;
      int clusters = 0;
      CK(cudaOccupancyMaxActiveClusters(&clusters, k.fn, &launch));
      std::printf(" %d x %d", clusters, s);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout's kill
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--clusters") return cluster_occupancy();
  if (mode == "--time") {  // --time B M N K SPLIT...
    if (argc < 6) {
      std::printf("usage: %s --time B M N K [SPLIT...]\n", argv[0]);
      return 2;
    }
    const int64_t b = std::atoll(argv[2]), m = std::atoll(argv[3]), n = std::atoll(argv[4]),
                  k = std::atoll(argv[5]);
    if (std::getenv("TIME_PACK"))
      std::printf("pack %ldx%ldx%ldx%ld: %.2f us\n", long(b), long(m), long(n), long(k),
                  time_graph(-1, b, m, n, k, 1));
    const char* epi = kEpiKinds[timed_kind()].name;
    for (int cfg = 0; cfg < kNumConfigs; ++cfg)
      for (int i = 6; i < std::max(argc, 7) && selected16(cfg); ++i) {
        const int split = i < argc ? std::atoi(argv[i]) : 1;
        const double us = time_graph(cfg, b, m, n, k, split);
        std::printf("%s %ldx%ldx%ldx%ld split %d epi %s: %.2f us (%.1f TFLOP/s)\n",
                    ConfigName(kConfigs[cfg]).c_str(), long(b), long(m), long(n), long(k), split,
                    epi, us, 2.0 * b * m * n * k / us * 1e-6);
      }
    return 0;
  }
  if (mode == "--timings") {
    timings();
    return 0;
  }
  const bool quick = mode == "--quick" || mode == "--sanitize";
  if (!quick && !mode.empty() && mode != "--checks") {
    std::printf("unknown mode %s (see the head of tools/kernel_selftest.cu)\n", mode.c_str());
    return 2;
  }
  const int cc = device_cc();
  Tally t;
  if (!quick) plain_cases(cc, t);
  epilogue_cases(quick, cc, t);
  dact_cases(quick, t);
  ragged_cases(quick, cc, t);
  byte_cases(quick, cc, t);
  coverage_report(cc, t);
  if (quick) CK(cudaDeviceReset());  // lets memcheck's leak check see every allocation released
  if (mode.empty()) timings();
  std::printf("%d passed, %d failed\n", t.passed, t.failed);
  return t.failed ? 1 : 0;
}
