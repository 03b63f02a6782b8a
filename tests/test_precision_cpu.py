"""`precision` as lax means it (the issue "float32 on the tensor cores and lax's precision
semantics exactly", its first bar): tcgemm_p keeps it as a param, in the canonical form that
lax.dot_general keeps in its own params; tg.dot_general, tg.matmul and tg.gemm thread it in and
reject what lax rejects with lax's exception; jvp, grad (the transposes assign a pair to the
backward products' operands as lax's dot_general transpose does), grad of grad and vmap carry
it; over a mesh it passes through the partitioner; on CPU the numerics do not change (float16 /
bfloat16 products are exact in the float32 accumulator at any precision). CPU only.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_tcgemm as tg
from jax_tcgemm.primitive import tcgemm, tcgemm_p
from jax_tcgemm.problem import canonical_precision, swap_precision

from conftest import assert_close, f64, rand, ref64
from test_cpu import prims

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
LAX_DOT = lax.dot_general  # the original (test_dropin_cpu monkeypatches it in one test)
JNP_MATMUL = jnp.matmul
Prec, Preset = lax.Precision, lax.DotAlgorithmPreset
DN = (((1,), (0,)), ((), ()))
M, N, K = 5, 7, 9  # distinct: a product's cotangent operand is the one shaped (M, N)
ASYM_ALGO = lax.DotAlgorithm(lhs_precision_type=jnp.float32, rhs_precision_type=jnp.bfloat16,
                             accumulation_type=jnp.float32, lhs_component_count=1,
                             rhs_component_count=3)

# Every form lax takes: None, a name, a Precision, pairs of Precisions and of names, presets
# and their names, a DotAlgorithm.
FORMS = [None, "highest", "float32", "high", "bfloat16_3x", "tensorfloat32", "default",
         "bfloat16", "fastest", Prec.DEFAULT, Prec.HIGH, Prec.HIGHEST,
         (Prec.DEFAULT, Prec.HIGHEST), (Prec.HIGHEST, Prec.HIGH), ("high", "highest"),
         ["default", "highest"], Preset.F32_F32_F32, Preset.BF16_BF16_F32_X3, Preset.DEFAULT,
         "F32_F32_F32", "TF32_TF32_F32", ASYM_ALGO]
FORM_IDS = [repr(f) if not isinstance(f, lax.DotAlgorithm) else "DotAlgorithm" for f in FORMS]
# What lax rejects (ValueError; TypeError for a list of Precisions, unhashable, and for a
# preset's name in a pair).
INVALID = ["bogus", (1, 2, 3), 7, 1.5, ("high", "low", "x"), (Prec.HIGH,), object(),
           (None, Prec.HIGH), ("bogus", "high"), ("F32_F32_F32", "high"),
           [Prec.HIGH, Prec.HIGHEST], {"lhs": Prec.HIGH}]
# Pairs and forms for the transposes: symmetric, asymmetric in both orders, a preset, and an
# asymmetric DotAlgorithm.
AD_FORMS = [Prec.HIGHEST, (Prec.DEFAULT, Prec.HIGHEST), (Prec.HIGHEST, Prec.HIGH),
            Preset.F32_F32_F32, ASYM_ALGO]
AD_IDS = ["HIGHEST", "DEFAULT,HIGHEST", "HIGHEST,HIGH", "F32_F32_F32", "DotAlgorithm"]
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
LAYOUT_IDS = ["NN", "NT", "TN", "TT"]


@pytest.fixture(autouse=True)
def _on_cpu():  # the CPU lowering, also on a GPU host
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def lax_param(precision, dtype=F16):
    """What lax.dot_general keeps in its eqn's params for `precision`."""
    s = jax.ShapeDtypeStruct((4, 8), dtype), jax.ShapeDtypeStruct((8, 3), dtype)
    jx = jax.make_jaxpr(lambda x, y: LAX_DOT(x, y, DN, precision=precision))(*s)
    (e,) = [e for e in jx.eqns if e.primitive.name == "dot_general"]
    return e.params["precision"]


