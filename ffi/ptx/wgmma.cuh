// wgmma: warpgroup-level asynchronous matrix multiply-accumulate (sm_90a only).
// PTX ISA 8.x, section 9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
// Instructions": wgmma.mma_async (9.7.15.5.2), wgmma.fence, wgmma.commit_group,
// wgmma.wait_group (9.7.15.6-8); the shared-memory matrix descriptor in 9.7.15.5.1.2.
// The four warps of a warpgroup (128 consecutive threads, the first warp's index a multiple of
// 4) issue each instruction together. A and B come from shared memory through 64-bit
// descriptors; D (float32) lives in registers: for m64nNk16, warp w of the group holds rows
// 16w .. 16w+15 and, per 8-column block j, d[4j .. 4j+3] laid out like mma.sync's m16n8 C
// fragment (rows g, g, g+8, g+8 and columns 8j + 2q, +1, with g = lane/4, q = lane%4).
// scale_d = 0 ignores D's old value (D = A*B), 1 accumulates. TRANS_A / TRANS_B = 1 reads an
// M-major A / N-major B (allowed for 16-bit types), 0 a K-major one. The int32 accumulators of
// the int8 forms have the same layout.
// The bodies are empty unless compiled for sm_90a (-gencode arch=compute_90a,code=sm_90a).
#pragma once
#include <cstdint>

