"""Robustness of tcgemm: 64-bit indexing, bitwise determinism (with and without the fused
epilogue), and NaN / Inf propagation (as in jnp.dot). The FFI handlers' answer to inconsistent
calls is in test_ffi_errors.py.

GPU tests are marked `gpu` (conftest: skipped off-GPU with a reason, failed instead under
TCGEMM_REQUIRE_GPU=1). The 64-bit tests need about 12 GB of GPU memory at a time. The NaN / Inf
tests also run on the CPU fallback (in CI).
"""
import functools
import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export, lax

import jax_tcgemm as tg
from jax_tcgemm import configs
from jax_tcgemm.primitive import tcgemm

from conftest import assert_close, bound, epilogue_ref64, f64, poisoned, seed_of
from test_fuzz import compare

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
LAYOUTS = list(itertools.product((False, True), repeat=2))  # (transpose_a, transpose_b)
CONFIG_NAMES = [c.name for c in configs.CONFIGS16]
gpu = pytest.mark.gpu


def stored(x, transposed):  # a logical (B, R, C) host operand in its stored layout
    return np.ascontiguousarray(np.swapaxes(x, -1, -2)) if transposed else x


# ---------------------------------------------------------------------------------------------
# 64-bit indexing: outputs and operands with more than 2^31 elements, batch offsets past 2^31.
# Operands are generated on the GPU (hashed coordinates); sampled full rows / columns of the (NaN-poisoned) output,
# at the ends and where a linear index crosses 2^31 or 2^32, are compared with float64
# products of the matching operand slices.

def _hashed(seed, shape, dtype):
    """Device array of pseudo-random values, uniform in [-2, 2), from a hash of each element's
    (seed, coordinates): one elementwise loop, no temporaries (jax.random's threefry wants
    several times the output in temporary memory at these sizes)."""
    def f():
        h = jnp.uint32(seed)
        for d, mult in enumerate((0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D)):
            h = (h ^ lax.broadcasted_iota(jnp.uint32, shape, d)) * jnp.uint32(mult)
            h = h ^ (h >> 15)
        h = (h ^ (h >> 16)) * jnp.uint32(0x7FEB352D)
        h = h ^ (h >> 15)
        return ((h >> 8).astype(jnp.float32) * 2.0 ** -22 - 2.0).astype(dtype)
    return jax.jit(f)()


@functools.partial(jax.jit, static_argnums=(1, 3))
def _take_jit(x, z, idx, axis):
    return jnp.take(x[z], idx, axis=axis)


def _take(x, z, idx, axis):
    """Host float64 copy of x[z] (rank 3 -> 2) at indices idx along `axis` of x[z] (all: None)."""
    return f64(x[z]) if idx is None else f64(_take_jit(x, z, jnp.asarray(idx), axis))


def _a_rows(a, ta, z, rows):  # logical rows of A[z]: (r, K)
    return _take(a, z, rows, 1).T if ta else _take(a, z, rows, 0)


def _b_cols(b, tb, z, cols):  # logical columns of B[z]: (K, c)
    return _take(b, z, cols, 0).T if tb else _take(b, z, cols, 1)


