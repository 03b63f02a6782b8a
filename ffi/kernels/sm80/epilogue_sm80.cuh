// The sm80 kernel's epilogue (gemm_sm80.cuh), after its main loop: a warp's accumulators
// (float32, or int32 sums of int8 operands) parked in shared memory and streamed out through
// the common epilogue (store_tile), the sum of a block's k groups (sum_k_groups: sliced K),
// and split-K inside a thread block cluster (cluster_reduce_store: every slice sums a share;
// cluster_push_reduce: the other slice pushes its tile to the leader).
#pragma once
#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "host/gemm_config.h"
#include "host/gemm_params.h"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"
#include "ptx/cluster.cuh"
#include "ptx/ldmatrix.cuh"  // cvta_to_shared

namespace tcgemm {

namespace cg = cooperative_groups;

// Sums of two partial accumulators: float, or int32 wrapping modulo 2^32 (as one int32
// accumulator would; no signed overflow).
__device__ __forceinline__ float acc_add(float x, float y) { return x + y; }
__device__ __forceinline__ int acc_add(int x, int y) { return int(uint32_t(x) + uint32_t(y)); }
// An accumulator as the 32-bit word parked in shared memory (or stored raw: split-K partials,
// int32 results) and back.
__device__ __forceinline__ float acc_word(float x) { return x; }
__device__ __forceinline__ float acc_word(int x) { return __int_as_float(x); }
template <typename Acc>
__device__ __forceinline__ Acc word_acc(float w) {
  if constexpr (std::is_same_v<Acc, int>) return __float_as_int(w);
  else return w;
}

// Calls f(mi, ni, h, i) for each pair of accumulators (acc[mi][ni][2h], acc[mi][ni][2h + 1])
// a thread holds: i is the pair's word index in a tile of rows LD words apart whose origin is
// the warp tile's (wm0, wn0): the block's [BM][kClusterLd] tile, or (0, 0) in a warp's own
// parking area (kEpiRowBytes rows).
template <int CFG, int LD = ConfigTraits<CFG>::kClusterLd, typename F>
__device__ __forceinline__ void for_each_acc_pair(int wm0, int wn0, int lane, F&& f) {
  using Tr = ConfigTraits<CFG>;
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < Tr::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < Tr::kNI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        f(mi, ni, h, (wm0 + mi * 16 + g + 8 * h) * LD + wn0 + ni * 8 + 2 * q);
}

// Copies a warp's parked tile (kWM rows of kWN 32-bit words, kEpiRowBytes apart) out, one
// 16-byte shared read per lane and step: float32 through the epilogue into D (RAW: the words
// as they are to `raw`, the split-K partials or an int32 D). Lane l always takes quad column
// l % kQuads and rows l / kQuads + i * kRowStep: `off` is the output element offset of its
// first quad (row r, column c of batch item z), `rows_left`/`cols_left` the rows and columns
// of the output from there on (<= 0: outside it). Not unrolled: the epilogue's code (C loads,
// activations) once per kernel.
template <int CFG, typename Out, bool RAW>
__device__ __forceinline__ void copy_rows(const GemmParams& p, EpiScale s, float* raw,
                                          int64_t off, int64_t z, int64_t r, int64_t c,
                                          const char* stage, int rows_left, int cols_left,
                                          int lane) {
  using Tr = ConfigTraits<CFG>;
  constexpr int kQuads = Tr::kWN / 4;  // 4-float groups per row
  static_assert(32 % kQuads == 0, "a lane keeps its quad column");
  constexpr int kRowStep = 32 / kQuads;
  const char* src = stage + (lane / kQuads) * Tr::kEpiRowBytes + (lane % kQuads) * 16;
  const bool vec = p.n % 4 == 0;  // then every quad is aligned and inside its row
  if (cols_left <= 0) return;
#pragma unroll 1
  for (int i = 0; i < Tr::kWM / kRowStep && i * kRowStep < rows_left;
       ++i, off += kRowStep * p.n, src += kRowStep * Tr::kEpiRowBytes) {
    const float4 q = *reinterpret_cast<const float4*>(src);
    float v[4] = {q.x, q.y, q.z, q.w};
    if constexpr (RAW) store_vec<float, 4>(raw + off, v, cols_left, vec);  // bit moves
    else epi_store<Out, 4>(p, s, z, r + i * kRowStep, c, v, off, cols_left, vec);
  }
}

// Epilogue of a warp tile: the warp parks all of its accumulators in its private shared area
// (kWM rows), then streams them out row by row (coalesced): as float32 through the epilogue
// into D's M x N item `item`, or raw (split-K through the workspace, p.partial set: into the
// partials' item `item`, slice * batch + z; int32 sums to an int32 D). z: the batch item of C
// and the bias row. Rows at or past row_end are not stored.
template <int CFG, typename Acc>
__device__ __forceinline__ void store_tile(const GemmParams& p, int64_t item, int64_t z,
                                           Acc (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4],
                                           char* stage, int64_t row0, int64_t col0,
                                           int64_t row_end, int lane) {
  using Tr = ConfigTraits<CFG>;
  constexpr int kQuads = Tr::kWN / 4;
  // int32 sums parked as their words (exact), or as float32 for the epilogue
  const bool raw = p.partial || (std::is_same_v<Acc, int> && p.d_type == DType::kS32);
  auto word = [raw](Acc x) { return raw ? acc_word(x) : float(x); };
  for_each_acc_pair<CFG, Tr::kEpiRowBytes / 4>(0, 0, lane, [&](int mi, int ni, int h, int i) {
    *reinterpret_cast<float2*>(reinterpret_cast<float*>(stage) + i) =
        make_float2(word(acc[mi][ni][2 * h]), word(acc[mi][ni][2 * h + 1]));
  });
  __syncwarp();
  const int64_t r = row0 + lane / kQuads, c = col0 + (lane % kQuads) * 4;
  const int64_t off = item * p.m * p.n + r * p.n + c;  // output offset of the lane's first quad
  const int rows_left = static_cast<int>(min(row_end - r, int64_t(Tr::kWM)));
  const int cols_left = static_cast<int>(min(p.n - c, int64_t(4)));
  const EpiScale s = epi_scale(p);
  if (raw) {
    float* dst = p.partial ? p.partial : static_cast<float*>(p.d);
    copy_rows<CFG, float, true>(p, s, dst, off, z, r, c, stage, rows_left, cols_left, lane);
  } else {
    with_dtype(p.d_type, [&](auto out) {
      copy_rows<CFG, decltype(out), false>(p, s, nullptr, off, z, r, c, stage, rows_left,
                                           cols_left, lane);
    });
  }
  __syncwarp();
}

// Stores a warp's accumulators into a [BM][kClusterLd] tile of 32-bit words in shared memory
// (acc_word; the layout of for_each_acc_pair), for another warp or block to add.
template <int CFG, typename Acc>
__device__ __forceinline__ void park_acc(
    float* tile, const Acc (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4], int wm0,
    int wn0, int lane) {
  for_each_acc_pair<CFG>(wm0, wn0, lane, [&](int mi, int ni, int h, int i) {
    *reinterpret_cast<float2*>(tile + i) =
        make_float2(acc_word(acc[mi][ni][2 * h]), acc_word(acc[mi][ni][2 * h + 1]));
  });
}

// Sliced K (kWarpsK > 1), after the main loop: k groups 1.. park their accumulators as tiles
// ([BM][kClusterLd] words each) at the start of shared memory, and group 0 adds them in group
// order (deterministic); from then on only group 0's warps hold the block's sums. Shared
// memory is free again on return.
template <int CFG, typename Acc>
__device__ __forceinline__ void sum_k_groups(
    Acc (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4], char* smem, int wk, int wm0,
    int wn0, int lane) {
  using Tr = ConfigTraits<CFG>;
  auto park = [&](int g) {  // k group g's (>= 1) float32 tile
    return reinterpret_cast<float*>(smem) + (g - 1) * Tr::kBM * Tr::kClusterLd;
  };
  if (wk > 0) park_acc<CFG>(park(wk), acc, wm0, wn0, lane);
  __syncthreads();
  if (wk == 0)
#pragma unroll
    for (int g = 1; g < Tr::kWarpsK; ++g)
      for_each_acc_pair<CFG>(wm0, wn0, lane, [&](int mi, int ni, int h, int i) {
        const float2 v = *reinterpret_cast<const float2*>(park(g) + i);
        acc[mi][ni][2 * h] = acc_add(acc[mi][ni][2 * h], word_acc<Acc>(v.x));
        acc[mi][ni][2 * h + 1] = acc_add(acc[mi][ni][2 * h + 1], word_acc<Acc>(v.y));
      });
  __syncthreads();
}

// Split-K inside a thread block cluster (sm_90+; the dispatcher launches the split_k slices of
// an output tile as one cluster along grid y and sets p.cluster_reduce = 1): every CTA parks its
// accumulators in its own shared memory ([BM][BN + 4] words), and after a cluster
// barrier CTA r sums rows r, r + S, r + 2S, ... of the tile over the S CTAs' shared memory
// (distributed shared memory), always in rank order (bitwise deterministic, the same order as
// the workspace reduction), and writes them to C. A second barrier keeps every CTA's shared
// memory alive until the others have read it. No workspace, no second launch. `holds`: this
// thread's warp holds the block's sums (sliced K: k group 0); every thread takes part. int32
// sums (int8 operands) add exactly, then go to an int32 D as they are or through the epilogue
// as float32.
template <int CFG, typename Acc>
__device__ __forceinline__ void cluster_reduce_store(
    const GemmParams& p, int64_t z, Acc (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4],
    char* smem, int64_t m0, int64_t n0, bool holds, int wm0, int wn0, int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Tr = ConfigTraits<CFG>;
  constexpr int kLd = Tr::kClusterLd;
  float* tile = reinterpret_cast<float*>(smem);
  if (holds) park_acc<CFG>(tile, acc, wm0, wn0, tid & 31);
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank());
  const int slices = static_cast<int>(cluster.num_blocks());
  constexpr int kQuads = Tr::kBN / 4;
  const EpiScale es = epi_scale(p);
  const bool vec = p.n % 4 == 0;
  for (int idx = tid;; idx += Tr::kThreads) {
    const int row = rank + (idx / kQuads) * slices, qd = idx % kQuads;
    if (row >= Tr::kBM) break;
    const int64_t gr = m0 + row, gc = n0 + qd * 4;
    if (gr >= p.m || gc >= p.n) continue;
    Acc sum[4] = {Acc(0), Acc(0), Acc(0), Acc(0)};
    for (int s = 0; s < slices; ++s) {
      const float4 v = *reinterpret_cast<const float4*>(
          cluster.map_shared_rank(tile + row * kLd + qd * 4, s));
      sum[0] = acc_add(sum[0], word_acc<Acc>(v.x));
      sum[1] = acc_add(sum[1], word_acc<Acc>(v.y));
      sum[2] = acc_add(sum[2], word_acc<Acc>(v.z));
      sum[3] = acc_add(sum[3], word_acc<Acc>(v.w));
    }
    const int64_t off = (z * p.m + gr) * p.n + gc;
    const int cols_left = static_cast<int>(p.n - gc);
    if (std::is_same_v<Acc, int> && p.d_type == DType::kS32) {
      float w[4] = {acc_word(sum[0]), acc_word(sum[1]), acc_word(sum[2]), acc_word(sum[3])};
      store_vec<float, 4>(static_cast<float*>(p.d) + off, w, cols_left, vec);  // bit moves
      continue;
    }
    float v[4] = {float(sum[0]), float(sum[1]), float(sum[2]), float(sum[3])};
    with_dtype(p.d_type, [&](auto out) {
      epi_store<decltype(out), 4>(p, es, z, gr, gc, v, off, cols_left, vec);
    });
  }
  cluster.sync();
#endif
}

