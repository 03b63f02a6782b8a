// The grouped (ragged) work list of both kernel families (host/gemm_params.h, RaggedParams):
// the one copy, in C++, of the clamping rule and of the walk from a work item to its group and
// tile. The sm90 kernel's persistent scheduler (Sm90Sched) and the sm80 kernel (one block per
// work item) both call ragged_tile.
//
// Clamping: a negative size counts as 0, and the groups are cut at the ragged extent (M for
// rows, K for the contraction): group g spans [start_g, start_g + size_g) with start_g the sum
// of the clamped sizes before it. Nothing outside [0, extent) is ever read or written.
//
// Work list: each group's items in group order. Rows (kRows): a group has ceil(size / BM) tile
// rows x tiles_n tile columns, rasterized as raster() does (an empty group has none). The sum
// over the groups is at most tiles_m + (groups with rows) tile rows per column: ragged_items
// bounds it for a grid that is not persistent. Contraction (kContract): every group has the
// whole tiles_m x tiles_n output (an empty group's tiles have no k tiles: zeros).
#pragma once
#include <cstdint>

#include "host/gemm_params.h"

namespace tcgemm {

// Tile `t` of a tm x tn grid of tiles in groups of kGroupM tile rows, column-major inside a
// group (neighbouring blocks share A rows and B columns in L2) -> (tile row, tile column).
__device__ __forceinline__ void raster(int64_t t, int64_t tm, int64_t tn, int64_t& mt,
                                       int64_t& nt) {
  constexpr int kGroupM = 8;
  const int64_t group_size = kGroupM * tn;
  const int64_t first_m = (t / group_size) * kGroupM;
  const int64_t group_m = min(tm - first_m, int64_t(kGroupM));
  mt = first_m + (t % group_size) % group_m;
  nt = (t % group_size) / group_m;
}

// The clamped size of group g that starts at `start`.
__device__ __forceinline__ int ragged_group_size(const GemmParams& p, int g, int64_t start) {
  const int64_t extent = p.ragged.mode == RaggedMode::kRows ? p.m : p.k;
  return static_cast<int>(
      max(int64_t(0), min(int64_t(__ldg(p.ragged.sizes + g)), extent - start)));
}

// Where the last group ends: the sum of the clamped sizes (rows from there on are zeros).
__device__ __forceinline__ int64_t ragged_end(const GemmParams& p) {
  int64_t start = 0;
  for (int g = 0; g < p.ragged.groups; ++g) start += ragged_group_size(p, g, start);
  return start;
}

// One item of a grouped work list.
struct RaggedTile {
  int m0, n0;    // tile origin in D's item (rows: in the one M x N result)
  int g;         // group: B's item (rows), D's item (contraction), the bias row
  int row_end;   // rows at or past it are not stored (rows: the group's end)
  int kbase;     // first k of the item's range
  int kend;      // k at or past it is not read (contraction: the group's end; rows: K)
  int ktiles;    // BK-wide k tiles from kbase (0: the tile is zeros)
  int kvalid;    // valid k of the last k tile (< BK: the rest is another group's)
};

// Item w of p's grouped work list into r; false past its end. Walks the group sizes from the
// first group (O(groups) cached loads; no state kept between calls).
template <int BM, int BN, int BK>
__device__ __forceinline__ bool ragged_tile(const GemmParams& p, int64_t w, RaggedTile& r) {
  const bool rows_mode = p.ragged.mode == RaggedMode::kRows;
  int g = 0, start = 0, size = 0;
  int64_t w0 = 0;
  for (;; ++g) {
    if (g >= p.ragged.groups) return false;
    size = ragged_group_size(p, g, start);
    const int64_t items =
        rows_mode ? int64_t(size + BM - 1) / BM * p.tiles_n : int64_t(p.tiles_m) * p.tiles_n;
    if (w < w0 + items) break;
    w0 += items;
    start += size;
  }
  int64_t mt, nt;
  r.g = g;
  if (rows_mode) {
    raster(w - w0, (size + BM - 1) / BM, p.tiles_n, mt, nt);
    r.m0 = static_cast<int>(start + mt * BM);
    r.row_end = start + size;
    r.kbase = 0;
    r.kend = static_cast<int>(p.k);
    r.ktiles = static_cast<int>((p.k + BK - 1) / BK);
    r.kvalid = BK;
  } else {
    raster(w - w0, p.tiles_m, p.tiles_n, mt, nt);
    r.m0 = static_cast<int>(mt * BM);
    r.row_end = static_cast<int>(p.m);
    r.kbase = start;
    r.kend = start + size;
    r.ktiles = (size + BK - 1) / BK;
    r.kvalid = size - (r.ktiles - 1) * BK;
  }
  r.n0 = static_cast<int>(nt * BN);
  return true;
}

// A block's item in shared memory, for a kernel that does not keep it in registers across its
// main loop (the sm80 kernel: written by thread 0 before a barrier, read after one).
__device__ __forceinline__ RaggedTile& ragged_tile_slot() {
  __shared__ RaggedTile slot;
  return slot;
}

// Zeros bytes [from, to) of `base`, spread over `count` threads of which this is `id`
// (16-byte stores where aligned): the rows past the last group (rows mode).
__device__ __forceinline__ void zero_bytes(char* base, int64_t from, int64_t to, int64_t id,
                                           int64_t count) {
  const int64_t head = min(to, (from + 15) / 16 * 16), body_end = max(head, to / 16 * 16);
  for (int64_t i = from + id; i < head; i += count) base[i] = 0;
  for (int64_t i = head + 16 * id; i < body_end; i += 16 * count)
    *reinterpret_cast<uint4*>(base + i) = make_uint4(0, 0, 0, 0);
  for (int64_t i = body_end + id; i < to; i += count) base[i] = 0;
}

// Zeros D's rows past the last group (rows mode), as thread `id` of `count` over the grid.
__device__ __forceinline__ void ragged_zero_tail(const GemmParams& p, int64_t id, int64_t count) {
  const int64_t bytes = DTypeBytes(p.d_type);
  zero_bytes(static_cast<char*>(p.d), ragged_end(p) * p.n * bytes, p.m * p.n * bytes, id, count);
}

}  // namespace tcgemm
