"""The 8-bit call (tg.scaled_matmul) under sharded jit over 2 GPUs: tests/test_scaled_sharding_cpu.py's
cases on the kernels. The compiled HLO holds our custom call on the LOCAL shard shapes, no
all-gather for M / N sharding, one all-reduce (float32; int32 for int8 -> int32) for K sharding;
the results equal the single-GPU call's (int8 exact; float32 summation order where K is summed
across devices). fp8 needs compute capability 9.0; int8 runs from 8.0.

Marked `gpu` (skipped off-GPU); skipped with the reason below on a machine with one GPU.
"""
import jax
import numpy as np
import pytest

import test_multi_gpu
from test_scaled_sharding_cpu import _check_hlo, _run, check_values, local_shape

_gpus = test_multi_gpu._gpus
pytestmark = test_multi_gpu.pytestmark  # gpu; skipped without 2 GPUs


@pytest.mark.parametrize("tb", [False, True], ids=["KN", "NK"])
@pytest.mark.parametrize("form", ["tensor", "outer", "block", "int32"])
@pytest.mark.parametrize("kind", ["M", "N", "K"])
def test_sharded_scaled_on_two_gpus(kind, form, tb):
    cc = _gpus()[0].compute_capability
    if form != "int32" and cc != "9.0":
        pytest.skip(f"fp8 kernels need compute capability 9.0; this GPU has {cc}")
    mesh = jax.make_mesh((2,), ("d",), devices=_gpus()[:2])
    m, n, k = 320, 768, 1024  # M, N not tile multiples per device (160, 384)
    got, want, text = _run(mesh, kind, form, tb, m=m, n=n, k=k)
    assert 'custom_call_target="tcgemm"' in text
    _check_hlo(text, kind, local_shape(kind, m, n, 2), "s32" if form == "int32" else "f32")
    check_values(got, want, summed=kind == "K")
    assert np.isfinite(np.asarray(got, np.float32)).all()
