// The launch of any sm90 kernel (the 16-bit ones of kernels_sm90_f16.cu / kernels_sm90_bf16.cu,
// the 8-bit ones of kernels_sm90_byte.cu and the float32 ones of kernels_sm90_tf32.cu, each a
// translation unit of its own, compiled in parallel): TMA tensor maps built on the host,
// one persistent block per SM. Compiled for sm_90a only (CMakeLists.txt); the dispatcher calls
// LaunchSm90 only on compute capability 9.0.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "host/gemm_dispatch.h"
#include "kernels/common/element.cuh"
#include "kernels/sm90/sm90_entry.h"  // and gemm_sm90.cuh

namespace tcgemm {
namespace {

using Encode = PFN_cuTensorMapEncodeTiled_v12000;

// cuTensorMapEncodeTiled from the driver the runtime already loaded (no libcuda link).
Encode EncodeFn() {
  static const Encode fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return Encode(nullptr);
    return reinterpret_cast<Encode>(f);
  }();
  return fn;
}

// 3-D map of an operand of type T (DType) stored as `items` matrices of rows x cols (cols
// contiguous, rows `ld` elements apart, items `item_stride` apart), read in boxes of 128 bytes
// of columns x box_rows rows with the 128-byte swizzle. Reads outside the matrix return zeros.
std::string EncodeOperand(CUtensorMap* map, DType t, const void* base, int64_t cols,
                          int64_t rows, int64_t items, int64_t ld, int64_t item_stride,
                          int box_rows) {
  const int kBytes = DTypeBytes(t);
  CUtensorMapDataType tma = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  with_dtype(t, [&](auto e) { tma = ElemTraits<decltype(e)>::kTma; });
  with_byte_operand(t, [&](auto e) { tma = ElemTraits<decltype(e)>::kTma; });
  const Encode encode = EncodeFn();
  if (!encode) return "cuTensorMapEncodeTiled is not available from the CUDA driver";
  const cuuint64_t dims[3] = {cuuint64_t(std::max<int64_t>(cols, 1)),
                              cuuint64_t(std::max<int64_t>(rows, 1)), cuuint64_t(items)};
  const int64_t item_bytes = (item_stride ? item_stride : rows * ld) * kBytes;
  const cuuint64_t strides[2] = {cuuint64_t(ld * kBytes),
                                 cuuint64_t(std::max<int64_t>(item_bytes, 16))};
  const cuuint32_t box[3] = {cuuint32_t(128 / kBytes), cuuint32_t(box_rows), 1};  // 128-byte rows
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, tma, 3, const_cast<void*>(base), dims,
                            strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")";
  return {};
}

// Shared-memory limit raised, per device: 16-bit kernels [in_type][config][layout], 8-bit ones
// [a's type - kE4M3][b's type - kE4M3][config], float32 and promoted float16 ones [config]
// (K-major only).
std::atomic<uint64_t> g_configured[2][kNumConfigs][4];
std::atomic<uint64_t> g_byte_configured[3][3][kNumConfigs];
std::atomic<uint64_t> g_tf32_configured[kNumConfigs];
std::atomic<uint64_t> g_f16x3_configured[kNumConfigs];

}  // namespace

std::string LaunchSm90(const GemmParams& p, int config, InType in_type, InType b_type,
                       bool a_kmajor, bool b_kmajor, bool promote, int device, int sms,
                       cudaStream_t stream) {
  const int layout = int(a_kmajor) * 2 + int(b_kmajor);
  const bool byte = IsByteOperand(in_type), tf32 = in_type == DType::kF32;
  if (!byte && !tf32 && in_type != DType::kF16 && in_type != DType::kBF16)
    return "sm90 operands are 16-bit, 8-bit or float32";
  if (byte && !(IsByteOperand(b_type) && a_kmajor && b_kmajor))
    return "8-bit operands run K-major (A as [M][K], B as [N][K]) and both 8-bit";
  if (tf32 && !(b_type == DType::kF32 && a_kmajor && b_kmajor))
    return "float32 operands run K-major (A as [M][K], B as [N][K]) and both float32";
  if (!byte) b_type = in_type;
  const bool ragged = p.ragged.mode != RaggedMode::kNone;
  const int64_t work = ragged ? int64_t(sms) : int64_t(p.tiles_m) * p.tiles_n * p.batch * p.split_k;
  // B's items: the groups' matrices (ragged rows), the batch, or one shared matrix.
  const int64_t b_items = p.ragged.mode == RaggedMode::kRows ? std::max(p.ragged.groups, 1)
                                                            : (p.stride_b ? p.batch : 1);
  Sm90Entry k{};
  if (byte) {
    k = Sm90ByteEntry(config, in_type, b_type);
    if (!k.fn) return "config " + ConfigNames()[config] + " has no kernel for 8-bit operands";
  } else if (tf32) {
    k = Sm90Tf32Entry(config);
    if (!k.fn) return "config " + ConfigNames()[config] + " has no kernel for float32 operands";
  } else if (promote) {
    k = Sm90F16x3Entry(config);
    if (!k.fn) return "config " + ConfigNames()[config] + " has no promoted float16 kernel";
  } else {
    with_dtype(in_type, [&](auto elem) {  // the one dispatch on the 16-bit operand type
      using T = decltype(elem);
      if constexpr (!std::is_same_v<T, float>) k = Sm90Entry16<T>(config, layout);
    });
    if (!k.fn) return "config is not an sm90 row";
  }
  if (work == 0) return {};
  CUtensorMap map_a, map_b;
  const int64_t a_cols = a_kmajor ? p.k : p.m, a_rows = a_kmajor ? p.m : p.k;
  const int64_t b_cols = b_kmajor ? p.k : p.n, b_rows = b_kmajor ? p.n : p.k;
  std::string err = EncodeOperand(&map_a, in_type, p.a, a_cols, a_rows, p.stride_a ? p.batch : 1,
                                  p.lda, p.stride_a, a_kmajor ? k.bm : 64);
  if (err.empty())
    err = EncodeOperand(&map_b, b_type, p.b, b_cols, b_rows, b_items, p.ldb, p.stride_b,
                        b_kmajor ? k.bn : 64);
  if (!err.empty()) return err;

  auto& raised = byte   ? g_byte_configured[int(in_type) - int(DType::kE4M3)]
                                           [int(b_type) - int(DType::kE4M3)][config]
                 : tf32    ? g_tf32_configured[config]
                 : promote ? g_f16x3_configured[config]
                           : g_configured[int(in_type)][config][layout];
  if (std::string e = RaiseSmemLimit(k.fn, k.smem_bytes, raised, device); !e.empty()) return e;

  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(work, std::max(sms, 1)));
  GemmParams pc = p;
  void* args[] = {&pc, &map_a, &map_b};
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(blocks);
  launch.blockDim = dim3(k.threads);
  launch.dynamicSmemBytes = static_cast<size_t>(k.smem_bytes);
  launch.stream = stream;
  cudaError_t e = cudaLaunchKernelExC(&launch, k.fn, args);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) return std::string("sm90 kernel launch: ") + cudaGetErrorString(e);
  return {};
}

}  // namespace tcgemm
