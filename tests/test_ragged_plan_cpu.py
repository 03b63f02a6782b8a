"""CPU tests of the ragged GEMM's planner (configs.ragged_kind, configs.plan_ragged): which
kernel family runs grouped products on which GPU, that every plan names a row with grouped
kernels, the CUDA lowering off Hopper, and the lowering's message without the extension."""
import jax
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm import _ffi, configs, ragged as rg

from test_ragged_cpu import BF16, F16, S, _ragged_calls, needs_module



@pytest.mark.parametrize("arch,kind", [((9, 0), "sm90"), ((8, 0), "sm80"), ((8, 6), "sm80"),
                                       ((8, 9), "sm80"), ((10, 0), "sm80"), ((12, 0), "sm80"),
                                       ((7, 5), None), ((7, 0), None), (None, None)], ids=str)
def test_ragged_kind_by_arch(arch, kind):
    """sm90 on 9.0, the sm80 kernels on every other GPU from 8.0 on, none below 8.0 or when
    the device is not known (the lax lowering)."""
    assert configs.ragged_kind(arch) == kind
    if kind is None:  # no grouped kernel: no plan (this needs no config table)
        assert configs.plan_ragged(1000, 72, 200, 5, BF16, 0, arch=arch) is None


PLAN_SHAPES = [(1000, 72, 200, 5, 0), (1000, 72, 200, 5, 1), (8192, 14336, 4096, 8, 0),
               (16384, 1408, 2048, 64, 0), (16384, 1408, 2048, 64, 1), (512, 14336, 4096, 8, 0),
               (1024, 256, 1024, 64, 0), (64, 64, 64, 64, 0), (1, 8, 8, 1, 1)]


@needs_module
@pytest.mark.parametrize("arch", [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0)], ids=str)
def test_plan_ragged_picks_a_grouped_row_of_the_family(arch):
    """plan_ragged names a row with grouped kernels (Config.ragged, the module's
    HasRaggedKernels) of ragged_kind(arch): an sm80 row off Hopper, an sm90 row on 9.0; the
    dispatcher runs either without a K split."""
    picked = set()
    for m, n, k, g, mode in PLAN_SHAPES:
        name = configs.plan_ragged(m, n, k, g, BF16, mode, arch=arch)
        c = configs.BY_NAME[name]
        assert c.ragged and c.kind == configs.ragged_kind(arch), (arch, m, n, k, g, mode, name)
        picked.add(name)
    if arch != (9, 0):  # every sm80 grouped kernel is some shape's pick (none is dead code)
        assert picked == {c.name for c in configs.CONFIGS if c.kind == "sm80" and c.ragged}
        assert configs.BY_NAME[configs.plan_ragged(8192, 14336, 4096, 8, arch=arch)].bm >= 128
        assert configs.BY_NAME[configs.plan_ragged(1024, 256, 1024, 64, arch=arch)].bm == 64


@needs_module
def test_grouped_rows_of_the_table():
    """Every sm90 row runs grouped products; of the sm80 rows, those of BK 32, BM >= 64 and
    BM <= BN (HasRaggedKernels): one per tile size the cost model tells apart."""
    assert all(c.ragged == (not c.fp8_only) for c in configs.CONFIGS if c.kind == "sm90")
    sm80 = {c.name for c in configs.CONFIGS if c.kind == "sm80" and c.ragged}
    assert sm80 == {"sm80_128x256x32_s4_w2x4", "sm80_128x128x32_s4_w2x2",
                    "sm80_64x64x32_s4_w2x2"}, sm80


@needs_module
def test_cuda_lowering_off_hopper_is_the_sm80_kernel(monkeypatch):
    """Lowered for a compute capability 8.x device, every form is one tcgemm_ragged call with
    the planner's sm80 row (no lax fallback)."""
    monkeypatch.setattr(configs, "device_arch", lambda: (8, 6))
    for mode, tb in ((0, False), (0, True), (1, False)):
        b = S((300, 72), BF16) if mode == 1 else S((5, 72, 200) if tb else (5, 200, 72), BF16)
        text = jax.jit(lambda a, b, g: rg.ragged(a, b, g, mode=mode, transpose_b=tb)).trace(
            S((300, 200), BF16), b, S((5,), np.int32)).lower(
            lowering_platforms=("cuda",)).as_text()
        ((attrs, _),) = _ragged_calls(text)
        assert configs.BY_NAME[attrs["config"]].kind == "sm80", (mode, tb, attrs)
        assert attrs["config"] == configs.plan_ragged(300, 72, 200, 5, BF16, mode, tb, (8, 6))


@pytest.mark.skipif(_ffi.available(), reason="the extension is built: planning works")
def test_cuda_lowering_without_extension_says_why():
    with pytest.raises(RuntimeError, match="could not be loaded"):
        jax.jit(tg.ragged_dot).trace(S((8, 16), F16), S((2, 16, 8), F16), S((2,), np.int32)
                                     ).lower(lowering_platforms=("cuda",))
