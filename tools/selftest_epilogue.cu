// The self-test's checked GEMM launch (any epilogue, float64 reference), its epilogue and dact
// case lists, and the table of kernel path x epilogue kind they covered (tools/selftest.cuh).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "selftest.cuh"

namespace selftest {

const EpiKind kEpiKinds[] = {
    {"plain", CForm::kNone, false, 0, Activation::kNone, false, false, 1.0f, 0.0f},
    {"c32_bias_gelu_tanh", CForm::kFull, true, 1, Activation::kGeluTanh, false, true, 0.7f, -1.3f},
    {"rowc_relu_scale", CForm::kRow, false, 0, Activation::kRelu, true, true, 1.5f, 0.5f},
    {"colc32_bbias_silu", CForm::kCol, true, 2, Activation::kSilu, false, true, 1.0f, 2.0f},
    {"bias_gelu_scale", CForm::kNone, false, 1, Activation::kGelu, true, false, 0.5f, 0.0f},
    {"sharedc_scale", CForm::kShared, false, 0, Activation::kNone, true, true, -0.9f, 1.1f},
};
const int kNumEpiKinds = static_cast<int>(sizeof(kEpiKinds) / sizeof(kEpiKinds[0]));

constexpr double kPi = 3.14159265358979323846;

double act_ref(Activation a, double x) {
  switch (a) {
    case Activation::kNone: return x;
    case Activation::kRelu: return x < 0 ? 0 : x;
    case Activation::kGelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::kGeluTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x)));
    case Activation::kSilu: return x / (1 + std::exp(-x));
  }
  return x;
}

namespace {

const char* const kLayouts[] = {"NN", "NT", "TN", "TT"};
const char* const kActNames[] = {"none", "relu", "gelu", "gelu_tanh", "silu"};

double act_grad_ref(Activation a, double x) {
  switch (a) {
    case Activation::kNone: return 1;
    case Activation::kRelu: return x > 0 ? 1 : 0;
    case Activation::kGelu:
      return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * kPi);
    case Activation::kGeluTanh: {
      const double c = std::sqrt(2 / kPi), t = std::tanh(c * (x + 0.044715 * x * x * x));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
    }
    case Activation::kSilu: {
      const double s = 1 / (1 + std::exp(-x));
      return s * (1 + x * (1 - s));
    }
  }
  return 1;
}

// Relative Frobenius error accumulated element by element (infinite once a result is not
// finite); absolute when the reference is all zeros.
struct RelErr {
  double num = 0, den = 0;
  bool finite = true;
  void add(double got, double ref) {
    if (!std::isfinite(got)) finite = false;
    num += (got - ref) * (got - ref);
    den += ref * ref;
  }
  double value() const {
    return finite ? std::sqrt(num / (den > 0 ? den : 1)) : std::numeric_limits<double>::infinity();
  }
};

// Kernel paths of the coverage table; a packed case also counts as kPack.
enum Family { kSm80, kSm90, kPull, kPush, kWsSm80, kWsSm90, kPack, kNumFamilies };
const char* const kFamilyNames[] = {"sm80", "sm90", "cluster_pull", "cluster_push",
                                    "ws_sm80+reduce", "ws_sm90+reduce", "pack"};
int g_cover[kNumFamilies][8] = {};
int g_dact_cover[kNumActivations][2] = {};

