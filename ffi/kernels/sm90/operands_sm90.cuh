// The operand types of the sm90 kernel (gemm_sm90.cuh): element types, accumulator, and the
// wgmma of one 32-byte k step.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/element.cuh"
#include "ptx/wgmma.cuh"

namespace tcgemm {

// The operand types of an sm90 kernel: A's and B's elements (the same but for the mixed fp8
// pairs), the accumulator type, and the wgmma of one 32-byte k step of a 64 x BN block (k16 of
// 16-bit operands, k32 of 8-bit ones, k8 of float32 ones read as TF32). kPromote: a k tile's
// (TF32: two k tiles') products are summed apart (from 0) and then added into the float32
// accumulators (fp8, whose
// wgmma sums keep fewer bits than float32; TF32, whose wgmma float32 sums are truncated: chained
// over all of K their error grows linearly with K, 1.6e-4 at K = 65536 for 3xTF32 against
// 1.1e-6 for float32 FMA; summed per 32 or 64 of K and added with round-to-nearest FADDs it
// does not grow: benchmarks/NOTES.md v35, v38). PROMOTED: 16-bit operands summed so too (float16
// parts of float32 operands, f16x3: GemmProblem::promote), K-major both, as TF32 is.
// kScaled: products that may carry row and column scales in the epilogue (8-bit: W8A8 and fp8
// per-row / per-column scales; f16x3: the parts' powers of two).
template <typename TA, typename TB = TA, bool PROMOTED = false>
struct Sm90Operands {
  using A = TA;
  using B = TB;
  static constexpr int kBytes = ElemTraits<TA>::kBytes;
  static constexpr bool kInt = std::is_same_v<TA, int8_t>;
  static constexpr bool kPromote = (kBytes == 1 && !kInt) || kBytes == 4 || PROMOTED;
  static constexpr bool kScaled = kBytes == 1 || PROMOTED;
  static_assert(!PROMOTED || kBytes == 2, "PROMOTED: 16-bit operands");
  static constexpr bool kBlockScales = kBytes == 1 && !kInt;  // DeepSeek-V3 block scales: fp8
  using Acc = std::conditional_t<kInt, int, float>;
  static constexpr int kKTile = 128 / kBytes;  // elements of a k tile: one 128-byte row
  static_assert(ElemTraits<TB>::kBytes == kBytes && (kBytes == 4 || kBytes == 2 || kBytes == 1),
                "A and B: both float32, both 16-bit or both 8-bit");
  static_assert(kBytes != 1 ? std::is_same_v<TA, TB> : kInt == std::is_same_v<TB, int8_t>,
                "float32 or 16-bit operands of one type; int8 with int8; fp8 with fp8");

  template <int BN, bool A_KMAJOR, bool B_KMAJOR>
  __device__ __forceinline__ static void mma(Acc (&d)[BN / 2], uint64_t da, uint64_t db,
                                             int scale_d) {
    if constexpr (kBytes == 2) {
      constexpr int ta = A_KMAJOR ? 0 : 1, tb = B_KMAJOR ? 0 : 1;
      constexpr bool bf16 = std::is_same_v<TA, __nv_bfloat16>;
      if constexpr (BN == 256) ptx::wgmma_m64n256k16<ta, tb, bf16>(d, da, db, scale_d);
      else ptx::wgmma_m64n128k16<ta, tb, bf16>(d, da, db, scale_d);
    } else if constexpr (kBytes == 4) {
      static_assert(A_KMAJOR && B_KMAJOR, "wgmma reads TF32 operands K-major only");
      if constexpr (BN == 256) ptx::wgmma_m64n256k8_tf32(d, da, db, scale_d);
      else ptx::wgmma_m64n128k8_tf32(d, da, db, scale_d);
    } else {
      static_assert(A_KMAJOR && B_KMAJOR, "wgmma reads 8-bit operands K-major only");
      if constexpr (kInt) {
        if constexpr (BN == 256) ptx::wgmma_m64n256k32_s8(d, da, db, scale_d);
        else ptx::wgmma_m64n128k32_s8(d, da, db, scale_d);
      } else {
        static_assert(BN == 128, "fp8: pieces of 128 columns (gemm_sm90_kernel)");
        ptx::wgmma_m64n128k32_fp8<std::is_same_v<TA, __nv_fp8_e5m2>,
                                  std::is_same_v<TB, __nv_fp8_e5m2>>(d, da, db, scale_d);
      }
    }
  }
};

}  // namespace tcgemm
