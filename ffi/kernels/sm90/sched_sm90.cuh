// The sm90 kernel's work list (gemm_sm90.cuh): a block's items (output tile x batch item x K
// slice, or a grouped product's tiles) and what each reads and writes; the producer and every
// consumer warpgroup walk it alike.
#pragma once
#include <cstdint>

#include "host/gemm_params.h"
#include "kernels/common/ragged.cuh"

namespace tcgemm {

// One work item of a block: an output tile, what it reads and where it writes.
// (32-bit fields: M, N, K and the batch are below 2^31; the consumers keep this live across
// their main loop, beside the accumulators.)
struct Sm90Work {
  int m0, n0;        // tile origin in D's item
  int z;             // batch item: D's (d_item()), C's and the bias row's
  int row_end;       // rows at or past it are not stored
  int za, zb;        // operand items (TMA coordinate 2)
  int slice;         // split-K slice
  int kbase;         // first k of the item's range (TMA coordinate); k tiles from there
  int ktiles;        // k tiles of the item (0: the tile is zeros)
  int kvalid;        // valid k of its last tile (< kBK: the rest is another group's, zeroed)

  // Element offset of D's item: the batch item's, or the group's (ragged contraction); ragged
  // rows write the one M x N result.
  __device__ int64_t d_item(const GemmParams& p) const {
    return p.ragged.mode == RaggedMode::kRows ? 0 : int64_t(z) * p.m * p.n;
  }
};

// A block's work list: items blockIdx.x, + gridDim.x, ... in ascending order (the producer and
// every consumer walk it alike). Plain: output tile x batch item x K slice (the slice
// outermost, then the batch item, then the tiles). Ragged (p.ragged): each group's tiles in
// turn, the group of an item found by walking the device group sizes (ragged_tile in
// kernels/common/ragged.cuh: the rule both kernel families share).
template <int BM, int BN, int BK>
struct Sm90Sched {
  // Item w into r; false past the end of the list. Grouped lists walk the group sizes from
  // the first group on every call: no state is kept across the main loop, where the
  // consumers' accumulators leave no registers for it (kept in registers, a cursor made ptxas
  // spill; the walk costs O(groups) cached loads per item). (p is passed, not kept: a
  // reference member would hold the kernel parameter's generic address.)
  __device__ bool next(const GemmParams& p, int64_t w, Sm90Work& r) const {
    const int ktiles_all = static_cast<int>((p.k + BK - 1) / BK);
    if (p.ragged.mode == RaggedMode::kNone) {
      const int64_t tiles = int64_t(p.tiles_m) * p.tiles_n;
      if (w >= tiles * p.batch * p.split_k) return false;
      int64_t mt, nt;
      raster(w % tiles, p.tiles_m, p.tiles_n, mt, nt);
      const int64_t rest = w / tiles;
      r.m0 = static_cast<int>(mt * BM);
      r.n0 = static_cast<int>(nt * BN);
      r.z = static_cast<int>(rest % p.batch);
      r.row_end = static_cast<int>(p.m);
      r.za = p.stride_a ? static_cast<int>(r.z) : 0;
      r.zb = p.stride_b ? static_cast<int>(r.z) : 0;
      r.slice = static_cast<int>(rest / p.batch);
      const int kt0 = r.slice * p.k_tiles_per_split;
      r.kbase = kt0 * BK;
      r.ktiles = max(0, min(ktiles_all - kt0, p.k_tiles_per_split));
      r.kvalid = BK;  // past K, TMA reads zeros
      return true;
    }
    RaggedTile t;
    if (!ragged_tile<BM, BN, BK>(p, w, t)) return false;
    const bool rows_mode = p.ragged.mode == RaggedMode::kRows;
    r.m0 = t.m0;
    r.n0 = t.n0;
    r.z = t.g;
    r.row_end = t.row_end;
    r.za = 0;
    r.zb = rows_mode ? t.g : 0;
    r.slice = 0;
    r.kbase = t.kbase;
    r.ktiles = t.ktiles;
    r.kvalid = t.kvalid;
    return true;
  }
};

}  // namespace tcgemm
