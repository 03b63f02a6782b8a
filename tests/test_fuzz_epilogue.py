"""The epilogue fuzz (see test_fuzz.py, whose cases, references and runner it shares): random
cases of tcgemm_p with a fused epilogue: C of any form (full, batch-shared, per-row,
per-column, scalar; one row or a row per batch item) and dtype, a shared or per-item bias, every
activation, alpha / beta static or traced (the scale operand), and the pre-activation as a
second output (aux); over every config (plan override, some with split_k) or the planner,
layout, input and output dtype, as the plain fuzz.

GPU: TCGEMM_FUZZ_EPI_CASES cases (default 2000) into NaN-poisoned outputs; CPU (the lax
fallback): TCGEMM_FUZZ_CPU_CASES (default 50). Both report the number of cases run.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import random

import jax.numpy as jnp
import numpy as np
import pytest

from jax_tcgemm import configs
from jax_tcgemm.epilogue import activate, activate_grad
from jax_tcgemm.problem import ACTIVATIONS

from conftest import ACT_LIPSCHITZ, act64, act_grad64, seed_of
from test_fuzz import (BF16, CPU_MODE, F16, F32, SEED, Case, Mode, _run_cpu, combos, draw_split,
                       _run_gpu, _select, _shape, check, needs_table, operands)

C_FORMS = ("full", "shared", "row", "col", "scalar")  # C (B, M, N), (1, M, N), (., M, 1), ...

# Epilogue cases: smaller caps (the references and the C operands cost host time).
EPI_GPU_MODE = Mode(work=2 ** 25, out=2 ** 21, operand=2 ** 21, big=5000, small=300,
                    huge_batch=True)


def _f32(x: float) -> float:
    return float(np.float32(x))


def _epilogue(r: random.Random, bt: int, m: int, n: int, activation: str):
    """Random epilogue fields of a (bt, m, n) result with `activation` (never the plain
    product: without anything else, a bias)."""
    form = r.choices((None,) + C_FORMS, [15, 30, 15, 15, 15, 10])[0]
    c_shape = c_dtype = None
    if form is not None:
        rows = r.choice([1, bt])
        c_shape = {"full": (bt, m, n), "shared": (1, m, n), "row": (rows, m, 1),
                   "col": (rows, 1, n), "scalar": (1, 1, 1)}[form]
        c_dtype = r.choice((F16, BF16, F32))
    bias_rows = r.choice([0, 1, bt])
    alpha = r.choice([1.0, -1.0, 0.5, 1.5, _f32(r.uniform(-2, 2))])
    beta = r.choice([1.0, -0.75, 2.0, _f32(r.uniform(-2, 2))]) if c_shape else 0.0
    traced, aux = r.random() < 0.25, r.random() < 0.2
    if c_shape is None and not bias_rows and alpha == 1.0 and not (traced or aux) and (
            activation == "none"):
        bias_rows = 1
    bias_dtype = r.choice((F32, F16, BF16)) if bias_rows else F32  # drawn last: the draws
    # above are those of the cases before bias dtypes
    return dict(c_shape=c_shape, c_dtype=c_dtype, bias_rows=bias_rows, activation=activation,
                alpha=alpha, beta=beta, traced=traced, aux=aux, bias_dtype=bias_dtype)


def generate_epilogue(count: int, mode: Mode, seed: int = SEED) -> list[Case]:
    """Epilogue cases 0..count-1: config x layout x dtype x out dtype cycle through every
    combination (shuffled once per seed), and the activation with them, so that each
    combination meets every activation within 5 cycles (5 x 336 cases); shapes and the rest of
    the epilogue are drawn per case."""
    combo = combos(seed_of("fuzz-epi", seed))
    cases = []
    for i in range(count):
        r = random.Random(seed_of("fuzz-epi-shape", seed, i))
        config, (ta, tb), dt, od = combo[i % len(combo)]
        m, n, k, ba, bb = _shape(r, mode)
        split = draw_split(r, config, m, n, ba, bb, mode)
        # each combo meets every activation over five cycles of the combos
        act = ACTIVATIONS[(i + 2 * (i // len(combo))) % len(ACTIVATIONS)]
        epi = _epilogue(r, max(ba, bb), m, n, act)
        cases.append(Case(i, m, n, k, ba, bb, dt, od, ta, tb, config, split, **epi))
    return cases


@pytest.mark.gpu
def test_fuzz_epilogue_gpu(capsys):
    count = int(os.environ.get("TCGEMM_FUZZ_EPI_CASES", "2000"))
    _run_gpu(capsys, _select(generate_epilogue(count, EPI_GPU_MODE)), "epilogue fuzz")


def test_fuzz_epilogue_cpu(capsys):
    count = int(os.environ.get("TCGEMM_FUZZ_CPU_CASES", "50"))
    _run_cpu(capsys, _select(generate_epilogue(count, CPU_MODE)), "epilogue fuzz")


@needs_table
def test_epilogue_generator_covers_the_space():
    """The 2000-case epilogue run hits every config x layout x dtype x out dtype (float32
    operands, at HIGHEST: the configs with TF32 kernels), every config
    with every activation, every C form and dtype, both bias forms, traced scales and aux
    outputs, with splits, batches and sizes as the plain fuzz, within its caps."""
    cases = generate_epilogue(2000, EPI_GPU_MODE)
    names = [c.name for c in configs.CONFIGS16] + [None]
    assert {(c.config, c.ta, c.tb, c.dtype, c.out_dtype) for c in cases} == set(
        itertools.product(names, (False, True), (False, True), (F16, BF16), (F16, BF16, F32))) | set(
        itertools.product([c.name for c in configs.CONFIGS if c.f32] + [None], (False, True),
                          (False, True), (F32,), (F16, BF16, F32)))
    assert {(c.config, c.activation) for c in cases} == set(itertools.product(names, ACTIVATIONS))
    assert all(c.epilogue for c in cases)
    bt_forms = {(c.c_shape == c.out_shape, c.c_shape is not None and c.c_shape[1:] == (c.m, 1),
                 c.c_shape is not None and c.c_shape[1:] == (1, c.n)) for c in cases}
    assert {(True, False, False), (False, True, False), (False, False, True)} <= bt_forms
    assert any(c.c_shape == (1, c.m, c.n) and c.batch > 1 for c in cases)
    assert {c.c_dtype for c in cases} == {None, F16, BF16, F32}
    assert any(c.bias_rows == 1 for c in cases)
    assert any(c.bias_rows == c.batch > 1 for c in cases)
    assert {np.dtype(c.bias_dtype) for c in cases if c.bias_rows} == {F32, F16, BF16}
    assert any(c.traced for c in cases) and any(c.aux for c in cases)
    assert any(c.aux and c.split_k for c in cases) and any(c.batch > 65535 for c in cases)
    for c in cases:
        assert c.batch * c.m * c.n * c.k <= EPI_GPU_MODE.work
        assert c.batch * c.m * c.n <= EPI_GPU_MODE.out
    assert [str(c) for c in generate_epilogue(40, EPI_GPU_MODE)] == [str(c) for c in cases[:40]]


def test_check_catches_epilogue_defects():
    """`check` passes the exact epilogue (computed here in float32 as the kernels do: the
    product, then alpha, beta * C, bias, the activation) and flags a bias missing from one
    column, C missing from one element, the erf GELU where the tanh one is asked, the result
    where the pre-activation (aux) belongs, and a NaN in aux; for each output dtype."""
    base = Case(0, 70, 50, 16, 2, 1, BF16, F32, True, False, None, None, c_shape=(2, 70, 50),
                c_dtype=F16, bias_rows=1, activation="gelu_tanh", alpha=-0.75, beta=1.5,
                aux=True)
    ops = operands(base)
    a, b, c, bias, _ = ops
    ab = np.matmul(np.swapaxes(a.astype(np.float32), 1, 2), b.astype(np.float32))
    pre32 = (ab * np.float32(-0.75) + np.float32(1.5) * c.astype(np.float32)) + bias[:, None, :]
    d32 = np.asarray(activate("gelu_tanh", jnp.asarray(pre32)))
    g32 = np.asarray(activate("gelu", jnp.asarray(pre32)))

    for od in (F32, F16, BF16):
        case = dataclasses.replace(base, out_dtype=od)
        good = [d32.astype(od), pre32.astype(od)]
        assert check(case, ops, good) is None, check(case, ops, good)
        no_bias = d32.copy()
        no_bias[:, :, 7] = np.asarray(activate("gelu_tanh",
                                               jnp.asarray(pre32[:, :, 7] - bias[0, 7])))
        no_c = pre32.copy()
        no_c[1, 3, 4] -= np.float32(1.5) * c[1, 3, 4].astype(np.float32)
        nan = pre32.copy()
        nan[1, 69, 49] = np.nan
        defects = {"bias missing in a column": [no_bias, pre32],
                   "C missing in an element": [d32, no_c], "gelu for gelu_tanh": [g32, pre32],
                   "d as aux": [d32, d32], "NaN in aux": [d32, nan]}
        for what, outs in defects.items():
            if what == "gelu for gelu_tanh" and od != F32:
                continue  # within a half-precision rounding
            assert check(case, ops, [x.astype(od) for x in outs]), f"{what} not caught ({od})"


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_reference_helpers_match_jax(name):
    """The float64 activations and slopes of the references (conftest.act64, act_grad64)
    agree with the primitive's own (activate, activate_grad: lax, float32) and with jax.grad
    of them, and ACT_LIPSCHITZ bounds the slope."""
    x = np.concatenate([np.linspace(-12, 12, 4001), [-60.0, -30.0, 0.0, 30.0, 60.0]])
    ours = np.asarray(activate(name, jnp.asarray(x, jnp.float32)), np.float64)
    np.testing.assert_allclose(ours, act64(name, x), rtol=2e-6, atol=2e-6)
    slope = np.asarray(activate_grad(name, jnp.asarray(x, jnp.float32)), np.float64)
    np.testing.assert_allclose(slope, act_grad64(name, x), rtol=1e-5, atol=1e-5)
    fine = np.linspace(-8, 8, 160001)
    assert np.abs(act_grad64(name, fine)).max() <= ACT_LIPSCHITZ
