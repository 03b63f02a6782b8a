"""Two GPUs: a second device, two threads on two devices, and sharded jit over a 2-GPU mesh.

Marked `gpu` (skipped off-GPU); skipped with the reason below on a machine with one GPU.
The sharded cases are tests/test_sharding.py's, on GPUs: the compiled HLO must hold our
custom call on the LOCAL shard shapes, no all-gather for batch/M/N sharding, and a float32
all-reduce for K sharding; results match the float64 reference and the single-GPU result.
With a fused epilogue (C + bias + gelu_tanh, and aux): batch/M/N sharding runs the whole fused
kernel on local shards (no tanh op in the HLO: it is in our kernel); K sharding sums float32
partials with one all-reduce and applies the epilogue once, after it. Gradients of a fused
layer under sharding equal the single-GPU ones. float32 operands at HIGHEST (f16x3) and the
3xTF32 / BF16x3 presets split on the local shards (their parts' scales from the local rows and
K slice), with float32 accuracy.
"""
import itertools
import threading
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg
from jax_tcgemm.primitive import tcgemm

from conftest import assert_close, f64, rand, ref64
from test_sharding import (C_FORMS, KINDS, check_epilogue_grad, check_epilogue_partitioned,
                           check_epilogue_values, check_partitioned, epilogue_case,
                           epilogue_grad_case, sharded_case)

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)


def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:  # no GPU backend at all
        return []


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(len(_gpus()) < 2,
                                 reason=f"needs 2 GPUs; {len(_gpus())} visible")]


def test_second_device():
    """Inputs placed on GPU 1: the kernel runs there and the output lives there."""
    dev = _gpus()[1]
    a, b = rand(("gpu1-a",), (2, 200, 136), F16), rand(("gpu1-b",), (136, 72), F16)
    x, y = jax.device_put(a, dev), jax.device_put(b, dev)
    for out_dtype in (F16, F32):
        out = jax.jit(partial(tg.matmul, out_dtype=out_dtype))(x, y)
        assert out.devices() == {dev}
        assert_close(out, ref64(a, b), out_dtype, 136, f"GPU 1 {out_dtype}")


def test_threads_on_two_devices():
    """Two Python threads, each calling tcgemm 20 times on its own GPU with its own inputs."""
    gpus = _gpus()[:2]
    f = jax.jit(partial(tg.matmul, out_dtype=F32))
    inputs = [[(rand(("thr-a", d, i), (96, 80), BF16), rand(("thr-b", d, i), (80, 64), BF16))
               for i in range(20)] for d in range(2)]
    results, errors = [[None] * 20 for _ in range(2)], []

    def work(d):
        try:
            for i, (a, b) in enumerate(inputs[d]):
                out = f(jax.device_put(a, gpus[d]), jax.device_put(b, gpus[d]))
                results[d][i] = (out.block_until_ready(), out.devices())
        except Exception as e:  # noqa: BLE001 (re-raised in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(d,)) for d in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for d in range(2):
        for (a, b), (out, devices) in zip(inputs[d], results[d]):
            assert devices == {gpus[d]}
            assert_close(out, ref64(a, b), F32, 80, f"thread {d}")


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2,), ("d",), devices=_gpus()[:2])


@pytest.mark.parametrize("ta,tb", list(itertools.product((False, True), repeat=2)),
                         ids=lambda v: "T" if v else "N")
@pytest.mark.parametrize("kind", KINDS)
def test_sharded_jit_two_gpus(mesh, kind, ta, tb):
    out, ref, text, local, _ = sharded_case(mesh, "d", kind, ta, tb, dtype=BF16, m=264,
                                            n=136, k=520)
    assert 'custom_call_target="tcgemm"' in text
    check_partitioned(kind, text, local)
    assert_close(out, ref, F32, 520, f"{kind} 2 GPUs")


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_equals_single_gpu(mesh, kind):
    """The sharded program equals the same product on one GPU (within the f16 bound; K
    sharding sums in another order)."""
    out, ref, _, _, (a, b) = sharded_case(mesh, "d", kind, out_dtype=F16, m=130, n=66, k=256)
    one = _gpus()[0]
    single = jax.jit(partial(tcgemm, out_dtype=F16))(jax.device_put(a, one),
                                                     jax.device_put(b, one))
    assert_close(out, f64(single), F16, 256, f"{kind} vs single GPU")
    assert_close(out, ref, F16, 256, f"{kind} vs reference")