def tcgemm_params(fn, *args):
    return [e.params["precision"] for e in prims(jax.make_jaxpr(fn)(*args), "tcgemm")]


def entry_points():
    """(name, fn(a (M, K), b (K, N), precision)) of each public entry point."""
    return [("dot_general", lambda x, y, p: tg.dot_general(x, y, DN, precision=p)),
            ("matmul", lambda x, y, p: tg.matmul(x, y, precision=p)),
            ("gemm", lambda x, y, p: tg.gemm(x, y, precision=p)),
            ("gemm_epilogue", lambda x, y, p: tg.gemm(
                x, y, jnp.ones((M, N), F32), beta=0.5, bias=jnp.arange(N, dtype=F32),
                activation="gelu", out_dtype=F32, precision=p))]


ENTRY_IDS = [name for name, _ in entry_points()]
ENTRY = dict(entry_points())


def operands(tag, dt=F16, ta=False, tb=False):
    a = rand(("prec-a", tag), (K, M) if ta else (M, K), dt, scale=K ** -0.5)
    b = rand(("prec-b", tag), (N, K) if tb else (K, N), dt)
    return a, b


# ---------------------------------------------------------------------------------------------
# The param: lax's canonical form, for every form and every entry point.

@pytest.mark.parametrize("precision", FORMS, ids=FORM_IDS)
def test_canonical_form_is_lax(precision):
    """canonical_precision gives exactly (==, same type, hashable) what lax keeps: None, a
    tuple of two lax.Precision, a DotAlgorithmPreset or the DotAlgorithm."""
    want = lax_param(precision)
    got = canonical_precision(precision)
    assert got == want and type(got) is type(want), (got, want)
    hash(got)
    assert canonical_precision(got) == got  # idempotent


