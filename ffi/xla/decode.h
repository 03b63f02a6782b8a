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
    case ffi::DataType::F8E4M3FN: return "float8_e4m3fn";
    case ffi::DataType::F8E5M2: return "float8_e5m2";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S32: return "int32";
    default: return "an unsupported dtype";
  }
}

inline ffi::Error Invalid(const std::string& msg) { return ffi::Error::InvalidArgument("tcgemm: " + msg); }

// The float element types (16-bit operands, epilogue inputs, float results); nullopt for others.
inline std::optional<DType> ToDType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16: return DType::kF16;
    case ffi::DataType::BF16: return DType::kBF16;
    case ffi::DataType::F32: return DType::kF32;
    default: return std::nullopt;
  }
}

// The epilogue's bias operand into ep (bias, bias_type): any float type of ToDType, which the
// kernels read and add in float32; false (ep unchanged) for any other type.
inline bool DecodeBias(const ffi::AnyBuffer& b, EpilogueParams& ep) {
  const auto t = ToDType(b.element_type());
  if (!t) return false;
  ep.bias = b.untyped_data();
  ep.bias_type = *t;
  return true;
}

// Every element type of ours: the float ones, the 8-bit operand types and int32 results.
inline std::optional<DType> ToAnyDType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F8E4M3FN: return DType::kE4M3;
    case ffi::DataType::F8E5M2: return DType::kE5M2;
    case ffi::DataType::S8: return DType::kS8;
    case ffi::DataType::S32: return DType::kS32;
    default: return ToDType(t);
  }
}

}  // namespace tcgemm
