"""Kernel configs: the table of ffi/gemm_config.inc (the one source, also compiled into C++)
and the choice of a config for a problem."""
from __future__ import annotations

import dataclasses
import math
import pathlib
import re

_ROW = re.compile(r"^\s*TCGEMM_CONFIG\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,"
                  r"\s*(\d+)\s*,\s*(\d+)\s*\)", re.M)

LAYOUTS = ("NN", "NT", "TN", "TT")  # BLAS letters for (A, B): N = as stored, T = transposed


def layout_name(transpose_a: bool, transpose_b: bool) -> str:
    return ("T" if transpose_a else "N") + ("T" if transpose_b else "N")


@dataclasses.dataclass(frozen=True)
class Config:
    bm: int
    bn: int
    bk: int
    stages: int
    warps_m: int
    warps_n: int

    @property
    def name(self) -> str:  # same rule as ConfigName() in ffi/gemm_config.h
        return (f"sm80_{self.bm}x{self.bn}x{self.bk}_s{self.stages}"
                f"_w{self.warps_m}x{self.warps_n}")

    def tiles(self, m: int, n: int) -> int:
        return math.ceil(m / self.bm) * math.ceil(n / self.bn)


def _table_text() -> str:
    here = pathlib.Path(__file__).resolve().parent
    for path in (here / "gemm_config.inc", here.parent / "ffi" / "gemm_config.inc"):
        if path.is_file():
            return path.read_text()
    raise FileNotFoundError("jax_tcgemm: gemm_config.inc not found next to the package "
                            "(installed by CMake) nor in ../ffi (source tree)")


CONFIGS: tuple[Config, ...] = tuple(
    Config(*map(int, m.groups())) for m in _ROW.finditer(_table_text()))
BY_NAME: dict[str, Config] = {c.name: c for c in CONFIGS}

_SMS = 132  # streaming multiprocessors of an H100/H200 SXM
_REGS_PER_THREAD = 256  # the kernels are built to use up to 255 registers (+1 granule)
_SMEM_PER_SM = 228 * 1024
MAX_SPLIT_K = 64  # kMaxSplitK in ffi/gemm_params.h (a CPU test checks they agree)
_MIN_K_PER_SPLIT = 512  # a K slice shorter than this spends too long in its pipeline prologue


def blocks_per_sm(c: Config) -> int:
    """Resident threadblocks of config c per SM (register- or shared-memory-bound)."""
    threads = 32 * c.warps_m * c.warps_n
    smem = max(c.stages * (c.bm + c.bn) * c.bk * 2,  # kSmemBytes in ffi/gemm_config.h:
               c.warps_m * c.warps_n * 16 * (c.bn // c.warps_n * 4 + 16),  # pipeline, epilogue,
               c.bm * (c.bn + 4) * 4)  # cluster split-K tile
    return max(1, min(65536 // (threads * _REGS_PER_THREAD), _SMEM_PER_SM // (smem + 1024)))


# Cost model of the selector (H100/H200 SXM class; autotune.py measures instead of guessing).
_PEAK = 600e12  # FLOP/s of mma.sync on all SMs at full occupancy
_BW = 3.0e12    # bytes/s of HBM
_LAUNCH = 3e-6  # s, a second kernel launch (the split-K reduction)
_DSMEM_BW = 10e12  # bytes/s over all SMs of the cluster split-K reduction (shared memory)
MAX_CLUSTER_SPLIT = 8  # kMaxClusterSplit in ffi/gemm_params.h: up to here, no workspace pass
_PIPE_FILL = 3  # k tiles of latency before a block's first mma (prologue) and its epilogue


def _rate(c: Config) -> float:
    """Fraction of _PEAK that SMs full of config c reach: smaller warp tiles move more shared
    memory per mma (64x64 warp tiles: 1, 32x32: about half)."""
    warp_tile = (c.bm // c.warps_m) * (c.bn // c.warps_n)
    full = blocks_per_sm(c) * c.warps_m * c.warps_n >= 8  # 8 warps per SM hide the latencies
    # BK = 64 halves the barriers per k: +7% at 8192^3 and +5% at 4096^3 on an H200 (autotune)
    return min(1.0, 0.6 + 0.4 * warp_tile / 4096) * (1.0 if full else 0.8) * (
        1.07 if c.bk >= 64 else 1.0)


def estimate(c: Config, s: int, m: int, n: int, k: int, batch: int = 1,
             elem_bytes: int = 2) -> float:
    """Modelled seconds of config c with s K slices, and the compute part alone (the tie-break
    among memory-bound choices): whole waves of padded tiles at c's rate plus the split-K
    workspace round trip, no faster than HBM moves the operands."""
    slots = _SMS * blocks_per_sm(c)
    blocks = c.tiles(m, n) * batch * s
    kt = math.ceil(math.ceil(k / c.bk) / s)
    # With two or more resident blocks per SM one block's prologue and epilogue overlap
    # another's main loop: half the fill is hidden (measured: 128x128 beats 256x128 on
    # 64 x 256^3, where k is 8 tiles).
    fill = _PIPE_FILL * 32 / c.bk / (2 if blocks_per_sm(c) >= 2 else 1)
    t_wave = (kt + fill) * c.bk * 2 * c.bm * c.bn * slots / (_PEAK * _rate(c))
    t_mem = batch * (m * k + k * n + m * n) * elem_bytes / _BW
    t_gemm = math.ceil(blocks / slots) * t_wave
    if 1 < s <= MAX_CLUSTER_SPLIT:  # slices sum each other's tiles in shared memory (sm_90)
        t_gemm += s * blocks / s * c.bm * c.bn * 4 / _DSMEM_BW
    elif s > 1:
        t_gemm += s * batch * m * n * 4 * 2 / _BW + _LAUNCH  # workspace written once, read once
    return max(t_gemm, t_mem), t_gemm


def splits(c: Config, k: int) -> range:
    """K slice counts worth trying for config c: 1 up to 16, each slice at least 512 of K."""
    return range(1, max(1, min(MAX_SPLIT_K, 16, k // _MIN_K_PER_SPLIT)) + 1)


def plan(m: int, n: int, k: int, batch: int = 1, dtype=None, layout: str = "NN"):
    """(config name, split_k) for a (batch x) M x N x K product: the pair of least modelled
    time (ties: less compute, the earlier config of the table, then fewer slices)."""
    del dtype, layout  # same model for both input types and all layouts (for now)
    best = min(((*estimate(c, s, m, n, k, batch), i, s)
                for i, c in enumerate(CONFIGS) for s in splits(c, k)))
    return CONFIGS[best[2]].name, best[3]


def select(m: int, n: int, k: int, batch: int = 1, dtype=None, layout: str = "NN") -> str:
    """Name of the config plan() picks."""
    return plan(m, n, k, batch, dtype, layout)[0]


def split_k(c: Config, m: int, n: int, k: int, batch: int = 1) -> int:
    """Best K slices for a given config c (by the same model)."""
    return min(splits(c, k), key=lambda s: (*estimate(c, s, m, n, k, batch), s))