// The path LaunchGemm takes for pr on a GPU of compute capability cc (a label for the log and
// the coverage table: the dispatcher's choice, restated), and whether it packs an operand.
Family path_of(const GemmProblem& pr, const WorkspacePlan& wp, int cc, std::string& label) {
  const GemmParams& p = pr.params;
  const bool a_km = !pr.transpose_a, b_km = pr.transpose_b;
  int64_t lda = a_km ? p.k : p.m, ldb = b_km ? p.k : p.n, sa = p.stride_a, sb = p.stride_b;
  if (wp.a.packed) { if (sa) sa = sa / wp.a.cols * wp.a.ld; lda = wp.a.ld; }
  if (wp.b.packed) { if (sb) sb = sb / wp.b.cols * wp.b.ld; ldb = wp.b.ld; }
  const bool aligned = lda % 8 == 0 && ldb % 8 == 0;  // device buffers start 256-byte aligned
  int cfg = pr.config;
  if (kConfigs[cfg].kind == Kind::kSm90 && !(cc == 90 && aligned && sa % 8 == 0 && sb % 8 == 0))
    cfg = Sm80Fallback(cfg);
  const int split = EffectiveSplitK(pr);
  Family f;
  if (kConfigs[cfg].kind == Kind::kSm90) f = split > 1 ? kWsSm90 : kSm90;
  else if (split == 1) f = kSm80;
  else if (split <= kMaxClusterSplit && cc >= 90)
    f = split == 2 && Sm80Kernel(pr.in_type, cfg, VariantIndex(a_km, b_km, aligned)).push_slot_bytes
            ? kPush : kPull;
  else f = kWsSm80;
  label = std::string(kFamilyNames[f]) + (cfg != pr.config ? "(fallback)" : "") +
          (aligned ? "" : "(elementwise)") + " split " + std::to_string(split) +
          (wp.a.packed || wp.b.packed ? " packed" : "");
  return f;
}

}  // namespace

Operands::Operands(InType it_, bool ta_, bool tb_, int64_t batch_, int64_t m_, int64_t n_,
                   int64_t k_, bool share_b_, std::mt19937& rng)
    : it(it_), ta(ta_), tb(tb_), share_b(share_b_), batch(batch_), m(m_), n(n_), k(k_) {
  const int64_t bb = share_b ? 1 : batch;
  const std::vector<uint8_t> ha = random_buffer(it, batch * m * k, rng);
  const std::vector<uint8_t> hb = random_buffer(it, bb * k * n, rng);
  a = DevBuf(ha.size());
  b = DevBuf(hb.size());
  a.upload(ha.data());
  b.upload(hb.data());
  // float64 copies with K contiguous (A as [z][i][l], B as [z][j][l]), then the products.
  std::vector<double> ad(batch * m * k), bd(bb * n * k);
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t l = 0; l < k; ++l)
        ad[(z * m + i) * k + l] = host_load(ha.data(), it, z * m * k + (ta ? l * m + i : i * k + l));
  for (int64_t z = 0; z < bb; ++z)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l)
        bd[(z * n + j) * k + l] = host_load(hb.data(), it, z * k * n + (tb ? j * k + l : l * n + j));
  acc.assign(batch * m * n, 0.0);
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const double* x = &ad[(z * m + i) * k];
        const double* y = &bd[((share_b ? 0 : z) * n + j) * k];
        double s = 0;
        for (int64_t l = 0; l < k; ++l) s += x[l] * y[l];
        acc[(z * m + i) * n + j] = s;
      }
}

EpiBuffers make_epilogue(int kind, DType out, int64_t B, int64_t M, int64_t N,
                         std::mt19937& rng) {
  const EpiKind& e = kEpiKinds[kind];
  EpiBuffers x;
  EpilogueParams& ep = x.ep;
  ep.act = e.act;
  // C in its broadcast form: element (z, r, c) at z * c_sb + r * c_sr + c * c_sc.
  int64_t c_count = 0;
  switch (e.c) {
    case CForm::kNone: break;
    case CForm::kFull: c_count = B * M * N; ep.c_sb = M * N; ep.c_sr = N; ep.c_sc = 1; break;
    case CForm::kShared: c_count = M * N; ep.c_sr = N; ep.c_sc = 1; break;
    case CForm::kRow: c_count = B * M; ep.c_sb = M; ep.c_sr = 1; break;
    case CForm::kCol: c_count = N; ep.c_sc = 1; break;
  }
  ep.c_type = e.c_f32 ? DType::kF32 : out;
  if (e.c != CForm::kNone) {
    x.hc = random_buffer(ep.c_type, c_count, rng);
    x.c = DevBuf(x.hc.size());
    x.c.upload(x.hc.data());
    ep.c = x.c.p;
  }
  if (e.bias) {  // a shared bias in float32, a batched one in the output type (both reach
                 // the kernels as the FFI passes them)
    ep.bias_type = e.bias == 2 ? out : DType::kF32;
    x.hbias = random_buffer(ep.bias_type, e.bias == 2 ? B * N : N, rng);
    x.bias = DevBuf(x.hbias.size());
    x.bias.upload(x.hbias.data());
    ep.bias = x.bias.p;
    ep.bias_sb = e.bias == 2 ? N : 0;
  }
  if (e.scale) {  // the attribute fields poisoned: only the device values may be used
    const float s[2] = {e.alpha, e.beta};
    x.scale = DevBuf(sizeof(s));
    x.scale.upload(s);
    ep.scale = static_cast<const float*>(x.scale.p);
    ep.alpha = ep.beta = std::numeric_limits<float>::quiet_NaN();
  } else {
    ep.alpha = e.alpha;
    ep.beta = e.beta;
  }
  if (e.aux) {
    x.aux = DevBuf(B * M * N * DTypeBytes(out));
    x.aux.poison();
    ep.aux = x.aux.p;
  }
  return x;
}

