// Hopper kernels (every sm90 config x layout x input type) and their launch: TMA tensor maps
// built on the host, one persistent block per SM. Compiled for sm_90a only (CMakeLists.txt);
// the dispatcher calls LaunchSm90 only on compute capability 9.0.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <array>
#include <atomic>
#include <type_traits>
#include <utility>

#include "host/gemm_dispatch.h"
#include "kernels/common/element.cuh"
#include "kernels/sm90/gemm_sm90.cuh"

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

// 3-D map of an operand stored as `items` matrices of rows x cols (cols contiguous, rows `ld`
// elements apart, items `item_stride` apart), read in boxes of 64 columns x box_rows rows with
// the 128-byte swizzle. Reads outside the matrix return zeros.
template <typename T>
std::string EncodeOperand(CUtensorMap* map, const void* base, int64_t cols, int64_t rows,
                          int64_t items, int64_t ld, int64_t item_stride, int box_rows) {
  constexpr int kBytes = ElemTraits<T>::kBytes;
  const Encode encode = EncodeFn();
  if (!encode) return "cuTensorMapEncodeTiled is not available from the CUDA driver";
  const cuuint64_t dims[3] = {cuuint64_t(std::max<int64_t>(cols, 1)),
                              cuuint64_t(std::max<int64_t>(rows, 1)), cuuint64_t(items)};
  const int64_t item_bytes = (item_stride ? item_stride : rows * ld) * kBytes;
  const cuuint64_t strides[2] = {cuuint64_t(ld * kBytes),
                                 cuuint64_t(std::max<int64_t>(item_bytes, 16))};
  const cuuint32_t box[3] = {128 / kBytes, cuuint32_t(box_rows), 1};  // 128-byte swizzle rows
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, ElemTraits<T>::kTma, 3, const_cast<void*>(base), dims,
                            strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")";
  return {};
}

struct Sm90Entry {
  const void* fn;
  int threads, smem_bytes, bm, bn;
};

template <typename T, int CFG, bool AK, bool BK>
Sm90Entry MakeSm90() {
  using Tr = Sm90Traits<CFG>;
  return {reinterpret_cast<const void*>(&gemm_sm90_kernel<T, CFG, AK, BK>), Tr::kThreads,
          Tr::kSmemBytes, Tr::kBM, Tr::kBN};
}

// Entries of config CFG in layout order (a_kmajor * 2 + b_kmajor); sm80 rows have none.
template <typename T, int CFG>
std::array<Sm90Entry, 4> Sm90Entries() {
  if constexpr (kConfigs[CFG].kind == Kind::kSm90) {
    return {MakeSm90<T, CFG, false, false>(), MakeSm90<T, CFG, false, true>(),
            MakeSm90<T, CFG, true, false>(), MakeSm90<T, CFG, true, true>()};
  } else {
    return {};
  }
}

template <typename T, int... CFGs>
Sm90Entry LookupSm90(int config, int layout, std::integer_sequence<int, CFGs...>) {
  static const std::array<Sm90Entry, 4> table[] = {Sm90Entries<T, CFGs>()...};
  return table[config][layout];
}

std::atomic<uint64_t> g_configured[2][kNumConfigs][4];  // [in_type]  // shared-memory limit raised, per device

}  // namespace

std::string LaunchSm90(const GemmParams& p, int config, InType in_type, bool a_kmajor,
                       bool b_kmajor, int device, int sms, cudaStream_t stream) {
  const int layout = int(a_kmajor) * 2 + int(b_kmajor);
  if (in_type != DType::kF16 && in_type != DType::kBF16) return "sm90 operands are 16-bit";
  const bool ragged = p.ragged.mode != RaggedMode::kNone;
  const int64_t work = ragged ? int64_t(sms) : int64_t(p.tiles_m) * p.tiles_n * p.batch * p.split_k;
  // B's items: the groups' matrices (ragged rows), the batch, or one shared matrix.
  const int64_t b_items = p.ragged.mode == RaggedMode::kRows ? std::max(p.ragged.groups, 1)
                                                            : (p.stride_b ? p.batch : 1);
  Sm90Entry k{};
  CUtensorMap map_a, map_b;
  std::string err;
  with_dtype(in_type, [&](auto elem) {  // the one dispatch on the operand type
    using T = decltype(elem);
    if constexpr (!std::is_same_v<T, float>) {
      k = LookupSm90<T>(config, layout, std::make_integer_sequence<int, kNumConfigs>{});
      if (!k.fn || work == 0) return;
      const int64_t a_cols = a_kmajor ? p.k : p.m, a_rows = a_kmajor ? p.m : p.k;
      const int64_t b_cols = b_kmajor ? p.k : p.n, b_rows = b_kmajor ? p.n : p.k;
      err = EncodeOperand<T>(&map_a, p.a, a_cols, a_rows, p.stride_a ? p.batch : 1, p.lda,
                             p.stride_a, a_kmajor ? k.bm : 64);
      if (err.empty())
        err = EncodeOperand<T>(&map_b, p.b, b_cols, b_rows, b_items, p.ldb, p.stride_b,
                               b_kmajor ? k.bn : 64);
    }
  });
  if (!k.fn) return "config is not an sm90 row";
  if (work == 0) return {};
  if (!err.empty()) return err;

  auto& raised = g_configured[int(in_type)][config][layout];
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
