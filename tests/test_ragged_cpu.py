"""CPU tests of the ragged GEMM (jax_tcgemm/ragged.py): tg.ragged_dot, tg.ragged_dot_general,
tg.ragged_gemm and tcgemm_ragged_p.

* Semantics against lax.ragged_dot(_general) and a float64 numpy reference of the clamping rule
  (`ragged64`): random group sizes with empty groups, sums below and above M, skewed and
  single-group vectors; the three kernel forms (forward, dgrad against (G, N, K) weights,
  wgrad); every input / output dtype and lax's preferred_element_type normalisation; what
  goes to lax (other dtypes, dims, group_offset) and that it is lax's result.
* Invalid sizes: traced negative sizes follow the clamping rule (and lax's result differs,
  as documented), concrete ones raise; sums above M agree with lax; no int32 overflow.
* Errors at trace time naming shapes and dtypes; the primitive's own validation.
* AD: grad wrt lhs, rhs (and bias through an activation) against lax / float64; the jaxprs
  hold tcgemm_ragged (and tcgemm_dact) only, no dot_general or ragged_dot_general; the modes
  each gradient maps onto; jvp, grad of grad, vmap (one launch, or a loop for a shared rhs),
  vmap of grad, jit, jax.export (CPU round trip; CUDA serialisation with a config override),
  the CUDA custom call's attributes, and monkeypatch safety (the planner's family by GPU:
  test_ragged_plan_cpu.py; sharding on 4 CPU devices: test_ragged_sharding_cpu.py).
"""
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg
from jax_tcgemm import _ffi, configs, ragged as rg

from conftest import act64, act_grad64, assert_close, bound, f64, rand, rel_err
from test_cpu import eqns, prims

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
DOT_LIKE = {"dot_general", "ragged_dot_general", "ragged_dot"}
RDN = lax.RaggedDotDimensionNumbers
FWD = RDN((([1], [1]), ([], [])), [0], [0])      # lhs (M, K), rhs (G, K, N) -> (M, N)
DGRAD = RDN((([1], [2]), ([], [])), [0], [0])    # lhs (M, N), rhs (G, K, N) -> (M, K)
WGRAD = RDN((([0], [0]), ([], [])), [0], [])     # lhs (M, K), rhs (M, N) -> (G, K, N)
M, K, N, G = 37, 24, 20, 5  # no tile multiples
SM90 = next((c.name for c in configs.CONFIGS if c.kind == "sm90"), "sm90_any")  # an override
SM80 = next((c.name for c in configs.CONFIGS if c.kind == "sm80" and c.ragged), "sm80_any")
needs_module = pytest.mark.skipif(not _ffi.available(), reason="the config table is the CUDA "
                                  "extension's (jax_tcgemm._tcgemm), which is not built here")
S = jax.ShapeDtypeStruct


@pytest.fixture(autouse=True)
def _on_cpu():  # the CPU lowering, also on a GPU host
    with jax.default_device(jax.devices("cpu")[0]):
        yield


# ---------------------------------------------------------------------------------------------
# References and inputs.

def ends64(gs, m):
    """The clamping rule in numpy: negative sizes count as 0, ends cut at m."""
    return np.minimum(np.cumsum(np.clip(np.asarray(gs, np.int64), 0, None)), m)


def ragged64(lhs, rhs, gs, mode=0, tb=False, bias=None, act=None):
    """float64 tcgemm_ragged_p semantics of the rounded inputs."""
    a, b = f64(lhs), f64(rhs)
    ends = ends64(gs, a.shape[0])
    starts = np.r_[0, ends[:-1]]
    if mode == 1:
        return np.stack([a[s:e].T @ b[s:e] for s, e in zip(starts, ends)])
    out = np.zeros((a.shape[0], b.shape[1] if tb else b.shape[2]))
    for g, (s, e) in enumerate(zip(starts, ends)):
        p = a[s:e] @ (b[g].T if tb else b[g]) + (0 if bias is None else f64(bias)[g])
        out[s:e] = act64(act, p)
    return out