bool run_gemm(const Operands& ops, int cfg, int split, bool pack, int kind, DType out, int cc,
              std::mt19937& rng, Tally& t) {
  const EpiKind& e = kEpiKinds[kind];
  const int64_t B = ops.batch, M = ops.m, N = ops.n, count = B * M * N;
  const EpiBuffers eb = make_epilogue(kind, out, B, M, N, rng);
  const EpilogueParams& ep = eb.ep;
  const int osz = DTypeBytes(out);
  DevBuf dd(count * osz);
  dd.poison();

  GemmProblem pr{};
  GemmParams& p = pr.params;
  p.a = ops.a.p;
  p.b = ops.b.p;
  p.d = dd.p;
  p.m = M;
  p.n = N;
  p.k = ops.k;
  p.batch = B;
  p.stride_a = M * ops.k;
  p.stride_b = ops.share_b ? 0 : ops.k * N;
  p.d_type = out;
  p.split_k = split;
  p.epi = ep;
  pr.in_type = ops.it;
  pr.b_type = ops.it;
  pr.transpose_a = ops.ta;
  pr.transpose_b = ops.tb;
  pr.config = cfg;
  pr.pack = pack;
  const WorkspacePlan wp = PlanWorkspace(pr);  // split-K partials and packed operands, exactly
  DevBuf ws;
  if (const int64_t f = wp.total(); f > 0) {
    ws = DevBuf(f * sizeof(float));
    ws.poison();  // a partial that no slice writes reaches D as NaN
    pr.workspace = static_cast<float*>(ws.p);
  }
  std::string label = "?";
  const Family fam = cc ? path_of(pr, wp, cc, label) : kSm80;
  if (cc) {
    ++g_cover[fam][kind];
    if (wp.a.packed || wp.b.packed) ++g_cover[kPack][kind];
  }
  char tag[320];
  std::snprintf(tag, sizeof(tag),
                "%s [%s] in=%s out=%s %s b=%ld %ldx%ldx%ld share_b=%d split_k=%d pack=%d epi=%s",
                ConfigName(kConfigs[cfg]).c_str(), label.c_str(), dtype_name(ops.it),
                dtype_name(out), kLayouts[ops.ta * 2 + ops.tb], long(B), long(M), long(N),
                long(ops.k), int(ops.share_b), split, int(pack), e.name);
  const std::string err = LaunchGemm(pr, wp, 0);
  if (!err.empty()) {
    std::printf("FAIL %s: launch: %s\n", tag, err.c_str());
    return t.add(false);
  }
  if (const cudaError_t ce = cudaDeviceSynchronize(); ce != cudaSuccess) {
    std::printf("FAIL %s: %s (sticky: stopping)\n", tag, cudaGetErrorString(ce));
    std::printf("%d passed, %d failed\n", t.passed, t.failed + 1);
    std::exit(1);
  }
  const std::vector<uint8_t> hd = dd.download();
  const std::vector<uint8_t> haux = e.aux ? eb.aux.download() : std::vector<uint8_t>();
  RelErr ed, ea;
  for (int64_t z = 0; z < B; ++z)
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < N; ++c) {
        const int64_t i = (z * M + r) * N + c;
        double pre = double(e.alpha) * ops.acc[i];
        if (e.c != CForm::kNone)
          pre += double(e.beta) * host_load(eb.hc.data(), ep.c_type, z * ep.c_sb + r * ep.c_sr + c * ep.c_sc);
        if (e.bias) pre += host_load(eb.hbias.data(), ep.bias_type, z * ep.bias_sb + c);
        ed.add(host_load(hd.data(), out, i), act_ref(e.act, pre));
        if (e.aux) ea.add(host_load(haux.data(), out, i), pre);
      }
  const double err_d = ed.value(), err_aux = e.aux ? ea.value() : 0.0;
  const double tol = bound(out, ops.k);
  const bool ok = err_d <= tol && err_aux <= tol;
  if (!ok || verbose())
    std::printf("%s %s: err %.3g aux %.3g (bound %.1e)\n", ok ? "ok  " : "FAIL", tag, err_d,
                err_aux, tol);
  return t.add(ok);
}