@pytest.mark.parametrize("precision", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("entry", ENTRY_IDS)
def test_params_hold_precision(entry, precision):
    a, b = operands("params")
    if entry == "matmul":  # jnp.matmul's precision is a static argument: no list
        try:
            jax.eval_shape(lambda x, y: JNP_MATMUL(x, y, precision=precision), a, b)
        except Exception as e:
            with pytest.raises(type(e)):
                tg.matmul(a, b, precision=precision)
            return
    (got,) = tcgemm_params(lambda x, y: ENTRY[entry](x, y, precision), a, b)
    want = lax_param(precision)
    assert got == want and type(got) is type(want), (entry, got, want)


@pytest.mark.parametrize("precision", ["highest", Prec.HIGH, (Prec.DEFAULT, Prec.HIGHEST),
                                       Preset.F32_F32_F32], ids=str)
def test_binder_and_batched_paths(precision):
    """The binder, and tg.gemm's batched forms (a shared b folded into M; both batched)."""
    want = canonical_precision(precision)
    a, b = operands("binder")
    assert tcgemm_params(lambda x, y: tcgemm(x[None], y[None], precision=precision), a, b) == [want]
    x3 = rand(("prec-x3",), (3, M, K), F16)
    assert tcgemm_params(lambda x, y: tg.gemm(x, y, precision=precision), x3, b) == [want]
    y3 = rand(("prec-y3",), (3, K, N), F16)
    assert tcgemm_params(lambda x, y: tg.matmul(x, y, precision=precision), x3, y3) == [want]


@pytest.mark.parametrize("default", ["highest", "tensorfloat32", "F32_F32_F32"])
def test_none_follows_default_matmul_precision(default):
    """precision=None under jax.default_matmul_precision is that default, as lax keeps it."""
    a, b = operands("default")
    with jax.default_matmul_precision(default):
        want = lax_param(None)
        assert want is not None
        for name, fn in entry_points():
            assert tcgemm_params(lambda x, y: fn(x, y, None), a, b) == [want], name


def test_abstract_eval_wants_the_canonical_form():
    """tcgemm_p.bind with a precision not in canonical form fails at trace time."""
    x, y = jnp.ones((1, 4, 8), F16), jnp.ones((1, 8, 3), F16)
    params = dict(transpose_a=False, transpose_b=False, out_dtype=F16, alpha=1.0, beta=0.0,
                  activation="none", has_c=False, has_bias=False, has_scale=False, aux=False,
                  plan=None, overwrite_c=False)
    for bad in ("highest", Prec.HIGHEST, ("high", "high"), (Prec.HIGH, "high")):
        with pytest.raises(ValueError, match="precision"):
            tcgemm_p.bind(x, y, **params, precision=bad)
    assert tcgemm_p.bind(x, y, **params, precision=(Prec.HIGH, Prec.DEFAULT))[0].shape == (1, 4, 3)


# ---------------------------------------------------------------------------------------------
# Validation: lax's exceptions.

@pytest.mark.parametrize("precision", INVALID, ids=repr)
def test_invalid_precision_raises_as_lax(precision):
    """tg.dot_general and tg.gemm raise what lax.dot_general raises; tg.matmul what
    jnp.matmul raises (they differ on an unhashable list); the binder what lax does."""
    a, b = operands("invalid")
    with pytest.raises(Exception) as lax_err:
        LAX_DOT(a, b, DN, precision=precision)
    with pytest.raises(Exception) as jnp_err:
        JNP_MATMUL(a, b, precision=precision)
    for fn, err in [(lambda: tg.dot_general(a, b, DN, precision=precision), lax_err),
                    (lambda: tg.gemm(a, b, precision=precision), lax_err),
                    (lambda: tg.gemm(a, b, activation="relu", precision=precision), lax_err),
                    (lambda: jax.jit(lambda x, y: tg.gemm(x, y, precision=precision))(a, b),
                     lax_err),
                    (lambda: tg.matmul(a, b, precision=precision), jnp_err),
                    (lambda: tcgemm(a[None], b[None], precision=precision), lax_err)]:
        with pytest.raises(Exception) as ours:
            fn()
        assert type(ours.value) is type(err.value), (ours.value, err.value)


# ---------------------------------------------------------------------------------------------
# Transformations: jvp, grad (lax's assignment of a pair), grad of grad, vmap.

def test_lax_transpose_assignment():
    """The premise of _transpose: lax's backward products of dot_general are
    dot_general(cotangent, other operand) with the forward's precision unchanged, so the
    cotangent takes the forward's lhs part and the other operand its rhs part."""
    pair = (Prec.DEFAULT, Prec.HIGHEST)
    a, b = operands("lax-premise", F32)
    f = lambda x, y: LAX_DOT(x, y, DN, precision=pair).sum()  # noqa: E731
    dots = [e for e in jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(a, b).eqns
            if e.primitive.name == "dot_general"]
    assert len(dots) == 3 and all(e.params["precision"] == pair for e in dots)
    for e in dots[1:]:
        assert e.invars[0].aval.shape == (M, N)  # the cotangent is the lhs


def assert_lax_assignment(jaxpr, precision, n_products):
    """Every tcgemm eqn carries `precision`; in those with the cotangent as an operand (shaped
    (., M, N); M, N, K distinct), lax's assignment: its part is the forward's lhs part, so the
    eqn holds the precision as is where the cotangent is a, swapped where it is b."""
    want = canonical_precision(precision)
    gemms = prims(jaxpr, "tcgemm")
    assert len(gemms) == n_products, [str(e) for e in gemms]
    swapped = 0
    for e in gemms:
        got = e.params["precision"]
        shapes = [v.aval.shape[1:] for v in e.invars[:2]]
        if shapes[1] == (M, N) and shapes[0] != (M, N):  # the cotangent is b
            assert got == swap_precision(want), (shapes, got, want)
            swapped += 1
        else:
            assert got == want, (shapes, got, want)
    return swapped


@pytest.mark.parametrize("precision", AD_FORMS, ids=AD_IDS)
@pytest.mark.parametrize("entry", ENTRY_IDS)
def test_grad_jaxpr_carries_precision(entry, precision):
    a, b = operands("grad")
    f = lambda x, y: ENTRY[entry](x, y, precision).astype(F32).sum()  # noqa: E731
    jx = jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(a, b)
    assert_lax_assignment(jx, precision, 3)


@pytest.mark.parametrize("precision", AD_FORMS, ids=AD_IDS)
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
def test_grad_jaxpr_layouts(ta, tb, precision):
    """Every layout of tg.gemm: dA and dB each have the cotangent as a or as b (one of the two
    backward products swaps, as lax's transpose implies), and a DotAlgorithm's lhs / rhs
    types and component counts swap with it."""
    a, b = operands(("layouts", ta, tb), BF16, ta, tb)
    f = lambda x, y: tg.gemm(x, y, transpose_a=ta, transpose_b=tb, precision=precision,  # noqa: E731
                             out_dtype=F32).sum()
    swapped = assert_lax_assignment(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(a, b),
                                    precision, 3)
    # cotangent as b: dA when transpose_a (op(B) . dC^T), dB when not transpose_b (op(A)^T . dC)
    assert swapped == int(ta) + int(not tb)


def test_swap_precision():
    assert swap_precision(None) is None
    assert swap_precision((Prec.DEFAULT, Prec.HIGHEST)) == (Prec.HIGHEST, Prec.DEFAULT)
    assert swap_precision(Preset.BF16_BF16_F32_X3) is Preset.BF16_BF16_F32_X3
    s = swap_precision(ASYM_ALGO)
    assert isinstance(s, lax.DotAlgorithm)
    assert (s.lhs_precision_type, s.rhs_precision_type) == (jnp.bfloat16, jnp.float32)
    assert (s.lhs_component_count, s.rhs_component_count) == (3, 1)
    assert swap_precision(s) == ASYM_ALGO


@pytest.mark.parametrize("precision", AD_FORMS, ids=AD_IDS)
def test_grad_through_dot_general_dims(precision):
    """tg.dot_general with batch dims and a contraction that maps to both layout flags."""
    x = rand(("dg-x",), (2, K, M), BF16)   # (batch, contracting, free): transpose_a
    y = rand(("dg-y",), (2, N, K), BF16)   # (batch, free, contracting): transpose_b
    dims = (((1,), (2,)), ((0,), (0,)))
    f = lambda x, y: tg.dot_general(x, y, dims, precision=precision,  # noqa: E731
                                    preferred_element_type=F32).sum()
    assert_lax_assignment(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(x, y), precision, 3)


@pytest.mark.parametrize("precision", AD_FORMS, ids=AD_IDS)
def test_jvp_jaxpr_keeps_precision_as_is(precision):
    """Tangent products keep the operands' places (op(ta) . op(b), op(a) . op(tb)): the
    precision as is in all of them, as in lax's JVP."""
    a, b = operands("jvp")
    c, bias = jnp.ones((M, N), F32), jnp.arange(N, dtype=F32)
    f = lambda x, y: tg.gemm(x, y, c, beta=0.5, bias=bias, activation="silu",  # noqa: E731
                             precision=precision)
    jx = jax.make_jaxpr(lambda p, t: jax.jvp(f, p, t))((a, b), (a, b))
    want = canonical_precision(precision)
    got = [e.params["precision"] for e in prims(jx, "tcgemm")]
    assert len(got) == 3 and all(g == want for g in got), got


def test_traced_alpha_jvp_keeps_precision():
    """The d(alpha) term's extra product carries it too."""
    a, b = operands("alpha")
    pair = (Prec.HIGH, Prec.HIGHEST)
    f = lambda al, x: tg.gemm(x, b, alpha=al, out_dtype=F32, precision=pair)  # noqa: E731
    jx = jax.make_jaxpr(lambda al, x: jax.jvp(f, (al, x), (al, x)))(jnp.float32(2), a)
    got = [e.params["precision"] for e in prims(jx, "tcgemm")]
    assert len(got) == 3 and all(g == pair for g in got), got


@pytest.mark.parametrize("precision", [(Prec.DEFAULT, Prec.HIGHEST), ASYM_ALGO],
                         ids=["pair", "DotAlgorithm"])
def test_grad_of_grad_carries_precision(precision):
    a, b = operands("gradgrad", F16)
    want = canonical_precision(precision)

    def f(x, y):
        return jnp.sum(tg.gemm(x, y, activation="gelu", out_dtype=F32, precision=precision) ** 2)
    g = lambda x, y: jnp.sum(jax.grad(f)(x, y).astype(F32) ** 2)  # noqa: E731
    jx = jax.make_jaxpr(jax.grad(g, argnums=(0, 1)))(a, b)
    got = {e.params["precision"] for e in prims(jx, "tcgemm")}
    assert got <= {want, swap_precision(want)} and want in got, got


@pytest.mark.parametrize("precision", [(Prec.DEFAULT, Prec.HIGHEST), Preset.F32_F32_F32],
                         ids=["pair", "preset"])
def test_vmap_keeps_precision(precision):
    """vmap (one product, the batch folded in), vmap of grad, and grad of vmap."""
    want = canonical_precision(precision)
    xs = rand(("vmap-x",), (3, M, K), F16)
    _, b = operands("vmap")
    f = lambda x, y: tg.dot_general(x, y, DN, precision=precision)  # noqa: E731
    assert tcgemm_params(jax.vmap(f, in_axes=(0, None)), xs, b) == [want]
    ys = rand(("vmap-y",), (3, K, N), F16)
    assert tcgemm_params(jax.vmap(f), xs, ys) == [want]
    loss = lambda x, y: f(x, y).astype(F32).sum()  # noqa: E731
    jx = jax.make_jaxpr(jax.vmap(jax.grad(loss, argnums=(0, 1))))(xs, ys)
    assert_lax_assignment(jx, precision, 3)
    jx = jax.make_jaxpr(jax.grad(lambda x, y: jax.vmap(loss)(x, y).sum(), argnums=(0, 1)))(xs, ys)
    assert_lax_assignment(jx, precision, 3)


def test_vmap_traced_alpha_keeps_precision():
    """vmap with a per-item alpha (a loop of products): each keeps the precision."""
    a, b = operands("vmap-alpha")
    pair = (Prec.HIGHEST, Prec.DEFAULT)
    f = lambda al: tg.gemm(a, b, alpha=al, precision=pair)  # noqa: E731
    got = tcgemm_params(jax.vmap(f), jnp.arange(3, dtype=F32))
    assert got == [pair]


# ---------------------------------------------------------------------------------------------
# Numerics on CPU: unchanged (float16 / bfloat16 products are exact in float32).

NUMERIC_FORMS = ["default", Prec.HIGH, "highest", (Prec.DEFAULT, Prec.HIGHEST),
                 Preset.F32_F32_F32, Preset.BF16_BF16_F32_X3, "TF32_TF32_F32", ASYM_ALGO]


@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
def test_numerics_unchanged(dt):
    """Every canonical kind of precision gives bitwise the precision=None result (presets lax
    cannot run on CPU, as TF32_TF32_F32, included: the reference computes half-precision
    products at HIGHEST), close to lax at HIGHEST, and so do the gradients."""
    a, b = operands(("num", dt.name), dt)
    c, bias = rand(("num-c",), (M, N), F32), rand(("num-bias",), (N,), F32)

    @functools.partial(jax.jit, static_argnums=2)
    def run(a, b, precision):
        fns = [lambda x, y: tg.dot_general(x, y, DN, precision=precision,
                                           preferred_element_type=F32),
               lambda x, y: tg.matmul(x, y, out_dtype=F32, precision=precision),
               lambda x, y: tg.gemm(x, y, c, beta=0.5, bias=bias, activation="gelu",
                                    out_dtype=F32, precision=precision)]
        return [fn(a, b) for fn in fns] + [
            jax.grad(lambda x, y, fn=fn: fn(x, y).sum(), argnums=(0, 1))(a, b) for fn in fns]

    base = run(a, b, None)
    want = LAX_DOT(a, b, DN, precision=Prec.HIGHEST, preferred_element_type=F32)
    assert_close(base[0], ref64(a, b), F32, K)
    np.testing.assert_allclose(f64(base[0]), f64(want), rtol=1e-6, atol=1e-6)
    for precision in NUMERIC_FORMS:
        got = run(a, b, precision)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(base)):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(f64(x), f64(y), err_msg=repr(precision))