def sizes_of(kind, m=M, g=G, seed=0):
    """Group-size vectors: random with empties, sum < m, sum > m, skewed, one group."""
    rng = np.random.default_rng(seed)
    if kind == "random":  # group 0 empty
        s = rng.multinomial(m, rng.dirichlet(np.ones(g)))
        s[1], s[0] = s[1] + s[0], 0
    elif kind == "under":
        s = rng.multinomial(m - 7, np.ones(g) / g)
    elif kind == "over":
        s = rng.multinomial(m + 9, np.ones(g) / g)
    elif kind == "skewed":
        w = 1.0 / np.arange(1, g + 1) ** 1.5
        s = np.floor(m * w / w.sum()).astype(int)
        s[0] += m - s.sum()
        s[g // 2] = 0
    elif kind == "one":
        s = np.zeros(g, int)
        s[-1] = m
    return jnp.asarray(s, jnp.int32)


SIZE_KINDS = ("random", "under", "over", "skewed", "one")


def operands(tag, dt=BF16, m=M, k=K, n=N, g=G, tb=False):
    lhs = rand((tag, "lhs", dt.name, m, k), (m, k), dt, scale=k ** -0.5)
    rhs = rand((tag, "rhs", dt.name, g, k, n), (g, n, k) if tb else (g, k, n), dt)
    return lhs, rhs


# ---------------------------------------------------------------------------------------------
# Semantics.

def test_public_signatures_match_lax():
    for ours, theirs in ((tg.ragged_dot, lax.ragged_dot),
                         (tg.ragged_dot_general, lax.ragged_dot_general)):
        po, pt = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
        # ours are jax 0.12.1's; jax 0.11.2's have no keyword-only reduction_order
        assert list(po) == list(pt) + [n for n in ("reduction_order",) if n not in pt]
        for name, p in po.items():
            want = pt.get(name, inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                                  default=None))
            assert (p.kind, p.default) == (want.kind, want.default), name


@pytest.mark.parametrize("kind", SIZE_KINDS)
@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
def test_ragged_dot_vs_lax_and_float64(kind, dt):
    """Every output dtype (preferred_element_type None, f16, bf16, f32) against float64 and
    lax.ragged_dot on the same rounded inputs."""
    lhs, rhs = operands(("rd", kind), dt)
    gs = sizes_of(kind)
    want = ragged64(lhs, rhs, gs)
    for pet in (None, F16, BF16, F32):
        f = lambda a, b, g: tg.ragged_dot(a, b, g, preferred_element_type=pet)  # noqa: E731
        out = jax.jit(f)(lhs, rhs, gs)
        theirs = lax.ragged_dot(lhs, rhs, gs, preferred_element_type=pet)
        assert out.shape == theirs.shape == (M, N) and out.dtype == theirs.dtype
        assert_close(out, want, out.dtype, K, f"{kind} {dt}->{pet}")
        assert rel_err(out, f64(theirs)) <= 2 * bound(out.dtype, K), (kind, pet)
        assert not np.any(f64(out)[int(ends64(gs, M)[-1]):]), "rows past the sum are zeros"


@pytest.mark.parametrize("form", ["forward", "dgrad", "wgrad"])
def test_three_forms_through_ragged_dot_general(form):
    """Forward (rhs (G, K, N)), dgrad (rhs (G, K, N) contracted over N: transpose_b, no copy)
    and wgrad (ragged contraction, (G, K, N) out) are each one tcgemm_ragged of its mode, equal
    to lax.ragged_dot_general and to float64."""
    gs = sizes_of("random", seed=3)
    lhs, w = operands(("forms", form), BF16)
    if form == "forward":
        args, dn, want, mode, tb = (lhs, w), FWD, ragged64(lhs, w, gs), 0, False
    elif form == "dgrad":
        ct = rand(("forms-ct",), (M, N), BF16)
        args, dn, want, mode, tb = (ct, w), DGRAD, ragged64(ct, w, gs, tb=True), 0, True
    else:
        ct = rand(("forms-ct",), (M, N), BF16)
        args, dn, want, mode, tb = (lhs, ct), WGRAD, ragged64(lhs, ct, gs, mode=1), 1, False
    f = lambda x, y, g: tg.ragged_dot_general(x, y, g, dn, preferred_element_type=F32)  # noqa: E731
    out = jax.jit(f)(*args, gs)
    theirs = lax.ragged_dot_general(*args, gs, dn, preferred_element_type=F32)
    assert out.shape == theirs.shape == want.shape and out.dtype == F32
    assert_close(out, want, F32, M, form)
    assert_close(out, f64(theirs), F32, M, f"{form} vs lax")
    (e,) = prims(jax.make_jaxpr(f)(*args, gs), "tcgemm_ragged")
    assert (e.params["mode"], e.params["transpose_b"]) == (mode, tb)
    assert not [x for x in eqns(jax.make_jaxpr(f)(*args, gs)) if x.primitive.name in
                DOT_LIKE | {"transpose"}]


@pytest.mark.parametrize("pet", [None, F16, BF16, F32, float, "float32", jnp.float16],
                         ids=str)
def test_result_types_are_lax(pet):
    for dt in (F16, BF16):
        args = (S((M, K), dt), S((G, K, N), dt), S((G,), np.int32))
        ours = jax.eval_shape(lambda *x: tg.ragged_dot(*x, preferred_element_type=pet), *args)
        theirs = jax.eval_shape(lambda *x: lax.ragged_dot(*x, preferred_element_type=pet), *args)
        assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype)