@pytest.mark.parametrize("c_form", list(C_FORMS))
@pytest.mark.parametrize("kind", KINDS)
def test_epilogue_sharded_two_gpus(mesh, kind, c_form):
    """gemm with C + bias + gelu_tanh (bf16) over 2 GPUs, shapes no tile multiple."""
    case = epilogue_case(mesh, {kind: "d"}, c_form=c_form, batch=4, m=264, n=136, k=520)
    assert 'custom_call_target="tcgemm"' in case["text"]
    check_epilogue_partitioned(kind == "K", case["text"], case["local"])
    check_epilogue_values(case, exact=False)  # local shapes may plan another config / split


@pytest.mark.parametrize("kind", KINDS)
def test_epilogue_aux_sharded_two_gpus(mesh, kind):
    """tcgemm(..., aux=True) over 2 GPUs: d and the pre-activation; float16."""
    case = epilogue_case(mesh, {kind: "d"}, aux=True, dtype=F16, out_dtype=F16, batch=4,
                         m=130, n=200, k=256)
    assert 'custom_call_target="tcgemm"' in case["text"] and len(case["outs"]) == 2
    check_epilogue_partitioned(kind == "K", case["text"], case["local"])
    check_epilogue_values(case, exact=False)


@pytest.mark.parametrize("kind", ["K", "M"])
def test_epilogue_traced_alpha_beta_two_gpus(mesh, kind):
    """alpha and beta as jit arguments (the scale operand) over 2 GPUs."""
    case = epilogue_case(mesh, {kind: "d"}, traced=True, batch=2, m=200, n=72, k=264)
    check_epilogue_partitioned(kind == "K", case["text"], case["local"])
    check_epilogue_values(case, exact=False)


@pytest.mark.parametrize("activation", ["gelu_tanh", None])
@pytest.mark.parametrize("kind", ["batch", "M", "N", "K"])
def test_epilogue_grad_two_gpus(mesh, kind, activation):
    """grad of a fused gemm + bias + activation layer over 2 GPUs equals the single-GPU one;
    every product is our kernel."""
    case = epilogue_grad_case(mesh, kind, activation, bt=4, m=96, k=520, n=136)
    assert 'custom_call_target="tcgemm"' in case["text"]
    check_epilogue_grad(case, kind)


@pytest.mark.parametrize("kind", ["M", "K"])
def test_epilogue_grad_under_set_mesh_two_gpus(mesh, kind):
    """The same inside `jax.set_mesh` over 2 GPUs (the context mesh must not reach the
    per-device module: sharding._meshless); nothing gathered, every product our kernel."""
    case = epilogue_grad_case(mesh, kind, "gelu_tanh", bt=4, m=96, k=520, n=136, set_mesh=True)
    assert 'custom_call_target="tcgemm"' in case["text"]
    check_epilogue_grad(case, kind)


F32_PRECISIONS = {"highest": ("highest", 5e-6),
                  "tf32x3": (lax.DotAlgorithmPreset.TF32_TF32_F32_X3, 5e-6),
                  "bf16x3": (lax.DotAlgorithmPreset.BF16_BF16_F32_X3, 5e-5)}


@pytest.mark.parametrize("precision", list(F32_PRECISIONS))
@pytest.mark.parametrize("kind", KINDS)
def test_f32_sharded_two_gpus(mesh, kind, precision):
    """float32 operands over 2 GPUs by multi-pass algorithm (f16x3 for HIGHEST, whose row and
    column scales each shard takes from its own rows and K slice): our kernel on the local
    shards, K sharding summed by one float32 all-reduce; float32 accuracy against float64
    (relative error of the whole result, bound per algorithm), layouts NT and TN."""
    prec, lim = F32_PRECISIONS[precision]
    for ta, tb in ((False, True), (True, False)):
        out, ref, text, local, _ = sharded_case(mesh, "d", kind, ta, tb, dtype=F32, m=264,
                                                n=136, k=520, precision=prec)
        assert 'custom_call_target="tcgemm"' in text
        check_partitioned(kind, text, local)
        err = assert_close(out, ref, F32, 520, f"{precision} {kind} 2 GPUs")
        assert err <= lim, f"{precision} {kind} ta={ta} tb={tb}: relative error {err:.3g} > {lim}"
