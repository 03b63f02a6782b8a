// The one epilogue of every kernel family (sm80, sm90, the cluster and workspace split-K
// reductions):  D = act(alpha * acc + beta * C + bias), in float32 from the accumulator,
// rounded once to D's type; optionally the pre-activation value to `aux` (what the backward
// pass reads); or, for a split-K slice, the raw float32 partial product instead.
//
// A kernel calls, for V consecutive accumulators of one row (r < M; columns col.. of which
// those past N are ignored):
//   EpiScale s = epi_scale(p);             once per thread (alpha, beta)
//   epi_store<Out>(p, s, z, r, col, v, ...) the whole epilogue into D (and aux), or its parts:
//   epi_pre(p, s, z, r, col, v)            v <- alpha * v + beta * C + bias (pre-activation)
//   epi_act(p, v)                          v <- act(v)
//   store_vec<Out>(dst, v, ...)            v converted once and stored
#pragma once
#include <cstdint>
#include <type_traits>

#include "host/gemm_params.h"
#include "kernels/common/element.cuh"
#include "ptx/math.cuh"

namespace tcgemm {

// FAST: the result is rounded to bfloat16, so tanh may be the one-instruction approximation
// (relative error ~2^-11, below bfloat16's 2^-9 rounding).
template <bool FAST = false>
__device__ __forceinline__ float activate(Activation a, float x) {
  switch (a) {
    case Activation::kNone: return x;
    case Activation::kRelu: return x < 0.0f ? 0.0f : x;  // NaN stays NaN, as jax.nn.relu
    case Activation::kGelu: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::kGeluTanh: {
      const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + (FAST ? ptx::tanh_approx(u) : tanhf(u)));
    }
    case Activation::kSilu: return x / (1.0f + expf(-x));
  }
  return x;
}

// f(std::integral_constant<Activation, a>{}): the activation as a compile-time value, for a
// loop that applies it to many elements (the switch outside the loop).
template <typename F>
__host__ __device__ __forceinline__ void with_activation(Activation a, F&& f) {
  using A = Activation;
  switch (a) {
    case A::kNone: f(std::integral_constant<A, A::kNone>{}); return;
    case A::kRelu: f(std::integral_constant<A, A::kRelu>{}); return;
    case A::kGelu: f(std::integral_constant<A, A::kGelu>{}); return;
    case A::kGeluTanh: f(std::integral_constant<A, A::kGeluTanh>{}); return;
    case A::kSilu: f(std::integral_constant<A, A::kSilu>{}); return;
  }
}

// d act / dx at the pre-activation x (kernels/aux/dact.cu). FAST: the result is rounded to a
// 16-bit type, so gelu_tanh's tanh and sech^2 may come from one fast exponential,
// e = exp(-2|u|): tanh u = sign(u) (1 - e) / (1 + e), sech^2 u = 4 e / (1 + e)^2; both keep
// their relative accuracy (~1e-6) where 1 - tanh^2 cancels (tanh.approx's 2^-11 would not).
template <bool FAST = false>
__device__ __forceinline__ float activate_grad(Activation a, float x) {
  if (FAST && a == Activation::kGeluTanh) {
    const float c = 0.79788456080286536f;
    const float u = c * (x + 0.044715f * x * x * x);
    const float e = __expf(-2.0f * fabsf(u)), r = __fdividef(1.0f, 1.0f + e);
    const float t = copysignf((1.0f - e) * r, u), sech2 = 4.0f * e * r * r;
    return 0.5f * (1.0f + t) + 0.5f * x * sech2 * c * (1.0f + 3.0f * 0.044715f * x * x);
  }
  switch (a) {
    case Activation::kNone: return 1.0f;
    case Activation::kRelu: return x > 0.0f ? 1.0f : 0.0f;
    case Activation::kGelu:
      return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) +
             x * 0.39894228040143268f * expf(-0.5f * x * x);
    case Activation::kGeluTanh: {
      const float c = 0.79788456080286536f;
      const float t = tanhf(c * (x + 0.044715f * x * x * x));
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
    }
    case Activation::kSilu: {
      const float s = 1.0f / (1.0f + expf(-x));
      return s * (1.0f + x * (1.0f - s));
    }
  }
  return 1.0f;
}

__device__ __forceinline__ float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF32: return static_cast<const float*>(base)[i];
    default: break;  // C and bias are float16, bfloat16 or float32 (the FFI checks)
  }
  return 0.0f;
}

// alpha and beta of a launch, read once per thread (from device memory when traced).
struct EpiScale {
  float alpha, beta;
};
__device__ __forceinline__ EpiScale epi_scale(const GemmParams& p) {
  EpiScale s = p.epi.scale ? EpiScale{p.epi.scale[0], p.epi.scale[1]}
                           : EpiScale{p.epi.alpha, p.epi.beta};
#pragma unroll
  for (const float* t : p.epi.tensor_scale)
    if (t) s.alpha *= *t;
  return s;
}

// The scale of row r of item z (row_scale, 1 without) and of column c of item z (col_scale; 1
// without, or past N): a scaled product's per-row / per-column factors. The sm90 kernels' epilogue
// (epilogue_sm90.cuh) and epi_pre (the sm80 kernels' epilogue: int8; the split-K reductions)
// apply them: scaled products have 8-bit or promoted float16 operands (f16x3); LaunchGemm
// rejects the scales with any other.
__device__ __forceinline__ float epi_row_scale(const EpilogueParams& ep, int64_t m, int64_t z,
                                               int64_t r) {
  return ep.row_scale ? __ldg(ep.row_scale + z * m + r) : 1.0f;
}
__device__ __forceinline__ float epi_col_scale(const EpilogueParams& ep, int64_t n, int64_t z,
                                               int64_t c) {
  return ep.col_scale && c < n ? __ldg(ep.col_scale + z * ep.col_scale_sb + c) : 1.0f;
}

