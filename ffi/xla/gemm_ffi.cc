// XLA FFI handler of the tcgemm custom call: decodes buffers and attributes, validates them
// against each other, and launches the GEMM on XLA's stream. Every failure is an ffi::Error.
#include "xla/gemm_ffi.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <optional>

#include <string>
#include <string_view>

#include "host/gemm_config.h"
#include "host/gemm_dispatch.h"
#include "xla/decode.h"
#include "xla/ffi/api/ffi.h"

namespace tcgemm {
namespace {

// The epilogue operands (c, bias, scale, `tensor_scales` float32 scalars, row_scale, col_scale:
// the call's arguments after a and b, those the flags name, in that order), then the block
// scales (block_sa, block_sb: into p) and the aux result (after d and the workspace), checked
// against the result (B, M, N) and K and decoded into p. Empty string, or what is wrong.
std::string DecodeEpilogue(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets,
                           ffi::AnyBuffer::Dimensions cd, int64_t k, DType d_type, bool has_c,
                           bool has_bias, bool has_scale, int64_t tensor_scales,
                           bool has_row_scale, bool has_col_scale, bool has_block_scale, bool aux,
                           float alpha, float beta, int32_t activation, GemmParams& p) {
  EpilogueParams& ep = p.epi;
  if (tensor_scales < 0 || tensor_scales > 2)
    return "tensor_scales must be 0, 1 or 2; got " + std::to_string(tensor_scales);
  const size_t want = size_t(has_c) + size_t(has_bias) + size_t(has_scale) +
                      size_t(tensor_scales) + size_t(has_row_scale) + size_t(has_col_scale) +
                      2 * size_t(has_block_scale);
  if (d_type == DType::kS32 && (want > 0 || aux || activation != 0 || alpha != 1.0f))
    return "an int32 result is the exact int8 product: no epilogue, scale or alpha";
  if (args.size() != want)
    return "expected " + std::to_string(want) + " epilogue operands; got " + std::to_string(args.size());
  if (rets.size() != size_t(aux))
    return "expected " + std::to_string(int(aux)) + " aux results; got " + std::to_string(rets.size());
  if (activation < 0 || activation >= kNumActivations)
    return "unknown activation " + std::to_string(activation);
  ep.act = static_cast<Activation>(activation);
  ep.alpha = alpha;
  ep.beta = beta;
  size_t i = 0;
  if (has_c) {
    auto c = args.get<ffi::AnyBuffer>(i++);
    if (c.has_error()) return "cannot decode c";
    const auto d = c.value().dimensions();
    const auto t = ToDType(c.value().element_type());
    if (!t) return "c must be float16, bfloat16 or float32";
    if (d.size() != 3 || (d[0] != 1 && d[0] != cd[0]) || (d[1] != 1 && d[1] != cd[1]) ||
        (d[2] != 1 && d[2] != cd[2]))
      return "c" + Dims(d) + " does not broadcast to the result" + Dims(cd);
    ep.c = c.value().untyped_data();
    ep.c_type = *t;
    ep.c_sc = d[2] == cd[2] && cd[2] > 1 ? 1 : 0;
    ep.c_sr = d[1] == cd[1] && cd[1] > 1 ? d[2] : 0;
    ep.c_sb = d[0] == cd[0] && cd[0] > 1 ? d[1] * d[2] : 0;
  }
  if (has_bias) {
    auto b = args.get<ffi::AnyBuffer>(i++);
    if (b.has_error()) return "cannot decode bias";
    const auto d = b.value().dimensions();
    if (!DecodeBias(b.value(), ep) || d.size() != 2 || d[1] != cd[2] ||
        (d[0] != 1 && d[0] != cd[0]))
      return "bias must be float16, bfloat16 or float32 (1 or B, N); got " +
             std::string(DtypeName(b.value().element_type())) + Dims(d) + " for the result" +
             Dims(cd);
    ep.bias_sb = d[0] == cd[0] && cd[0] > 1 ? d[1] : 0;
  }
  if (has_scale) {
    auto s = args.get<ffi::AnyBuffer>(i++);
    if (s.has_error()) return "cannot decode scale";
    if (s.value().element_type() != ffi::DataType::F32 || s.value().element_count() != 2)
      return "scale must be float32 [alpha, beta]";
    ep.scale = static_cast<const float*>(s.value().untyped_data());
  }
  for (int64_t j = 0; j < tensor_scales; ++j) {
    auto s = args.get<ffi::AnyBuffer>(i++);
    if (s.has_error()) return "cannot decode tensor scale " + std::to_string(j);
    if (s.value().element_type() != ffi::DataType::F32 || s.value().element_count() != 1)
      return "a tensor scale must be one float32; got " +
             std::string(DtypeName(s.value().element_type())) + Dims(s.value().dimensions());
    ep.tensor_scale[j] = static_cast<const float*>(s.value().untyped_data());
  }
  // Per-row (B, M) and per-column (1 or B, N) float32 scales; with `ld`, rows of at least
  // `cols` (their length stored there); with `got_rows`, 1 row also (shared by the batch; the
  // rows stored there); rows < 0: any number of rows (the caller checks them).
  auto vec = [&](const char* name, int64_t rows, int64_t cols, const float*& to,
                 int64_t* ld = nullptr, int64_t* got_rows = nullptr) -> std::string {
    const bool rows1 = got_rows != nullptr;
    auto v = args.get<ffi::AnyBuffer>(i++);
    if (v.has_error()) return std::string("cannot decode ") + name;
    const auto d = v.value().dimensions();
    if (v.value().element_type() != ffi::DataType::F32 || d.size() != 2 ||
        !(rows < 0 || d[0] == rows || (rows1 && d[0] == 1)) ||
        (ld ? d[1] < cols : d[1] != cols))
      return std::string(name) + " must be float32 (" + (rows1 && rows >= 0 ? "1 or " : "") +
             (rows < 0 ? std::string("rows") : std::to_string(rows)) + ", " +
             (ld ? ">= " : "") + std::to_string(cols) +
             "); got " + DtypeName(v.value().element_type()) + Dims(d);
    to = static_cast<const float*>(v.value().untyped_data());
    if (ld) *ld = d[1];
    if (got_rows) *got_rows = d[0];
    return {};
  };
  if (has_row_scale)
    if (std::string e = vec("row_scale", cd[0], cd[1], ep.row_scale); !e.empty()) return e;
  if (has_col_scale) {
    int64_t rows = 1;
    if (std::string e = vec("col_scale", cd[0], cd[2], ep.col_scale, nullptr, &rows); !e.empty())
      return e;
    ep.col_scale_sb = rows == cd[0] && cd[0] > 1 ? cd[2] : 0;
  }
  if (has_block_scale) {  // (ceil(K/128), >= M) and (ceil(K/128), ceil(N/128)), or the B items'
    // stacked along the rows: (B ceil(K/128), ...)
    const int64_t kb = (k + 127) / 128, nb = (cd[2] + 127) / 128;
    int64_t rows_a = 0, rows_b = 0;
    auto items = [&](const char* name, int64_t rows) -> std::string {
      if (rows == kb || rows == cd[0] * kb) return {};
      return std::string(name) + " must have ceil(K/128) = " + std::to_string(kb) + " or B * " +
             std::to_string(kb) + " rows; got " + std::to_string(rows);
    };
    if (std::string e = vec("block_sa", -1, cd[1], p.block_sa, &p.block_sa_ld, &rows_a);
        !e.empty() || !(e = items("block_sa", rows_a)).empty())
      return e;
    if (std::string e = vec("block_sb", -1, nb, p.block_sb, nullptr, &rows_b);
        !e.empty() || !(e = items("block_sb", rows_b)).empty())
      return e;
    p.block_sa_sb = rows_a == kb ? 0 : kb * p.block_sa_ld;
    p.block_sb_sb = rows_b == kb ? 0 : kb * nb;
  }
  if (aux) {
    auto x = rets.get<ffi::AnyBuffer>(0);
    if (x.has_error()) return "cannot decode aux";
    const auto d = x.value()->dimensions();
    if (ToDType(x.value()->element_type()) != d_type || d.size() != 3 || d[0] != cd[0] ||
        d[1] != cd[1] || d[2] != cd[2])
      return "aux must have the result's type and shape" + Dims(cd) + "; got " + Dims(d);
    ep.aux = x.value()->untyped_data();
  }
  return {};
}

ffi::Error TcgemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                      ffi::RemainingArgs epi_args, ffi::Result<ffi::AnyBuffer> c,
                      ffi::Result<ffi::AnyBuffer> workspace, ffi::RemainingRets epi_rets,
                      bool transpose_a, bool transpose_b, std::string_view config,
                      int64_t split_k, bool pack, bool has_c, bool has_bias, bool has_scale,
                      int64_t tensor_scales, bool has_row_scale, bool has_col_scale,
                      bool has_block_scale, bool aux,
                      bool promote, int64_t piece_scale_k, float piece_scale, int64_t tail_rows,
                      int64_t tail_split, float alpha, float beta, int32_t activation) {
  const auto ad = a.dimensions(), bd = b.dimensions(), cd = c->dimensions();
  if (ad.size() != 3 || bd.size() != 3 || cd.size() != 3)
    return Invalid("operands and result must have rank 3 (batch, rows, cols); got a" + Dims(ad) +
                   ", b" + Dims(bd) + ", c" + Dims(cd));
  const int64_t m = transpose_a ? ad[2] : ad[1], ka = transpose_a ? ad[1] : ad[2];
  const int64_t kb = transpose_b ? bd[2] : bd[1], n = transpose_b ? bd[1] : bd[2];
  const int64_t batch = cd[0];
  // Built only when an error is reported: nothing is formatted on the launch path.
  auto shapes = [&] {
    return "a" + Dims(ad) + " transpose_a=" + (transpose_a ? "1" : "0") + ", b" + Dims(bd) +
           " transpose_b=" + (transpose_b ? "1" : "0") + ", c" + Dims(cd);
  };
  if (ka != kb) return Invalid("contracting sizes differ: " + shapes());
  if (m > INT32_MAX || n > INT32_MAX || ka > INT32_MAX)
    return Invalid("M, N and K must each be below 2^31: " + shapes());
  if (cd[1] != m || cd[2] != n) return Invalid("result shape does not match operands: " + shapes());
  if ((ad[0] != batch && ad[0] != 1) || (bd[0] != batch && bd[0] != 1))
    return Invalid("batch sizes must equal the result's or be 1: " + shapes());

  const ffi::DataType at = a.element_type(), bt = b.element_type(), ct = c->element_type();
  const std::optional<DType> ta = ToAnyDType(at), tb = ToAnyDType(bt);
  const bool wide = at == bt && (at == ffi::DataType::F16 || at == ffi::DataType::BF16);
  const bool byte = ta && tb && BytePair(*ta, *tb) >= 0;  // an 8-bit pair of ours
  const bool tf32 = at == ffi::DataType::F32 && bt == ffi::DataType::F32;  // read as TF32
  if (!wide && !byte && !tf32)
    return Invalid(std::string("operands must be float16 x float16, bfloat16 x bfloat16, "
                               "float32 x float32, int8 x int8 or float8 (e4m3fn x e4m3fn, "
                               "e4m3fn x e5m2, e5m2 x e4m3fn); got ") +
                   DtypeName(at) + " and " + DtypeName(bt));
  const std::optional<DType> d_type = ToAnyDType(ct);
  if (!d_type || (*d_type == DType::kS32 ? *ta != DType::kS8 : !ToDType(ct)))
    return Invalid(std::string("result must be float16, bfloat16 or float32 (or int32 for int8 "
                               "operands); got ") + DtypeName(ct) + " for " + DtypeName(at) +
                   " operands");
  // 8-bit b may also come N-major with pack=1: the handler copies it K-major (PlanWorkspace)
  if (tf32 && (transpose_a || !transpose_b || pack))
    return Invalid("float32 operands are read K-major: a (B, M, K) with transpose_a=0 and b "
                   "(B, N, K) with transpose_b=1, pack=0: " + shapes());
  if (byte && (transpose_a || transpose_b == pack))
    return Invalid("8-bit operands are read K-major: a (B, M, K) with transpose_a=0, and b "
                   "(B, N, K) with transpose_b=1, pack=0 or b (B, K, N) with transpose_b=0, "
                   "pack=1 (copied K-major first): " + shapes());
  if (has_block_scale && !(byte && *ta != DType::kS8))
    return Invalid("block scales go with fp8 operands: " + shapes());
  if (promote && (at != ffi::DataType::F16 || bt != ffi::DataType::F16 || transpose_a ||
                  !transpose_b || pack))
    return Invalid("promoted operands are float16, read K-major: a (B, M, K) with "
                   "transpose_a=0 and b (B, N, K) with transpose_b=1, pack=0: " + shapes());

  const int cfg = FindConfig(config);
  if (cfg < 0) return Invalid("unknown config '" + std::string(config) + "'");
  if (split_k < 1 || split_k > kMaxSplitK)
    return Invalid("split_k must be in [1, " + std::to_string(kMaxSplitK) + "]; got " +
                   std::to_string(split_k));
  if (tail_rows < 0 || tail_rows >= std::max<int64_t>(m, 1) || tail_split < 1 ||
      tail_split > kMaxSplitK || (tail_rows > 0 && (split_k != 1 || batch != 1)))
    return Invalid("a tail split needs 0 <= tail_rows < M, tail_split in [1, " +
                   std::to_string(kMaxSplitK) + "], and split_k 1 and batch 1 with tail_rows > "
                   "0; got tail_rows " + std::to_string(tail_rows) + ", tail_split " +
                   std::to_string(tail_split) + ", split_k " + std::to_string(split_k) + ": " +
                   shapes());
  if (workspace->element_type() != ffi::DataType::F32 || workspace->dimensions().size() != 1)
    return Invalid("the workspace result must be a rank-1 float32 buffer; got " +
                   std::string(DtypeName(workspace->element_type())) +
                   Dims(workspace->dimensions()));
  GemmProblem pr{};
  if (std::string err = DecodeEpilogue(epi_args, epi_rets, cd, ka, *d_type, has_c, has_bias,
                                       has_scale, tensor_scales, has_row_scale, has_col_scale,
                                       has_block_scale, aux, alpha, beta, activation, pr.params);
      !err.empty())
    return Invalid(err + " [" + shapes() + "]");
  if (c->element_count() == 0) return ffi::Error::Success();  // M, N or batch is 0

  pr.params.a = a.untyped_data();
  pr.params.b = b.untyped_data();
  pr.params.d = c->untyped_data();
  pr.params.m = m;
  pr.params.n = n;
  pr.params.k = ka;
  pr.params.batch = batch;
  pr.params.stride_a = ad[0] == 1 ? 0 : m * ka;
  pr.params.stride_b = bd[0] == 1 ? 0 : ka * n;
  pr.params.d_type = *d_type;
  pr.in_type = *ta;
  pr.b_type = *tb;
  pr.transpose_a = transpose_a;
  pr.transpose_b = transpose_b;
  pr.config = cfg;
  pr.params.split_k = static_cast<int>(split_k);
  pr.workspace = static_cast<float*>(workspace->untyped_data());
  pr.pack = pack;
  pr.promote = promote;
  pr.params.piece_scale_k = piece_scale_k;  // (LaunchGemm checks both)
  pr.params.piece_scale = piece_scale;
  pr.tail_rows = tail_rows;  // (LaunchGemm checks the rest)
  pr.tail_split = static_cast<int>(tail_split);
  const WorkspacePlan plan = PlanWorkspace(pr);
  if (const int64_t need = plan.total(); static_cast<int64_t>(workspace->element_count()) < need)
    return Invalid("split_k=" + std::to_string(split_k) + (pack ? ", pack=1" : ", pack=0") +
                   " needs a workspace of " + std::to_string(need) + " floats; got " +
                   std::to_string(workspace->element_count()) + " [" + shapes() + "]");
  if (std::string err = LaunchGemm(pr, plan, stream); !err.empty())
    return ffi::Error::Internal("tcgemm: " + err + " [" + shapes() + ", config " +
                                std::string(config) + "]");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TcgemmHandler, TcgemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a: (Ba, M, K), or (Ba, K, M) if transpose_a
                                  .Arg<ffi::AnyBuffer>()  // b: (Bb, K, N), or (Bb, N, K) if transpose_b
                                  .RemainingArgs()        // [c], [bias], [scale], tensor
                                                          // scales, [row_scale], [col_scale],
                                                          // [block_sa, block_sb]
                                                          // (DecodeEpilogue)
                                  .Ret<ffi::AnyBuffer>()  // d: (B, M, N); Ba, Bb in {1, B}
                                  .Ret<ffi::AnyBuffer>()  // workspace: f32 (PlanWorkspace)
                                  .RemainingRets()        // [aux]: the pre-activation
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b")
                                  .Attr<std::string_view>("config")
                                  .Attr<int64_t>("split_k")
                                  .Attr<bool>("pack")
                                  .Attr<bool>("has_c")
                                  .Attr<bool>("has_bias")
                                  .Attr<bool>("has_scale")
                                  .Attr<int64_t>("tensor_scales")  // 0-2 float32 scalars
                                  .Attr<bool>("has_row_scale")
                                  .Attr<bool>("has_col_scale")
                                  .Attr<bool>("has_block_scale")
                                  .Attr<bool>("aux")
                                  .Attr<bool>("promote")  // GemmProblem::promote (f16x3)
                                  .Attr<int64_t>("piece_scale_k")  // GemmParams::piece_scale_k
                                  .Attr<float>("piece_scale")
                                  .Attr<int64_t>("tail_rows")   // GemmProblem::tail_rows
                                  .Attr<int64_t>("tail_split")  // GemmProblem::tail_split
                                  .Attr<float>("alpha")
                                  .Attr<float>("beta")
                                  .Attr<int32_t>("activation"),
                              {ffi::Traits::kCmdBufferCompatible});

ffi::Error DactImpl(cudaStream_t stream, ffi::AnyBuffer ct, ffi::AnyBuffer pre,
                    ffi::RemainingRets rets, int32_t activation, bool has_g, bool has_dbias,
                    bool bias_batched) {
  const auto cd = ct.dimensions(), pd = pre.dimensions();
  auto shapes = [&] { return "ct" + Dims(cd) + ", pre" + Dims(pd); };
  if (cd.size() != 3) return Invalid("dact: ct must have rank 3 (batch, rows, cols): " + shapes());
  if (activation < 0 || activation >= kNumActivations)
    return Invalid("dact: unknown activation " + std::to_string(activation));
  DactJob job{};
  job.act = static_cast<Activation>(activation);
  job.batch = cd[0];
  job.rows = cd[1];
  job.cols = cd[2];
  const auto ctt = ToDType(ct.element_type()), pt = ToDType(pre.element_type());
  if (!ctt || !pt) return Invalid("dact: ct and pre must be float16, bfloat16 or float32");
  if (job.act != Activation::kNone &&
      (pd.size() != 3 || pd[0] != cd[0] || pd[1] != cd[1] || pd[2] != cd[2]))
    return Invalid("dact: pre must have ct's shape: " + shapes());
  if (rets.size() != size_t(has_g) + size_t(has_dbias))
    return Invalid("dact: results do not match has_g / has_dbias");
  job.ct = ct.untyped_data();
  job.ct_type = *ctt;
  job.pre = pre.untyped_data();
  job.pre_type = *pt;
  job.bias_batched = bias_batched;
  size_t i = 0;
  if (has_g) {
    auto g = rets.get<ffi::AnyBuffer>(i++);
    if (g.has_error()) return Invalid("dact: cannot decode g");
    const auto gd = g.value()->dimensions();
    const auto gt = ToDType(g.value()->element_type());
    if (!gt || gd.size() != 3 || gd[0] != cd[0] || gd[1] != cd[1] || gd[2] != cd[2])
      return Invalid("dact: g must have ct's shape and a float type: " + shapes());
    job.g = g.value()->untyped_data();
    job.g_type = *gt;
  }
  if (has_dbias) {
    auto db = rets.get<ffi::AnyBuffer>(i++);
    if (db.has_error()) return Invalid("dact: cannot decode dbias");
    const auto dd = db.value()->dimensions();
    if (db.value()->element_type() != ffi::DataType::F32 || dd.size() != 2 || dd[1] != cd[2] ||
        dd[0] != (bias_batched ? cd[0] : 1))
      return Invalid("dact: dbias must be float32 (B or 1, cols): " + shapes() + ", dbias" + Dims(dd));
    job.dbias = static_cast<float*>(db.value()->untyped_data());
  }
  if (cd[2] > INT32_MAX * int64_t(32) || (bias_batched && cd[0] > 65535))
    return Invalid("dact: too large: " + shapes());
  if (cudaError_t e = LaunchDact(job, stream); e != cudaSuccess)
    return ffi::Error::Internal(std::string("tcgemm dact launch: ") + cudaGetErrorString(e));
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(TcgemmDactHandler, DactImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // ct: (B, rows, cols)
                                  .Arg<ffi::AnyBuffer>()  // pre: ct's shape (the forward's aux)
                                  .RemainingRets()        // [g: ct's shape], [dbias: f32 (B|1, cols)]
                                  .Attr<int32_t>("activation")
                                  .Attr<bool>("has_g")
                                  .Attr<bool>("has_dbias")
                                  .Attr<bool>("bias_batched"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace tcgemm
