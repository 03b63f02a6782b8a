"""GPU tests of the ragged GEMM kernel (tcgemm_ragged; jax_tcgemm/ragged.py, DESIGN §7).

References are float64 numpy of the already-rounded inputs under the clamping rule
(test_ragged_cpu.ragged64: negative sizes count as 0, ends cut at M); errors are relative
Frobenius norms within conftest.bound of the output dtype (K: the contraction length; for the
wgrad form the rows of a group, bounded by M). Inputs are fresh random normals per case. Every
kernel output (all but the gradients) is written into NaN-poisoned donated buffers, twice
(conftest.poisoned_twice / poisoned): an element the kernel never writes (a row past the sum of
the sizes, an empty group's weight gradient) stays NaN, and the two runs must agree bitwise.

Both kernel families: the tests of the kernel (forms, bias + activation, edge sizes, the fuzz)
run every case once with the planner's row (sm90 on an H100/H200, an sm80 row elsewhere) and
once forced onto each sm80 row with grouped kernels (CONFIGS: the sm80 kernels run on any
GPU from sm_80 on, the H100 included), so that an H100 run checks both families.

- test_forms_dtypes: forward (rhs (G, K, N)), dgrad ((G, N, K): transpose_b) and wgrad
  (mode 1) x float16 / bfloat16 in x float16 / bfloat16 / float32 out, on unaligned shapes
  (K = 200, N = 72, sizes no multiple of 64 or 128, empty groups, sum < M), G = 1 and G = 64.
- test_bias_activation: mode 0 with a per-group bias and every activation, both rhs layouts.
- test_edge_group_sizes: all empty, one group, sum = M, sum > M, negative and 2^31 - 1 sizes
  (traced: the kernel's clamping; nothing out of bounds).
- test_grad_*: gradients against lax.ragged_dot on the GPU and float64; through the epilogue.
- test_vmap_folded, test_export_round_trip.
- test_fuzz: TCGEMM_RAGGED_FUZZ_CASES (default 2400) random group-size vectors (Dirichlet
  sizes of random skew, random empty groups, sums below, at and above M, some negative) over
  fixed shapes, one compiled function per (shape, form, dtype, out dtype) called with each
  sizes array (device data): within bounds of float64, within twice the bound of
  lax.ragged_dot_general's result on the GPU (sizes >= 0), zeros past the sum, 0 failures.
  TCGEMM_RAGGED_FUZZ_SEED picks the vectors. Even cases run on the planner's row, odd ones
  on the sm80 grouped rows in turn: on an H100 half the vectors (1200 by default) check
  each family.
"""
from __future__ import annotations

import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg
from jax_tcgemm import _ffi, configs
from jax_tcgemm.ragged import ragged

from conftest import (ACT_LIPSCHITZ, act_grad64, bound, f64, nan_filled, poisoned,
                      poisoned_twice, rel_err, seed_of)
from test_ragged_cpu import ends64, ragged64

pytestmark = pytest.mark.gpu

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
IN_DTYPES, OUT_DTYPES = (F16, BF16), (F16, BF16, F32)
ACTS = (None, "relu", "gelu", "gelu_tanh", "silu")
FORMS = {"forward": (0, False), "dgrad": (0, True), "wgrad": (1, False)}  # (mode, transpose_b)
FUZZ_CASES = int(os.environ.get("TCGEMM_RAGGED_FUZZ_CASES", "2400"))
FUZZ_SEED = int(os.environ.get("TCGEMM_RAGGED_FUZZ_SEED", "0"))
# None: the planner's row (configs.plan_ragged); then every sm80 row with grouped kernels
SM80_RAGGED = [c.name for c in configs.CONFIGS if c.kind == "sm80" and c.ragged]
CONFIGS = [None] + SM80_RAGGED


def cfg_id(c):
    return c or "planned"


def host_rand(parts, shape, dtype, scale=1.0):
    """Fresh N(0, scale^2) host values rounded to dtype (never zero or constant)."""
    rng = np.random.default_rng(seed_of(*parts))
    return (rng.standard_normal(shape, np.float32) * scale).astype(dtype)


def form_operands(form, m, k, n, g, dt, tag):
    """Host (a, b) of a form: forward a (M, K), b (G, K, N); dgrad a (M, N) [a cotangent],
    b (G, K, N) read as (G, N', K') = transposed weights; wgrad a (M, K), b (M, N)."""
    mode, tb = FORMS[form]
    a = host_rand((tag, form, "a", dt.name), (m, n if tb else k), dt, k ** -0.5)
    b_shape = (m, n) if mode == 1 else (g, k, n)
    return a, host_rand((tag, form, "b", dt.name), b_shape, dt)