void epilogue_cases(bool quick, int cc, Tally& t) {
  std::mt19937 rng(quick ? 777 : 778);
  const int splits[] = {1, 2, 4, 16};
  const int before = t.failed;
  int cases = 0;
  for (int cfg = 0; cfg < kNumConfigs; ++cfg) {
    if (!selected16(cfg)) continue;
    // K of `tiles` BK-wide k tiles, the last one partial: more tiles than any row's stages;
    // split 16 leaves more than kMaxClusterSplit slices (the workspace path), 2 and 4 fewer
    // (the cluster path on sm_90). Aligned: M, N, K multiples of 8 (cp.async, TMA); unaligned:
    // odd N, K (element-wise loads unless packed; odd-N epilogue stores).
    const int bk = kConfigs[cfg].bk, tiles = quick ? 9 : 17;
    for (int l = 0; l < 4; ++l)
      for (int al = 0; al < 2; ++al)
        for (int it = 0; it < 2; ++it) {
          // quick: every layout x alignment x input type (every kernel variant) once, the
          // split, epilogue kind and packing rotating; full: one input type per layout and
          // alignment, each with every split x epilogue kind
          const int idx = l * 4 + al * 2 + it;
          if (!quick && it != (cfg + l + al) % 2) continue;
          const bool share = (l + al) % 2;
          const Operands ops(InType(it), l >> 1, l & 1, 2, al ? 136 : 131, al ? 264 : 67,
                             int64_t(tiles) * bk - (al ? 8 : 5), share, rng);
          for (int s = 0; s < 4; ++s)
            for (int kind = 0; kind < kNumEpiKinds; ++kind) {
              if (quick && (s != (idx + cfg) % 4 || kind != (cfg + idx + idx / 4) % kNumEpiKinds))
                continue;
              const DType out = DType((cfg + l + s + kind + al) % 3);
              const bool pack = quick ? (idx / 2 + cfg) % 2 : (s + kind) % 2;
              run_gemm(ops, cfg, splits[s], pack, kind, out, cc, rng, t);
              ++cases;
            }
        }
    {  // K = 0: D = act(beta * C + bias)
      const Operands ops(InType::kBF16, false, true, 1, 70, 33, 0, false, rng);
      run_gemm(ops, cfg, 1, false, 1 + cfg % (kNumEpiKinds - 1), DType::kF32, cc, rng, t);
    }
    {  // 1 x 1 x 1
      const Operands ops(InType::kF16, cfg % 2, false, 1, 1, 1, 1, false, rng);
      run_gemm(ops, cfg, 1, false, (cfg + 2) % kNumEpiKinds, DType(cfg % 3), cc, rng, t);
    }
    {  // rows of 520: 16-byte but not 32-byte multiples, packed into rows of 576
      const int l = cfg % 4;
      const Operands ops(InType(cfg % 2), l >> 1, l & 1, 1, 72, 520, 520, false, rng);
      run_gemm(ops, cfg, 1, true, cfg % kNumEpiKinds, DType::kF32, cc, rng, t);
    }
    cases += 3;
  }
  std::printf("epilogue%s: %d cases, %d failures\n", quick ? " (quick)" : "", cases,
              t.failed - before);
}

