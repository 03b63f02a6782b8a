// XLA FFI handler of the tcgemm_split custom call (lowering.split_operand): the parts of one
// float32 operand of a multi-pass float32 product, laid out along K' as jax_tcgemm/f32.layout
// says (host/split.h). Decodes and validates the buffers and the layout (every column of K'
// written exactly once, nothing outside the result), then launches on XLA's stream. Every
// failure is an ffi::Error.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "host/split.h"
#include "xla/decode.h"
#include "xla/gemm_ffi.h"

namespace tcgemm {
namespace {

ffi::Error SplitImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::RemainingRets rets,
                     int32_t kind, bool k_major, ffi::Span<const int64_t> offsets,
                     ffi::Span<const int32_t> parts, ffi::Span<const int64_t> zeros,
                     int32_t top_exp, float lo_scale) {
  const auto xd = x.dimensions();
  auto shapes = [&] {
    std::string s = std::string("x") + Dims(xd) + " " + DtypeName(x.element_type()) +
                    (k_major ? " (batch, rows, k)" : " (batch, k, rows)");
    for (size_t i = 0; i < rets.size(); ++i) {
      auto r = rets.get<ffi::AnyBuffer>(i);
      if (!r.has_error())
        s += ", result " + Dims(r.value()->dimensions()) + " " +
             DtypeName(r.value()->element_type());
    }
    return s;
  };
  if (kind < 0 || kind >= kNumSplitKinds) return Invalid("split: unknown kind " + std::to_string(kind));
  SplitJob j{};
  j.kind = static_cast<SplitKind>(kind);
  const bool scaled = j.kind == SplitKind::kF16Scaled;
  if (x.element_type() != ffi::DataType::F32 || xd.size() != 3)
    return Invalid("split: x must be float32 of rank 3: " + shapes());
  if (rets.size() != (scaled ? 2u : 1u))
    return Invalid("split: expected " + std::string(scaled ? "2 results (parts, inv)" : "1 result") +
                   ": " + shapes());
  j.x = static_cast<const float*>(x.untyped_data());
  j.k_major = k_major;
  j.batch = xd[0];
  j.rows = k_major ? xd[1] : xd[2];
  j.k = k_major ? xd[2] : xd[1];
  auto out = rets.get<ffi::AnyBuffer>(0);
  if (out.has_error()) return Invalid("split: cannot decode the parts' result");
  const auto od = out.value()->dimensions();
  const ffi::DataType want = j.kind == SplitKind::kTf32   ? ffi::DataType::F32
                             : j.kind == SplitKind::kBf16 ? ffi::DataType::BF16
                                                          : ffi::DataType::F16;
  if (out.value()->element_type() != want || od.size() != 3 || od[0] != j.batch ||
      od[1] != j.rows)
    return Invalid(std::string("split: the parts must be ") + DtypeName(want) +
                   " (batch, rows, K'): " + shapes());
  j.out = out.value()->untyped_data();
  j.kk = od[2];
  if (scaled) {
    auto inv = rets.get<ffi::AnyBuffer>(1);
    if (inv.has_error()) return Invalid("split: cannot decode inv");
    const auto id = inv.value()->dimensions();
    if (inv.value()->element_type() != ffi::DataType::F32 || id.size() != 2 ||
        id[0] != j.batch || id[1] != j.rows)
      return Invalid("split: inv must be float32 (batch, rows): " + shapes());
    j.inv = static_cast<float*>(inv.value()->untyped_data());
    if (top_exp < -100 || top_exp > 100) return Invalid("split: top_exp out of range");
    j.top_exp = top_exp;
    j.lo_scale = lo_scale;
  }
  // The layout: blocks [offset, offset + k) and zero ranges tile [0, K') exactly.
  if (offsets.size() != parts.size() || offsets.size() < 1 || offsets.size() > kMaxSplitBlocks ||
      zeros.size() % 2 != 0 || zeros.size() / 2 > kMaxSplitZeros)
    return Invalid("split: a layout of 1-" + std::to_string(kMaxSplitBlocks) +
                   " blocks (offsets, parts) and up to " + std::to_string(kMaxSplitZeros) +
                   " zero ranges");
  std::vector<std::pair<int64_t, int64_t>> spans;
  j.nblocks = int(offsets.size());
  for (int b = 0; b < j.nblocks; ++b) {
    const int part = parts[b] & 3;
    if (parts[b] < 0 || parts[b] > 7 || part > (scaled ? 1 : 2))
      return Invalid("split: block " + std::to_string(b) + " has no part " + std::to_string(parts[b]));
    j.offset[b] = offsets[b];
    j.part[b] = part;
    j.masked[b] = parts[b] & 4;
    j.parts = std::max(j.parts, part + 1);
    spans.emplace_back(offsets[b], offsets[b] + j.k);
  }
  j.nzeros = int(zeros.size() / 2);
  for (int i = 0; i < j.nzeros; ++i) {
    j.zero_begin[i] = zeros[2 * i];
    j.zero_end[i] = zeros[2 * i + 1];
    if (zeros[2 * i + 1] > zeros[2 * i]) spans.emplace_back(zeros[2 * i], zeros[2 * i + 1]);
  }
  std::sort(spans.begin(), spans.end());
  int64_t at = 0;  // each span must start where the last ended: no gap, overlap or overhang
  bool tiled = true;
  for (const auto& [begin, end] : spans) {
    tiled = tiled && begin == at;
    at = end;
  }
  if (!tiled || at != j.kk)
    return Invalid("split: the layout's blocks and zero ranges do not tile K' = " +
                   std::to_string(j.kk) + " exactly: " + shapes());
  if (cudaError_t e = LaunchSplit(j, stream); e != cudaSuccess)
    return ffi::Error::Internal(std::string("tcgemm split launch: ") + cudaGetErrorString(e));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TcgemmSplitHandler, SplitImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x: float32, rank 3
                                  .RemainingRets()        // parts (B, rows, K'), [inv f32 (B, rows)]
                                  .Attr<int32_t>("kind")
                                  .Attr<bool>("k_major")
                                  .Attr<ffi::Span<const int64_t>>("offsets")
                                  .Attr<ffi::Span<const int32_t>>("parts")
                                  .Attr<ffi::Span<const int64_t>>("zeros")
                                  .Attr<int32_t>("top_exp")
                                  .Attr<float>("lo_scale"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace tcgemm