def form_ref(form, a, b, gs):
    mode, tb = FORMS[form]
    return ragged64(a, b, gs, mode=mode, tb=tb)


def form_k(form, a, m):
    return m if FORMS[form][0] == 1 else a.shape[1]


def check(cases):
    """cases: (what, fn, args, want, out_dtype, k, slack). All in one jit run twice into
    NaN-poisoned outputs; asserts shape, dtype, no NaN, bitwise repeatability, error bound."""
    args = [tuple(jnp.asarray(x) for x in c[2]) for c in cases]
    fn = lambda args: [c[1](*xs) for c, xs in zip(cases, args)]  # noqa: E731
    outs, same, _ = poisoned_twice(fn, args)
    fails = []
    for (what, _, _, want, od, k, slack), out, ok in zip(cases, outs, same):
        if out.shape != want.shape or out.dtype != od:
            fails.append(f"{what}: {out.shape} {out.dtype}, expected {want.shape} {od}")
        elif np.isnan(out.astype(np.float32)).any():
            fails.append(f"{what}: NaN (an element never written)")
        elif not ok:
            fails.append(f"{what}: two identical calls differ")
        elif not rel_err(out, want) <= slack * bound(od, k):
            fails.append(f"{what}: rel err {rel_err(out, want):.3g} > {slack * bound(od, k):.3g}")
    assert not fails, f"{len(fails)} of {len(cases)} failed:\n" + "\n".join(fails)


def random_sizes(rng, m, g, kind):
    """One group-size vector of `kind`: "sum" (= m), "under", "over", "negative"; Dirichlet
    proportions of random skew, some groups forced empty."""
    p = rng.dirichlet(np.full(g, 10.0 ** rng.uniform(-1.5, 1.0)))
    p[rng.random(g) < 0.2] = 0.0
    p = p / p.sum() if p.sum() > 0 else np.full(g, 1.0 / g)
    total = {"sum": m, "under": int(rng.integers(0, m)), "over": m + int(rng.integers(1, m)),
             "negative": m}[kind]
    s = rng.multinomial(total, p)
    if kind == "negative":
        s[rng.integers(g)] = -int(rng.integers(1, m))
    return s.astype(np.int32)


def test_grouped_kernel_runs_on_this_gpu():
    """On every GPU from sm_80 on each form lowers to the tcgemm_ragged custom call with the
    planner's config, of the family configs.ragged_kind names (sm90 on 9.0, else sm80)."""
    arch = configs.device_arch()
    kind = configs.ragged_kind(arch)
    if kind is None:
        pytest.skip(f"no grouped kernel on compute capability {arch}: the lax path runs")
    S = jax.ShapeDtypeStruct
    for form, (mode, tb) in FORMS.items():
        b = S((300, 72), BF16) if mode == 1 else S((5, 72, 200) if tb else (5, 200, 72), BF16)
        text = jax.jit(lambda a, b, g: ragged(a, b, g, mode=mode, transpose_b=tb)).lower(
            S((300, 200), BF16), b, S((5,), np.int32)).as_text()
        assert text.count("stablehlo.custom_call @tcgemm_ragged(") == 1, form
        name = configs.plan_ragged(300, 72, 200, 5, BF16, mode, tb)
        assert name in text and configs.BY_NAME[name].kind == kind, (form, name)


# ---------------------------------------------------------------------------------------------
# Every form x dtype x out dtype.

SHAPES = [  # (tag, M, K, N, sizes)
    ("unaligned", 300, 200, 72, [0, 67, 131, 0, 59]),           # sum 257 < 300, two empty
    ("odd_kn", 300, 100, 50, [0, 67, 131, 0, 59]),              # K, N not 16-byte rows: padded
    ("g1", 130, 200, 72, [97]),
    ("g64", 1000, 136, 72, None),                                # 64 groups, see below
    ("wide", 700, 264, 520, [0, 300, 1, 0, 250, 100]),           # N > 256, several k tiles
]


def shape_sizes(tag, m, sizes):
    if sizes is not None:
        return np.asarray(sizes, np.int32)
    rng = np.random.default_rng(seed_of("g64-sizes"))
    return random_sizes(rng, m - 10, 64, "sum")  # some empty, sum M - 10


