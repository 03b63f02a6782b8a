"""The planner: the choice of a config and split for a problem (a cost model of the H100/H200
class), on the config table the extension reports (ffi/host/gemm_config.inc, compiled into
C++). The derived rules (names, shared memory, fallback, effective split, packing, workspace)
are C++'s: asked of the module, never computed here."""
from __future__ import annotations

import dataclasses
import functools
import math

from .problem import layout_name  # noqa: F401  (configs.layout_name: tests, bench)

LAYOUTS = ("NN", "NT", "TN", "TT")  # BLAS letters for (A, B): N = as stored, T = transposed


@dataclasses.dataclass(frozen=True)
class Config:
    """One row of the config table as the extension reports it (module.cc, config_table): the
    fields of ffi/host/gemm_config.inc and what C++ derives from them (name, threads, shared
    memory, sm80 fallback). Nothing here re-derives a C++ rule."""
    name: str
    kind: str  # "sm80": cp.async + mma.sync; "sm90": TMA + wgmma (compute capability 9.0);
    # "narrow": 8-bit products of at most bm rows, mma.sync from registers (plan_byte)
    bm: int
    bn: int
    bk: int
    stages: int
    warps_m: int  # sm80: warp layout; sm90: 0, 0
    warps_n: int
    warps_k: int  # sm80: warp groups that split every stage's K (sliced K); sm90: 1
    consumers: int  # sm90: consumer warpgroups (beside one producer warpgroup)
    pingpong: bool  # sm90: each consumer warpgroup owns whole tiles, in turn (gemm_config.inc)
    fp8_only: bool  # sm90: kernels for the fp8 pairs only (TCGEMM_SM90_FP8_CONFIG)
    threads: int
    smem_bytes: int  # sm80: dynamic shared memory of its kernel; sm90: 0 (one block per SM)
    fallback: str  # the sm80 row that runs in its place where it cannot (itself for sm80)
    element_loads: bool  # sm80: has kernels for operands that are not 16-byte aligned (else
    # such operands run on the first row with its BK that has them: ElementLoadsRow in C++)
    ragged: bool  # runs grouped (ragged) products (HasRaggedKernels in C++): every sm90 row,
    # and the sm80 rows with grouped kernels (plan_ragged picks among these)
    int8: bool = False  # has kernels for int8 x int8 (HasByteKernels in C++; plan_byte)
    fp8: bool = False   # has kernels for the fp8 pairs (HasByteKernels, fp8)
    f32: bool = False   # has kernels for float32 operands read as TF32 (HasTf32Kernels; plan_f32)
    staged_scales: bool = False  # its fp8 kernels stage block scales in shared memory with each
    # stage (Sm90StagesScales in C++); elsewhere their consumers load them: _RATE_BLOCK_LOADS

    def tiles(self, m: int, n: int) -> int:
        return math.ceil(m / self.bm) * math.ceil(n / self.bn)


def _module():
    from . import _ffi
    return _ffi._tcgemm


# Table order = the C++ config index (kConfigs in ffi/host/gemm_config.h), sm90 rows included.
# Empty where the extension is not built (then nothing is planned: the CPU lowering needs no plan).
CONFIGS: tuple[Config, ...] = (tuple(Config(**r) for r in _module().config_table())
                               if _module() is not None else ())
BY_NAME: dict[str, Config] = {c.name: c for c in CONFIGS}
# The rows with kernels for 16-bit operands: all but the fp8-only and narrow ones (Has16BitKernels).
CONFIGS16: tuple[Config, ...] = tuple(c for c in CONFIGS if not c.fp8_only and c.kind != "narrow")
MAX_SPLIT_K = _module().max_split_k() if _module() is not None else 64
MAX_CLUSTER_SPLIT = _module().max_cluster_split() if _module() is not None else 8


def sm80_fallback(c: Config) -> Config:
    """The config that runs in place of c where c cannot (Sm80Fallback in C++): for an sm90
    row on another GPU, or with operands TMA cannot address; c itself for sm80 rows."""
    return BY_NAME[c.fallback]


@functools.cache
def device_arch() -> tuple[int, ...] | None:
    """Compute capability of the default JAX device, e.g. (9, 0), when the default backend is
    a CUDA GPU; None otherwise (CPU, or a GPU that reports none). Asked once per process."""
    import jax
    if jax.default_backend() != "gpu":
        return None
    cc = getattr(jax.devices()[0], "compute_capability", None)  # "9.0" on CUDA devices
    try:
        return tuple(int(x) for x in str(cc).split(".")) if cc else None
    except ValueError:  # not a CUDA compute capability
        return None