namespace tcgemm::ptx {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TCGEMM_SM90A 1
#else
#define TCGEMM_SM90A 0
#endif

// Orders this thread's register writes (accumulators) before the next wgmma.mma_async.
__device__ __forceinline__ void wgmma_fence() {
#if TCGEMM_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

// Closes the wgmma.mma_async operations issued so far into one group.
__device__ __forceinline__ void wgmma_commit_group() {
#if TCGEMM_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most N groups of this warpgroup are pending (their shared-memory reads and
// register writes are complete).
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
#if TCGEMM_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Pins the compiler's view of accumulator registers `d` at this point (an empty asm that
// reads and writes each): reads of sums that an earlier wgmma_wait_group made complete are not
// moved above that wait, and writes to them not below the next wgmma_fence.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// setmaxnreg (PTX 9.7.17.1): moves registers between warpgroups of a kernel launched with a
// register cap (__launch_bounds__(threads, 1)); every warp of the warpgroup executes it.
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
#if TCGEMM_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
#if TCGEMM_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

// wgmma.mma_async.sync.aligned.m64n{256,128}k16.f32.{f16,bf16}: D (+)= A * B. The accumulator
// operand lists are spelled once (D_REGS_*: "%0, ..., %63" and "%64, ..., %127"; D_OUT*: the
// matching "+f" constraints); descriptors, scale_d and the transpose immediates follow them.
#define TCGEMM_D_REGS_LO \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define TCGEMM_D_REGS_HI \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, " \
  "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, " \
  "%115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// (C: the constraint, "+f" for float32 accumulators, "+r" for int32 ones)
#define TCGEMM_D_OUTC8(C, d, i) \
  C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), C(d[i + 6]), C(d[i + 7])
#define TCGEMM_D_OUTC64(C, d, i)                                                          \
  TCGEMM_D_OUTC8(C, d, i), TCGEMM_D_OUTC8(C, d, i + 8), TCGEMM_D_OUTC8(C, d, i + 16),      \
      TCGEMM_D_OUTC8(C, d, i + 24), TCGEMM_D_OUTC8(C, d, i + 32),                         \
      TCGEMM_D_OUTC8(C, d, i + 40), TCGEMM_D_OUTC8(C, d, i + 48), TCGEMM_D_OUTC8(C, d, i + 56)
#define TCGEMM_D_OUT64(d, i) TCGEMM_D_OUTC64("+f", d, i)
#define TCGEMM_D_OUTI64(d, i) TCGEMM_D_OUTC64("+r", d, i)
// One wgmma with D registers REGS, then operands A (descriptor), B, scale_d, trans-a, trans-b.
#define TCGEMM_WGMMA(N, TY, REGS, A, B, S, TA, TB)                                       \
  "{\n .reg .pred p;\n setp.ne.b32 p, " S ", 0;\n"                                      \
  " wgmma.mma_async.sync.aligned.m64n" N "k16.f32." TY "." TY " {" REGS "}, " A ", " B \
  ", p, 1, 1, " TA ", " TB ";\n}\n"

template <int TRANS_A, int TRANS_B, bool BF16>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                 int scale_d) {
#if TCGEMM_SM90A
  if constexpr (BF16) {
    asm volatile(TCGEMM_WGMMA("256", "bf16", TCGEMM_D_REGS_LO ", " TCGEMM_D_REGS_HI, "%128",
                              "%129", "%130", "%131", "%132")
                 : TCGEMM_D_OUT64(d, 0), TCGEMM_D_OUT64(d, 64)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
  } else {
    asm volatile(TCGEMM_WGMMA("256", "f16", TCGEMM_D_REGS_LO ", " TCGEMM_D_REGS_HI, "%128",
                              "%129", "%130", "%131", "%132")
                 : TCGEMM_D_OUT64(d, 0), TCGEMM_D_OUT64(d, 64)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
  }
#endif
}

template <int TRANS_A, int TRANS_B, bool BF16>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int scale_d) {
#if TCGEMM_SM90A
  if constexpr (BF16) {
    asm volatile(TCGEMM_WGMMA("128", "bf16", TCGEMM_D_REGS_LO, "%64", "%65", "%66", "%67", "%68")
                 : TCGEMM_D_OUT64(d, 0)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
  } else {
    asm volatile(TCGEMM_WGMMA("128", "f16", TCGEMM_D_REGS_LO, "%64", "%65", "%66", "%67", "%68")
                 : TCGEMM_D_OUT64(d, 0)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
  }
#endif
}

// The 8-bit and TF32 forms read K-major A and B only (no transpose immediates); one
// instruction covers 32 bytes of K (k32 of 8-bit, k8 of tf32 elements).
// fp8 (TA, TB each "e4m3" or "e5m2"): m64n128k32.f32: D (+)= A * B, the imm-scale-a / -b sign
// immediates at +1. Hopper keeps fewer than float32's bits in this accumulation: the kernel
// starts each k tile's sum at 0 (scale_d = 0 on its first instruction) and adds it into float32
// registers itself. int8: m64n{128,256}k32.s32.s8.s8, exact int32 accumulation. tf32:
// m64n{128,256}k8.f32.tf32.tf32 on float32 operands in shared memory (the tensor cores use
// each one's sign, exponent and 10 high mantissa bits), float32 accumulation.
#define TCGEMM_WGMMA_KMAJOR(N, K, TYS, REGS, A, B, S, TAIL)                                   \
  "{\n .reg .pred p;\n setp.ne.b32 p, " S ", 0;\n"                                         \
  " wgmma.mma_async.sync.aligned.m64n" N "k" K "." TYS " {" REGS "}, " A ", " B ", p" TAIL \
  ";\n}\n"
#define TCGEMM_WGMMA_K32(N, TYS, REGS, A, B, S, TAIL) \
  TCGEMM_WGMMA_KMAJOR(N, "32", TYS, REGS, A, B, S, TAIL)

template <bool A_E5M2, bool B_E5M2>
__device__ __forceinline__ void wgmma_m64n128k32_fp8(float (&d)[64], uint64_t desc_a,
                                                     uint64_t desc_b, int scale_d) {
#if TCGEMM_SM90A
#define TCGEMM_FP8(TYS)                                                                        \
  asm volatile(TCGEMM_WGMMA_K32("128", TYS, TCGEMM_D_REGS_LO, "%64", "%65", "%66", ", 1, 1") \
               : TCGEMM_D_OUT64(d, 0)                                                          \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))
  if constexpr (!A_E5M2 && !B_E5M2) TCGEMM_FP8("f32.e4m3.e4m3");
  else if constexpr (!A_E5M2 && B_E5M2) TCGEMM_FP8("f32.e4m3.e5m2");
  else if constexpr (A_E5M2 && !B_E5M2) TCGEMM_FP8("f32.e5m2.e4m3");
  else TCGEMM_FP8("f32.e5m2.e5m2");
#undef TCGEMM_FP8
#endif
}

__device__ __forceinline__ void wgmma_m64n128k32_s8(int (&d)[64], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d) {
#if TCGEMM_SM90A
  asm volatile(TCGEMM_WGMMA_K32("128", "s32.s8.s8", TCGEMM_D_REGS_LO, "%64", "%65", "%66", "")
               : TCGEMM_D_OUTI64(d, 0)
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

__device__ __forceinline__ void wgmma_m64n256k32_s8(int (&d)[128], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d) {
#if TCGEMM_SM90A
  asm volatile(TCGEMM_WGMMA_K32("256", "s32.s8.s8", TCGEMM_D_REGS_LO ", " TCGEMM_D_REGS_HI,
                                "%128", "%129", "%130", "")
               : TCGEMM_D_OUTI64(d, 0), TCGEMM_D_OUTI64(d, 64)
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

__device__ __forceinline__ void wgmma_m64n128k8_tf32(float (&d)[64], uint64_t desc_a,
                                                     uint64_t desc_b, int scale_d) {
#if TCGEMM_SM90A
  asm volatile(TCGEMM_WGMMA_KMAJOR("128", "8", "f32.tf32.tf32", TCGEMM_D_REGS_LO, "%64", "%65",
                                   "%66", ", 1, 1")
               : TCGEMM_D_OUT64(d, 0)
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

__device__ __forceinline__ void wgmma_m64n256k8_tf32(float (&d)[128], uint64_t desc_a,
                                                     uint64_t desc_b, int scale_d) {
#if TCGEMM_SM90A
  asm volatile(TCGEMM_WGMMA_KMAJOR("256", "8", "f32.tf32.tf32",
                                   TCGEMM_D_REGS_LO ", " TCGEMM_D_REGS_HI, "%128", "%129", "%130",
                                   ", 1, 1")
               : TCGEMM_D_OUT64(d, 0), TCGEMM_D_OUT64(d, 64)
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

#undef TCGEMM_WGMMA_K32
#undef TCGEMM_WGMMA_KMAJOR
#undef TCGEMM_D_OUTI64
#undef TCGEMM_WGMMA
#undef TCGEMM_D_OUT64
#undef TCGEMM_D_OUTC64
#undef TCGEMM_D_OUTC8
#undef TCGEMM_D_REGS_HI
#undef TCGEMM_D_REGS_LO

}  // namespace tcgemm::ptx