def form_case(name, form, a, b, gs, od, m, config):
    """A check() case: the grouped product of `form` on (a, b, gs) into od on `config`, against
    its float64 reference."""
    mode, tb = FORMS[form]
    fn = lambda a, b, g: ragged(a, b, g, mode=mode, transpose_b=tb, out_dtype=od,  # noqa: E731
                                config=config)
    return (f"{name} [{cfg_id(config)}]", fn, (a, b, gs), form_ref(form, a, b, gs), od,
            form_k(form, a, m), 1.0)


@pytest.mark.parametrize("config", CONFIGS, ids=cfg_id)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s[0])
@pytest.mark.parametrize("form", list(FORMS))
def test_forms_dtypes(form, shape, config):
    tag, m, k, n, sizes = shape
    gs = shape_sizes(tag, m, sizes)
    cases = []
    for dt, od in itertools.product(IN_DTYPES, OUT_DTYPES):
        a, b = form_operands(form, m, k, n, len(gs), dt, (tag, od.name))
        cases.append(form_case(f"{form} {tag} {dt}->{od}", form, a, b, gs, od, m, config))
    check(cases)


@pytest.mark.parametrize("config", CONFIGS, ids=cfg_id)
@pytest.mark.parametrize("tb", [False, True], ids=["KN", "NK"])
def test_bias_activation(tb, config):
    """act(a[rows of g] @ op(b[g]) + bias[g]) in float32, rounded once; rows past the sum
    zeros (not act(bias))."""
    m, k, n, gs = 300, 200, 72, np.asarray([0, 67, 131, 0, 59], np.int32)
    cases = []
    for (act, od), dt in zip(itertools.product(ACTS, OUT_DTYPES), itertools.cycle(IN_DTYPES)):
        a = host_rand(("ba", act, od.name, tb), (m, k), dt, k ** -0.5)
        b = host_rand(("bb", act, od.name, tb), (5, n, k) if tb else (5, k, n), dt)
        bd = (F32, dt)[len(cases) % 2]  # float32 or the input type: the kernel reads either
        bias = host_rand(("bbias", act, od.name, tb), (5, n), bd)
        fn = lambda a, b, g, bias, act=act, od=od: ragged(  # noqa: E731
            a, b, g, bias, transpose_b=tb, activation=act, out_dtype=od, config=config)
        want = ragged64(a, b, gs, tb=tb, bias=bias, act=act)
        cases.append((f"bias({bd})+{act} {dt}->{od} [{cfg_id(config)}]", fn, (a, b, gs, bias),
                      want, od, k, ACT_LIPSCHITZ))
    check(cases)


EDGE_SIZES = {
    "all_empty": [0, 0, 0, 0, 0, 0],
    "one_group": [0, 0, 200, 0, 0, 0],
    "sum_m_skewed": [150, 30, 12, 5, 2, 1],
    "over_m": [60, 0, 90, 80, 50, 7],
    "negative": [50, -20, 40, 0, -1, 70],
    "int32_max": [13, 2**31 - 1, 2**31 - 1, 5, 0, 2**31 - 1],
}


@pytest.mark.parametrize("config", CONFIGS, ids=cfg_id)
@pytest.mark.parametrize("form", list(FORMS))
def test_edge_group_sizes(form, config):
    """Sizes as device data (traced): the kernel's clamping, never out of bounds."""
    m, k, n = 200, 72, 40
    cases = []
    for (name, sizes), dt in zip(EDGE_SIZES.items(), itertools.cycle(IN_DTYPES)):
        gs = np.asarray(sizes, np.int32)
        a, b = form_operands(form, m, k, n, len(gs), dt, ("edge", name))
        od = F32 if name != "over_m" else dt
        cases.append(form_case(f"{form} {name}", form, a, b, gs, od, m, config))
    check(cases)


# ---------------------------------------------------------------------------------------------
# Gradients, vmap, export.