FALLBACKS = {  # (lhs, rhs, group_sizes, dims, why): computed by lax
    "float32": (S((M, K), F32), S((G, K, N), F32), S((G,), np.int32), FWD),
    "int8": (S((M, K), np.int8), S((G, K, N), np.int8), S((G,), np.int32), FWD),
    "f16xbf16": (S((M, K), F16), S((G, K, N), BF16), S((G,), np.int32), FWD),
    "lhs_KM": (S((K, M), BF16), S((G, K, N), BF16), S((G,), np.int32),
               RDN((([0], [1]), ([], [])), [1], [0])),
    "rhs_group_last": (S((M, K), BF16), S((K, N, G), BF16), S((G,), np.int32),
                       RDN((([1], [0]), ([], [])), [0], [2])),
    "ragged_batch": (S((G, M, K), BF16), S((G, K, N), BF16), S((G,), np.int32),
                     RDN((([2], [1]), ([0], [0])), [0], [])),
    "batched_sizes": (S((3, M, K), BF16), S((G, 3, K, N), BF16), S((3, G), np.int32),
                      RDN((([2], [2]), ([0], [1])), [1], [0])),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_fallback_is_lax(case):
    """What the kernels do not take is lax.ragged_dot_general's (its primitive, its result)."""
    l_, r_, g_, dn = FALLBACKS[case]
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal(l_.shape) * 3).astype(l_.dtype)
    rhs = jnp.asarray(rng.standard_normal(r_.shape) * 3).astype(r_.dtype)
    ragged_extent = l_.shape[dn.lhs_ragged_dimensions[0]]
    gs = jnp.asarray(rng.multinomial(ragged_extent, np.ones(G) / G, size=g_.shape[:-1]),
                     jnp.int32)
    f = lambda x, y, g: tg.ragged_dot_general(x, y, g, dn)  # noqa: E731
    jx = jax.make_jaxpr(f)(lhs, rhs, gs)
    assert prims(jx, "ragged_dot_general") and not prims(jx, "tcgemm_ragged")
    np.testing.assert_array_equal(np.asarray(f(lhs, rhs, gs)),
                                  np.asarray(lax.ragged_dot_general(lhs, rhs, gs, dn)))


def test_group_offset_is_lax():
    """lax does not implement group_offset (jax 0.11.2): we pass it through, with its error."""
    lhs, rhs = operands(("go",))
    off = jnp.asarray([1], jnp.int32)
    with pytest.raises(Exception) as theirs:
        jax.jit(lambda *x: lax.ragged_dot(*x, group_offset=off))(lhs, rhs, sizes_of("random"))
    with pytest.raises(type(theirs.value)):
        jax.jit(lambda *x: tg.ragged_dot(*x, group_offset=off))(lhs, rhs, sizes_of("random"))


@pytest.mark.skipif("reduction_order" not in inspect.signature(lax.ragged_dot).parameters,
                    reason=f"jax {jax.__version__}'s lax.ragged_dot takes no reduction_order")
def test_reduction_order_as_lax():
    """'unordered' leaves the order to us (the kernel); any other order is lax's, with lax's
    result or error (jax 0.12.1 has no ragged_dot lowering for an ordered reduction)."""
    lhs, rhs = operands(("ro",), F16)
    gs = sizes_of("random")
    f = lambda o: lambda *x: tg.ragged_dot(*x, preferred_element_type=F32,  # noqa: E731
                                           reduction_order=o)
    jx = jax.make_jaxpr(f("unordered"))(lhs, rhs, gs)
    assert prims(jx, "tcgemm_ragged") and not prims(jx, "ragged_dot_general")
    assert_close(f("unordered")(lhs, rhs, gs), ragged64(lhs, rhs, gs), F32, K, "unordered")
    assert not prims(jax.make_jaxpr(f("linear"))(lhs, rhs, gs), "tcgemm_ragged")
    try:
        want = jax.jit(lambda *x: lax.ragged_dot(*x, preferred_element_type=F32,
                                                 reduction_order="linear"))(lhs, rhs, gs)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            jax.jit(f("linear"))(lhs, rhs, gs)
    else:
        np.testing.assert_array_equal(np.asarray(jax.jit(f("linear"))(lhs, rhs, gs)),
                                      np.asarray(want))


@pytest.mark.parametrize("gs_dtype", [np.int8, np.int16, np.uint8, np.uint32, np.int32])
def test_group_size_dtypes(gs_dtype):
    lhs, rhs = operands(("gsd",), F16)
    gs = np.asarray(sizes_of("under")).astype(gs_dtype)
    out = tg.ragged_dot(lhs, rhs, gs, preferred_element_type=F32)
    assert_close(out, ragged64(lhs, rhs, gs), F32, K, str(gs_dtype))


