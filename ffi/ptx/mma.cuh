// mma.sync m16n8k16 with float32 accumulation and m16n8k32 int8 with int32 accumulation
// (sm_80+). PTX ISA 8.x, section 9.7.14.5.14 "Multiply-and-Accumulate Instruction: mma",
// fragment layouts in 9.7.14.5.8 (".m16n8k16" for .f16/.bf16, ".m16n8k32" for .s8).
// Per lane (g = lane/4, q = lane%4):
//   m16n8k16 a[0..3]: A rows {g, g+8} (a[1], a[3]: g+8) x cols {2q, 2q+1} (+8 for a[2], a[3]),
//            two b16 per register
//   m16n8k16 b[0..1]: B rows (k) {2q, 2q+1} (+8 for b[1]) x col (n) g
//   m16n8k32 a[0..3]: the same rows x cols {4q..4q+3} (+16 for a[2], a[3]), four s8 per register
//   m16n8k32 b[0..1]: B rows (k) {4q..4q+3} (+16 for b[1]) x col (n) g
//   c/d[0..3]: rows {g, g+8} x cols {2q, 2q+1} (both shapes)
// m16n8k32 with e4m3 / e5m2 operands (sm_89+) has the s8 fragment layout, float32 sums.
// Where K is contiguous in memory, a register of either shape holds the same four bytes of
// its row (column of B): a k16 step's 16-bit fragments are, byte for byte, a k32 step's int8
// fragments (kernels/sm80/gemm_sm80.cuh reads int8 operands as 16-bit pairs).
#pragma once
#include <cstdint>

namespace tcgemm::ptx {

// One mma.sync of shape and types TYS ("m16n8k16.row.col.f32.f16.f16.f32", ...) on d (C:
// "+f" for float32 accumulators, "+r" for int32 ones), A a[0..3], B b[0..1]; D = A * B + D.
#define TCGEMM_MMA_SYNC(TYS, C)                                                  \
  asm volatile("mma.sync.aligned." TYS                                          \
               " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
               : C(d[0]), C(d[1]), C(d[2]), C(d[3])                             \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))

__device__ __forceinline__ void mma_m16n8k16_f32_f16_f16_f32(float (&d)[4], const uint32_t (&a)[4],
                                                             const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  TCGEMM_MMA_SYNC("m16n8k16.row.col.f32.f16.f16.f32", "+f");
#endif
}

__device__ __forceinline__ void mma_m16n8k16_f32_bf16_bf16_f32(float (&d)[4],
                                                               const uint32_t (&a)[4],
                                                               const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  TCGEMM_MMA_SYNC("m16n8k16.row.col.f32.bf16.bf16.f32", "+f");
#endif
}

// Exact: int32 sums wrap modulo 2^32 (no .satfinite).
__device__ __forceinline__ void mma_m16n8k32_s32_s8_s8_s32(int (&d)[4], const uint32_t (&a)[4],
                                                          const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  TCGEMM_MMA_SYNC("m16n8k32.row.col.s32.s8.s8.s32", "+r");
#endif
}

// fp8 pairs (e4m3 / e5m2 for A and B), float32 accumulation: sm_89 and newer (the kernels'
// sm_80 builds compile an empty body; the dispatcher launches them on 9.0 and newer only).
#define TCGEMM_MMA_FP8(NAME, TA, TB)                                                   \
  __device__ __forceinline__ void NAME(float (&d)[4], const uint32_t (&a)[4],           \
                                       const uint32_t (&b)[2]) {                        \
    TCGEMM_MMA_FP8_BODY("m16n8k32.row.col.f32." TA "." TB ".f32");                     \
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define TCGEMM_MMA_FP8_BODY(TYS) TCGEMM_MMA_SYNC(TYS, "+f")
#else
#define TCGEMM_MMA_FP8_BODY(TYS)
#endif
TCGEMM_MMA_FP8(mma_m16n8k32_f32_e4m3_e4m3_f32, "e4m3", "e4m3")
TCGEMM_MMA_FP8(mma_m16n8k32_f32_e4m3_e5m2_f32, "e4m3", "e5m2")
TCGEMM_MMA_FP8(mma_m16n8k32_f32_e5m2_e4m3_f32, "e5m2", "e4m3")
#undef TCGEMM_MMA_FP8_BODY
#undef TCGEMM_MMA_FP8

#undef TCGEMM_MMA_SYNC

}  // namespace tcgemm::ptx