namespace {

// One dact launch: g = ct * act'(pre) (to g_type, when has_g) and dbias = column sums of g
// (per batch item or over all), against float64.
bool run_dact(Activation act, DType ct_t, DType pre_t, DType g_t, bool has_g, bool has_dbias,
              bool bias_batched, int64_t batch, int64_t rows, int64_t cols, std::mt19937& rng,
              Tally& t) {
  const int64_t count = batch * rows * cols;
  const std::vector<uint8_t> hct = random_buffer(ct_t, count, rng);
  const std::vector<uint8_t> hpre = random_buffer(pre_t, count, rng, 2.0f);
  DevBuf dct(hct.size()), dpre, dg, ddb;
  dct.upload(hct.data());
  DactJob j{};
  j.ct = dct.p;
  j.ct_type = ct_t;
  j.pre_type = pre_t;
  if (act != Activation::kNone) {  // unread otherwise: left null (memcheck would see a read)
    dpre = DevBuf(hpre.size());
    dpre.upload(hpre.data());
    j.pre = dpre.p;
  }
  if (has_g) {
    dg = DevBuf(count * DTypeBytes(g_t));
    dg.poison();
    j.g = dg.p;
  }
  j.g_type = g_t;
  const int64_t db_count = (bias_batched ? batch : 1) * cols;
  if (has_dbias) {
    ddb = DevBuf(db_count * sizeof(float));
    ddb.poison();
    j.dbias = static_cast<float*>(ddb.p);
  }
  j.bias_batched = bias_batched;
  j.act = act;
  j.batch = batch;
  j.rows = rows;
  j.cols = cols;
  ++g_dact_cover[int(act)][bias_batched];
  char tag[200];
  std::snprintf(tag, sizeof(tag), "dact %s ct=%s pre=%s g=%s dbias=%s %ldx%ldx%ld",
                kActNames[int(act)], dtype_name(ct_t), dtype_name(pre_t),
                has_g ? dtype_name(g_t) : "-", has_dbias ? (bias_batched ? "batched" : "shared") : "-",
                long(batch), long(rows), long(cols));
  if (const cudaError_t e = LaunchDact(j, 0); e != cudaSuccess) {
    std::printf("FAIL %s: launch: %s\n", tag, cudaGetErrorString(e));
    return t.add(false);
  }
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    std::printf("FAIL %s: %s (sticky: stopping)\n", tag, cudaGetErrorString(e));
    std::printf("%d passed, %d failed\n", t.passed, t.failed + 1);
    std::exit(1);
  }
  const std::vector<uint8_t> hg = has_g ? dg.download() : std::vector<uint8_t>();
  const std::vector<uint8_t> hdb = has_dbias ? ddb.download() : std::vector<uint8_t>();
  RelErr eg, edb;
  std::vector<double> dref(db_count, 0.0);
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = (z * rows + r) * cols + c;
        double g = host_load(hct.data(), ct_t, i);
        if (act != Activation::kNone) g *= act_grad_ref(act, host_load(hpre.data(), pre_t, i));
        if (has_g) {
          const double got = host_load(hg.data(), g_t, i);
          eg.add(got, g);
          g = got;  // dbias sums g as stored (what the products read)
        }
        dref[(bias_batched ? z : 0) * cols + c] += g;
      }
  if (has_dbias)
    for (int64_t i = 0; i < db_count; ++i) edb.add(host_load(hdb.data(), DType::kF32, i), dref[i]);
  const double err_g = has_g ? eg.value() : 0.0, err_db = has_dbias ? edb.value() : 0.0;
  const bool ok = err_g <= bound(g_t) && err_db <= bound(DType::kF32);
  if (!ok || verbose())
    std::printf("%s %s: err g %.3g dbias %.3g\n", ok ? "ok  " : "FAIL", tag, err_g, err_db);
  return t.add(ok);
}

}  // namespace