// The column scales of columns c and c + 1 (c even; 1 past N): one 8-byte load where aligned.
__device__ __forceinline__ float2 epi_col_scales2(const EpilogueParams& ep, int64_t n, int64_t z,
                                                  int64_t c) {
  if (!ep.col_scale) return make_float2(1.0f, 1.0f);
  const float* at = ep.col_scale + z * ep.col_scale_sb + c;
  if (c + 1 < n && (reinterpret_cast<uintptr_t>(at) & 7) == 0)
    return __ldg(reinterpret_cast<const float2*>(at));
  return make_float2(c < n ? __ldg(at) : 1.0f, c + 1 < n ? __ldg(at + 1) : 1.0f);
}

// x * a * b for a product's scales a (alpha times its row's) and b (its column's): their product
// times x, or, where that product leaves float32's normal range (f16x3's powers of two of a row
// and a column far apart: x * 2^113 * 2^-112 or x * 2^-97 * 2^-56), x times the one that keeps
// x * a * b in range first, so that only a result beyond float32's range over- or underflows.
__device__ __forceinline__ float scale_by(float x, float a, float b) {
  const float f = a * b;
  if ((fabsf(f) >= 1.17549435e-38f && fabsf(f) <= 3.40282347e38f) || a == 0.0f || b == 0.0f)
    return f * x;
  const bool a_small = fabsf(a) < fabsf(b);
  const float small = a_small ? a : b, large = a_small ? b : a;
  return fabsf(f) < 1.0f ? x * large * small : x * small * large;
}

// v[j] (row r, column col + j of batch item z) <- alpha * row scale * column scale * v[j] +
// beta * C + bias (the scales: 8-bit products' W8A8 form, f16x3's powers of two: 1 without;
// scale_by).
template <int V>
__device__ __forceinline__ void epi_pre(const GemmParams& p, EpiScale s, int64_t z, int64_t r,
                                        int64_t col, float (&v)[V]) {
  const EpilogueParams& ep = p.epi;
  // (the helpers return 1 without scales; the tests here keep 16-bit products' reduction at
  // one multiply, which it needs to stay spill-free: benchmarks/NOTES.md v42)
  const float ra = ep.row_scale ? s.alpha * epi_row_scale(ep, p.m, z, r) : s.alpha;
#pragma unroll
  for (int j = 0; j < V; ++j)
    v[j] = ep.col_scale ? scale_by(v[j], ra, epi_col_scale(ep, p.n, z, col + j)) : v[j] * ra;
  if (ep.c) {
    const int64_t base = z * ep.c_sb + r * ep.c_sr;
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (col + j < p.n) v[j] += s.beta * load_as_float(ep.c, ep.c_type, base + (col + j) * ep.c_sc);
  }
  if (ep.bias) {
    const int64_t base = z * ep.bias_sb;
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (col + j < p.n) v[j] += load_as_float(ep.bias, ep.bias_type, base + col + j);
  }
}

// The activation of a value that is rounded to Out next (bfloat16: the fast tanh, see activate).
template <typename Out>
__device__ __forceinline__ float activate_for(Activation a, float x) {
  return activate<std::is_same_v<Out, __nv_bfloat16>>(a, x);
}

template <int V, typename Out = float>
__device__ __forceinline__ void epi_act(const GemmParams& p, float (&v)[V]) {
  if (p.epi.act == Activation::kNone) return;
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = activate_for<Out>(p.epi.act, v[j]);
}

// Stores V floats to dst[0..V) as Out: one vector store when `vec` (dst aligned to V elements,
// the whole group inside the row), else element by element up to `cols_left`.
template <typename Out, int V>
__device__ __forceinline__ void store_vec(Out* dst, const float (&v)[V], int cols_left, bool vec) {
  static_assert(V == 1 || V == 2 || V == 4, "one, a pair or a quad");
  if (V == 1 || vec) {
    if constexpr (std::is_same_v<Out, float>) {
      if constexpr (V == 4) *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
      else if constexpr (V == 2) *reinterpret_cast<float2*>(dst) = make_float2(v[0], v[1]);
      else dst[0] = v[0];
    } else {
      struct alignas(V * sizeof(Out)) OutV { Out x[V]; } o;
#pragma unroll
      for (int j = 0; j < V; ++j) o.x[j] = convert<Out>(v[j]);
      *reinterpret_cast<OutV*>(dst) = o;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (j < cols_left) dst[j] = convert<Out>(v[j]);
  }
}

// The whole epilogue on v, then v to D at element offset d_off (and the pre-activation to aux
// at the same offset, when asked).
template <typename Out, int V>
__device__ __forceinline__ void epi_store(const GemmParams& p, EpiScale s, int64_t z, int64_t r,
                                          int64_t col, float (&v)[V], int64_t d_off,
                                          int cols_left, bool vec) {
  epi_pre(p, s, z, r, col, v);
  if (p.epi.aux) store_vec<Out, V>(static_cast<Out*>(p.epi.aux) + d_off, v, cols_left, vec);
  epi_act<V, Out>(p, v);
  store_vec<Out, V>(static_cast<Out*>(p.d) + d_off, v, cols_left, vec);
}

}  // namespace tcgemm