@pytest.mark.parametrize("dt", IN_DTYPES, ids=str)
def test_grad_vs_lax(dt):
    """grad of sum(w * ragged_dot(x, W)) wrt x and W: ours (mode 0 flipped, mode 1) within the
    bound of float64, and no worse than twice lax.ragged_dot's own gradient error."""
    m, k, n, gs = 300, 200, 72, np.asarray([0, 67, 131, 0, 59], np.int32)
    x = jnp.asarray(host_rand(("gx", dt.name), (m, k), dt, k ** -0.5))
    w = jnp.asarray(host_rand(("gw", dt.name), (5, k, n), dt))
    wt = host_rand(("gwt", dt.name), (m, n), F32)

    def loss(fn):
        return lambda x, w: jnp.sum(wt * fn(x, w, gs, preferred_element_type=F32))
    ours = jax.jit(jax.grad(loss(tg.ragged_dot), argnums=(0, 1)))(x, w)
    theirs = jax.jit(jax.grad(loss(lax.ragged_dot), argnums=(0, 1)))(x, w)
    ends, g64 = ends64(gs, m), f64(wt)
    dx, dw = np.zeros((m, k)), np.zeros((5, k, n))
    for g, (s, e) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
        dx[s:e] = g64[s:e] @ f64(w)[g].T
        dw[g] = f64(x)[s:e].T @ g64[s:e]
    for got, jn, ref, kk, what in ((ours[0], theirs[0], dx, n, "dx"),
                                   (ours[1], theirs[1], dw, m, "dW")):
        assert got.dtype == dt
        tol = max(bound(dt, kk), 2 * rel_err(jn, ref))
        assert rel_err(got, ref) <= tol, f"{what}: {rel_err(got, ref):.3g} > {tol:.3g}"


@pytest.mark.parametrize("act", ["gelu_tanh", "silu", "relu"])
def test_grad_through_epilogue(act):
    """Gradients wrt lhs, rhs and bias of sum(w * act(x @ W[g] + bias[g])): the forward's
    float32 pre-activation, tcgemm_dact for act', our ragged kernels for the products, the
    bias gradient by group (a float32 segment sum)."""
    m, k, n, gs = 260, 136, 72, np.asarray([40, 0, 100, 77, 0, 20], np.int32)
    x = jnp.asarray(host_rand(("ex", act), (m, k), BF16, k ** -0.5))
    w = jnp.asarray(host_rand(("ew", act), (6, k, n), BF16))
    bias = jnp.asarray(host_rand(("eb", act), (6, n), F32))
    wt = host_rand(("ewt", act), (m, n), F32)

    def loss(x, w, bias):
        return jnp.sum(wt * tg.ragged_gemm(x, w, gs, bias=bias, activation=act, out_dtype=F32))
    dx, dw, db = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, bias)
    ends = ends64(gs, m)
    rdx, rdw, rdb = np.zeros((m, k)), np.zeros((6, k, n)), np.zeros((6, n))
    for g, (s, e) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
        gg = f64(wt)[s:e] * act_grad64(act, f64(x)[s:e] @ f64(w)[g] + f64(bias)[g])
        rdx[s:e], rdw[g], rdb[g] = gg @ f64(w)[g].T, f64(x)[s:e].T @ gg, gg.sum(0)
    assert rel_err(dx, rdx) <= 2 * bound(BF16, n), "dx"
    assert rel_err(dw, rdw) <= 2 * bound(BF16, m), "dW"
    assert rel_err(db, rdb) <= 1e-4, "dbias"


def test_vmap_folded():
    """vmap over lhs, rhs and sizes (one launch of V * G groups) and vmap of the weight
    gradient (mode 1 folded): every item equals its own product."""
    v, m, k, n, g = 3, 200, 72, 40, 4
    x = jnp.asarray(host_rand(("vx",), (v, m, k), F16, k ** -0.5))
    w = jnp.asarray(host_rand(("vw",), (v, g, k, n), F16))
    gs = jnp.asarray([[10, 0, 100, 50], [60, 60, 60, 20], [0, 0, 0, 150]], jnp.int32)
    out = jax.jit(jax.vmap(lambda *a: tg.ragged_dot(*a, preferred_element_type=F32)))(x, w, gs)
    wt = host_rand(("vwt",), (m, n), F32)
    dws = jax.jit(jax.vmap(jax.grad(lambda w, x, gg: jnp.sum(
        wt * tg.ragged_dot(x, w, gg, preferred_element_type=F32)))))(w, x, gs)
    for i in range(v):
        assert rel_err(out[i], ragged64(x[i], w[i], gs[i])) <= bound(F32, k), i
        ends = ends64(gs[i], m)
        ref = np.stack([f64(x[i])[s:e].T @ f64(wt)[s:e] for s, e in zip(np.r_[0, ends[:-1]],
                                                                           ends)])
        assert rel_err(dws[i], ref) <= bound(F16, m), i


