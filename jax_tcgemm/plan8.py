"""The 8-bit planner: the (row, K slices) of an fp8 / int8 product (tg.scaled_matmul, int8
dot_general) on the config table (configs), by configs' cost model where the sm90 and sm80 rows
compete, and by the narrow rows' own rule for decode-sized products with b stored (K, N)."""
from __future__ import annotations

from . import configs


# int8 products of at most this many rows run on the sm80 rows (16-row tiles) on 9.0 too, where
# a 64-row wgmma tile idles: 4-13% faster at M = 1 and 16, not at 32 (H200, NOTES v61).
INT8_SM80_MAX_M = 16

# 8-bit products split K only where their tiles leave SMs idle (decode-sized M: 16 x 4096^2 has
# 32 column tiles of 128 for 132 SMs), each slice at least BYTE_MIN_SLICE_K of K; the slices'
# partials (int8: exact int32) are summed by the split-K reduction, which runs the epilogue.
BYTE_MIN_SLICE_K = 1024


def byte_splits(tiles: int, k: int) -> tuple[int, ...]:
    """K slice counts plan_byte weighs for a row with `tiles` output tiles and K = k."""
    return tuple(s for s in (1 << i for i in range(configs.MAX_SPLIT_K.bit_length()))
                 if s == 1 or (tiles * s <= 2 * configs.SMS and k // s >= BYTE_MIN_SLICE_K))


# 8-bit products of at most NARROW_MAX_M rows with b stored (K, N) (x @ W; N a multiple of 8)
# run on the narrow rows (int8 from 8.0, fp8 on 9.0): b read once as stored, where the other
# rows first copy it K-major (1.0-2.0x faster at M = 1-32 on the H200; with b (N, K) those rows
# stay ahead: NOTES v69). K slices: the most (powers of two) that keep the blocks within
# NARROW_BLOCKS and give every warp of a block a k tile of its slice.
NARROW_MAX_M = 32
NARROW_BLOCKS = 2 * configs.SMS


def _plan_narrow(m, n, k, kind, cc, batch, transpose_b):
    if cc is None or cc < (8, 0) or (kind == "fp8" and cc != (9, 0)) or transpose_b or n % 8:
        return None
    c = min((c for c in configs.CONFIGS if c.kind == "narrow" and c.bm >= m), key=lambda c: c.bm,
            default=None)
    if c is None:
        return None
    # (a k tile is 2 BK 8-bit k: KTileElems in C++)
    blocks, k_tiles, s = -(-n // c.bn) * batch, -(-k // (2 * c.bk)), 1
    while (2 * s <= configs.MAX_SPLIT_K and 2 * s * blocks <= NARROW_BLOCKS
           and k_tiles >= 2 * s * c.warps_k):
        s *= 2
    return c.name, s


# 8-bit products on the sm90 rows (fp8 with per-tensor, per-row or per-column scales; int8) of
# at most ONE_WAVE_MAX_M rows whose tiles on the smallest 8-bit row (64x128) fill one wave of the
# SMs to at least ONE_WAVE_FILL run there in one slice: the cost model would split the larger
# rows' fewer tiles, and those slices lose to 64x128's one wave (H200, NOTES v73): fp8 by 5-22%
# (128 x 8192^2, 128 x 7168 x 16384, 160 x 4096^2, 384 x 2048 x 7168; within 2% at
# 192 x 4096 x 14336 and 256 x 4096 x 14336), int8 by 6-26% (7 shapes, M = 80-448); with row /
# column scales (W8A8, per-token / per-channel fp8) by 8-35% and 3-26% (NOTES v75). Below that
# fill 64x128 in one slice leaves SMs idle (fp8 128 x 4096^2: 64 tiles, 5% slower than 2
# slices); past one wave the larger rows win (fp8 320 x 28672 x 4096: 64x128 0.9 of 192x128).
# Not with block scales: 64x128 runs them at 0.75-0.92 of its per-tensor rate at these shapes,
# 15% behind the plan at 192 x 4096 x 14336.
ONE_WAVE_FILL = 0.7
ONE_WAVE_MAX_M = 512


def _plan_one_wave(m, n, kind, batch):
    c = min((c for c in configs.CONFIGS if c.kind == "sm90" and getattr(c, kind)),
            key=lambda c: c.bm * c.bn, default=None)
    if c is None or m > ONE_WAVE_MAX_M:
        return None
    fill = c.tiles(m, n) * batch / configs.SMS
    return (c.name, 1) if ONE_WAVE_FILL <= fill <= 1 else None


def plan_byte(m: int, n: int, k: int, kind: str, arch: tuple[int, ...] | None = "device",
              block_scales: bool = False, batch: int = 1, transpose_b: bool = True):
    """(config name, split_k) for an 8-bit product (kind "int8" or "fp8": tg.scaled_matmul and
    int8 dot_general, K-major operands), or None where no 8-bit kernel runs (K not a multiple
    of 16; fp8 off compute capability 9.0, int8 below 8.0; an empty product). Among the rows
    with 8-bit kernels of that kind and the K slices byte_splits allows, the cost model's pick:
    on 9.0 the sm90 rows (fp8: the fp8-only rows, three consumer warpgroups on large squares,
    where the third hides the promotion's waits, two where their smaller tile fills the waves
    better: NOTES v41, v70; `block_scales`: rows that stage them where they win: v43); int8
    elsewhere, and on 9.0 up to INT8_SM80_MAX_M rows, the sm80 rows (mma.sync m16n8k32); up to
    NARROW_MAX_M rows the narrow rows; on the sm90 rows, up to ONE_WAVE_MAX_M rows whose 64x128
    tiles fill one wave, without block scales: that row in one slice (v73). `batch`: items of
    M x N each; `transpose_b`: b stored (N, K), else (K, N)."""
    if min(m, n, k, batch) <= 0:
        return None
    if arch == "device":
        arch = configs.device_arch()
    if m <= NARROW_MAX_M and k % 16 == 0 and (narrow := _plan_narrow(
            m, n, k, kind, None if arch is None else tuple(arch[:2]), batch, transpose_b)):
        return narrow
    sm80 = kind == "int8" and (tuple(arch or ())[:2] != (9, 0) or m <= INT8_SM80_MAX_M)
    plan = configs.plan_rows(m, n, k, batch, lambda c: getattr(c, kind), 16, arch,
                             lambda c: byte_splits(c.tiles(m, n) * batch, k), elem_bytes=1,
                             block_scales=block_scales, sm80=sm80)
    if plan and not sm80 and not block_scales and (one := _plan_one_wave(m, n, kind, batch)):
        return one  # (plan_rows has checked the compute capability and K)
    return plan
