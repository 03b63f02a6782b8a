// Shared pieces of the standalone kernel self-test (tools/kernel_selftest.cu: main, the plain
// GEMM case lists, timings; tools/selftest_epilogue.cu: operands with a float64 reference, one
// checked launch with any epilogue, the epilogue and dact case lists, coverage).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "host/gemm_config.h"
#include "host/gemm_dispatch.h"

namespace selftest {
using namespace tcgemm;

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

// Device buffer of exactly `bytes` (no slack: memcheck sees any overrun); nullptr for 0 bytes
// when `null_if_empty`, else a 1-byte buffer (cudaMalloc of 0 gives none).
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t n) : bytes(n) { CK(cudaMalloc(&p, n ? n : 1)); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void upload(const void* src) { CK(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice)); }
  void poison() { CK(cudaMemset(p, 0xFF, bytes)); }  // NaN in every float type
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> h(bytes);
    CK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

// Host element access of a raw buffer of DType t (conversions round to nearest even).
inline float host_load(const void* base, DType t, int64_t i) {
  if (t == DType::kF32) return static_cast<const float*>(base)[i];
  uint16_t bits;
  std::memcpy(&bits, static_cast<const char*>(base) + 2 * i, 2);
  if (t == DType::kF16) { __half_raw r; r.x = bits; return __half2float(__half(r)); }
  __nv_bfloat16_raw r; r.x = bits; return __bfloat162float(__nv_bfloat16(r));
}
inline void host_store(void* base, DType t, int64_t i, float x) {
  char* at = static_cast<char*>(base) + int64_t(DTypeBytes(t)) * i;
  if (t == DType::kF32) { std::memcpy(at, &x, 4); return; }
  const uint16_t bits = t == DType::kF16 ? __half_raw(__float2half_rn(x)).x
                                         : __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
  std::memcpy(at, &bits, 2);
}
// `count` normal(0, sd) values rounded to t, as raw bytes.
inline std::vector<uint8_t> random_buffer(DType t, int64_t count, std::mt19937& rng,
                                          float sd = 1.0f) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<uint8_t> v(count * DTypeBytes(t));
  for (int64_t i = 0; i < count; ++i) host_store(v.data(), t, i, nd(rng));
  return v;
}

inline const char* dtype_name(DType t) {
  return t == DType::kF16 ? "f16" : t == DType::kBF16 ? "bf16" : "f32";
}
// Relative Frobenius bound of a result of type t against float64 (DESIGN §7; as
// tests/conftest.py bound: float32 scaled with K beyond 2048, for the tensor cores' rounding).
inline double bound(DType t, int64_t k = 1) {
  if (t == DType::kF32) return 1e-5 * (k > 2048 ? double(k) / 2048 : 1.0);
  return t == DType::kF16 ? 1e-3 : 5e-3;
}

// Configs whose name contains $SELFTEST_CONFIGS (all when unset): a quicker run for one kind.
inline bool selected(int cfg) {
  const char* f = std::getenv("SELFTEST_CONFIGS");
  return !f || ConfigName(kConfigs[cfg]).find(f) != std::string::npos;
}
// The selected configs with kernels for 16-bit operands (the plain and epilogue checks).
inline bool selected16(int cfg) { return selected(cfg) && Has16BitKernels(cfg); }
inline bool verbose() { return std::getenv("SELFTEST_VERBOSE") != nullptr; }

// Pass / fail counts of every check; the final line of a run is `N passed, M failed`.
struct Tally {
  int passed = 0, failed = 0;
  bool add(bool ok) {
    ok ? ++passed : ++failed;
    return ok;
  }
};

// One epilogue of the case lists: D = act(alpha * AB + beta * C + bias), C in one of the
// broadcast forms, of float32 or D's type; alpha and beta as attributes or from a device
// [alpha, beta]; optionally the pre-activation to aux.
enum class CForm { kNone, kFull, kShared, kRow, kCol };  // (B,M,N) (1,M,N) (B,M,1) (1,1,N)
struct EpiKind {
  const char* name;
  CForm c;
  bool c_f32;     // C float32 (else D's type)
  int bias;       // 0 none, 1 shared (1, N), 2 per batch item (B, N)
  Activation act;
  bool scale;     // alpha, beta from device memory
  bool aux;
  float alpha, beta;
};
extern const EpiKind kEpiKinds[];
extern const int kNumEpiKinds;  // kind 0: the plain product (no epilogue)

// The device operands of epilogue kind `kind` for a (B x) M x N result of type `out` (random C
// and bias, kept on the host for the reference too), and the EpilogueParams pointing at them.
struct EpiBuffers {
  DevBuf c, bias, scale, aux;
  std::vector<uint8_t> hc, hbias;
  EpilogueParams ep;
};
EpiBuffers make_epilogue(int kind, DType out, int64_t B, int64_t M, int64_t N, std::mt19937& rng);

// Random (batch x) M x N x K operands of type `it` in layout (ta, tb) on the device, with their
// float64 product (batch x M x N) on the host.
struct Operands {
  InType it;
  bool ta, tb, share_b;
  int64_t batch, m, n, k;
  DevBuf a, b;
  std::vector<double> acc;
  Operands(InType it, bool ta, bool tb, int64_t batch, int64_t m, int64_t n, int64_t k,
           bool share_b, std::mt19937& rng);
};

// One launch of config `cfg` on `ops` (split_k slices requested, packing allowed) with epilogue
// kind `kind` into a D of type `out`, checked against float64 (D and aux). Returns whether it
// passed; prints a FAIL line (every case with $SELFTEST_VERBOSE) and counts it in `t`, and, on
// a GPU of compute capability `cc`, records the kernel path it took for the coverage table.
bool run_gemm(const Operands& ops, int cfg, int split, bool pack, int kind, DType out, int cc,
              std::mt19937& rng, Tally& t);

// The case lists of tools/selftest_epilogue.cu: every config x split (1, 2, 4, 16) x epilogue
// kind (quick: a reduced list for compute-sanitizer that still covers every kernel path x
// epilogue kind), the dact kernel (every activation, g type, shared / batched dbias), then the
// coverage table (a gap on compute capability 9.0 counts as one failure).
void epilogue_cases(bool quick, int cc, Tally& t);
void dact_cases(bool quick, Tally& t);
void coverage_report(int cc, Tally& t);

// The activation in float64 (tools/selftest_epilogue.cu).
double act_ref(Activation a, double x);

// tools/selftest_ragged.cu: grouped (ragged) products through LaunchGemm on every row with
// grouped kernels this GPU runs (the sm80 rows everywhere, the sm90 rows on 9.0): rows (B N- or
// K-major) and contraction, empty / skewed / oversized / negative sizes, a sum below M, bias +
// activation, every output type; D poisoned, rows past the last group must be zeros.
void ragged_cases(bool quick, int cc, Tally& t);

// tools/selftest_byte.cu: 8-bit products (int8 -> int32 / scaled floats, the fp8 pairs with
// per-tensor, per-row / per-column and block scales, bias + activation) through LaunchGemm on
// every row with 8-bit kernels; compute capability 9.0 only (nothing elsewhere).
void byte_cases(bool quick, int cc, Tally& t);

}  // namespace selftest
