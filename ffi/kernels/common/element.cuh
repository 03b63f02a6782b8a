// Element types as a template axis: the CUDA type of each DType, its traits, and the one
// float32 -> element conversion (round to nearest even) that every store goes through.
#pragma once
#include <cuda.h>  // CUtensorMapDataType
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "host/gemm_params.h"

namespace tcgemm {

// Compile-time facts of element type T: bytes, the TMA data type that moves it, and its DType.
template <typename T>
struct ElemTraits;
template <>
struct ElemTraits<__half> {
  static constexpr int kBytes = 2;
  static constexpr DType kType = DType::kF16;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
};
template <>
struct ElemTraits<__nv_bfloat16> {
  static constexpr int kBytes = 2;
  static constexpr DType kType = DType::kBF16;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
};
template <>
struct ElemTraits<float> {
  static constexpr int kBytes = 4;
  static constexpr DType kType = DType::kF32;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
};

// The 8-bit operand types (sm90 wgmma only): TMA moves them as bytes.
template <>
struct ElemTraits<__nv_fp8_e4m3> {
  static constexpr int kBytes = 1;
  static constexpr DType kType = DType::kE4M3;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_UINT8;
};
template <>
struct ElemTraits<__nv_fp8_e5m2> {
  static constexpr int kBytes = 1;
  static constexpr DType kType = DType::kE5M2;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_UINT8;
};
template <>
struct ElemTraits<int8_t> {
  static constexpr int kBytes = 1;
  static constexpr DType kType = DType::kS8;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_UINT8;
};

template <typename Out>
__device__ __forceinline__ Out convert(float x) {
  if constexpr (std::is_same_v<Out, __half>) return __float2half_rn(x);
  else if constexpr (std::is_same_v<Out, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return x;
}

template <typename In>
__device__ __forceinline__ float to_float(In x) {
  if constexpr (std::is_same_v<In, float>) return x;
  else return static_cast<float>(x);
}

// Calls f(T{}) with T the CUDA type of DType t: the one switch over the float element types
// (16-bit operands, epilogue inputs, float results) that every kernel goes through (host and
// device). The 8-bit operand types and int32 results are not among them: with_byte_operand.
template <typename F>
__host__ __device__ __forceinline__ void with_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF16: f(__half{}); break;
    case DType::kBF16: f(__nv_bfloat16{}); break;
    case DType::kF32: f(float{}); break;
    default: break;
  }
}

// A 4 x 4 block of bytes transposed: x[i] holds row i (byte c: column c); y[c] receives column c
// (byte i: row i). Eight byte permutes; how 8-bit rows stored N-major become K-major words
// (kernels/aux/pack.cu's copy, the narrow kernels' registers).
__device__ __forceinline__ void transpose_4x4_bytes(const uint32_t (&x)[4], uint32_t (&y)[4]) {
  const uint32_t lo01 = __byte_perm(x[0], x[1], 0x5140), hi01 = __byte_perm(x[0], x[1], 0x7362);
  const uint32_t lo23 = __byte_perm(x[2], x[3], 0x5140), hi23 = __byte_perm(x[2], x[3], 0x7362);
  y[0] = __byte_perm(lo01, lo23, 0x5410);
  y[1] = __byte_perm(lo01, lo23, 0x7632);
  y[2] = __byte_perm(hi01, hi23, 0x5410);
  y[3] = __byte_perm(hi01, hi23, 0x7632);
}

// Calls f(T{}) with T the CUDA type of 8-bit operand type t (IsByteOperand).
template <typename F>
__host__ __device__ __forceinline__ void with_byte_operand(DType t, F&& f) {
  switch (t) {
    case DType::kE4M3: f(__nv_fp8_e4m3{}); break;
    case DType::kE5M2: f(__nv_fp8_e5m2{}); break;
    case DType::kS8: f(int8_t{}); break;
    default: break;
  }
}

// Calls f(TA{}, TB{}) with the CUDA types of 8-bit operand pair `pair` (BytePair's index).
template <typename F>
__host__ __device__ __forceinline__ void with_byte_pair(int pair, F&& f) {
  switch (pair) {
    case 0: f(int8_t{}, int8_t{}); break;
    case 1: f(__nv_fp8_e4m3{}, __nv_fp8_e4m3{}); break;
    case 2: f(__nv_fp8_e4m3{}, __nv_fp8_e5m2{}); break;
    case 3: f(__nv_fp8_e5m2{}, __nv_fp8_e4m3{}); break;
    default: break;
  }
}

}  // namespace tcgemm
