// XLA FFI handler of the tcgemm_ragged custom call (lax.ragged_dot's grouped products): decodes
// and validates the buffers and attributes, and launches one grouped GEMM on XLA's stream. The
// group sizes stay on the device (the kernel's tile scheduler reads them). Every failure is an
// ffi::Error.
#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "host/gemm_config.h"
#include "host/gemm_dispatch.h"
#include "xla/decode.h"
#include "xla/gemm_ffi.h"

namespace tcgemm {
namespace {

// mode 0 (rows): a (M, K), b (G, K, N) or (G, N, K) with transpose_b, d (M, N), [bias f32
//   (G, N)]; mode 1 (contraction): a (M, K), b (M, N), d (G, K, N). group_sizes: int32 (G,).
ffi::Error RaggedImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                      ffi::AnyBuffer group_sizes, ffi::RemainingArgs rest,
                      ffi::Result<ffi::AnyBuffer> d, int32_t mode, bool transpose_b,
                      std::string_view config, int32_t activation, bool has_bias) {
  const auto ad = a.dimensions(), bd = b.dimensions(), gd = group_sizes.dimensions(),
             dd = d->dimensions();
  auto shapes = [&] {
    return "a" + Dims(ad) + ", b" + Dims(bd) + " transpose_b=" + (transpose_b ? "1" : "0") +
           ", group_sizes" + Dims(gd) + ", d" + Dims(dd) + ", mode " + std::to_string(mode);
  };
  if (mode != 0 && mode != 1) return Invalid("ragged: mode must be 0 or 1: " + shapes());
  if (group_sizes.element_type() != ffi::DataType::S32 || gd.size() != 1)
    return Invalid("ragged: group_sizes must be int32 (G,): " + shapes());
  const int64_t groups = gd[0];
  if (ad.size() != 2) return Invalid("ragged: a must be (M, K): " + shapes());
  const int64_t rows = ad[0], kdim = ad[1];
  GemmProblem pr{};
  GemmParams& p = pr.params;
  if (mode == 0) {
    const int64_t n = bd.size() == 3 ? (transpose_b ? bd[1] : bd[2]) : -1;
    if (bd.size() != 3 || bd[0] != groups || (transpose_b ? bd[2] : bd[1]) != kdim ||
        dd.size() != 2 || dd[0] != rows || dd[1] != n)
      return Invalid("ragged rows: b must be (G, K, N) (or (G, N, K) with transpose_b) and d "
                     "(M, N): " + shapes());
    p.m = rows;
    p.n = n;
    p.k = kdim;
    p.batch = 1;
    p.stride_b = kdim * n;
    pr.transpose_a = false;
    pr.transpose_b = transpose_b;
    p.ragged.mode = RaggedMode::kRows;
  } else {
    if (transpose_b || bd.size() != 2 || bd[0] != rows || dd.size() != 3 || dd[0] != groups ||
        dd[1] != kdim || dd[2] != bd[1])
      return Invalid("ragged contraction: b must be (M, N) and d (G, K, N): " + shapes());
    p.m = kdim;  // the product is op(A) = a^T (K x M, stored [M][K]) times b (M x N)
    p.n = bd[1];
    p.k = rows;
    p.batch = groups;
    p.stride_b = 0;
    pr.transpose_a = true;
    pr.transpose_b = false;
    p.ragged.mode = RaggedMode::kContract;
  }
  if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX || groups > INT32_MAX)
    return Invalid("ragged: M, N, K and G must each be below 2^31: " + shapes());
  const ffi::DataType at = a.element_type(), bt = b.element_type();
  if (at != bt || (at != ffi::DataType::F16 && at != ffi::DataType::BF16))
    return Invalid(std::string("ragged: operands must both be float16 or both bfloat16; got ") +
                   DtypeName(at) + " and " + DtypeName(bt));
  const auto d_type = ToDType(d->element_type());
  if (!d_type) return Invalid("ragged: d must be float16, bfloat16 or float32: " + shapes());
  const int cfg = FindConfig(config);
  if (cfg < 0) return Invalid("ragged: unknown config '" + std::string(config) + "'");
  if (activation < 0 || activation >= kNumActivations)
    return Invalid("ragged: unknown activation " + std::to_string(activation));
  if (rest.size() != size_t(has_bias)) return Invalid("ragged: has_bias does not match the operands");
  if (mode == 1 && (has_bias || activation != 0))
    return Invalid("ragged contraction: no bias or activation");
  p.epi.act = static_cast<Activation>(activation);
  if (has_bias) {
    auto bias = rest.get<ffi::AnyBuffer>(0);
    if (bias.has_error()) return Invalid("ragged: cannot decode bias");
    const auto bsd = bias.value().dimensions();
    if (!DecodeBias(bias.value(), p.epi) || bsd.size() != 2 || bsd[0] != groups || bsd[1] != p.n)
      return Invalid("ragged: bias must be float16, bfloat16 or float32 (G, N); got " +
                     std::string(DtypeName(bias.value().element_type())) + Dims(bsd) + " [" +
                     shapes() + "]");
    p.epi.bias_sb = p.n;
  }
  if (d->element_count() == 0) return ffi::Error::Success();

  p.a = a.untyped_data();
  p.b = b.untyped_data();
  p.d = d->untyped_data();
  p.d_type = *d_type;
  p.stride_a = 0;
  p.split_k = 1;
  p.ragged.sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  p.ragged.groups = static_cast<int>(groups);
  pr.in_type = *ToDType(at);
  pr.b_type = pr.in_type;
  pr.config = cfg;
  pr.pack = false;
  pr.workspace = nullptr;
  if (std::string err = LaunchGemm(pr, PlanWorkspace(pr), stream); !err.empty())
    return ffi::Error::Internal("tcgemm_ragged: " + err + " [" + shapes() + ", config " +
                                std::string(config) + "]");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TcgemmRaggedHandler, RaggedImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a: (M, K)
                                  .Arg<ffi::AnyBuffer>()  // b: (G, K, N) / (G, N, K) / (M, N)
                                  .Arg<ffi::AnyBuffer>()  // group_sizes: int32 (G,)
                                  .RemainingArgs()        // [bias: f32 (G, N)]
                                  .Ret<ffi::AnyBuffer>()  // d: (M, N) / (G, K, N)
                                  .Attr<int32_t>("mode")
                                  .Attr<bool>("transpose_b")
                                  .Attr<std::string_view>("config")
                                  .Attr<int32_t>("activation")
                                  .Attr<bool>("has_bias"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace tcgemm
