"""Two GPUs, grouped (ragged) products (issue 24): tg.ragged_dot and tg.ragged_gemm under jit
over a 2-GPU mesh, expert parallel (rhs sharded over the groups G), data parallel (lhs sharded
over the rows M, the group sizes replicated and cut to each device's window) and N sharded.

Each case checks the compiled HLO (our `tcgemm_ragged` custom call on the LOCAL operand shapes,
no all-gather of an operand, an all-reduce only where the partition rule needs one: the
expert-parallel forward and the data-parallel weight gradient) and the values: against the
float64 reference and against the same program on one GPU. Bitwise equality with one GPU is not
asserted: each device plans its kernel for its local shape (configs.plan_ragged), and another
tile shape may add a row's k tiles in another order; the float32 bound is far tighter than a
wrong shard would give.

Marked `gpu`; skipped with the reason below where fewer than 2 GPUs are visible (the same rules
run on a 4-device CPU mesh in tests/test_ragged_sharding_cpu.py, through the lax lowering).
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_tcgemm as tg

from conftest import assert_close, f64
from test_multi_gpu import _gpus, mesh, pytestmark  # noqa: F401 (the 2-GPU skip, fixture)
from test_ragged_cpu import operands, ragged64

BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float32)


# Rows of K and N (and N / 2) elements are 16-byte multiples, so the custom call sees the local
# operands as they are (the CUDA lowering zero-pads other rows for TMA).
M, G, K, N = 96, 8, 40, 48
SIZES = [11, 0, 17, 9, 20, 0, 14, 13]  # sum 84 < 96, two empty groups, no tile multiples
SPECS = {"M": (P("d"), P()), "G": (P(), P("d")), "N": (P(), P(None, None, "d"))}


def _custom_call_operands(text, target="tcgemm_ragged"):
    """Operand shapes (as 'bf16[a,b]' strings) of each `target` custom call in compiled HLO:
    printed with the operands, or (where XLA prints bare operand names) in its
    operand_layout_constraints."""
    out = []
    for line in text.splitlines():
        if f'custom_call_target="{target}"' in line:
            args = line.split("custom-call(", 1)[1].split(")", 1)[0]
            if not re.search(r"\w+\[[\d,]*\]", args):
                args = line.split("operand_layout_constraints={", 1)[-1]
                args = args[:args.find("}, api_version") if "}, api_version" in args else None]
            out.append(re.findall(r"(\w+\[[\d,]*\])", args))
    return out


def _put(mesh, kind, lhs, rhs, gs):
    spec_l, spec_r = SPECS[kind]
    return (jax.device_put(lhs, NamedSharding(mesh, spec_l)),
            jax.device_put(rhs, NamedSharding(mesh, spec_r)),
            jax.device_put(gs, NamedSharding(mesh, P())))


@pytest.mark.parametrize("kind", ["M", "G", "N"])
def test_ragged_sharded_two_gpus(mesh, kind):
    lhs, rhs = operands(("mgpu", kind), BF16, m=M, k=K, n=N, g=G)
    gs = jnp.asarray(SIZES, jnp.int32)
    x, y, gsh = _put(mesh, kind, lhs, rhs, gs)
    f = jax.jit(lambda *a: tg.ragged_dot(*a, preferred_element_type=F32))
    text = f.lower(x, y, gsh).compile().as_text()
    calls = _custom_call_operands(text)
    assert calls, "no tcgemm_ragged custom call in the compiled HLO"
    local_l = {"M": f"bf16[{M // 2},{K}]", "G": f"bf16[{M},{K}]", "N": f"bf16[{M},{K}]"}[kind]
    local_r = {"M": f"bf16[{G},{K},{N}]", "G": f"bf16[{G // 2},{K},{N}]",
               "N": f"bf16[{G},{K},{N // 2}]"}[kind]
    assert any(local_l in c and local_r in c for c in calls), (kind, calls)
    assert "all-gather" not in text, "an operand was gathered"
    assert ("all-reduce" in text) == (kind == "G"), kind
    out = f(x, y, gsh)
    assert_close(out, ragged64(lhs, rhs, gs), F32, K, f"{kind} 2 GPUs vs float64")
    one = _gpus()[0]
    single = f(*(jax.device_put(v, one) for v in (lhs, rhs, gs)))
    assert_close(out, f64(single), F32, K, f"{kind} 2 GPUs vs 1 GPU")


@pytest.mark.parametrize("kind", ["M", "G"])
def test_ragged_grad_sharded_two_gpus(mesh, kind):
    """The gradients (dgrad and wgrad, our grouped kernel) under both partitionings equal the
    single-GPU ones; data parallel sums the float32 weight gradient with one all-reduce."""
    lhs, rhs = operands(("mgpu-grad", kind), BF16, m=M, k=K, n=N, g=G)
    gs = jnp.asarray(SIZES, jnp.int32)
    wt = jax.random.normal(jax.random.key(5), (M, N), F32)
    loss = lambda a, b, g: jnp.sum(wt * tg.ragged_dot(a, b, g, preferred_element_type=F32))  # noqa: E731
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    x, y, gsh = _put(mesh, kind, lhs, rhs, gs)
    text = grad.lower(x, y, gsh).compile().as_text()
    assert 'custom_call_target="tcgemm_ragged"' in text
    if kind == "M":
        assert re.search(rf"= f32\[{G},{K},{N}\][^=]*all-reduce", text), "wgrad: f32 all-reduce"
    one = _gpus()[0]
    single = grad(*(jax.device_put(v, one) for v in (lhs, rhs, gs)))
    for got, ref, what in zip(grad(x, y, gsh), single, ("d lhs", "d rhs")):
        assert_close(got, f64(ref), BF16, M, f"{kind} {what} 2 GPUs vs 1 GPU")


def test_ragged_gemm_expert_parallel_two_gpus(mesh):
    """ragged_gemm with a per-group bias and gelu, experts over the 2 GPUs: the fused kernel on
    each device's groups (each row has one owner), nothing gathered."""
    lhs, rhs = operands(("mgpu-epi",), BF16, m=M, k=K, n=N, g=G)
    gs = jnp.asarray(SIZES, jnp.int32)
    bias = jax.random.normal(jax.random.key(6), (G, N), F32)
    f = jax.jit(lambda a, b, g, bb: tg.ragged_gemm(a, b, g, bias=bb, activation="gelu",
                                                   out_dtype=F32))
    args = (jax.device_put(lhs, NamedSharding(mesh, P())),
            jax.device_put(rhs, NamedSharding(mesh, P("d"))),
            jax.device_put(gs, NamedSharding(mesh, P())),
            jax.device_put(bias, NamedSharding(mesh, P("d"))))
    text = f.lower(*args).compile().as_text()
    assert 'custom_call_target="tcgemm_ragged"' in text and "all-gather" not in text
    out = f(*args)
    assert_close(out, ragged64(lhs, rhs, gs, bias=bias, act="gelu"), F32, K, "expert parallel")
    one = _gpus()[0]
    single = f(*(jax.device_put(v, one) for v in (lhs, rhs, gs, bias)))
    assert_close(out, f64(single), F32, K, "expert parallel vs 1 GPU")