def test_export_round_trip():
    """Exported for CUDA, serialised, deserialised and called: bitwise the direct result."""
    x = jnp.asarray(host_rand(("xx",), (300, 200), BF16, 200 ** -0.5))
    w = jnp.asarray(host_rand(("xw",), (5, 200, 72), BF16))
    gs = jnp.asarray([0, 67, 131, 0, 59], jnp.int32)
    f = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(
        tg.ragged_gemm(x, w, gs, activation="silu", out_dtype=F32)), argnums=(0, 1)))
    allow = [jax.export.DisabledSafetyCheck.custom_call(t)
             for t in (_ffi.RAGGED_TARGET, _ffi.DACT_TARGET)]
    exp = jax.export.export(f, platforms=["cuda"], disabled_checks=allow)(x, w)
    back = jax.export.deserialize(exp.serialize())
    for got, want in zip(jax.tree.leaves(back.call(x, w)), jax.tree.leaves(f(x, w))):
        np.testing.assert_array_equal(f64(got), f64(want))


# ---------------------------------------------------------------------------------------------
# Fuzz over group-size vectors.

FUZZ_SHAPES = ((384, 136, 80, 8), (520, 72, 130, 64))  # (M, K, N, G): no tile multiples
LAX_DIMS = {"forward": lax.RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0]),
            "dgrad": lax.RaggedDotDimensionNumbers((([1], [2]), ([], [])), [0], [0]),
            "wgrad": lax.RaggedDotDimensionNumbers((([0], [0]), ([], [])), [0], [])}
KINDS = ("sum", "sum", "under", "over", "negative")


def test_fuzz():
    rng = np.random.default_rng(FUZZ_SEED)
    combos = list(itertools.product(range(len(FUZZ_SHAPES)), FORMS, IN_DTYPES, OUT_DTYPES))
    compiled, fails = {}, []
    for i in range(FUZZ_CASES):
        j = i // 2  # even i: the planner's row; odd: the sm80 grouped rows, one per cycle
        si, form, dt, od = combos[j % len(combos)]
        cfg = None if i % 2 == 0 else SM80_RAGGED[j // len(combos) % len(SM80_RAGGED)]
        m, k, n, g = FUZZ_SHAPES[si]
        key = (si, form, dt, od, cfg)
        if key not in compiled or j % (7 * len(combos)) < len(combos):  # fresh inputs often
            mode, tb = FORMS[form]
            a, b = form_operands(form, m, k, n, g, dt, ("fuzz", FUZZ_SEED, i))
            fn = lambda a, b, gg, mode=mode, tb=tb, od=od, cfg=cfg: [ragged(  # noqa: E731
                a, b, gg, mode=mode, transpose_b=tb, out_dtype=od, config=cfg)]
            ops = (jnp.asarray(a), jnp.asarray(b))
            avals = jax.eval_shape(fn, *ops, jax.ShapeDtypeStruct((g,), np.int32))
            run, lax_fn = compiled[key][2:4] if key in compiled else (poisoned(
                fn, nan_filled(avals), *ops, jnp.zeros((g,), jnp.int32)), jax.jit(
                lambda a, b, gg, dn=LAX_DIMS[form], od=od: lax.ragged_dot_general(
                    a, b, gg, dn, preferred_element_type=od)))
            compiled[key] = (a, b, run, lax_fn, ops, avals)
        a, b, run, lax_fn, ops, avals = compiled[key]
        kind = KINDS[int(rng.integers(len(KINDS)))]
        gs = random_sizes(rng, m, g, kind)
        (out,), _ = run(nan_filled(avals), *ops, jnp.asarray(gs))
        out = np.asarray(out)
        want = form_ref(form, a, b, gs)
        err, lim = rel_err(out, want), bound(od, form_k(form, a, m))
        # lax's own result (same rule for sizes >= 0), within both roundings
        vs_lax = 0.0 if kind == "negative" else rel_err(out, f64(lax_fn(*ops, gs)))
        live = int(ends64(gs, m)[-1])
        zero_tail = FORMS[form][0] == 1 or not np.any(out[live:].astype(np.float32))
        if (np.isnan(out.astype(np.float32)).any() or not err <= lim or not zero_tail
                or not vs_lax <= 2 * lim):
            fails.append(f"case {i} ({form}, {dt}->{od}, {cfg_id(cfg)}, M K N G = {m} {k} {n} "
                         f"{g}, {kind} "
                         f"sizes {gs.tolist()}): rel err {err:.3g} (bound {lim:.3g}), vs "
                         f"lax.ragged_dot_general {vs_lax:.3g}, zeros past the sum: {zero_tail}")
    assert not fails, f"{len(fails)} of {FUZZ_CASES} fuzz cases failed:\n" + "\n".join(
        fails[:40])