// Split-K in a cluster of two by push (ConfigTraits::kPushReduce: small tiles; the dispatcher
// sets p.cluster_reduce = 2), where only the leader waits. Slice 1 stores its accumulators
// (acc_word) straight into the receive slot of the leader's (rank 0's) shared memory, which
// lies past the block's own kSmemBytes and is never touched by the leader's pipeline, arrives
// on the cluster barrier (release) and is done; the leader arrives, waits (acquire), adds the
// slot to its own accumulators (0 + own + slot: bitwise the sums of cluster_reduce_store and
// of the workspace reduction) and stores C through the usual staged epilogue. The kernel's
// first cluster barrier phase (arrived at its start) must have completed: both blocks run.
// With another batch item to come (`more`), a second phase keeps the slot until the leader
// has read it. Every thread takes part; those whose warp `holds` the block's sums (sliced K:
// k group 0) move them. Returns whether this thread stores C (the leader's that hold them).
template <int CFG, typename Acc>
__device__ __forceinline__ bool cluster_push_reduce(
    Acc (&acc)[ConfigTraits<CFG>::kMI][ConfigTraits<CFG>::kNI][4], char* smem, bool more,
    bool holds, int wm0, int wn0, int lane) {
  using Tr = ConfigTraits<CFG>;
  const float* slot = reinterpret_cast<const float*>(smem + Tr::kSmemBytes);
  if (ptx::cluster_rank() != 0) {
    const uint32_t leader_slot = ptx::map_to_rank(ptx::cvta_to_shared(slot), 0);
    if (holds)
      for_each_acc_pair<CFG>(wm0, wn0, lane, [&](int mi, int ni, int h, int i) {
        ptx::st_cluster_v2_f32(leader_slot + 4 * i, acc_word(acc[mi][ni][2 * h]),
                               acc_word(acc[mi][ni][2 * h + 1]));
      });
    ptx::cluster_arrive();
    if (more) {  // this phase, then the one in which the leader has read the slot
      ptx::cluster_wait();
      ptx::cluster_arrive();
      ptx::cluster_wait();
    }
    return false;
  }
  ptx::cluster_arrive();
  ptx::cluster_wait();
  if (holds)
    for_each_acc_pair<CFG>(wm0, wn0, lane, [&](int mi, int ni, int h, int i) {
      const float2 v = *reinterpret_cast<const float2*>(slot + i);
      acc[mi][ni][2 * h] = acc_add(acc_add(Acc(0), acc[mi][ni][2 * h]), word_acc<Acc>(v.x));
      acc[mi][ni][2 * h + 1] =
          acc_add(acc_add(Acc(0), acc[mi][ni][2 * h + 1]), word_acc<Acc>(v.y));
    });
  if (more) {
    ptx::cluster_arrive();
    ptx::cluster_wait();
  }
  return holds;
}

}  // namespace tcgemm