def test_empty_problems():
    """Zero-sized M, N, K or G: zeros of lax's shape, no launch."""
    for m, k, n, g in [(0, K, N, G), (M, 0, N, G), (M, K, 0, G), (M, K, N, 0)]:
        lhs, rhs = jnp.ones((m, k), BF16), jnp.ones((g, k, n), BF16)
        gs = jnp.full((g,), m // max(g, 1), jnp.int32)
        out = tg.ragged_dot(lhs, rhs, gs)
        theirs = lax.ragged_dot(lhs, rhs, gs)
        assert out.shape == theirs.shape and out.dtype == theirs.dtype and not np.any(f64(out))


# ---------------------------------------------------------------------------------------------
# Invalid group sizes.

def test_negative_sizes_traced_follow_the_clamping_rule():
    """Under jit a negative size counts as 0 (the kernel's rule, ragged64); lax (dense masked
    lowering) instead shifts the later groups back and sums where ranges overlap."""
    lhs, rhs = operands(("neg",), F16, m=6, g=3)
    gs = jnp.asarray([3, -1, 2], jnp.int32)
    out = jax.jit(lambda *x: tg.ragged_dot(*x, preferred_element_type=F32))(lhs, rhs, gs)
    assert_close(out, ragged64(lhs, rhs, gs), F32, K, "clamped")
    np.testing.assert_array_equal(ends64([3, -1, 2], 6), [3, 3, 5])
    theirs = f64(lax.ragged_dot(lhs.astype(F32), rhs.astype(F32), gs, precision="highest"))
    a, b = f64(lhs), f64(rhs)  # lax: row 2 in groups 0 and 2, row 3 in group 2
    lax_rule = np.r_[a[:2] @ b[0], a[2:3] @ (b[0] + b[2]), a[3:4] @ b[2], np.zeros((2, N))]
    assert_close(theirs, lax_rule, F32, K, "lax's behaviour")
    assert rel_err(out, theirs) > 0.1


def test_negative_sizes_concrete_raise():
    lhs, rhs = operands(("negc",), F16, m=6, g=3)
    with pytest.raises(ValueError, match=r"negative group sizes \[ 3 -1  2\]"):
        tg.ragged_dot(lhs, rhs, np.asarray([3, -1, 2], np.int32))


def test_sum_above_m_agrees_with_lax_and_does_not_overflow():
    lhs, rhs = operands(("over",), BF16)
    for gs in (sizes_of("over"), jnp.asarray([2**31 - 1] * G, jnp.int32),
               jnp.asarray([M - 1, 2**31 - 1, 5, 0, 1], jnp.int32)):
        out = jax.jit(lambda *x: tg.ragged_dot(*x, preferred_element_type=F32))(lhs, rhs, gs)
        assert_close(out, ragged64(lhs, rhs, gs), F32, K, str(gs))
    gs = sizes_of("over")
    theirs = lax.ragged_dot(lhs, rhs, gs, preferred_element_type=F32)
    assert_close(jax.jit(tg.ragged_dot)(lhs, rhs, gs).astype(F32), f64(theirs), BF16, K, "lax")
    ends = jax.jit(lambda g: rg.group_ends(g, 100))(jnp.asarray([2**31 - 1, -5, 2**31 - 1]))
    np.testing.assert_array_equal(np.asarray(ends), [100, 100, 100])


# ---------------------------------------------------------------------------------------------
# Errors.

ERRORS = [  # (thunk, exception, message pattern)
    (lambda: tg.ragged_dot(jnp.ones((M,), BF16), jnp.ones((G, K, N), BF16),
                           jnp.ones((G,), jnp.int32)), TypeError, r"lhs\(37,\) bfloat16"),
    (lambda: tg.ragged_dot(jnp.ones((M, K), BF16), jnp.ones((G + 1, K, N), BF16),
                           jnp.ones((G,), jnp.int32)), TypeError, r"rhs\(6, 24, 20\)"),
    (lambda: tg.ragged_dot(jnp.ones((M, K), BF16), jnp.ones((G, K + 1, N), BF16),
                           jnp.ones((G,), jnp.int32)), TypeError, r"lhs\(37, 24\).*rhs\(5, 25"),
    (lambda: tg.ragged_dot(jnp.ones((M, K), BF16), jnp.ones((G, K, N), BF16),
                           jnp.ones((G,), F32)), TypeError, r"group_sizes\(5,\) float32"),
    (lambda: tg.ragged_dot(jnp.ones((M, K), BF16), jnp.ones((G, K, N), BF16),
                           jnp.ones((1, G), jnp.int32)), TypeError, r"group_sizes\(1, 5\)"),
    (lambda: tg.ragged_gemm(jnp.ones((M, K), F16), jnp.ones((G, K, N), BF16),
                            jnp.ones((G,), jnp.int32)), TypeError, r"lhs\(37, 24\) float16, rhs"),
    (lambda: tg.ragged_gemm(jnp.ones((M, K), F16), jnp.ones((G, K, N), F16),
                            jnp.ones((G,), jnp.int32), bias=jnp.ones((N,))), ValueError,
     r"bias must be floating \(G, N\) = \(5, 20\); got \(20,\)"),
    (lambda: tg.ragged_gemm(jnp.ones((M, K), F16), jnp.ones((G, N, K), F16),
                            jnp.ones((G,), jnp.int32)), ValueError, r"K = 24 and G = 5"),
    (lambda: tg.ragged_gemm(jnp.ones((M, K), F16), jnp.ones((G, K, N), F16),
                            jnp.ones((G,), jnp.int32), activation="tanh"), ValueError, "tanh"),
    (lambda: rg.ragged(jnp.ones((M, K), F16), jnp.ones((G, K, N), F16),
                       jnp.ones((G,), jnp.int64 if jax.config.x64_enabled else jnp.int16)),
     TypeError, r"group_sizes must be int32.*group_sizes\(5,\)"),
    (lambda: rg.ragged(jnp.ones((M, K), F32), jnp.ones((G, K, N), F32),
                       jnp.ones((G,), jnp.int32)), TypeError, r"a\(37, 24\) float32"),
    (lambda: rg.ragged(jnp.ones((M, K), F16), jnp.ones((M + 1, N), F16),
                       jnp.ones((G,), jnp.int32), mode=1), ValueError, r"b\(38, 20\)"),
    (lambda: rg.ragged(jnp.ones((M, K), F16), jnp.ones((M, N), F16), jnp.ones((G,), jnp.int32),
                       mode=1, activation="relu"), ValueError, "no bias or activation"),
    (lambda: rg.ragged(jnp.ones((M, K), F16), jnp.ones((G, K, N), F16),
                       jnp.ones((G,), jnp.int32), jnp.ones((G, N), jnp.int32)), ValueError,
     r"bias must be float16, bfloat16 or float32 \(G, N\)"),
    (lambda: rg.ragged(jnp.ones((M, K), F16), jnp.ones((G, K, N), F16),
                       jnp.ones((G,), jnp.int32), config=3), ValueError,
     "must name a config with grouped kernels"),
] + ([(lambda: rg.ragged(jnp.ones((M, K), F16), jnp.ones((G, K, N), F16),
                         jnp.ones((G,), jnp.int32), config=name), ValueError,
       "must name a config with grouped kernels")
      for name in [next(c.name for c in configs.CONFIGS if not c.ragged)]]
     if configs.CONFIGS else [])


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors_at_trace_time(i):
    thunk, exc, pattern = ERRORS[i]
    with pytest.raises(exc, match=pattern):
        jax.eval_shape(thunk)


# ---------------------------------------------------------------------------------------------
# AD.

def _loss(fn, w, dn=FWD, **kw):
    return lambda x, y, g: jnp.sum(w * fn(x, y, g, dn, preferred_element_type=F32, **kw))


@pytest.mark.parametrize("form", ["forward", "dgrad", "wgrad"])
def test_grad_is_ragged_kernels_and_matches_lax(form):
    """grad wrt both operands: lax's values (float64 for wgrad, whose gradient lax does not
    implement in jax 0.11.2); the jaxpr has only tcgemm_ragged products, in the modes of the
    module docstring (forward: mode 0 flipped + mode 1; wgrad: two mode 0)."""
    gs = sizes_of("under", seed=5)
    lhs, w = operands(("grad", form), BF16)
    other = rand(("grad-ct", form), (M, N), BF16)
    args, dn, out_shape = {"forward": ((lhs, w), FWD, (M, N)),
                           "dgrad": ((other, w), DGRAD, (M, K)),
                           "wgrad": ((lhs, other), WGRAD, (G, K, N))}[form]
    wt = rand(("grad-w", form), out_shape, F32)
    ours = jax.grad(_loss(tg.ragged_dot_general, wt, dn), argnums=(0, 1))
    if form == "wgrad":  # d a[r] = wt[g] b[r], d b[r] = a[r] wt[g] for the rows r of g
        ends = ends64(gs, M)
        grp = np.searchsorted(ends, np.arange(M), side="right")
        live = (np.arange(M) < ends[-1])[:, None]
        wg = f64(wt)[np.minimum(grp, G - 1)]  # (M, K, N)
        refs = (live * np.einsum("rkn,rn->rk", wg, f64(other)),
                live * np.einsum("rk,rkn->rn", f64(lhs), wg))
    else:
        theirs = jax.grad(_loss(lax.ragged_dot_general, wt, dn), argnums=(0, 1))
        refs = [f64(r) for r in theirs(*[x.astype(F32) for x in args], gs)]
    for got, ref, x in zip(jax.jit(ours)(*args, gs), refs, args):
        assert got.dtype == x.dtype and got.shape == x.shape
        assert_close(got, ref, BF16, M, form)
    jx = jax.make_jaxpr(ours)(*args, gs)
    assert not [e for e in eqns(jx) if e.primitive.name in DOT_LIKE]
    modes = sorted((e.params["mode"], e.params["transpose_b"]) for e in prims(jx, "tcgemm_ragged"))
    assert modes == {"forward": [(0, False), (0, True), (1, False)],
                     "dgrad": [(0, False), (0, True), (1, False)],
                     "wgrad": [(0, False), (0, True), (1, False)]}[form]


def test_grad_of_float16_with_a_float32_cotangent_below_its_range():
    """float16 operands, float32 result, cotangent ~ 2^-20 (a float16 subnormal, 4 bits): the
    gradients keep float16 precision, as lax's float32 products do (epilogue.narrow_cotangent
    scales it first; cast as it is, the relative error is ~2^-5)."""
    gs = sizes_of("under", seed=3)
    lhs = rand(("cot", "lhs"), (M, K), F32, scale=256.0).astype(F16)
    w = rand(("cot", "w"), (G, K, N), F32, scale=256.0).astype(F16)
    wt = rand(("cot", "wt"), (M, N), F32, scale=2.0**-20)
    da, dw = jax.jit(jax.grad(_loss(tg.ragged_dot_general, wt, FWD), argnums=(0, 1)))(lhs, w, gs)
    ends = ends64(gs, M)
    grp = np.searchsorted(ends, np.arange(M), side="right")
    live = (np.arange(M) < ends[-1])[:, None]
    wg = f64(w)[np.minimum(grp, G - 1)]  # (M, K, N): each row's group's weight
    da64 = live * np.einsum("rkn,rn->rk", wg, f64(wt))
    dw64 = np.stack([f64(lhs)[s:e].T @ f64(wt)[s:e] for s, e in zip(np.r_[0, ends[:-1]], ends)])
    assert da.dtype == dw.dtype == F16
    assert_close(da, da64, F16, N, "d lhs")
    assert_close(dw, dw64, F16, M, "d w")


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"], ids=str)
@pytest.mark.parametrize("tb", [False, True], ids=["KN", "NK"])
def test_ragged_gemm_epilogue_and_grad(act, tb):
    """act(lhs @ rhs[g] + bias[g]) and its gradients wrt lhs, rhs and bias against float64;
    the backward's activation derivative is one tcgemm_dact, the rest tcgemm_ragged. A
    bfloat16 bias (NK cases) reaches the kernel as it is, and its gradient is bfloat16."""
    gs = sizes_of("under", seed=7)
    lhs, rhs = operands(("epi", act, tb), BF16, tb=tb)
    bias = rand(("epi-bias", act), (G, N), BF16 if tb else F32)
    out = jax.jit(lambda *x: tg.ragged_gemm(*x[:3], bias=x[3], activation=act, transpose_b=tb,
                                            out_dtype=F32))(lhs, rhs, gs, bias)
    assert_close(out, ragged64(lhs, rhs, gs, tb=tb, bias=bias, act=act), F32, K, "forward")
    wt = rand(("epi-w", act), (M, N), F32)

    def loss(x, y, b):
        return jnp.sum(wt * tg.ragged_gemm(x, y, gs, bias=b, activation=act, transpose_b=tb,
                                           out_dtype=F32))
    da, db, dbias = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(lhs, rhs, bias)
    ends = ends64(gs, M)
    pre = np.zeros((M, N))
    a, b = f64(lhs), f64(rhs)
    bt = np.swapaxes(b, 1, 2) if tb else b  # (G, K, N)
    gsum = np.zeros((G, N))
    g_full = np.zeros((M, N))
    da64, db64 = np.zeros((M, K)), np.zeros_like(bt)
    for g, (s, e) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
        pre[s:e] = a[s:e] @ bt[g] + f64(bias)[g]
        g_full[s:e] = f64(wt)[s:e] * act_grad64(act, pre[s:e])
        da64[s:e] = g_full[s:e] @ bt[g].T
        db64[g] = a[s:e].T @ g_full[s:e]
        gsum[g] = g_full[s:e].sum(0)
    assert_close(da, da64, BF16, N, "d lhs")
    assert_close(db, np.swapaxes(db64, 1, 2) if tb else db64, BF16, M, "d rhs")
    assert dbias.dtype == bias.dtype
    assert_close(dbias, gsum, bias.dtype, M, "d bias")
    jx = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(lhs, rhs, bias)
    assert not [e for e in eqns(jx) if e.primitive.name in DOT_LIKE]
    assert len(prims(jx, "tcgemm_dact")) == (act is not None)
    fwd = [e for e in prims(jx, "tcgemm_ragged") if e.params["has_bias"]]
    assert len(fwd) == 1 and fwd[0].params["activation"] == "none"  # pre, then act in lax
    assert fwd[0].invars[3].aval.dtype == bias.dtype


def test_jvp_and_grad_of_grad():
    gs = sizes_of("random", seed=9)
    lhs, rhs = operands(("jvp",), F16)
    bias = rand(("jvp-bias",), (G, N), F32)
    ts = [rand(("jvp-t", i), x.shape, x.dtype) for i, x in enumerate((lhs, rhs, bias))]
    f = lambda x, y, b: tg.ragged_gemm(x, y, gs, bias=b, activation="silu",  # noqa: E731
                                       out_dtype=F32)
    out, tan = jax.jit(lambda p, t: jax.jvp(f, p, t))((lhs, rhs, bias), tuple(ts))
    ends, lin, pre = ends64(gs, M), np.zeros((M, N)), np.zeros((M, N))
    for g, (s, e) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
        pre[s:e] = f64(lhs)[s:e] @ f64(rhs)[g] + f64(bias)[g]
        lin[s:e] = (f64(ts[0])[s:e] @ f64(rhs)[g] + f64(lhs)[s:e] @ f64(ts[1])[g]
                    + f64(ts[2])[g])
    assert_close(out, act64("silu", pre), F32, K, "primal")
    assert_close(tan, act_grad64("silu", pre) * lin, F32, K, "tangent")

    def h(fn):
        inner = lambda x, y: jnp.sum(fn(x, y, gs, preferred_element_type=F32) ** 2)  # noqa: E731
        return lambda x, y: jnp.sum(jax.grad(inner)(x, y).astype(F32) ** 2)
    ours = jax.jit(jax.grad(h(tg.ragged_dot), argnums=(0, 1)))(lhs, rhs)
    theirs = jax.grad(h(lax.ragged_dot), argnums=(0, 1))(lhs.astype(F32), rhs.astype(F32))
    for got, ref in zip(ours, theirs):
        assert_close(got, f64(ref), F16, K, "grad of grad")
    jx = jax.make_jaxpr(jax.grad(h(tg.ragged_dot), argnums=(0, 1)))(lhs, rhs)
    assert not [e for e in eqns(jx) if e.primitive.name in DOT_LIKE]


# ---------------------------------------------------------------------------------------------
# vmap, export, lowering.

def test_vmap_folds_into_one_launch():
    """lhs, rhs and sizes mapped (sums below M included): one tcgemm_ragged over V * G groups;
    a shared rhs runs as a loop (lax.map) rather than copying it V times."""
    v = 3
    lhs = rand(("vm-l",), (v, M, K), BF16, scale=K ** -0.5)
    rhs = rand(("vm-r",), (v, G, K, N), BF16)
    gs = jnp.stack([sizes_of(k, seed=i) for i, k in enumerate(("random", "under", "over"))])
    f = lambda *x: tg.ragged_dot(*x, preferred_element_type=F32)  # noqa: E731
    out = jax.jit(jax.vmap(f))(lhs, rhs, gs)
    for i in range(v):
        assert_close(out[i], ragged64(lhs[i], rhs[i], gs[i]), F32, K, f"item {i}")
    jx = jax.make_jaxpr(jax.vmap(f))(lhs, rhs, gs)
    (e,) = prims(jx, "tcgemm_ragged")
    assert e.invars[1].aval.shape == (v * G, K, N) and not prims(jx, "scan")
    shared = jax.jit(jax.vmap(f, in_axes=(0, None, 0)))(lhs, rhs[0], gs)
    for i in range(v):
        assert_close(shared[i], ragged64(lhs[i], rhs[0], gs[i]), F32, K, f"shared rhs {i}")
    assert prims(jax.make_jaxpr(jax.vmap(f, in_axes=(0, None, 0)))(lhs, rhs[0], gs), "scan")
    only_sizes = jax.vmap(f, in_axes=(None, 0, 0))(lhs[0], rhs, gs)
    assert_close(only_sizes[2], ragged64(lhs[0], rhs[2], gs[2]), F32, K, "mapped rhs, sizes")


def test_vmap_of_grad():
    """Per-item weight gradients (mode 1 folded: rows past each item's sum zeroed first)."""
    v = 3
    lhs = rand(("vg-l",), (v, M, K), F16, scale=K ** -0.5)
    rhs = rand(("vg-r",), (v, G, K, N), F16)
    gs = jnp.stack([sizes_of(k, seed=i) for i, k in enumerate(("under", "skewed", "one"))])
    wt = rand(("vg-w",), (M, N), F32)
    loss = lambda fn: lambda x, y, g: jnp.sum(wt * fn(x, y, g, preferred_element_type=F32))  # noqa: E731
    ours = jax.jit(jax.vmap(jax.grad(loss(tg.ragged_dot), argnums=(0, 1))))(lhs, rhs, gs)
    lax_grad = jax.grad(loss(lax.ragged_dot), argnums=(0, 1))  # (lax cannot vmap it)
    for i in range(v):
        for got, ref in zip(ours, lax_grad(lhs[i].astype(F32), rhs[i].astype(F32), gs[i])):
            assert_close(got[i], f64(ref), F16, M, f"vmap(grad) item {i}")
    jx = jax.make_jaxpr(jax.vmap(jax.grad(loss(tg.ragged_dot), argnums=(0, 1))))(lhs, rhs, gs)
    assert len(prims(jx, "tcgemm_ragged")) == 3 and not prims(jx, "scan")


def _ragged_calls(text):
    calls = []
    for line in text.splitlines():
        if "stablehlo.custom_call @tcgemm_ragged(" in line:
            config = line.split("mhlo.backend_config")[1]
            attrs = dict(re.findall(r'(\w+) = "?(\w+)"?', config.split("}")[0]))
            calls.append((attrs, line))
    return calls


@pytest.mark.parametrize("cfg", [SM90, SM80], ids=["sm90", "sm80"])
def test_cuda_lowering_attributes_with_config_override(cfg):
    """The FFI call of the kernel contract, written from this CPU host (a config override
    needs neither the GPU nor the extension): operands, attributes and the result type; for
    a row of either kernel family."""
    a, b = S((100, 64), BF16), S((4, 48, 64), BF16)
    g, bias = S((4,), np.int32), S((4, 48), F32)
    f = lambda *x: rg.ragged(*x, transpose_b=True, activation="gelu_tanh",  # noqa: E731
                             out_dtype=F32, config=cfg)
    text = jax.jit(f).trace(a, b, g, bias).lower(lowering_platforms=("cuda",)).as_text()
    ((attrs, line),) = _ragged_calls(text)
    assert attrs == {"activation": "3", "config": cfg, "has_bias": "true", "mode": "0",
                     "transpose_b": "true"}
    assert ("(tensor<100x64xbf16>, tensor<4x48x64xbf16>, tensor<4xi32>, tensor<4x48xf32>) -> "
            "tensor<100x48xf32>") in line
    w = lambda x, y, gg: rg.ragged(x, y, gg, mode=1, out_dtype=BF16, config=cfg)  # noqa: E731
    text = jax.jit(w).trace(S((100, 64), F16), S((100, 48), F16), g).lower(
        lowering_platforms=("cuda",)).as_text()
    ((attrs, line),) = _ragged_calls(text)
    assert attrs["mode"] == "1" and attrs["has_bias"] == "false" and attrs["activation"] == "0"
    assert "-> tensor<4x64x48xbf16>" in line


def test_cpu_lowering_is_the_reference():
    text = jax.jit(tg.ragged_dot).trace(S((8, 16), F16), S((2, 16, 8), F16),
                                        S((2,), np.int32)).lower(lowering_platforms=("cpu",))
    assert "custom_call @tcgemm_ragged" not in text.as_text() and "dot_general" in text.as_text()


def test_export_round_trips():
    """CPU: serialise, deserialise, call (equal to direct execution). CUDA: serialises here
    with a config override, the custom call unchecked as for tcgemm (tests/test_export.py)."""
    lhs, rhs = operands(("exp",), BF16)
    gs = sizes_of("under")
    f = jax.jit(lambda *x: tg.ragged_dot(*x, preferred_element_type=F32))
    back = jax.export.deserialize(jax.export.export(f, platforms=["cpu"])(lhs, rhs, gs).serialize())
    np.testing.assert_array_equal(np.asarray(back.call(lhs, rhs, gs)), np.asarray(f(lhs, rhs, gs)))
    allow = [jax.export.DisabledSafetyCheck.custom_call(_ffi.RAGGED_TARGET)]
    g = jax.jit(lambda *x: rg.ragged(*x, out_dtype=F16, config=SM90))
    exp = jax.export.export(g, platforms=["cuda"], disabled_checks=allow)(lhs, rhs, gs)
    back = jax.export.deserialize(exp.serialize())
    assert back.platforms == ("cuda",) and back.out_avals[0].shape == (M, N)
    assert len(_ragged_calls(back.mlir_module())) == 1


def test_monkeypatch_safe():
    """jax.lax.ragged_dot(_general) = ours: our fallbacks and reference call lax as imported."""
    saved = lax.ragged_dot, lax.ragged_dot_general
    lhs, rhs = operands(("mp",), BF16)
    gs = sizes_of("random")
    try:
        jax.lax.ragged_dot, jax.lax.ragged_dot_general = tg.ragged_dot, tg.ragged_dot_general
        for dt in (BF16, F32):  # the kernel, and lax's fallback
            out = jax.jit(lambda *x: jax.lax.ragged_dot(*x, preferred_element_type=F32))(
                lhs.astype(dt), rhs.astype(dt), gs)
            assert_close(out, ragged64(lhs, rhs, gs), F32, K, str(dt))
            jax.grad(lambda a: jax.lax.ragged_dot(a, rhs.astype(dt), gs).astype(F32).sum())(
                lhs.astype(dt))
    finally:
        jax.lax.ragged_dot, jax.lax.ragged_dot_general = saved