def _crossings(extent, inner, batch=1):
    """{item: indices} of the rows of a (batch, extent, inner) array where its linear element
    index crosses 2^31 or 2^32 (each with its neighbours)."""
    out = {}
    for t in (2 ** 31, 2 ** 32):
        if t < batch * extent * inner:
            z, i = divmod(t // inner, extent)
            out.setdefault(z, set()).update(j for j in (i - 1, i, i + 1) if 0 <= j < extent)
    return out


def _samples(extent, seed, extra=()):
    rng = np.random.default_rng(seed)
    base = {0, 1, extent // 2, extent - 2, extent - 1, *rng.integers(0, extent, 3).tolist()}
    return sorted(v for v in base | set(extra) if 0 <= v < extent)


def check_sampled(out, a, b, ta, tb, rows=None, cols=None):
    """Problems (a list) of sampled full rows {z: rows} / columns {z: cols} of out (B, M, N)."""
    k = a.shape[1] if ta else a.shape[2]
    problems = []
    for what, picks in (("rows", rows or {}), ("cols", cols or {})):
        for z, idx in picks.items():
            za, zb = (z if a.shape[0] > 1 else 0), (z if b.shape[0] > 1 else 0)
            idx = np.asarray(sorted(idx))
            if what == "rows":
                lhs, rhs, got = _a_rows(a, ta, za, idx), _b_cols(b, tb, zb, None), _take(
                    out, z, idx, 0)
            else:
                lhs, rhs, got = _a_rows(a, ta, za, None), _b_cols(b, tb, zb, idx), _take(
                    out, z, idx, 1)
            p = compare(got.astype(out.dtype), lhs @ rhs, np.linalg.norm(lhs, axis=1)[:, None],
                        np.linalg.norm(rhs, axis=0)[None, :], out.dtype, k)
            if p:
                problems.append(f"batch item {z}, {what} {idx.tolist()}: {p}")
    return problems


def run_big(ba, bb, m, n, k, dtype, out_dtype, ta, tb, tag):
    """Operands generated on the GPU; the product written into a NaN-filled output."""
    a = _hashed(seed_of(tag, "a"), (ba, k, m) if ta else (ba, m, k), dtype)
    b = _hashed(seed_of(tag, "b"), (bb, n, k) if tb else (bb, k, n), dtype)
    shape = (max(ba, bb), m, n)
    poison = jax.jit(lambda: jnp.full(shape, jnp.nan, out_dtype))()
    fn = lambda p, q: [tcgemm(p, q, transpose_a=ta, transpose_b=tb, out_dtype=out_dtype)]  # noqa: E731
    (out,), (in_place,) = poisoned(fn, [poison], a, b)([poison], a, b)
    if not in_place:
        warnings.warn("the output was not written into the NaN-poisoned buffer; unwritten "
                      "elements are caught only where they differ from the reference")
    return a, b, out


BIG_OUT = [  # (Ba, Bb, M, N, K, dtype, out dtype, ta, tb): more than 2^31 output elements
    (1, 1, 65536, 40000, 16, F16, F16, False, False),   # 2.6e9 outputs (5.2 GB)
    (1, 1, 65536, 40000, 13, BF16, F32, False, True),   # unaligned loads; f32 out (10.5 GB)
    (3, 1, 30000, 24000, 24, F16, F16, True, False),    # batch*M*N = 2.2e9, shared B (stride 0)
]


@gpu
@pytest.mark.parametrize("ba,bb,m,n,k,dtype,out_dtype,ta,tb", BIG_OUT, ids=str)
def test_output_beyond_2_31_elements(ba, bb, m, n, k, dtype, out_dtype, ta, tb):
    a, b, out = run_big(ba, bb, m, n, k, dtype, out_dtype, ta, tb, ("big_out", m, n, k, ba))
    bt = max(ba, bb)
    rows = {0: {0, 1}, bt - 1: set(_samples(m, seed_of("rows", m, n)))}
    for z, idx in _crossings(m, n, bt).items():
        rows.setdefault(z, set()).update(idx)
    crossing_cols = [t % n for t in (2 ** 31, 2 ** 32)]
    cols = {bt - 1: set(_samples(n, seed_of("cols", m, n), crossing_cols))}
    problems = check_sampled(out, a, b, ta, tb, rows, cols)
    assert not problems, "\n".join(problems)


BIG_IN = [  # (id, Ba, Bb, M, N, K, dtype, out dtype, ta, tb): an operand past 2^31 elements
    ("A_NN_unaligned", 1, 1, 140000, 40, 16001, F16, F16, False, False),  # A: 2.24e9 (4.5 GB)
    ("A_TN", 1, 1, 140000, 40, 16000, BF16, F32, True, False),
    ("B_NT", 1, 1, 40, 140000, 16000, F16, F32, False, True),
    ("B_NN_unaligned", 1, 1, 40, 140001, 16000, BF16, BF16, False, False),
    ("A_batch_offsets", 5, 1, 24000, 40, 24000, F16, F16, False, False),  # z*stride up to 2.3e9
    ("B_batch_offsets", 1, 5, 40, 24000, 24000, BF16, F32, False, True),
]


@gpu
@pytest.mark.parametrize("ba,bb,m,n,k,dtype,out_dtype,ta,tb", [c[1:] for c in BIG_IN],
                         ids=[c[0] for c in BIG_IN])
def test_operands_beyond_2_31_elements(ba, bb, m, n, k, dtype, out_dtype, ta, tb):
    a, b, out = run_big(ba, bb, m, n, k, dtype, out_dtype, ta, tb, ("big_in", m, n, k, ba, bb))
    # Sample output rows (all columns) if A is the big operand, else output columns; add those
    # whose operand row crosses 2^31 elements (K-major operands; an MN-major one's crossing is
    # a K index, used by every output element).
    big_a = m > n
    extent, batch, kmajor = (m, ba, not ta) if big_a else (n, bb, tb)
    picks = {z: set(_samples(extent, seed_of("picks", extent, z))) for z in range(batch)}
    for z, idx in (_crossings(extent, k, batch) if kmajor else {}).items():
        picks[z].update(idx)
    problems = check_sampled(out, a, b, ta, tb, **{"rows" if big_a else "cols": picks})
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# Determinism: repeated runs are bitwise identical (each written into a different poison).

def repeated(fn, shape, out_dtype, args, reps):
    """Host copies of `reps` runs of fn(*args) -> array, each into a fresh buffer filled with
    NaN or with random garbage (an unwritten or racy element makes two runs differ)."""
    rng = np.random.default_rng(seed_of("garbage", shape))
    fills = [np.full(shape, np.nan, out_dtype)] + [
        rng.standard_normal(shape, np.float32).astype(out_dtype) for _ in range(2)]
    args = [jax.device_put(v) for v in args]
    run = poisoned(lambda *xs: [fn(*xs)], [jax.device_put(fills[0])], *args)
    return [np.asarray(run([jax.device_put(fills[r % 3])], *args)[0][0]) for r in range(reps)]


def assert_bitwise_identical(runs, what):
    for i, r in enumerate(runs[1:], 1):
        diff = np.flatnonzero(r.view(np.uint8) != runs[0].view(np.uint8))
        assert diff.size == 0, f"{what}: run {i} differs from run 0 at {diff.size} bytes"


@gpu
@pytest.mark.parametrize("config", CONFIG_NAMES + [None], ids=lambda c: c or "default")
def test_repeated_runs_bitwise_identical(config):
    m, n, k = 999, 1001, 1531
    rng = np.random.default_rng(seed_of("determinism", m, n, k))
    a = rng.standard_normal((1, m, k), np.float32).astype(BF16)
    b = rng.standard_normal((1, k, n), np.float32).astype(BF16)
    c = rng.standard_normal((1, m, n), np.float32)
    bias = rng.standard_normal((1, n), np.float32)
    ref = np.matmul(f64(a), f64(b))
    ref_epi = epilogue_ref64(a, b, c, bias, alpha=0.5, beta=-1.5, activation="gelu")[0]
    for (ta, tb), split, epi in itertools.product([(False, False), (True, True)],
                                                  (None, 4) if config else (None,),
                                                  (False, True)):
        # plain, or with the fused epilogue (C, bias, gelu: every split-K path sums first)
        epi_kw = dict(alpha=0.5, beta=-1.5, activation="gelu") if epi else {}
        def fn(p, q, cc, bb, ta=ta, tb=tb, split=split, epi_kw=epi_kw):
            return tcgemm(p, q, cc, bb, transpose_a=ta, transpose_b=tb, out_dtype=F32,
                          config=config, split_k=split, **epi_kw)
        args = (stored(a, ta), stored(b, tb)) + ((c, bias) if epi else (None, None))
        runs = repeated(fn, (1, m, n), F32, args, reps=5)
        what = (f"{config or 'default'} {configs.layout_name(ta, tb)} split_k={split}"
                f"{' epilogue' if epi else ''}")
        assert_bitwise_identical(runs, what)
        assert_close(runs[0], ref_epi if epi else ref, F32, k, what)


@gpu
def test_skinny_products_bitwise_identical():
    """M = 16 and M = 128 against the same 4096 x 4096 weights (where split-K is selected)."""
    rng = np.random.default_rng(seed_of("skinny"))
    w = rng.standard_normal((1, 4096, 4096), np.float32).astype(F16)
    cfg = [c for c in configs.CONFIGS if c.kind == "sm80" and c.bk == 64][-1].name
    variants = [(None, None)] + [(cfg, s) for s in (2, 8, 16)]
    for m in (16, 128):
        a = rng.standard_normal((1, m, 4096), np.float32).astype(F16)
        ref = np.matmul(f64(a), f64(w))
        for config, split in variants:
            fn = lambda p, q: tcgemm(p, q, out_dtype=F16, config=config, split_k=split)  # noqa: E731,B023
            runs = repeated(fn, (1, m, 4096), F16, (a, w), reps=10)
            what = f"M={m} {config or 'default'} split_k={split}"
            assert_bitwise_identical(runs, what)
            assert_close(runs[0], ref, F16, 4096, what)


# ---------------------------------------------------------------------------------------------
# NaN and Inf propagate as in jnp.dot.

def planted(m, n, k, seed):
    """Logical float32 a (1, M, K), b (1, K, N) with NaN / Inf planted at the edges and inside."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1, m, k), np.float32)
    b = rng.standard_normal((1, k, n), np.float32)
    a[0, m - 1, k - 1] = np.nan       # row m-1: all NaN
    a[0, m // 2, 0] = np.inf          # row m//2: +-Inf by the sign of b[0, j] ...
    b[0, 0, n - 1] = 0.0              # ... and Inf * 0 = NaN at (m//2, n-1)
    a[0, 1, k // 2] = -np.inf         # row 1: -+Inf
    b[0, k // 3, n // 2] = np.nan     # column n//2: all NaN
    return a, b


def overflowing(m, n, k, seed):
    """Positive a ~ 225 and b = +-225 (some columns 1000x smaller): |C| ~ 8e5 with K = 16
    overflows float16 to +-Inf, the small columns stay finite."""
    rng = np.random.default_rng(seed)
    a = (200 + 50 * rng.random((1, m, k))).astype(np.float32)
    b = (200 + 50 * rng.random((1, k, n))) * rng.choice([-1.0, 1.0], (1, 1, n))
    b[:, :, ::5] *= 1e-3
    return a, b.astype(np.float32)


def ieee_ref(a, b, out_dtype):
    """Explicit float64 sum of products (IEEE: Inf * 0 = NaN, Inf - Inf = NaN), rounded to the
    output dtype through float32 as the kernel does."""
    with np.errstate(invalid="ignore", over="ignore"):
        prod = f64(a)[0][:, :, None] * f64(b)[0][None, :, :]
        return prod.sum(axis=1).astype(np.float32).astype(out_dtype)[None]


def check_nonfinite(got, a, b, out_dtype, k, what):
    """got has NaN / +Inf / -Inf exactly where the IEEE reference and jnp.dot have them, and is
    close to the reference elsewhere."""
    want = f64(ieee_ref(a, b, out_dtype))
    dot = f64(jnp.dot(jnp.asarray(a[0]), jnp.asarray(b[0]), preferred_element_type=F32)
              .astype(out_dtype))[None]
    got = f64(got)
    for name, f in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        assert (f(got) == f(want)).all(), f"{what}: {name} at {np.argwhere(f(got) != f(want))[:5]}"
        assert (f(got) == f(dot)).all(), f"{what}: {name} differs from jnp.dot's"
    fin = np.isfinite(want)
    assert fin.any()
    err = np.linalg.norm(got[fin] - want[fin]) / np.linalg.norm(want[fin])
    assert err <= 2 * bound(out_dtype, k), f"{what}: finite part off by {err:.3g}"


def nonfinite_cases(configs_, splits):
    """[(what, dtype, out dtype, ta, tb, config, split, a, b)] of planted and overflowing
    operands (a, b: logical, rounded to dtype) over layouts, dtypes and configs."""
    out = []
    for (m, n, k), dt, cfg, s in itertools.product([(77, 45, 70), (136, 72, 48)], (F16, BF16),
                                                   configs_, splits):
        a, b = planted(m, n, k, seed_of("nan", m, n, k, dt.name))
        a, b = a.astype(dt), b.astype(dt)
        for (ta, tb), od in itertools.product(LAYOUTS, (F16, F32)):
            out.append((f"NaN/Inf {m}x{n}x{k}", dt, od, ta, tb, cfg, s, a, b))
    for dt, od, (ta, tb), cfg in itertools.product((F16, BF16), (F16, BF16, F32), LAYOUTS[::3],
                                                   configs_):
        a, b = overflowing(65, 33, 16, seed_of("overflow", dt.name))
        out.append(("overflow 65x33x16", dt, od, ta, tb, cfg, None, a.astype(dt), b.astype(dt)))
    return out


def run_nonfinite(cases):
    """All cases in one jit; each output checked against the IEEE reference and jnp.dot."""
    ops = [(stored(a, ta), stored(b, tb)) for _, _, _, ta, tb, _, _, a, b in cases]
    outs = jax.jit(lambda ops: [
        tcgemm(p, q, transpose_a=ta, transpose_b=tb, out_dtype=od, config=cfg, split_k=s)
        for (p, q), (_, _, od, ta, tb, cfg, s, _, _) in zip(ops, cases)])(ops)
    for out, (what, dt, od, ta, tb, cfg, s, a, b) in zip(outs, cases):
        check_nonfinite(out, a, b, od, a.shape[2],
                        f"{what} {configs.layout_name(ta, tb)} {dt}->{od} {cfg} split_k={s}")


@gpu
@pytest.mark.parametrize("config", CONFIG_NAMES + [None], ids=lambda c: c or "default")
def test_nan_inf_propagate_gpu(config):
    # a K split is an override of a named config (the default plan picks its own)
    run_nonfinite(nonfinite_cases([config], (None, 4) if config else (None,)))


def test_nan_inf_propagate_cpu_fallback():
    with jax.default_device(jax.devices("cpu")[0]):
        run_nonfinite(nonfinite_cases([None], (None,)))


def test_planted_pattern_is_what_the_tests_claim():
    """The reference pattern of `planted`: exactly its row / column / element are NaN, the
    Inf rows are +-Inf elsewhere, all other elements finite."""
    m, n, k = 77, 45, 70
    a, b = planted(m, n, k, 0)
    want = f64(ieee_ref(a, b, F32))[0]
    nan = np.zeros((m, n), bool)
    nan[m - 1, :] = nan[:, n // 2] = True
    nan[m // 2, n - 1] = True
    inf = np.zeros((m, n), bool)
    inf[[1, m // 2], :] = True
    inf &= ~nan
    np.testing.assert_array_equal(np.isnan(want), nan)
    np.testing.assert_array_equal(np.isinf(want), inf)
    np.testing.assert_array_equal(np.sign(want[m // 2][inf[m // 2]]), np.sign(b[0, 0][inf[m // 2]]))
    np.testing.assert_array_equal(np.sign(want[1][inf[1]]), -np.sign(b[0, k // 2][inf[1]]))
    over = f64(ieee_ref(*overflowing(65, 33, 16, 0), F16))
    assert np.isinf(over[..., 1:5]).all() and np.isfinite(over[..., ::5]).all()


# ---------------------------------------------------------------------------------------------
# Symbolic dimensions (shape polymorphism: sizes unknown at trace time).

def test_symbolic_dims_trace():
    (m,) = export.symbolic_shape("m")
    out = jax.eval_shape(tg.matmul, jax.ShapeDtypeStruct((m, 8), F16),
                         jax.ShapeDtypeStruct((8, 3), F16))
    assert out.shape == (m, 3) and out.dtype == F16


def test_check_sampled_catches_a_wrong_element():
    """The sampled comparison of the 64-bit tests, run on small CPU-fallback products."""
    with jax.default_device(jax.devices("cpu")[0]):
        a, b = _hashed(1, (2, 50, 30), F16), _hashed(2, (1, 20, 30), F16)
        out = tcgemm(a, b, transpose_b=True, out_dtype=F16)
        assert check_sampled(out, a, b, False, True, {1: {0, 49}}, {0: {19}}) == []
        bad = out.at[1, 49, 3].add(0.25)
        assert check_sampled(bad, a, b, False, True, rows={1: {49}})
        assert check_sampled(bad, a, b, False, True, cols={1: {3}})
        assert check_sampled(bad, a, b, False, True, rows={0: {49}}, cols={1: {2}}) == []
    assert _crossings(40000, 65536) == {0: {32767, 32768, 32769}}
    assert _crossings(30000, 24000, 3) == {2: {29477, 29478, 29479}}
