// Grouped (ragged) products of the self-test (tools/kernel_selftest.cu; declared in
// selftest.cuh): GemmProblems built as ffi/xla/ragged_ffi.cc builds them, launched through
// LaunchGemm on every row with grouped kernels that this GPU runs (HasRaggedKernels: the sm80
// rows on any GPU, the sm90 rows on compute capability 9.0), checked against float64 under the
// clamping rule (a negative size counts as 0, groups cut at the ragged extent). D is poisoned
// first (NaN): every element must be written; rows past the last group must be exact zeros.
// Buffers have exactly the problem's size, so compute-sanitizer sees any out-of-bounds access.
#include <cmath>
#include <cstdio>
#include <vector>

#include "selftest.cuh"

namespace selftest {
namespace {

struct RaggedCase {
  const char* name;
  int mode;  // 0 rows, 1 contraction
  bool tb;   // rows: B stored (G, N, K)
  int64_t m, k, n;  // a (M, K); rows: b (G, K, N), d (M, N); contraction: b (M, N), d (G, K, N)
  std::vector<int> sizes;
  Activation act;
  bool bias;
};

// Group g's clamped [start, end) over `extent` (kernels/common/ragged.cuh's rule).
std::vector<std::pair<int64_t, int64_t>> bounds(const std::vector<int>& sizes, int64_t extent) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = 0;
  for (int s : sizes) {
    const int64_t size = std::max<int64_t>(0, std::min<int64_t>(s, extent - start));
    out.push_back({start, start + size});
    start += size;
  }
  return out;
}

bool run_case(const RaggedCase& c, int cfg, InType it, DType ot, std::mt19937& rng, Tally& t) {
  const int64_t g = static_cast<int64_t>(c.sizes.size()), m = c.m, k = c.k, n = c.n;
  const int64_t b_count = c.mode == 0 ? g * k * n : m * n;
  const int64_t d_count = c.mode == 0 ? m * n : g * k * n;
  const std::vector<uint8_t> ha = random_buffer(it, m * k, rng, 1.0f / std::sqrt(float(k)));
  const std::vector<uint8_t> hb = random_buffer(it, b_count, rng);
  std::vector<float> hbias(c.bias ? g * n : 0);
  std::normal_distribution<float> nd(0.f, 0.5f);
  for (float& x : hbias) x = nd(rng);
  DevBuf a(ha.size()), b(hb.size()), sizes(g * 4), bias(hbias.size() * 4), d(d_count * DTypeBytes(ot));
  a.upload(ha.data());
  b.upload(hb.data());
  sizes.upload(c.sizes.data());
  if (c.bias) bias.upload(hbias.data());
  d.poison();

  GemmProblem pr{};
  GemmParams& p = pr.params;
  p.a = a.p;
  p.b = b.p;
  p.d = d.p;
  p.d_type = ot;
  p.split_k = 1;
  p.ragged.sizes = static_cast<const int32_t*>(sizes.p);
  p.ragged.groups = static_cast<int>(g);
  p.epi.act = c.act;
  if (c.bias) {
    p.epi.bias = static_cast<const float*>(bias.p);
    p.epi.bias_sb = n;
  }
  if (c.mode == 0) {
    p.m = m, p.n = n, p.k = k, p.batch = 1, p.stride_b = k * n;
    pr.transpose_b = c.tb;
    p.ragged.mode = RaggedMode::kRows;
  } else {
    p.m = k, p.n = n, p.k = m, p.batch = g, p.stride_b = 0;
    pr.transpose_a = true;
    p.ragged.mode = RaggedMode::kContract;
  }
  pr.in_type = it;
  pr.b_type = it;
  pr.config = cfg;
  const std::string err = LaunchGemm(pr, PlanWorkspace(pr), nullptr);
  if (err.empty()) CK(cudaDeviceSynchronize());
  const std::vector<uint8_t> hd = err.empty() ? d.download() : std::vector<uint8_t>();

  // float64 reference and the relative Frobenius error; rows past the groups exactly zero
  double num = 0, den = 0;
  bool finite = true, zeros = true;
  const auto bd = bounds(c.sizes, m);  // the ragged extent: a's rows, in both modes
  auto A = [&](int64_t r, int64_t col) { return double(host_load(ha.data(), it, r * k + col)); };
  auto B = [&](int64_t i) { return double(host_load(hb.data(), it, i)); };
  for (int64_t e = 0; e < d_count && err.empty(); ++e) {
    double want = 0;
    bool live = true;
    if (c.mode == 0) {
      const int64_t r = e / n, col = e % n;
      int64_t grp = -1;
      for (int64_t q = 0; q < g; ++q)
        if (r >= bd[q].first && r < bd[q].second) grp = q;
      live = grp >= 0;
      if (live) {
        for (int64_t kk = 0; kk < k; ++kk)
          want += A(r, kk) * B(c.tb ? (grp * n + col) * k + kk : (grp * k + kk) * n + col);
        if (c.bias) want += hbias[grp * n + col];
        want = act_ref(c.act, want);
      }
    } else {
      const int64_t grp = e / (k * n), i = (e / n) % k, j = e % n;
      for (int64_t r = bd[grp].first; r < bd[grp].second; ++r) want += A(r, i) * B(r * n + j);
    }
    const double got = host_load(hd.data(), ot, e);
    if (!std::isfinite(got)) finite = false;
    if (!live && got != 0) zeros = false;
    num += (got - want) * (got - want);
    den += want * want;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const double tol = bound(ot, c.mode == 0 ? k : m) * (c.act != Activation::kNone ? 2 : 1);
  const bool ok = err.empty() && finite && zeros && rel <= tol;
  if (!ok || verbose())
    std::printf("%s ragged %s %s %s->%s %s: rel %.2e (tol %.0e)%s%s%s\n", ok ? "ok  " : "FAIL",
                c.name, ConfigName(kConfigs[cfg]).c_str(), dtype_name(it), dtype_name(ot),
                c.mode ? "contraction" : c.tb ? "rows (B K-major)" : "rows", rel, tol,
                finite ? "" : " [not finite: an element never written]",
                zeros ? "" : " [rows past the groups not zero]", err.empty() ? "" : err.c_str());
  return t.add(ok);
}

}  // namespace

void ragged_cases(bool quick, int cc, Tally& t) {
  std::mt19937 rng(4321);
  const int before = t.failed, total = t.passed + t.failed;
  const Activation kNoAct = Activation::kNone;
  std::vector<RaggedCase> cases;
  for (int mode = 0; mode < 2; ++mode)
    for (bool tb : {false, true}) {
      if (mode == 1 && tb) continue;
      cases.push_back({"skewed", mode, tb, 300, 200, 72, {0, 67, 131, 0, 59}, kNoAct, false});
      cases.push_back({"over_m", mode, tb, 200, 72, 40, {60, 0, 90, 80, 50, 7}, kNoAct, false});
      cases.push_back({"negative", mode, tb, 200, 72, 40, {50, -20, 40, 0, -1, 70}, kNoAct, false});
      cases.push_back({"all_empty", mode, tb, 130, 64, 48, {0, 0, 0}, kNoAct, false});
      if (!quick)
        cases.push_back({"wide", mode, tb, 700, 264, 520, {0, 300, 1, 0, 250, 100}, kNoAct, false});
    }
  cases.push_back({"bias_silu", 0, false, 300, 136, 264, {100, 0, 150, 3}, Activation::kSilu, true});
  cases.push_back({"bias_gelu_tanh", 0, true, 300, 136, 264, {7, 200, 0, 50}, Activation::kGeluTanh,
                   true});
  int i = 0;
  for (int cfg = 0; cfg < kNumConfigs; ++cfg) {
    if (!HasRaggedKernels(cfg) || !selected(cfg)) continue;
    if (kConfigs[cfg].kind == Kind::kSm90 && cc != 90) continue;  // sm90 rows: 9.0 only
    for (const RaggedCase& c : cases)
      for (int it = 0; it < 2; ++it, ++i)  // output types rotate (all three per config)
        run_case(c, cfg, InType(it), DType(i % 3), rng, t);
  }
  std::printf("ragged: %d of %d cases failed\n", t.failed - before, t.passed + t.failed - total);
}

}  // namespace selftest