def test_reference_precision_for_float32_operands():
    """The reference (the lowering off CUDA) computes half-precision operands at HIGHEST
    whatever the param, and passes the param to lax for float32 operands (the later float32
    kernels'): a preset XLA:CPU lacks fails there, as in lax."""
    from jax_tcgemm import primitive
    kw = dict(transpose_a=False, transpose_b=False, out_dtype=F32)
    h = rand(("ref-a",), (1, M, K), F16), rand(("ref-b",), (1, K, N), F16)
    tf32 = Preset.TF32_TF32_F32
    np.testing.assert_array_equal(
        primitive.reference(*h, **kw, precision=tf32)[0], primitive.reference(*h, **kw)[0])
    f = tuple(x.astype(F32) for x in h)
    with pytest.raises(ValueError, match="TF32_TF32_F32"):
        jax.jit(lambda x, y: primitive.reference(x, y, **kw, precision=tf32))(*f)
    with pytest.raises(ValueError, match="TF32_TF32_F32"):
        jax.jit(lambda x, y: LAX_DOT(x[0], y[0], DN, precision=tf32))(*f)
    out = primitive.reference(*f, **kw, precision=(Prec.HIGHEST, Prec.HIGHEST))[0]
    np.testing.assert_allclose(f64(out), ref64(*h), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Over a mesh: the param reaches the partitioner's local products (hashable, static).

@pytest.mark.parametrize("spec_a,spec_b", [(P("d"), P("d")), (P(None, None, "d"), P(None, "d"))],
                         ids=["batch", "K"])
def test_sharded_with_precision(spec_a, spec_b):
    mesh = jax.make_mesh((2,), ("d",), axis_types=(AxisType.Explicit,),
                         devices=jax.devices("cpu")[:2])
    a, b = rand(("mesh-a",), (2, M, 8), BF16), rand(("mesh-b",), (2, 8, N), BF16)
    pair = (Prec.DEFAULT, Prec.HIGHEST)
    x = jax.device_put(a, NamedSharding(mesh, spec_a))
    y = jax.device_put(b, NamedSharding(mesh, spec_b))
    f = jax.jit(lambda x, y: tcgemm(x, y, out_dtype=F32, precision=pair))
    assert "CustomSPMDPartitioning" in f.lower(x, y).as_text()
    assert_close(f(x, y), ref64(a, b), F32, 8, str(spec_a))
    np.testing.assert_allclose(f64(f(x, y)), f64(tcgemm(a, b, out_dtype=F32)), rtol=1e-6,
                               atol=1e-6)  # K sharded: a psum of partial products
    g = jax.jit(jax.grad(lambda x, y: tg.gemm(x, y, out_dtype=F32, precision=pair).sum()))(x, y)
    np.testing.assert_allclose(f64(g), f64(jax.grad(
        lambda x: tg.gemm(x, b, out_dtype=F32).sum())(a)), rtol=1e-2, atol=1e-2)
