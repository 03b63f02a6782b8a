"""CPU tests of the Hopper (sm90) rows of the config table and of planning by compute
capability: names, fallbacks, workspace sizes, and which configs configs.plan may pick where.

sm90 configs (TMA + wgmma) run as themselves only on compute capability 9.0 with
TMA-addressable operands; elsewhere as configs.sm80_fallback (C++ Sm80Fallback). plan(arch=None)
plans with sm80 rows only; tcgemm plans with configs.device_arch().
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_tcgemm import autotune, configs

F16 = np.dtype(jnp.float16)
SM90 = [c for c in configs.CONFIGS if c.kind == "sm90"]


def test_sm90_rows():
    """Hopper rows: name rule, no warp layout, warpgroup threads, one block per SM, split by the
    planner in at most 2 slices and only with M >= 64, and an sm80 fallback with the same BK
    (Sm80Fallback in C++)."""
    assert SM90, "gemm_config.inc has no TCGEMM_SM90_CONFIG row"
    for c in SM90:
        assert re.fullmatch(r"sm90_\d+x\d+x\d+_s\d+_g\d+", c.name), c.name
        assert c.name == f"sm90_{c.bm}x{c.bn}x{c.bk}_s{c.stages}_g{c.consumers}"
        assert (c.warps_m, c.warps_n) == (0, 0) and c.consumers >= 1
        assert c.threads == 128 * (c.consumers + 1) and c.bm % c.consumers == 0
        assert configs.blocks_per_sm(c) == 1 and configs.splits(c, 65536) == (1, 2)
        assert configs.splits(c, 65536, 16) == configs.splits(c, 1023, 128) == (1,)
        f = configs.sm80_fallback(c)
        assert f.kind == "sm80" and f.bk == c.bk
        assert f is next(x for x in configs.CONFIGS if x.kind == "sm80" and x.bk == c.bk)
    for c in configs.CONFIGS:
        if c.kind == "sm80":
            assert configs.sm80_fallback(c) is c
    assert {c.name for c in SM90} >= {"sm90_128x256x64_s4_g2", "sm90_128x128x64_s6_g2"}


def test_parse_both_row_kinds():
    text = ("// TCGEMM_CONFIG(BM, BN, BK, STAGES, WARPS_M, WARPS_N, WARPS_K)\n"
            "TCGEMM_CONFIG(128, 256, 32, 4, 2, 4, 1)\n  TCGEMM_SM90_CONFIG( 128,128 , 64, 6, 2 )\n"
            "TCGEMM_CONFIG(16, 64, 128, 6, 1, 4, 2)\n")
    rows = [configs._parse(m) for m in configs._ROW.finditer(text)]
    assert [c.name for c in rows] == ["sm80_128x256x32_s4_w2x4", "sm90_128x128x64_s6_g2",
                                      "sm80_16x64x128_s6_w1x4x2"]
    assert rows[1] == configs.Config(128, 128, 64, 6, 0, 0, "sm90", 2)
    assert rows[2].warps_k == 2 and rows[2].threads == 256 and rows[0].warps_k == 1


@pytest.mark.parametrize("m,n,k,batch", [
    (8192, 8192, 8192, 1), (4096, 4096, 4096, 1), (4096, 11008, 4096, 1), (16, 4096, 4096, 1),
    (128, 4096, 4096, 1), (4095, 4097, 4093, 1), (127, 129, 255, 1), (256, 256, 256, 64)],
    ids=str)
def test_plan_by_arch(m, n, k, batch):
    """sm90 rows are candidates on compute capability 9.0 only, and only where both operands
    are TMA-addressable (rows 16-byte multiples as stored, or packed)."""
    for layout in configs.LAYOUTS:
        for arch in (None, (8, 0), (8, 9), (10, 0)):
            name, _ = configs.plan(m, n, k, batch, F16, layout, arch=arch)
            assert configs.BY_NAME[name].kind == "sm80", (arch, layout, name)
            assert configs.select(m, n, k, batch, F16, layout, arch) == name
        assert configs.plan(m, n, k, batch, F16, layout, arch=None) == configs.plan(
            m, n, k, batch, F16, layout)  # the default is sm80 only
        name, split = configs.plan(m, n, k, batch, F16, layout, arch=(9, 0))
        ta, tb = layout[0] == "T", layout[1] == "T"
        if not configs.tma_addressable(m, n, k, batch, ta, tb):
            assert configs.BY_NAME[name].kind == "sm80", (layout, name)
        if configs.BY_NAME[name].kind == "sm90":  # split only with M >= 64, at most 2
            assert split in configs.splits(configs.BY_NAME[name], k, m) and (split == 1 or m >= 64)


@pytest.mark.parametrize("m,n,k", [(8192, 8192, 8192), (4096, 11008, 4096),
                                   (8192, 28672, 8192), (4096, 4096, 11008)], ids=str)
def test_plan_picks_sm90_on_hopper(m, n, k):
    name, split = configs.plan(m, n, k, arch=(9, 0))
    assert name.startswith("sm90_") and split == 1, (name, split)
    assert configs.plan(m, n, k)[0].startswith("sm80_")


def test_skinny_plans_on_hopper():
    """Against 4096 x 4096 weights on 9.0 (H100, CUDA-graph replay of every candidate): M = 16
    takes the 16-row tile in a 2-block cluster split (8.6 us, 8.3 since v20's push reduction;
    64x64x64 split 2 12.1, the best sm90 plan 12.2), M = 32 the 16-row tile in one slice
    (11.8 us; two slices 14.3, 64x64x64 split 2 12.5), and since v22 the sliced-K 16-row tile in
    one slice (10.5 us), M = 128 the one-warpgroup sm90 row in 2 slices (harness 25.2 us; sm80
    64x64x64 split 2 31.8). 16 x 28672 x 8192 needs two waves of 16-row tiles: sm90 instead."""
    assert configs.plan(16, 4096, 4096, arch=(9, 0)) == ("sm80_16x64x64_s6_w1x4", 2)
    assert configs.plan(32, 4096, 4096, arch=(9, 0)) == ("sm80_16x64x128_s6_w1x4x2", 1)
    assert configs.plan(128, 4096, 4096, arch=(9, 0)) == ("sm90_64x128x64_s8_g1", 2)
    assert configs.plan(16, 28672, 8192, arch=(9, 0)) == ("sm90_64x128x64_s8_g1", 1)


@pytest.mark.parametrize("m,n,k,batch", [(16, 4096, 4096, 1), (32, 4096, 4096, 1),
                                         (16, 28672, 8192, 1), (8, 8192, 28672, 1),
                                         (33, 4096, 4096, 1), (1000, 1000, 1000, 1),
                                         (16, 256, 4096, 64), (24, 4096, 4096, 1),
                                         (16, 8192, 8192, 1), (16, 4096, 512, 1),
                                         (32, 4096, 11008, 1)], ids=str)
@pytest.mark.parametrize("arch", [None, (9, 0)], ids=str)
def test_skinny_rows_only_where_they_pay(m, n, k, batch, arch):
    """A skinny row (BM < 64) is planned only for M <= SKINNY_MAX_M, all its blocks in one
    wave, and split only while every block has an SM to itself; autotune offers the same."""
    name, split = configs.plan(m, n, k, batch, arch=arch)
    c = configs.BY_NAME[name]
    if c.bm < 64:
        blocks = c.tiles(m, n) * batch
        assert m <= configs.SKINNY_MAX_M and blocks <= 132 * configs.blocks_per_sm(c)
        assert split == 1 or blocks * split <= 132, (name, split)
        if c.warps_k > 1:  # sliced K: one slice, where the plain skinny row cannot take two
            assert split == 1 and (2 * blocks > 132 or k < 1024), (name, split)
            assert 2 * blocks <= 132 or m > c.bm or n * k * 2 <= configs.SLICED_K_MAX_WEIGHT
    for cname, s in autotune.candidates(m, n, k, batch, arch):
        assert configs.competes(configs.BY_NAME[cname], s, m, n, k, batch)
    assert any(c.bm < 64 for c in configs.CONFIGS)


def test_tma_addressable():
    assert configs.tma_addressable(300, 520, 200)       # NN: rows of K and N, both % 8 == 0
    assert not configs.tma_addressable(300, 520, 200, 1, True, False)  # TN: A rows are M = 300
    assert not configs.tma_addressable(129, 67, 1001)   # K rows odd, too small to pack
    assert configs.tma_addressable(1000, 1000, 1001)    # packed (configs.should_pack)
    assert configs.should_pack(1000, 1000, 1001) and not configs.should_pack(129, 67, 1001)


def test_device_arch():
    arch = configs.device_arch()
    assert arch is configs.device_arch()  # cached
    if jax.default_backend() != "gpu":
        assert arch is None
    else:
        assert arch is None or (isinstance(arch, tuple) and all(isinstance(x, int) for x in arch))
    assert configs.configs_for(None) == configs.configs_for((8, 0)) == tuple(
        c for c in configs.CONFIGS if c.kind == "sm80")
    assert configs.configs_for((9, 0)) == configs.CONFIGS


@pytest.mark.parametrize("split", [1, 2, 3, 64])
def test_sm90_workspace_equals_fallback(split):
    """An sm90 config asks for the same float32 workspace as its fallback (same BK)."""
    for c in SM90:
        f = configs.sm80_fallback(c)
        for args in [(300, 520, 200, 1, True, True, False, False),
                     (129, 257, 1000, 3, False, True, True, False),
                     (5, 7, 1001, 2, True, False, False, True)]:
            for pack in (False, True):
                ws = configs.workspace_floats(*args, c.name, split, pack)
                assert ws == configs.workspace_floats(*args, f.name, split, pack), (c, args, pack)
        m, n = 300, 520
        want = 2 * m * n if split == 2 else (0 if split == 1 else None)
        if want is not None:
            assert configs.workspace_floats(m, n, 1024, 1, True, True, False, False, c.name,
                                            split, False) == want
