// XLA FFI handler of the tcgemm custom call: decodes buffers and attributes, validates them
// against each other, and launches the GEMM on XLA's stream. Every failure is an ffi::Error.
#include "gemm_ffi.h"

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "gemm_config.h"
#include "gemm_dispatch.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace tcgemm {
namespace {

std::string Dims(ffi::AnyBuffer::Dimensions d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

const char* DtypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F32: return "float32";
    default: return "an unsupported dtype";
  }
}

ffi::Error Invalid(const std::string& msg) { return ffi::Error::InvalidArgument("tcgemm: " + msg); }

ffi::Error TcgemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                      ffi::Result<ffi::AnyBuffer> c, ffi::Result<ffi::AnyBuffer> workspace,
                      bool transpose_a, bool transpose_b, std::string_view config,
                      int64_t split_k, bool pack) {
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
  if (at != bt || (at != ffi::DataType::F16 && at != ffi::DataType::BF16))
    return Invalid(std::string("operands must both be float16 or both bfloat16; got ") +
                   DtypeName(at) + " and " + DtypeName(bt));
  if (ct != ffi::DataType::F16 && ct != ffi::DataType::BF16 && ct != ffi::DataType::F32)
    return Invalid("result must be float16, bfloat16 or float32");

  const int cfg = FindConfig(config);
  if (cfg < 0) return Invalid("unknown config '" + std::string(config) + "'");
  if (split_k < 1 || split_k > kMaxSplitK)
    return Invalid("split_k must be in [1, " + std::to_string(kMaxSplitK) + "]; got " +
                   std::to_string(split_k));
  if (workspace->element_type() != ffi::DataType::F32 || workspace->dimensions().size() != 1)
    return Invalid("the workspace result must be a rank-1 float32 buffer; got " +
                   std::string(DtypeName(workspace->element_type())) +
                   Dims(workspace->dimensions()));
  if (c->element_count() == 0) return ffi::Error::Success();  // M, N or batch is 0

  GemmProblem pr{};
  pr.params.a = a.untyped_data();
  pr.params.b = b.untyped_data();
  pr.params.c = c->untyped_data();
  pr.params.m = m;
  pr.params.n = n;
  pr.params.k = ka;
  pr.params.batch = batch;
  pr.params.stride_a = ad[0] == 1 ? 0 : m * ka;
  pr.params.stride_b = bd[0] == 1 ? 0 : ka * n;
  pr.params.out_type = ct == ffi::DataType::F16    ? OutType::kF16
                       : ct == ffi::DataType::BF16 ? OutType::kBF16
                                                   : OutType::kF32;
  pr.in_type = at == ffi::DataType::F16 ? InType::kF16 : InType::kBF16;
  pr.transpose_a = transpose_a;
  pr.transpose_b = transpose_b;
  pr.config = cfg;
  pr.params.split_k = static_cast<int>(split_k);
  pr.workspace = static_cast<float*>(workspace->untyped_data());
  pr.pack = pack;
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
                                  .Ret<ffi::AnyBuffer>()  // c: (B, M, N); Ba, Bb in {1, B}
                                  .Ret<ffi::AnyBuffer>()  // workspace: f32 (PlanWorkspace)
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b")
                                  .Attr<std::string_view>("config")
                                  .Attr<int64_t>("split_k")
                                  .Attr<bool>("pack"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace tcgemm
