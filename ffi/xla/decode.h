// What every FFI handler shares: formatting shapes and dtypes for errors, the ffi::Error of a
// bad call, and the map from XLA element types to ours.
#pragma once
#include <optional>
#include <string>

#include "host/gemm_params.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace tcgemm {

inline std::string Dims(ffi::AnyBuffer::Dimensions d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

inline const char* DtypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F32: return "float32";
    default: return "an unsupported dtype";
  }
}

inline ffi::Error Invalid(const std::string& msg) { return ffi::Error::InvalidArgument("tcgemm: " + msg); }

inline std::optional<DType> ToDType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16: return DType::kF16;
    case ffi::DataType::BF16: return DType::kBF16;
    case ffi::DataType::F32: return DType::kF32;
    default: return std::nullopt;
  }
}

}  // namespace tcgemm
