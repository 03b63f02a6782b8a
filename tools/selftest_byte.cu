// K-major-only products of the self-test (tools/kernel_selftest.cu; declared in selftest.cuh):
// int8 x int8 (to int32, exact; to floats with per-row / per-column scales), the fp8 pairs
// (per-tensor scale from the device, per-row / per-column scales, DeepSeek-V3 block scales,
// bias + activation), float32 x float32 read as TF32 (one pass; K splits through the
// workspace) and promoted float16 (f16x3's kernels: GemmProblem::promote, row and column
// scales), GemmProblems built as ffi/xla/gemm_ffi.cc builds them (A [M][K], B [N][K]),
// launched through LaunchGemm on every row with such kernels (HasByteKernels, HasTf32Kernels;
// compute capability 9.0 only, but int8 on the sm80 rows on any GPU from 8.0: mma.sync
// m16n8k32, with split-K in a cluster on 9.0), checked against float64 of the operands as
// stored. D is
// poisoned first; buffers have exactly the problem's size, so compute-sanitizer sees any
// out-of-bounds access.
#include <cuda_fp8.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "selftest.cuh"

namespace selftest {
namespace {

enum class Scale { kNone, kTensor, kRowCol, kBlock };
struct ByteCase {
  DType ta, tb, out;
  int64_t m, n, k;
  Scale scale;
  bool bias;
  Activation act;
  int split = 1;  // K slices (summed by the split-K reduction; int8: exact int32 partials)
  bool n_major = false;  // B stored [K][N] (8-bit: copied K-major by LaunchGemm, pack)
  bool promote = false;  // float16 operands on the promoted kernels
  int64_t piece_k = 0;   // promoted: pieces of K below piece_k times 0.5 (piece_scale_k)
};

// An 8-bit element as a double (raw byte of type t).
double byte_value(DType t, uint8_t raw) {
  if (t == DType::kS8) return double(int8_t(raw));
  if (t == DType::kE4M3) { __nv_fp8_e4m3 x; x.__x = raw; return double(float(x)); }
  __nv_fp8_e5m2 x; x.__x = raw; return double(float(x));
}
// Element i of operand type t stored in v, as a double.
double elem_value(DType t, const std::vector<uint8_t>& v, int64_t i) {
  if (t == DType::kF16) {
    __half h;
    std::memcpy(&h, v.data() + 2 * i, 2);
    return double(__half2float(h));
  }
  if (t != DType::kF32) return byte_value(t, v[i]);
  float f;
  std::memcpy(&f, v.data() + 4 * i, 4);
  return f;
}
std::vector<uint8_t> random_bytes(DType t, int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  if (t == DType::kF16) {  // f16x3's parts: magnitudes up to 2^15
    std::vector<uint8_t> v(2 * count);
    for (int64_t i = 0; i < count; ++i) {
      const __half h = __float2half(4096.0f * nd(rng));
      std::memcpy(v.data() + 2 * i, &h, 2);
    }
    return v;
  }
  if (t == DType::kF32) {
    std::vector<uint8_t> v(4 * count);
    for (int64_t i = 0; i < count; ++i) {
      const float f = nd(rng);
      std::memcpy(v.data() + 4 * i, &f, 4);
    }
    return v;
  }
  std::vector<uint8_t> v(count);
  std::uniform_int_distribution<int> ud(-16, 15);
  for (auto& b : v) {
    if (t == DType::kS8) b = uint8_t(int8_t(ud(rng)));
    else if (t == DType::kE4M3) b = __nv_fp8_e4m3(nd(rng)).__x;
    else b = __nv_fp8_e5m2(nd(rng)).__x;
  }
  return v;
}
const char* byte_name(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : t == DType::kS8 ? "s8"
         : t == DType::kE4M3 ? "e4m3" : "e5m2";
}

bool run_case(const ByteCase& c, int cfg, std::mt19937& rng, Tally& t) {
  const int64_t m = c.m, n = c.n, k = c.k, kb = (k + 127) / 128, nb = (n + 127) / 128;
  const int64_t lsa = (m + 3) / 4 * 4;  // block_sa's rows: 16-byte multiples (LaunchGemm)
  const std::vector<uint8_t> ha = random_bytes(c.ta, m * k, rng), hb = random_bytes(c.tb, n * k, rng);
  std::uniform_real_distribution<float> us(0.5f, 2.0f);
  std::normal_distribution<float> nd(0.f, 1.f);
  const float alpha = c.scale == Scale::kTensor ? us(rng) : 1.0f;
  const bool int_out = c.out == DType::kS32;
  std::vector<float> hscale = {alpha * (c.ta == DType::kS8 ? 1.0f / 64 : 1.0f), 0.0f};
  std::vector<float> hrow(c.scale == Scale::kRowCol ? m : 0), hcol(c.scale == Scale::kRowCol ? n : 0);
  std::vector<float> hsa(c.scale == Scale::kBlock ? kb * lsa : 0), hsb(c.scale == Scale::kBlock ? kb * nb : 0);
  std::vector<float> hbias(c.bias ? n : 0);
  for (auto* v : {&hrow, &hcol, &hsa, &hsb}) for (float& x : *v) x = us(rng);
  for (float& x : hbias) x = nd(rng);
  DevBuf a(ha.size()), b(hb.size()), d(m * n * DTypeBytes(c.out)), scale(int_out ? 0 : 8),
      row(hrow.size() * 4), col(hcol.size() * 4), sa(hsa.size() * 4), sb(hsb.size() * 4),
      bias(hbias.size() * 4);
  a.upload(ha.data());
  if (c.n_major) {  // hb is [N][K]; B goes in as [K][N]
    std::vector<uint8_t> hbn(hb.size());
    for (int64_t j = 0; j < n; ++j)
      for (int64_t kk = 0; kk < k; ++kk) hbn[kk * n + j] = hb[j * k + kk];
    b.upload(hbn.data());
  } else {
    b.upload(hb.data());
  }
  if (!int_out) scale.upload(hscale.data());
  if (!hrow.empty()) { row.upload(hrow.data()); col.upload(hcol.data()); }
  if (!hsa.empty()) { sa.upload(hsa.data()); sb.upload(hsb.data()); }
  if (c.bias) bias.upload(hbias.data());
  d.poison();

  GemmProblem pr{};
  GemmParams& p = pr.params;
  p.a = a.p, p.b = b.p, p.d = d.p, p.d_type = c.out;
  p.m = m, p.n = n, p.k = k, p.batch = 1, p.split_k = c.split;
  if (!int_out) p.epi.scale = static_cast<const float*>(scale.p);
  if (!hrow.empty()) {
    p.epi.row_scale = static_cast<const float*>(row.p);
    p.epi.col_scale = static_cast<const float*>(col.p);
  }
  if (!hsa.empty()) {
    p.block_sa = static_cast<const float*>(sa.p);
    p.block_sa_ld = lsa;
    p.block_sb = static_cast<const float*>(sb.p);
  }
  if (c.bias) p.epi.bias = static_cast<const float*>(bias.p);
  p.epi.act = c.act;
  pr.in_type = c.ta;
  pr.b_type = c.tb;
  pr.transpose_b = !c.n_major;  // B [N][K]: K-major; else [K][N], copied K-major first
  pr.pack = c.n_major;
  pr.promote = c.promote;
  p.piece_scale_k = c.piece_k;
  p.piece_scale = c.piece_k > 0 ? 0.5f : 1.0f;
  pr.config = cfg;
  const WorkspacePlan wp = PlanWorkspace(pr);
  DevBuf ws(wp.total() * 4);
  pr.workspace = static_cast<float*>(ws.p);
  const std::string err = LaunchGemm(pr, wp, nullptr);
  if (err.empty()) CK(cudaDeviceSynchronize());
  const std::vector<uint8_t> hd = err.empty() ? d.download() : std::vector<uint8_t>();

  double num = 0, den = 0;
  bool finite = true, exact = true;
  for (int64_t e = 0; e < m * n && err.empty(); ++e) {
    const int64_t r = e / n, j = e % n;
    double want = 0;
    for (int64_t q = 0; q < kb; ++q) {  // per 128-slice of K (the block scales' unit)
      double part = 0;
      for (int64_t kk = 128 * q; kk < std::min(k, 128 * (q + 1)); ++kk)
        part += elem_value(c.ta, ha, r * k + kk) * elem_value(c.tb, hb, j * k + kk) *
                (kk < c.piece_k ? 0.5 : 1.0);
      want += c.scale == Scale::kBlock ? part * hsa[q * lsa + r] * hsb[q * nb + j / 128] : part;
    }
    double got;
    if (int_out) {
      int32_t v;
      std::memcpy(&v, hd.data() + 4 * e, 4);
      got = v;
      exact = exact && got == want;
    } else {
      want *= hscale[0];
      if (!hrow.empty()) want *= double(hrow[r]) * hcol[j];
      if (c.bias) want += hbias[j];
      want = act_ref(c.act, want);
      got = host_load(hd.data(), c.out, e);
    }
    if (!std::isfinite(got)) finite = false;
    num += (got - want) * (got - want);
    den += want * want;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const double tol = int_out                  ? 0.0
                     : c.ta == DType::kF32       ? 2e-3  // operands read as TF32 (2^-11)
                     : c.promote ? (c.out == DType::kF32 ? 1e-6 : bound(c.out, k))  // exact products
                     : c.out == DType::kF32 && c.ta != DType::kS8 ? 2e-4  // fp8 wgmma sums
                                                                  : bound(c.out, k);
  const bool ok = err.empty() && finite && exact && rel <= tol;
  static const char* kScale[] = {"none", "tensor", "row/col", "block"};
  if (!ok || verbose())
    std::printf("%s byte %s %s x %s -> %s %ldx%ldx%ld split %d scale %s%s%s%s: rel %.2e (tol "
                "%.0e)%s%s\n",
                ok ? "ok  " : "FAIL", ConfigName(kConfigs[cfg]).c_str(), byte_name(c.ta),
                byte_name(c.tb), int_out ? "s32" : dtype_name(c.out), long(m), long(n), long(k),
                c.split, kScale[int(c.scale)], c.bias ? " bias" : "", c.n_major ? " B [K][N]" : "",
                c.piece_k ? " pieces scaled" : "", rel, tol,
                finite ? "" : " [not finite: an element never written]", err.c_str());
  return t.add(ok);
}

}  // namespace

void byte_cases(bool quick, int cc, Tally& t) {
  if (cc < 80) return;  // sm_90a kernels on 9.0 only; the sm80 int8 kernels from 8.0 on
  std::mt19937 rng(8642);
  const int before = t.failed, total = t.passed + t.failed;
  const DType E4 = DType::kE4M3, E5 = DType::kE5M2, S8 = DType::kS8, F32 = DType::kF32,
              F16 = DType::kF16;
  const Activation kNo = Activation::kNone;
  std::vector<ByteCase> cases = {
      {S8, S8, DType::kS32, 200, 136, 528, Scale::kNone, false, kNo},
      {S8, S8, DType::kBF16, 129, 300, 144, Scale::kRowCol, true, Activation::kRelu},
      {E4, E4, DType::kBF16, 200, 136, 528, Scale::kTensor, false, kNo},
      {E4, E5, DType::kF32, 129, 300, 144, Scale::kRowCol, true, Activation::kGeluTanh},
      {E5, E4, DType::kF16, 70, 260, 272, Scale::kBlock, false, kNo},
      {E4, E4, DType::kF32, 1, 200, 48, Scale::kBlock, true, Activation::kSilu},
      {F32, F32, DType::kF32, 200, 136, 528, Scale::kTensor, false, kNo},
      {F32, F32, DType::kBF16, 129, 300, 1060, Scale::kNone, true, Activation::kGeluTanh, 2},
      {F32, F32, DType::kF16, 1, 130, 4, Scale::kNone, false, kNo},
      // B [K][N]: N a 16-byte multiple (vector loads) or not (bytes), K past one 256-row tile
      {S8, S8, DType::kS32, 200, 272, 528, Scale::kNone, false, kNo, 1, true},
      {E4, E5, DType::kBF16, 129, 300, 144, Scale::kTensor, true, Activation::kRelu, 1, true},
      {E5, E4, DType::kF32, 70, 136, 400, Scale::kBlock, false, kNo, 1, true},
      // K slices: int8 exact and W8A8 (row / column scales in the reduction), fp8 per-tensor
      // and block scales, with B [K][N] too
      {S8, S8, DType::kS32, 16, 520, 2048, Scale::kNone, false, kNo, 4},
      {S8, S8, DType::kBF16, 40, 300, 1024, Scale::kRowCol, true, Activation::kGelu, 2, true},
      {E4, E4, DType::kBF16, 16, 264, 1280, Scale::kTensor, true, Activation::kRelu, 3},
      {E4, E5, DType::kF32, 33, 136, 1024, Scale::kBlock, false, kNo, 2, true},
      // block scales with M % 4 == 0 (no padding past M in block_sa's rows; the cases above
      // have some), a partial last tile, K slices
      {E4, E4, DType::kBF16, 200, 300, 528, Scale::kBlock, false, kNo},
      {E5, E4, DType::kF32, 260, 136, 1024, Scale::kBlock, true, Activation::kRelu, 2},
      // promoted float16 (f16x3): row / column scales, pieces of two k tiles and an odd last
      // one, K slices (the reduction applies the scales), a one-row product; scaled pieces
      // (piece_scale_k) whose boundary falls inside a pair: k tile 3 of 9, and k tile 10, the
      // second of slice 1's first pair (9 + 8 tiles)
      {F16, F16, DType::kF32, 200, 136, 520, Scale::kRowCol, true, Activation::kGeluTanh, 1,
       false, true},
      {F16, F16, DType::kF32, 200, 136, 520, Scale::kRowCol, false, kNo, 1, false, true, 192},
      {F16, F16, DType::kBF16, 129, 300, 1064, Scale::kRowCol, false, kNo, 2, false, true},
      {F16, F16, DType::kF32, 129, 300, 1064, Scale::kRowCol, true, kNo, 2, false, true, 640},
      {F16, F16, DType::kF32, 1, 130, 8, Scale::kTensor, false, kNo, 1, false, true},
  };
  if (!quick) {
    cases.push_back({S8, S8, DType::kS32, 517, 1000, 4096, Scale::kNone, false, kNo});
    cases.push_back({E4, E4, DType::kBF16, 517, 1000, 4112, Scale::kBlock, true, kNo});
  }
  for (int cfg = 0; cfg < kNumConfigs; ++cfg)
    for (const ByteCase& c : cases)
      if ((c.ta == F32 || c.promote ? HasTf32Kernels(cfg) : HasByteKernels(cfg, c.ta != S8)) &&
          (cc == 90 || (c.ta == S8 && kConfigs[cfg].kind == Kind::kSm80)) && selected(cfg))
        run_case(c, cfg, rng, t);
  std::printf("byte: %d of %d cases failed\n", t.failed - before, t.passed + t.failed - total);
}

}  // namespace selftest