def configs_for(arch: tuple[int, ...] | None) -> tuple[Config, ...]:
    """The configs worth planning a 16-bit product with on a device of compute capability
    `arch` (None: not known, as when tracing on a CPU): sm90 rows only on 9.0, where they run as
    written (elsewhere they would run as their sm80 fallback), and none with fp8 kernels only."""
    hopper = arch is not None and tuple(arch) == (9, 0)
    return tuple(c for c in CONFIGS16 if c.kind == "sm80" or hopper)


SMS = 132  # streaming multiprocessors of an H100/H200 SXM
_REGS_PER_THREAD = 256  # the kernels are built to use up to 255 registers (+1 granule)
_SMEM_PER_SM = 228 * 1024
_MIN_K_PER_SPLIT = 512  # a K slice shorter than this spends too long in its pipeline prologue


def blocks_per_sm(c: Config) -> int:
    """Resident threadblocks of config c per SM (register- or shared-memory-bound; sm90 rows
    use about 192 KB of shared memory: one)."""
    if c.kind == "sm90":
        return 1
    return max(1, min(65536 // (c.threads * _REGS_PER_THREAD),
                      _SMEM_PER_SM // (c.smem_bytes + 1024)))


# Cost model of the selector (H100/H200 SXM class; autotune.py measures instead of guessing).
# Constants fitted to H100 timings of every (config, split) candidate on 12 shapes (skinny
# LLM projections, 64 x 256^3, the odd case; benchmarks/NOTES.md, v10), refit with cluster
# occupancy on 10 skinny shapes (v11): the picks are 1.01x the fastest candidate in geometric
# mean, 1.05x at worst (v10: 1.04x and 1.37x on those shapes; v9: 1.17x on the 12).
_PEAK = 600e12   # FLOP/s of mma.sync on all SMs at full occupancy
_BW = 2.55e12    # bytes/s a GEMM streams from HBM (85% of the 3.0e12 a copy reaches)
_L2_BW = 10e12   # bytes/s of L2 -> shared memory over all SMs (the stages' tile loads)
_LATENCY = 1.25e-6  # s, a cp.async stage's round trip under load (stages-1 in flight)
_LAUNCH = 3e-6   # s, a second kernel launch (the split-K reduction)
_DSMEM_BW = 10e12  # bytes/s over all SMs of the cluster split-K reduction (shared memory)
_CLUSTER_SLICE = 4e-6  # s, each slice past the first of a cluster split-K (prologue, barriers)
_SLICE_ADD_BW = 100e9  # bytes/s at which the leader block adds one slice's float32 tile
# Thread block clusters resident at once, by (blocks per SM, cluster size): H100 SXM,
# cudaOccupancyMaxActiveClusters (tools/kernel_selftest.cu --clusters). Clusters of 4 or 8
# do not tile every GPC: with one block per SM they use 120 of the 132 SMs.
_MAX_CLUSTERS = {(1, 2): 66, (1, 4): 30, (1, 8): 15, (2, 2): 132, (2, 4): 62, (2, 8): 30}
_PIPE_FILL = 6   # 32-wide k tiles of latency before a block's first mma, and its epilogue
_FEW_WARPS = 0.8  # rate with fewer than 8 warps resident per SM (latencies not hidden)
_OVERLAP = 0.5   # the shorter of memory and compute time that is not hidden under the longer
# sm90 rows (TMA + wgmma, one block per SM). Fitted to H100 single launches (selftest) before
# the shared-memory epilogue (v14): modelled 655 / 702 TFLOP/s for 128x256 at 4096^3 / 8192^3,
# measured 659 / 710; 128x128 546 / 581, measured 544 / 556. Since v15 all rows run faster
# (128x256 744 / 768, 128x128 701 / 719); the constants were not refit, as a refit moved
# skinny picks away from the measured best (v15 notes); the picks were checked in the bench.
_PEAK_SM90 = 780e12  # FLOP/s of wgmma on all SMs
# 16-bit products (estimate's `refit`): L2 -> shared memory over all SMs for the sm90 rows' TMA
# loads, and the rate of a 128x128 tile against 128x256's, refit to H200 harness timings (every
# row forced on 15 plain shapes, 8192^3 class to 1000^3 and 3000^3 / 5000^3; then the picks that
# moved, plain and fused, old against new: benchmarks/NOTES.md v58). 128x128 runs at 0.95-1.0 of
# 128x256 on large shapes (the first fit's 0.78 predates v15's epilogue) and wins where its
# tiles fill the last wave (3000^3: 576 tiles in 4.4 waves against 288 in 2.2). 8-bit and
# float32 plans keep the first fit (_L2_BW, 0.78: not remeasured).
_L2_BW_SM90 = 12e12
_RATE_SM90_128X128 = 0.94
_PIPE_FILL_SM90 = 3  # 64-wide k tiles of TMA prologue and epilogue per block
# sm90 split-K: 2 us per slice past the first, fitted to harness timings of 128 x 4096^2 and
# 16 x 4096^2 (every sm90 row, 1, 2 and 4 slices; H100, benchmarks/NOTES.md v15)
_SM90_SLICE = 2e-6
# A fused epilogue (C, bias, activation, aux: anything past alpha) on a cooperative sm90 row
# runs while its tile's tensor-core work waits: seconds per 128x256 tile (scaled by the tile's
# area), H100 (benchmarks/NOTES.md v32). A ping-pong row (c.pingpong) runs one warpgroup's
# epilogue under the other's main loop: only a block's last tile shows it.
_EPI_TILE_SM90 = 15e-6
# The fp8-only rows (planned for fp8 products only), by consumer warpgroups: rate against
# 128x256's on fp8, whose two warpgroups each wait for every promoted piece of a k tile and add
# it into float32 while only the other's piece runs. Three (192x128): 1.03-1.11x per-tensor,
# 1.02-1.09x with block scales (H200, 8192^3 in the same harness; benchmarks/NOTES.md v41),
# 1.04-1.17x per area of tile on 5 shapes of v70. Two (128x128, whose warpgroups issue a k
# tile's piece before adding the last one): 0.92-0.97 of 192x128's per area of tile on 9
# shapes; with block scales 0.85-0.89 of 192x128's, about 0.92 of its own per-tensor rate (v70).
_RATE_FP8_ONLY = {3: 1.12, 2: 1.06}
_RATE_FP8_ONLY_BLOCK = {3: 1.0, 2: 0.92}  # with block scales, times the row's per-tensor rate
# fp8 products with block scales on a row whose consumers load the scales from global memory
# (not Config.staged_scales): the main loop's rate against the same row's with per-tensor
# scales. Measured (H200, 128x256, whole product): 0.71 at 8192^3 and 4096 x 7168 x 16384,
# 0.83 at 128 x 7168 x 16384 (split 4), where the loop is less of the time; the staging rows
# 0.92 at 8192^3 (benchmarks/NOTES.md v43). 0.83 picks the faster row at all three shapes.
_RATE_BLOCK_LOADS = 0.83


def _rate(c: Config, resident: int, refit: bool = True) -> float:
    """Fraction of the peak (_PEAK; _PEAK_SM90 for sm90 rows) that SMs holding `resident`
    blocks of config c reach: smaller warp tiles move more shared memory per mma (64x64 warp
    tiles: 1, 32x32: about half), smaller block tiles more global and L2 traffic (128x128:
    0.875 of 128x256; H100, 8192^3: 422 vs 484 TFLOP/s), fewer than 8 warps per SM hide less
    latency. sm90 rows: 1.0 for 128x256 and 256x128, 0.78 for 128x128 (H100, single launches
    before v15; `refit`: _RATE_SM90_128X128), 0.56 for 64x128; fp8-only rows _RATE_FP8_ONLY (by
    consumer warpgroups)."""
    intensity = c.bm * c.bn / (c.bm + c.bn) / (256 * 128 / 384)  # 1 for 128x256 and 256x128
    if c.pingpong:  # H100, 8192x16384x4096 bf16, harness: 0.91-1.02 of 128x256's rate (v32)
        return 0.97
    if c.fp8_only:
        return _RATE_FP8_ONLY[c.consumers]
    if c.kind == "sm90":
        if refit and c.bm * c.bn == 128 * 128:
            return _RATE_SM90_128X128
        return 0.12 + 0.88 * min(1.0, intensity)
    warp_tile = (c.bm // c.warps_m) * (c.bn // c.warps_n)
    full = resident * c.warps_m * c.warps_n >= 8
    # BK = 64 was +5-7% on an H200 before the main loop lost its predicated loads (v7); since
    # then it is 2-3% slower on an H100 at 8192^3 (its 3 stages hide less latency than BK =
    # 32's 4), though faster on skinny products, where the per-k-tile latency term decides.
    return (min(1.0, 0.6 + 0.4 * warp_tile / 4096) * (1.0 if full else _FEW_WARPS)
            * (0.5 + 0.5 * min(1.0, intensity)) * (0.97 if c.bk >= 64 else 1.0))


def _block_rate(c: Config) -> float:
    """fp8 block scales: the main loop's rate against the same row's with per-tensor scales."""
    if not c.staged_scales:
        return _RATE_BLOCK_LOADS
    return _RATE_FP8_ONLY_BLOCK[c.consumers] if c.fp8_only else 1.0


def estimate(c: Config, s: int, m: int, n: int, k: int, batch: int = 1,
             elem_bytes: int = 2, epilogue: bool = False,
             block_scales: bool = False, refit: bool = True) -> tuple[float, float]:
    """Modelled seconds of config c with s K slices, and the GEMM part alone (the tie-break).

    Blocks (or clusters of the s slices) run in waves of the resident slots; a block walks
    its k tiles, each taking the longest of: its mma work (the SM shared by the blocks
    resident on it), a memory round trip per stages-1 tiles in flight, and its share of L2
    bandwidth. Split-K adds the reduction. sm90 rows: one block per SM, their own peak and
    pipeline fill, split-K always through the workspace (never a cluster), plus _SM90_SLICE
    per slice past the first, and a fused epilogue's time per tile (`epilogue`: _EPI_TILE_SM90;
    a ping-pong row hides all but a block's last).
    The operands and C must also cross HBM once; memory and compute overlap only in part.
    `refit`: the sm90 constants refit to 16-bit products (_L2_BW_SM90, _RATE_SM90_128X128);
    8-bit and float32 plans (plan_rows) pass False."""
    bps = blocks_per_sm(c)
    slots = SMS * bps
    hopper = c.kind == "sm90"
    # sm80 rows: the s slices of a tile form one thread block cluster (sm_90 hardware);
    # sm90 rows sum their slices through the workspace
    cluster = not hopper and 1 < s <= MAX_CLUSTER_SPLIT
    if cluster:  # waves of whole clusters
        slots = s * _MAX_CLUSTERS.get((bps, s), int(0.9 * slots) // s)
    blocks = c.tiles(m, n) * batch * s
    kt = math.ceil(math.ceil(k / c.bk) / s)
    concurrent = min(blocks, slots)
    resident = min(bps, math.ceil(concurrent / SMS))
    peak = _PEAK_SM90 if hopper else _PEAK
    rate = _rate(c, resident, refit) * (_block_rate(c) if block_scales else 1)
    t_mma = 2 * c.bm * c.bn * c.bk * resident / (peak / SMS * rate)
    stage_bytes = (min(c.bm, m) + min(c.bn, n)) * c.bk * elem_bytes  # rows past M, N: no reads
    t_tile = max(t_mma, _LATENCY / (c.stages - 1),
                 stage_bytes * concurrent / (_L2_BW_SM90 if hopper and refit else _L2_BW))
    # With two or more resident blocks per SM one block's prologue and epilogue overlap
    # another's main loop: half the fill is hidden.
    fill = (_PIPE_FILL_SM90 * 64 if hopper else _PIPE_FILL * 32) / c.bk
    fill /= 2 if resident >= 2 else 1
    t_gemm = math.ceil(blocks / slots) * (kt + fill) * t_tile
    if hopper and epilogue:
        t_epi = _EPI_TILE_SM90 * c.bm * c.bn / (128 * 256)
        t_gemm += t_epi * (1 if c.pingpong else math.ceil(blocks / slots))
    if cluster:  # slices sum each other's tiles in shared memory
        t_gemm += (blocks * c.bm * c.bn * 4 / _DSMEM_BW + (s - 1) * _CLUSTER_SLICE
                   + (s - 1) * c.bm * c.bn * 4 / _SLICE_ADD_BW)
    elif s > 1:
        t_gemm += s * batch * m * n * 4 * 2 / _BW + _LAUNCH  # workspace written once, read once
        if hopper:  # each further slice: another pass of the persistent prologue and epilogue
            t_gemm += (s - 1) * _SM90_SLICE
    t_mem = batch * (m * k + k * n + m * n) * elem_bytes / _BW
    return max(t_gemm, t_mem) + _OVERLAP * min(t_gemm, t_mem), t_gemm


def effective_split(c: Config, k: int, split_k: int, operand_bytes: int = 2) -> int:
    """K slices that actually run for split_k requested ones (EffectiveSplitK in C++) of
    operands of `operand_bytes` bytes (an sm90 k tile is 128 bytes of K)."""
    return _module().effective_split(c.name, k, split_k, operand_bytes)


# Packing (ffi/kernels/aux/pack.cu): a product that packs (should_pack: the `pack` attribute of the
# call) copies every operand whose rows need_pack into padded rows in the workspace before the
# GEMM, so that the 16-byte cp.async / TMA path streams it from rows at a fast pitch.
# Rows that are not 16-byte multiples: below this many FLOP the extra launch and copy are not
# worth it (the element-wise loads are then cheap).
PACK_MIN_FLOP = 2**27
# Rows of 512 elements or more that are 16-byte but not 32-byte multiples (e.g. 1000, 3000) stream
# 1.2-2.7x slower per flop than aligned twins (H100, graph replay, benchmarks/NOTES.md "Row
# pitch"): 3000^3 on sm90 128x256 152.6 us vs 101.9 on 3072^3, mostly from B's pitch (C's costs
# nothing). Copying both of 3000^3's operands takes 25.9 us, and the product in the bench
# harness falls from 171-176 to 137-139 us; 1000x1000x4000 45 -> 37 us, 1000^3 23.0 -> 21.9
# (H100, tools/pack_ab.py, NOTES v18). From 2^30 FLOP (1000^3 is 2^30.9) the copy is worth it.
PITCH_PACK_MIN_FLOP = 2**30


def needs_pack(cols: int) -> bool:
    """Whether a product that packs copies an operand whose rows have `cols` contiguous
    elements (NeedsPack in C++)."""
    return _module().needs_pack(cols)


def _row_lengths(m: int, n: int, k: int, transpose_a: bool, transpose_b: bool
                 ) -> tuple[int, int]:
    """Contiguous extents (row lengths as stored) of A and B."""
    return (m if transpose_a else k), (k if transpose_b else n)


def _rows_aligned(m: int, n: int, k: int, transpose_a: bool, transpose_b: bool) -> bool:
    """Whether both stored operands' rows are 16-byte (8-element) multiples."""
    return all(c % 8 == 0 for c in _row_lengths(m, n, k, transpose_a, transpose_b))


def should_pack(m: int, n: int, k: int, batch: int = 1, transpose_a: bool = False,
                transpose_b: bool = False) -> bool:
    """Whether the CUDA lowering has the handler pack (every operand whose rows need_pack):
    where some operand's rows are not 16-byte multiples and the product has PACK_MIN_FLOP, or
    some operand's rows are long (>= 512) 16-byte but not 32-byte multiples and it has
    PITCH_PACK_MIN_FLOP."""
    flop = 2 * batch * m * n * k
    return any(needs_pack(c) and flop >= (PACK_MIN_FLOP if c % 8 else PITCH_PACK_MIN_FLOP)
               for c in _row_lengths(m, n, k, transpose_a, transpose_b))


def tma_addressable(m: int, n: int, k: int, batch: int = 1, transpose_a: bool = False,
                    transpose_b: bool = False) -> bool:
    """Whether an sm90 config runs as itself on a 9.0 device: both operands' rows are 16-byte
    multiples as stored or once packed (a product that packs copies every operand whose rows
    are not; XLA's buffers are aligned). Otherwise it runs as its sm80_fallback."""
    return (_rows_aligned(m, n, k, transpose_a, transpose_b)
            or should_pack(m, n, k, batch, transpose_a, transpose_b))


def packed_ld(cols: int) -> int:
    """Row length of a packed copy of rows of `cols` elements (PackedLd in C++)."""
    return _module().packed_ld(cols)


def workspace_floats(m: int, n: int, k: int, batch: int, a_shared: bool, b_shared: bool,
                     transpose_a: bool, transpose_b: bool, config: str, split_k: int,
                     pack: bool, operand_bytes: int = 2, tail: tuple[int, int] = (0, 1)) -> int:
    """float32 workspace of one call: split-K partials (a tail split's: its tail's), then
    (with `pack`) the packed operand copies (PlanWorkspace in C++, which the handler checks the
    workspace against), for operands of `operand_bytes` bytes."""
    return _module().workspace_floats(m, n, k, batch, a_shared, b_shared, transpose_a,
                                      transpose_b, config, split_k, pack, operand_bytes, *tail)


# A tail split (GemmProblem::tail_rows in C++): a 16-bit product on an sm90 row whose tiles
# leave the last wave at most TAIL_MAX_FILL full runs its head rows (whole waves of tiles) in
# one launch and its last rows in TAIL_SPLITS slices through the workspace, so that those tiles
# fill the SMs the last wave left idle (3000^3 on 128x256: 288 tiles, 2.2 waves run as 3),
# where the cost model says the two parts take less time than the whole (the tail's slices pay
# the workspace pass and the reduction).
TAIL_MAX_FILL = 0.5
TAIL_SPLITS = (2, 3, 4, 6, 8)


def _tail(c: Config, m: int, n: int, k: int, batch: int = 1, epilogue: bool = False,
          whole: float | None = None) -> tuple[float, int, int]:
    """(modelled seconds, tail_rows, tail_split) of config c in one slice with its best tail
    split, or its whole time (`whole`, when the caller has it) with (0, 1) where none pays."""
    if whole is None:
        whole = estimate(c, 1, m, n, k, batch, epilogue=epilogue)[0]
    tiles_m, tiles_n = math.ceil(m / c.bm), math.ceil(n / c.bn)
    waves = tiles_m * tiles_n / SMS
    if c.kind != "sm90" or c.fp8_only or batch != 1 or waves <= 1 or \
            waves - math.floor(waves) > TAIL_MAX_FILL:
        return whole, 0, 1
    head_tm = math.floor(waves) * SMS // tiles_n  # whole tile rows of the full waves
    tail = m - head_tm * c.bm
    if head_tm <= 0 or tail <= 0:
        return whole, 0, 1
    head = estimate(c, 1, m - tail, n, k, batch, epilogue=epilogue)[0]
    best = (whole, 0, 1)
    for s in TAIL_SPLITS:
        if k // s < _MIN_K_PER_SPLIT:
            break
        t = head + estimate(c, s, tail, n, k, batch, epilogue=epilogue)[0]
        if t < best[0]:
            best = (t, tail, s)
    return best


def tail_plan(config: str, split_k: int, m: int, n: int, k: int, batch: int = 1,
              epilogue: bool = False) -> tuple[int, int]:
    """(tail_rows, tail_split) of a 16-bit product planned on (config, split_k): the tail split
    the cost model takes (plan() ranks each sm90 row in one slice with it), or (0, 1)."""
    if split_k != 1:
        return 0, 1
    return _tail(BY_NAME[config], m, n, k, batch, epilogue)[1:]


def splits(c: Config, k: int, m: int | None = None) -> tuple[int, ...]:
    """K slice counts worth trying for config c on an M x N x K product: powers of two up to
    MAX_CLUSTER_SPLIT (sm90 rows: 2), each slice at least 512 of K. (Measured on an H100: 3-, 6-
    or 12-block clusters were never the fastest and were up to 1.2x slower than 2 or 4, filling
    the GPCs unevenly; 16 slices, reduced through the workspace, were never the fastest on 10
    skinny shapes and up to 1.5x slower than the best.) sm90 rows split only with M >= 64 (m
    None: not known, taken as large): at M = 16 their m64 blocks are three-quarters empty and
    every sm90 split was slower than the sm80 cluster split (harness, 16 x 4096^2: 24.8-29.0 us
    against 23.2); 4 sm90 slices were slower than 2 on every M = 128 shape timed (128 x 4096^2:
    19.7 vs 13.3 us). Larger split_k values remain available explicitly."""
    if c.kind == "sm90":
        if m is not None and m < 64:
            return (1,)
        top = max(1, min(2, k // _MIN_K_PER_SPLIT))
    else:
        top = max(1, min(MAX_CLUSTER_SPLIT, k // _MIN_K_PER_SPLIT))  # MAX_CLUSTER_SPLIT < MAX_SPLIT_K
    return tuple(s for s in (1, 2, 4, 8) if s <= top)


# Skinny rows (BM < 64: one m16 row of mma per warp, for decode-sized M) stream the weights
# with the least mma work, but only pay off where every block has an SM's bandwidth to itself.
# They compete up to SKINNY_MAX_M rows, when all blocks fit one wave, and split K only while
# every slice has its own SM. H100, graph replay, 16x64x64_s6 (benchmarks/NOTES.md v16): 16 x
# 4096^2 split 2 (128 blocks) 8.6 us (8.3 with v20's push reduction), the best m64 plan 12.1;
# 32 x 4096^2 split 1 11.8, split 2 (256 blocks) 14.3, the best m64 plan 12.5; 16 x 28672 x
# 8192 (448 blocks, two waves) 3-6% slower than the sm90 64x128 row in the harness; 16 x 8192
# x 28672 split 2 (256 blocks) 3% slower than split 1.
SKINNY_MAX_M = 32


# Sliced K (warps_k > 1: two warp groups share each stage's K) doubles the warps that stream a
# block's tiles, which pays off only while a block's own streaming rate decides the time. H100,
# graph replay (benchmarks/NOTES.md v22), 16x64x128_s6_w1x4x2 against 16x64x64_s6_w1x4, split
# 1: 32 x 4096^2 10.5 vs 11.9 us, 24 x 4096^2 10.7 vs 12.1, 17 x 4096^2 10.9 vs 12.1, 32 x 4096
# x 11008 33.1 vs 37.1 (36.2 in two slices), 16 x 4096^2 10.6 vs 11.8, 16 x 4096 x 11008 32.8
# vs 36.7 (64 blocks); but with two slices 8.6 vs 8.1, the plain row's two slices beat the
# sliced row's one (8.1 vs 10.6), and where 128 blocks of one tile row stream each weight byte
# once from HBM the sliced row is slower: 16 x 8192^2 47.1 vs 46.3, 16 x 8192 x 28672 157.5 vs
# 155.6. So a sliced-K row competes in one slice only, only where the plain skinny row cannot
# take a second slice (two slices per tile would exceed the SMs, or K is too short for two),
# and only where the weights do not simply stream from HBM: at most half the SMs busy, two or
# more tile rows (all but the first read a weight panel from L2), or weights that stay in L2
# (SLICED_K_MAX_WEIGHT bytes). (A 32x64x64 tile of 2 x 4 warps, tried instead for M = 17..32,
# was slower: 32 x 4096^2 in two slices 11.3 us, one 17.1.)
SLICED_K_MAX_WEIGHT = 32 << 20


def competes(c: Config, s: int, m: int, n: int, k: int, batch: int = 1,
             epilogue: bool = False) -> bool:
    """Whether config c with s K slices is one of plan()'s candidates for a (batch x) M x N x K
    product (rows with BM >= 64: always, but ping-pong rows only for a fused epilogue, the one
    thing they are for; skinny rows: see SKINNY_MAX_M; sliced-K rows: see above)."""
    if c.pingpong:
        return epilogue
    if c.bm >= 64:
        return True
    blocks = c.tiles(m, n) * batch
    ok = (m <= SKINNY_MAX_M and blocks <= SMS * blocks_per_sm(c)
          and (s == 1 or blocks * s <= SMS))
    if c.warps_k > 1:
        splittable = 2 in splits(c, k, m) and 2 * blocks <= SMS  # as the plain row would
        rate_bound = 2 * blocks <= SMS or m > c.bm or n * k * 2 <= SLICED_K_MAX_WEIGHT
        ok = ok and s == 1 and not splittable and rate_bound
    return ok


def plan(m: int, n: int, k: int, batch: int = 1, dtype=None, layout: str = "NN",
         arch: tuple[int, ...] | None = None, epilogue: bool = False):
    """(config name, split_k) for a (batch x) M x N x K product on a device of compute
    capability `arch` (device_arch() for the default device; None: sm80 rows only): the pair
    of least modelled time (ties: less compute, the earlier config of the table, then fewer
    slices). sm90 rows compete only where they would run as themselves (tma_addressable).
    `epilogue`: the product has a fused epilogue beyond alpha (problem.fused_epilogue)."""
    del dtype  # same model for both input types and all layouts (for now; the layout only
    # decides whether an sm90 row would run as itself)
    hopper_ok = tma_addressable(m, n, k, batch, layout[0] == "T", layout[1] == "T")
    allowed = configs_for(arch)
    def cost(c, s):  # (seconds, GEMM seconds) of c with s slices; one slice: its tail split
        t = estimate(c, s, m, n, k, batch, epilogue=epilogue)
        return (_tail(c, m, n, k, batch, epilogue, t[0])[0], t[1]) if s == 1 else t
    best = min(((*cost(c, s), i, s)
                for i, c in enumerate(CONFIGS)
                if c in allowed and (c.kind == "sm80" or hopper_ok)
                for s in splits(c, k, m) if competes(c, s, m, n, k, batch, epilogue)))
    return CONFIGS[best[2]].name, best[3]


def select(m: int, n: int, k: int, batch: int = 1, dtype=None, layout: str = "NN",
           arch: tuple[int, ...] | None = None) -> str:
    """Name of the config plan() picks."""
    return plan(m, n, k, batch, dtype, layout, arch)[0]


def split_k(c: Config, m: int, n: int, k: int, batch: int = 1) -> int:
    """Best K slices for a given config c (by the same model; for a skinny row, among those
    competes() allows, where there are any)."""
    cands = [s for s in splits(c, k, m) if competes(c, s, m, n, k, batch)] or [1]
    return min(cands, key=lambda s: (*estimate(c, s, m, n, k, batch), s))


def plan_for_device(m: int, n: int, k: int, batch: int = 1, dtype=None, layout: str = "NN",
                    epilogue: bool = False):
    """(config, split_k) for a product lowered for the default device: measured by the
    autotuner when it is on (imported only then; it times plain products), else plan()'s
    cost model."""
    import os
    import sys
    tuner = sys.modules.get(__package__ + ".autotune")
    on = os.environ.get("JAX_TCGEMM_AUTOTUNE", "").strip().lower() in ("1", "true", "yes", "on")
    if on or (tuner is not None and tuner.enabled()):
        from . import autotune
        if autotune.enabled():
            return autotune.plan(m, n, k, batch, dtype, layout)
    return plan(m, n, k, batch, dtype, layout, device_arch(), epilogue)


def ragged_kind(arch: tuple[int, ...] | None) -> str | None:
    """The kernel family that runs grouped products on a device of compute capability `arch`:
    "sm90" on 9.0 (the persistent TMA + wgmma scheduler), "sm80" on every other GPU from 8.0 on
    (sm_80, 86, 89, 10.x, 12.x: the mma.sync kernels), None where no grouped kernel runs (arch
    unknown, or below 8.0: the caller lowers through lax)."""
    if arch is None or tuple(arch[:2]) < (8, 0):
        return None
    return "sm90" if tuple(arch[:2]) == (9, 0) else "sm80"


def plan_ragged(m: int, n: int, k: int, groups: int, dtype=None, mode: int = 0,
                transpose_b: bool = False, arch: tuple[int, ...] | None = "device"):
    """Config name for a grouped product (tcgemm_ragged, ffi/xla/ragged_ffi.cc), or None where
    no grouped kernel runs (ragged_kind(arch) is None: the caller lowers through lax).
    Grouped products run without a K split on the rows with grouped kernels (Config.ragged)
    of the device's family (ragged_kind); the row is the one the cost model picks for the
    dense batched product of equal groups (mode 0, rows: groups x M/G x N x K; mode 1,
    contraction: groups x K x N over M/G)."""
    del dtype, transpose_b  # one model for both input types and layouts (as plan())
    if arch == "device":
        arch = device_arch()
    kind = ragged_kind(arch)
    if kind is None:
        return None
    g = max(int(groups), 1)
    per = max(1, -(-int(m) // g))
    mm, nn, kk = (per, n, k) if mode == 0 else (k, n, per)
    best = min((*estimate(c, 1, mm, nn, kk, g), i) for i, c in enumerate(CONFIGS)
               if c.kind == kind and c.ragged and not c.pingpong)
    return CONFIGS[best[-1]].name


def plan_rows(m, n, k, batch, has_kernels, k_multiple, arch, split_counts, epilogue=False,
               elem_bytes=2, block_scales=False, sm80=False):
    """(config name, split_k) among the sm90 rows with kernels for a K-major-only operand type
    (has_kernels(config): Config.int8 / fp8 / f32), or None where none runs: compute capability
    (arch "device": the default device's) not 9.0, K not a multiple of k_multiple (16-byte
    rows). The cost model picks as for 16-bit operands among the K slice counts
    split_counts(config) offers each row; `elem_bytes`: the bytes per operand element of its
    traffic terms (8-bit: 1); `block_scales`: fp8 block scales (estimate). `sm80`: int8 on the
    sm80 rows instead (8.0 and up), modelled as the 16-bit product of K/2 (an int8 pair is one
    16-bit element there, at twice the rate)."""
    if arch == "device":
        arch = device_arch()
    cc = None if arch is None else tuple(arch[:2])
    if cc is None or (cc < (8, 0) if sm80 else cc != (9, 0)) or k % k_multiple:
        return None
    kind = "sm80" if sm80 else "sm90"
    mk, eb = (k // 2, 2) if sm80 else (k, elem_bytes)  # what the cost model counts
    best = min(((*estimate(c, s, m, n, mk, batch, eb, epilogue, block_scales, False), i, s)
                for i, c in enumerate(CONFIGS) if c.kind == kind and has_kernels(c)
                for s in split_counts(c)
                if competes(c, s, m, n, mk, batch, epilogue)), default=None)
    return None if best is None else (CONFIGS[best[-2]].name, best[-1])


# float32 products on the TF32 kernels: a K slice adds its k tiles' sums in order into float32
# registers, so the rounding of that running sum grows with the tiles a slice adds (3xTF32 at
# 256 x 256 x 65536, K' = 3K in one slice: max-norm error 1.6e-6 against float64, jnp HIGHEST
# 8.7e-7; H100, benchmarks/NOTES.md v35). Slices are summed apart and then added by the split-K
# reduction, which divides that growth by about sqrt(slices): a slice covers at most
# F32_SLICE_K of K' (the K of the call: 3K for 3xTF32 and f16x3), as 8192^3 does in one
# (8.5e-7; f16x3's promoted float16 kernels take the same rows and slices).
F32_SLICE_K = 24576
# Beyond that floor the cost model picks among powers of two up to MAX_SPLIT_K, each slice at
# least F32_MIN_SLICE_K of K': a long-K product of few tiles fills the SMs with slices (the 16-bit
# rule of at most two sm90 slices was fitted to products of 4096 or less of K).
F32_MIN_SLICE_K = 2048


def f32_splits(k: int) -> tuple[int, ...]:
    """K slice counts plan_f32 weighs for a float32 product of K' = k (every row alike)."""
    floor = -(-k // F32_SLICE_K)
    out = tuple(s for s in (1 << i for i in range(MAX_SPLIT_K.bit_length()))
                if s >= floor and (s == 1 or k // s >= F32_MIN_SLICE_K))
    return out or (MAX_SPLIT_K,)


def plan_f32(m: int, n: int, k: int, batch: int = 1, arch: tuple[int, ...] | None = "device",
             epilogue: bool = False):
    """(config name, split_k) for a float32 product read as TF32 (K-major operands, K a
    multiple of 4: what the lowering makes of any float32 product), or None where no TF32
    kernel runs (plan_rows). Among the rows with TF32 kernels (Config.f32), the (row, split)
    the cost model picks, split as f32_splits allows (long K: F32_SLICE_K)."""
    splits = f32_splits(k)  # every row alike
    return plan_rows(m, n, k, batch, lambda c: c.f32, 4, arch, lambda c: splits,
                      epilogue=epilogue)