void dact_cases(bool quick, Tally& t) {
  std::mt19937 rng(quick ? 555 : 556);
  const int before = t.failed, passed = t.passed;
  const int64_t shapes[2][3] = {{3, 67, 45}, {2, 130, 300}};  // cols past a 32-column block
  for (int a = 0; a < kNumActivations; ++a)
    for (int bb = 0; bb < 2; ++bb)
      for (int s = 0; s < (quick ? 1 : 2); ++s)
        for (int g = 0; g < 3; ++g) {
          if (quick && g != (a + bb) % 3) continue;
          const int64_t* sh = shapes[s];
          run_dact(Activation(a), DType((g + a) % 3), DType((g + a + bb + 1) % 3), DType(g), true,
                   true, bb, sh[0], sh[1], sh[2], rng, t);
        }
  // only the bias gradient (no g; none: no pre either), only g
  for (int bb = 0; bb < 2; ++bb)
    run_dact(Activation::kNone, DType::kBF16, DType::kF32, DType::kF32, false, true, bb, 3, 67,
             45, rng, t);
  run_dact(Activation::kSilu, DType::kF16, DType::kBF16, DType::kF32, false, true, true, 3, 67,
           45, rng, t);
  run_dact(Activation::kGelu, DType::kF32, DType::kF16, DType::kBF16, true, false, false, 3, 67,
           45, rng, t);
  // the vector kernel: ct, pre and g of one type on rows of 16-byte multiples (128-byte lines;
  // 40 columns: fewer chunks than a block's; no bias gradient: rows split over blocks)
  for (int a = 0; a < kNumActivations; ++a)
    for (int g = 0; g < 3; ++g)
      for (int bb = 0; bb < 2; ++bb) {
        if (quick && (a + g + bb) % 2) continue;
        run_dact(Activation(a), DType(g), DType(g), DType(g), true, true, bb, 3, 131, 264, rng, t);
      }
  for (int g = 0; g < 3; ++g) {
    run_dact(Activation::kGeluTanh, DType(g), DType(g), DType(g), true, true, false, 2, 517, 40,
             rng, t);
    run_dact(Activation::kRelu, DType(g), DType(g), DType(g), true, false, false, 2, 1031, 128,
             rng, t);
  }
  run_dact(Activation::kNone, DType::kBF16, DType::kBF16, DType::kBF16, false, true, true, 3, 67,
           48, rng, t);
  std::printf("dact%s: %d cases, %d failures\n", quick ? " (quick)" : "",
              t.passed + t.failed - passed - before, t.failed - before);
}

void coverage_report(int cc, Tally& t) {
  std::printf("coverage (cases per kernel path x epilogue kind; compute capability %d):\n", cc);
  std::printf("  %-16s", "");
  for (int k = 0; k < kNumEpiKinds; ++k) std::printf(" %s", kEpiKinds[k].name);
  std::printf("\n");
  std::string gaps;
  for (int f = 0; f < kNumFamilies; ++f) {
    std::printf("  %-16s", kFamilyNames[f]);
    for (int k = 0; k < kNumEpiKinds; ++k) {
      std::printf(" %*d", int(std::strlen(kEpiKinds[k].name)), g_cover[f][k]);
      if (!g_cover[f][k]) gaps += std::string(" ") + kFamilyNames[f] + "/" + kEpiKinds[k].name;
    }
    std::printf("\n");
  }
  std::printf("  dact (shared, batched dbias):");
  for (int a = 0; a < kNumActivations; ++a) {
    std::printf(" %s %d/%d", kActNames[a], g_dact_cover[a][0], g_dact_cover[a][1]);
    for (int bb = 0; bb < 2; ++bb)
      if (!g_dact_cover[a][bb]) gaps += std::string(" dact/") + kActNames[a] + (bb ? "/batched" : "/shared");
  }
  std::printf("\n");
  // Every path exists only on compute capability 9.0 (sm90 rows, clusters); with every config.
  if (cc == 90 && !std::getenv("SELFTEST_CONFIGS")) {
    if (!gaps.empty()) std::printf("FAIL coverage gaps:%s\n", gaps.c_str());
    t.add(gaps.empty());
  } else if (!gaps.empty()) {
    std::printf("coverage gaps (not checked on this GPU / config subset):%s\n", gaps.c_str());
  }
}

}  // namespace selftest
