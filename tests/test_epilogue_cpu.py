"""CPU tests of tg.gemm, the fused epilogue D = act(alpha * op(a) @ op(b) + beta * c + bias).

* Numerics of the CPU lowering (lax) against float64 numpy: every activation, every C form
  (full, per-row, per-column, with and without batch dims, float32 or out_dtype), bias, alpha /
  beta static and traced, layouts, leading batch dims, f16/bf16 in, f16/bf16/f32 out.
* AD against float64 formulas and against jax's AD of the plain jnp composite: grad wrt a, b,
  bias, c and traced alpha / beta, jvp, vmap, vmap(grad), grad(grad); gradients keep the input
  dtypes.
* Jaxprs: every product is a tcgemm primitive; the forward under grad is one tcgemm with aux;
  the backward's activation derivative and bias gradient are one tcgemm_dact (no reduce_sum).
* Trace-time errors, and the CUDA custom call's epilogue attributes (needs the extension).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import jax_tcgemm as tg
from jax_tcgemm import _ffi
from jax_tcgemm.primitive import tcgemm

from conftest import (act64, act_grad64 as dact64, assert_close, bound, epilogue_ref64, f64, rand,
                      rel_err)
from test_cpu import NO_MODULE, custom_calls, eqns, prims

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
ACTS = (None, "relu", "gelu", "gelu_tanh", "silu")
ACT_IDS = [str(a) for a in ACTS]
DOT_LIKE = {"dot_general", "ragged_dot", "ragged_dot_general", "conv_general_dilated"}
M, N, K = 7, 10, 24  # no tile multiples
S = jax.ShapeDtypeStruct


@pytest.fixture(autouse=True)
def _on_cpu():  # the CPU lowering, also on a GPU host
    with jax.default_device(jax.devices("cpu")[0]):
        yield


# ---------------------------------------------------------------------------------------------
# float64 references (act64, dact64: conftest.py).

_S2PI, _C = np.sqrt(2 / np.pi), 0.044715


def d2act64(name, x):
    """act''(x) (0 for none and relu, almost everywhere)."""
    if name in (None, "none", "relu"):
        return np.zeros_like(x)
    if name == "gelu":
        return np.exp(-x * x / 2) / np.sqrt(2 * np.pi) * (2 - x * x)
    if name == "gelu_tanh":
        t, du = np.tanh(_S2PI * (x + _C * x ** 3)), _S2PI * (1 + 3 * _C * x * x)
        return (1 - t * t) * du + 0.5 * x * (1 - t * t) * (6 * _S2PI * _C * x - 2 * t * du * du)
    if name == "silu":
        s = 1 / (1 + np.exp(-x))
        return s * (1 - s) * (2 + x * (1 - 2 * s))
    raise ValueError(name)


def pre64(a, b, c=None, **kw):
    """alpha * op(a) @ op(b) + beta * c + bias in float64 (numpy broadcasting)."""
    return epilogue_ref64(a, b, c, **kw)[1]


def gemm64(a, b, c=None, **kw):
    return epilogue_ref64(a, b, c, **kw)[0]


def composite(a, b, c=None, *, alpha=1.0, beta=0.0, bias=None, activation=None,
              transpose_a=False, transpose_b=False, out_dtype=None):
    """The same thing as plain jnp (what tg.gemm replaces)."""
    op = lambda x, t: jnp.swapaxes(x, -1, -2) if t else x  # noqa: E731
    p = alpha * jnp.matmul(op(a, transpose_a), op(b, transpose_b), preferred_element_type=F32)
    if c is not None:
        p = p + beta * c.astype(F32)
    if bias is not None:
        p = p + bias.astype(F32)
    if activation == "relu":
        p = jax.nn.relu(p)
    elif activation in ("gelu", "gelu_tanh"):
        p = jax.nn.gelu(p, approximate=activation == "gelu_tanh")
    elif activation == "silu":
        p = jax.nn.silu(p)
    return p.astype(a.dtype if out_dtype is None else out_dtype)


def operands(tag, dt=F16, a_shape=(M, K), b_shape=(K, N)):
    """a, b of dtype dt, scaled so that pre-activations are O(1) (every activation bends)."""
    return (rand((tag, "a", dt.name, a_shape), a_shape, dt, scale=K ** -0.5),
            rand((tag, "b", dt.name, b_shape), b_shape, dt))


def test_reference_derivatives():
    """dact64 and d2act64 are the derivatives of act64 (central differences)."""
    x, h = np.linspace(-4, 4, 101) + 0.013, 1e-5
    for name in ACTS:
        fd1 = (act64(name, x + h) - act64(name, x - h)) / (2 * h)
        fd2 = (dact64(name, x + h) - dact64(name, x - h)) / (2 * h)
        np.testing.assert_allclose(dact64(name, x), fd1, rtol=1e-6, atol=1e-8, err_msg=str(name))
        np.testing.assert_allclose(d2act64(name, x), fd2, rtol=1e-5, atol=1e-8, err_msg=str(name))


# ---------------------------------------------------------------------------------------------
# Numerics.

@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
@pytest.mark.parametrize("act", ACTS, ids=ACT_IDS)
def test_activation_and_dtypes(act, dt):
    """Every activation, with full float32 C, bias, alpha and beta, into every output type;
    and the activation alone."""
    a, b = operands(("act", act), dt)
    c, bias = rand(("act_c", act), (M, N), F32), rand(("act_bias", act), (N,), F32)
    outs = jax.jit(lambda a, b, c, bias: [
        tg.gemm(a, b, c, alpha=1.1, beta=-0.6, bias=bias, activation=act, out_dtype=o)
        for o in (None, F16, BF16, F32)] + [tg.gemm(a, b, activation=act, out_dtype=F32)])(
        a, b, c, bias)
    want = gemm64(a, b, c, alpha=1.1, beta=-0.6, bias=bias, activation=act)
    for out, o in zip(outs, (dt, F16, BF16, F32)):
        assert out.shape == (M, N) and out.dtype == o
        assert_close(out, want, o, K, f"{act} {dt}->{o}")
    assert_close(outs[-1], gemm64(a, b, activation=act), F32, K, f"{act} alone")


C_SHAPES = [(M, N), (M, 1), (N,), (1, N), (), (3, M, N), (3, 1, N), (3, M, 1), (1, M, N),
            (1, 1, N)]


@pytest.mark.parametrize("c_shape", C_SHAPES, ids=str)
def test_c_forms(c_shape):
    """C broadcast to the (3, M, N) result: full, per-row, per-column, scalar, with or without
    batch dims; float32 or of the output type (f16, bf16), and f32 C into f32 out."""
    ops = {dt: operands(("cf", c_shape), dt, (3, M, K), (K, N)) for dt in (F16, BF16)}
    cases = [(BF16, F32, BF16), (BF16, BF16, BF16), (F16, F16, F16), (F16, F32, F32),
             (F16, F32, F16)]  # (operand type, c type, out type)
    cs = [rand(("cf_c", c_shape, ct.name), c_shape, ct) for _, ct, _ in cases]
    outs = jax.jit(lambda ops, cs: [
        tg.gemm(*ops[dt], c, alpha=0.9, beta=1.3, out_dtype=o)
        for c, (dt, _, o) in zip(cs, cases)])(ops, cs)
    for out, c, (dt, ct, o) in zip(outs, cs, cases):
        assert out.shape == (3, M, N) and out.dtype == o
        assert_close(out, gemm64(*ops[dt], c, alpha=0.9, beta=1.3), o, K,
                     f"c{c_shape} {ct} {dt}->{o}")


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["NN", "NT", "TN", "TT"])
def test_layouts_and_batch_dims(ta, tb):
    """transpose_a / transpose_b with leading batch dims that broadcast (a shared, b shared,
    both batched, (2, 1) x (3,)); per-column C, bias, relu."""
    kw = dict(transpose_a=ta, transpose_b=tb, alpha=1.5, beta=0.5, activation="relu")
    cases = []
    for ba, bb in [((), ()), ((3,), ()), ((), (3,)), ((3,), (3,)), ((2, 1), (3,))]:
        a_shape = ba + ((K, M) if ta else (M, K))
        b_shape = bb + ((N, K) if tb else (K, N))
        a, b = operands(("lay", ta, tb, ba, bb), BF16, a_shape, b_shape)
        c, bias = rand(("lay_c", ba, bb), (N,), F32), rand(("lay_b", ba, bb), (N,), F32)
        cases.append((a, b, c, bias))
    outs = jax.jit(lambda cases: [tg.gemm(a, b, c, bias=bias, out_dtype=F32, **kw)
                                  for a, b, c, bias in cases])(cases)
    for out, (a, b, c, bias) in zip(outs, cases):
        ba, bb = a.shape[:-2], b.shape[:-2]
        assert out.shape == np.broadcast_shapes(ba, bb) + (M, N)
        assert_close(out, gemm64(a, b, c, bias=bias, **kw), F32, K, f"{ta}{tb} {ba} {bb}")


def test_bias_forms_and_dtypes():
    """bias alone (no C), of float32 or a half type (added in float32), and with C."""
    a, b = operands(("bias",), F16, (2, M, K))
    for bias_dt in (F32, F16, BF16):
        bias = rand(("bias", bias_dt.name), (N,), bias_dt)
        out = tg.gemm(a, b, bias=bias, activation="silu", out_dtype=F32)
        assert_close(out, gemm64(a, b, bias=bias, activation="silu"), F32, K, f"bias {bias_dt}")
    c = rand(("bias_c",), (M, 1), F16)
    out = tg.gemm(a, b, c, beta=2.0, bias=bias, out_dtype=F16)
    assert_close(out, gemm64(a, b, c, beta=2.0, bias=bias), F16, K, "bias and c")


def test_bias_reaches_the_product_in_its_dtype():
    """A float16 / bfloat16 / float32 bias is the primitive's operand as it is (the kernels read
    it and add it in float32: no conversion pass before the product); its gradient comes back
    in its dtype."""
    a, b = operands(("bias_dt",), BF16, (M, K))
    for bias_dt in (F32, F16, BF16):
        bias = rand(("bias_dt", bias_dt.name), (N,), bias_dt)
        f = lambda a, b, bias: tg.gemm(a, b, bias=bias, activation="gelu_tanh")  # noqa: E731
        jx = jax.make_jaxpr(f)(a, b, bias)
        (e,) = prims(jx, "tcgemm")
        assert e.invars[2].aval.dtype == bias_dt and e.invars[2].aval.shape == (1, N)
        assert not [q for q in eqns(jx) if q.primitive.name == "convert_element_type"], jx
        loss = lambda a, b, bias: jnp.sum(f(a, b, bias).astype(F32) ** 2)  # noqa: E731
        gb = jax.grad(loss, argnums=2)(a, b, bias)
        assert gb.dtype == bias_dt and gb.shape == (N,)
        want = jax.grad(lambda bias: jnp.sum(jax.nn.gelu(
            jnp.dot(a, b, preferred_element_type=F32) + bias.astype(F32), approximate=True) ** 2)
        )(bias)
        assert rel_err(gb, want) < 3e-2, bias_dt


def test_alpha_beta_static_and_traced():
    """alpha / beta as Python numbers (static params) and as traced float32 scalars under jit
    (one operand [alpha, beta]), either or both; numpy and jax scalars are arrays too."""
    a, b = operands(("ab",), BF16, (2, M, K))
    c = rand(("ab_c",), (2, M, N), F32)
    want = lambda al, be: gemm64(a, b, c, alpha=al, beta=be, activation="gelu")  # noqa: E731
    g = lambda a, b, c, al, be: tg.gemm(a, b, c, alpha=al, beta=be, activation="gelu",  # noqa: E731
                                        out_dtype=F32)
    for al, be in [(2, -1), (0.75, 1.25), (np.float32(0.75), 1.25), (0.75, jnp.float32(1.25)),
                   (jnp.float32(0.75), jnp.float16(1.25))]:
        assert_close(g(a, b, c, al, be), want(float(al), float(be)), F32, K, f"{al!r} {be!r}")
    traced = jax.jit(g)
    for al, be in [(0.5, 2.0), (-1.5, 0.25)]:
        out = traced(a, b, c, jnp.float32(al), jnp.float32(be))
        assert_close(out, want(al, be), F32, K, f"traced {al} {be}")
    (e,) = prims(jax.make_jaxpr(g)(a, b, c, jnp.float32(1), jnp.float32(2)), "tcgemm")
    assert e.params["has_scale"] and len(e.invars) == 4  # a, b, c, [alpha, beta]
    (e,) = prims(jax.make_jaxpr(lambda a, b, c: g(a, b, c, 0.5, 2.0))(a, b, c), "tcgemm")
    assert not e.params["has_scale"] and (e.params["alpha"], e.params["beta"]) == (0.5, 2.0)


# ---------------------------------------------------------------------------------------------
# AD.

GRAD_CASES = [  # (in dtype, out dtype, c shape, c dtype)
    (F16, F32, (2, M, N), F32), (BF16, BF16, (M, 1), BF16), (F16, F16, (N,), F32)]


def grads64(a, b, c, bias, w, act, alpha, beta):
    """float64 gradients of sum(w * gemm(a, b, c, bias)) wrt a, b (shared: summed over the
    batch), bias, c (summed to its shape)."""
    p = pre64(a, b, c, alpha=alpha, beta=beta, bias=bias)
    g = f64(w) * dact64(act, p)
    da = alpha * g @ np.swapaxes(f64(b), -1, -2)
    db = (alpha * np.swapaxes(f64(a), -1, -2) @ g).reshape(-1, K, N).sum(0)
    dbias = g.reshape(-1, N).sum(0)
    return da, db, dbias, sum_to(beta * g, np.shape(c))


def sum_to(x, shape):
    """x summed down to a shape that broadcasts to it."""
    x = x.sum(tuple(range(x.ndim - len(shape))))
    return x.sum(tuple(i for i, s in enumerate(shape) if s == 1), keepdims=True)


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: f"{c[0]}-{c[1]}-c{c[2]}{c[3]}")
@pytest.mark.parametrize("act", ACTS, ids=ACT_IDS)
def test_grad_vs_composite(act, case):
    """jax.grad wrt a, b, bias and c equals the float64 gradient and jax.grad of the jnp
    composite (up to the roundings both take); gradients keep the input dtypes."""
    dt, out, c_shape, c_dt = case
    a, b = operands(("gr", act, case), dt, (2, M, K))
    c, bias = rand(("gr_c", case), c_shape, c_dt), rand(("gr_bias", case), (N,), F32)
    w = rand(("gr_w", case), (2, M, N), out).astype(F32)  # the cotangent, exact in `out`
    kw = dict(alpha=1.25, beta=0.5, activation=act, out_dtype=out)

    def loss(fn):
        return lambda a, b, bias, c: jnp.sum(w * fn(a, b, c, bias=bias, **kw).astype(F32))
    ours = jax.jit(jax.grad(loss(tg.gemm), argnums=(0, 1, 2, 3)))(a, b, bias, c)
    theirs = jax.jit(jax.grad(loss(composite), argnums=(0, 1, 2, 3)))(a, b, bias, c)
    refs = grads64(a, b, c, bias, w, act, 1.25, 0.5)
    for got, jn, ref, x, what in zip(ours, theirs, refs, (a, b, bias, c), "a b bias c".split()):
        assert got.dtype == jn.dtype == x.dtype and got.shape == x.shape, what
        tol = 2 * max(bound(x.dtype if x.dtype != F32 else out, K), rel_err(jn, ref))
        assert rel_err(got, ref) <= tol, f"d{what}: {rel_err(got, ref):.3g} > {tol:.3g}"


def test_grad_traced_alpha_beta():
    """Gradients wrt traced alpha and beta: sum(G * op(a) @ op(b)) and sum(G * c)."""
    a, b = operands(("gab",), F16, (2, M, K))
    c, w = rand(("gab_c",), (M, N), F32), rand(("gab_w",), (2, M, N), F32)

    def loss(al, be, a, b):
        return jnp.sum(w * tg.gemm(a, b, c, alpha=al, beta=be, activation="gelu_tanh",
                                   out_dtype=F32))
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(jnp.float32(0.8), jnp.float32(1.5),
                                                            a, b)
    assert [g.dtype for g in grads] == [F32, F32, F16, F16]
    g = f64(w) * dact64("gelu_tanh", pre64(a, b, c, alpha=0.8, beta=1.5))
    ab = np.matmul(f64(a), f64(b))
    for got, terms, what in [(grads[0], g * ab, "alpha"), (grads[1], g * f64(c), "beta")]:
        assert abs(float(got) - terms.sum()) <= 1e-5 * np.abs(terms).sum(), what
    assert_close(grads[2], 0.8 * g @ f64(b).T, F16, N, "a")


@pytest.mark.parametrize("act", ACTS, ids=ACT_IDS)
def test_jvp(act):
    """jvp wrt a, b, c, bias: act'(pre) * (alpha (da b + a db) + beta dc + dbias)."""
    a, b = operands(("jvp", act), BF16, (2, M, K))
    c, bias = rand(("jvp_c", act), (M, N), F32), rand(("jvp_bias", act), (N,), F32)
    ts = [rand(("jvp_t", act, i), x.shape, x.dtype) for i, x in enumerate((a, b, c, bias))]
    f = lambda a, b, c, bias: tg.gemm(a, b, c, alpha=0.7, beta=1.1, bias=bias,  # noqa: E731
                                      activation=act, out_dtype=F32)
    out, tan = jax.jit(lambda p, t: jax.jvp(f, p, t))((a, b, c, bias), tuple(ts))
    p = pre64(a, b, c, alpha=0.7, beta=1.1, bias=bias)
    lin = (0.7 * (f64(ts[0]) @ f64(b) + f64(a) @ f64(ts[1])) + 1.1 * f64(ts[2]) + f64(ts[3]))
    assert out.dtype == tan.dtype == F32
    assert_close(out, act64(act, p), F32, K, "primal")
    assert_close(tan, dact64(act, p) * lin, F32, K, "tangent")


def test_vmap():
    """vmap over a, C (full and per-column), bias and a per-item alpha: every item equals its
    own product."""
    v = 3
    a, b = operands(("vm",), F16, (v, M, K))
    c, c_col = rand(("vm_c",), (v, M, N), F32), rand(("vm_cc",), (v, N), F16)
    bias, al = rand(("vm_bias",), (v, N), F32), jnp.asarray([0.5, -1.0, 2.0], F32)
    f = lambda a, c, bias, al: tg.gemm(a, b, c, alpha=al, beta=0.5, bias=bias,  # noqa: E731
                                       activation="gelu", out_dtype=F32)
    out = jax.jit(jax.vmap(f))(a, c, bias, al)
    out_col = jax.vmap(lambda a, c, bias: tg.gemm(a, b, c, beta=2.0, bias=bias, out_dtype=F16),
                       in_axes=(0, 0, None))(a, c_col, bias[0])
    for i in range(v):
        assert_close(out[i], gemm64(a[i], b, c[i], alpha=float(al[i]), beta=0.5, bias=bias[i],
                                    activation="gelu"), F32, K, f"item {i}")
        assert_close(out_col[i], gemm64(a[i], b, c_col[i], beta=2.0, bias=bias[0]), F16, K,
                     f"per-column item {i}")
    jx = jax.make_jaxpr(jax.vmap(lambda a, c, bias: f(a, c, bias, 0.5)))(a, c, bias)
    assert len(prims(jx, "tcgemm")) == 1  # the vmapped axis folds into the kernel's batch


@pytest.mark.parametrize("act", ["gelu_tanh", "relu"])
def test_vmap_of_grad(act):
    """Per-example gradients (vmap of grad) wrt a and bias, with a shared b."""
    v = 4
    a, b = operands(("vg", act), BF16, (v, M, K))
    bias, w = rand(("vg_bias", act), (v, N), F32), rand(("vg_w", act), (M, N), F32)

    def loss(a, bias):
        return jnp.sum(w * tg.gemm(a, b, bias=bias, activation=act, out_dtype=F32))
    da, dbias = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(a, bias)
    assert da.dtype == BF16 and dbias.dtype == F32 and dbias.shape == (v, N)
    for i in range(v):
        g = f64(w) * dact64(act, pre64(a[i], b, bias=bias[i]))
        assert_close(da[i], g @ f64(b).T, BF16, N, f"da {i}")
        assert_close(dbias[i], g.sum(0), F32, M, f"dbias {i}")
    jx = jax.make_jaxpr(jax.vmap(jax.grad(loss, argnums=(0, 1))))(a, bias)
    assert not [e for e in eqns(jx) if e.primitive.name in DOT_LIKE]
    assert len(prims(jx, "tcgemm_dact")) == 1


@pytest.mark.parametrize("act", [None, "gelu", "gelu_tanh", "silu"], ids=str)
def test_grad_of_grad(act):
    """Second derivative: grad of h = <V, d/da sum(W * gemm)> wrt a, b and bias, against the
    float64 formula and jax's grad of grad of the jnp composite."""
    a, b = operands(("gg", act), F16)
    bias = rand(("gg_bias", act), (N,), F32)
    w, vv = rand(("gg_w", act), (M, N), F32), rand(("gg_v", act), (M, K), F32)
    al = 1.5

    def h(fn):
        def inner(a, b, bias):
            ga = jax.grad(lambda a: jnp.sum(w * fn(a, b, bias=bias, alpha=al, activation=act,
                                                   out_dtype=F32)))(a)
            return jnp.sum(vv * ga.astype(F32))
        return jax.jit(jax.grad(inner, argnums=(0, 1, 2)))
    ours, theirs = h(tg.gemm)(a, b, bias), h(composite)(a, b, bias)
    A, B, W, V = f64(a), f64(b), f64(w), f64(vv)
    p = pre64(a, b, alpha=al, bias=bias)
    G, H = W * dact64(act, p), al * W * d2act64(act, p) * (V @ B)
    refs = (al * H @ B.T, al * A.T @ H + al * V.T @ G, H.sum(0))
    for got, jn, ref, x, what in zip(ours, theirs, refs, (a, b, bias), ("a", "b", "bias")):
        assert got.dtype == jn.dtype == x.dtype, what
        if not np.any(ref):  # act = None: h is linear in b alone
            assert not np.any(f64(got)), what
            continue
        # float16 cotangents on the way (the first gradient wrt a is float16): float16's bound
        tol = 2 * max(bound(F16), rel_err(jn, ref))
        assert rel_err(got, ref) <= tol, f"d{what}: {rel_err(got, ref):.3g} > {tol:.3g}"
    jx = jax.make_jaxpr(h(tg.gemm))(a, b, bias)
    assert prims(jx, "tcgemm") and not [e for e in eqns(jx) if e.primitive.name in DOT_LIKE]


@pytest.mark.parametrize("act", ACTS[1:], ids=ACT_IDS[1:])
def test_grad_at_large_pre_activations(act):
    """Pre-activations out to +-600 (silu's exp(-x) overflows float32 below -88, where the
    quotient's own derivative is inf / inf): the gradients of tg.gemm and tg.scaled_matmul (the
    kernel's formula, s (1 + x (1 - s))) are finite and match the float64 derivative."""
    x = jnp.asarray(np.linspace(-15.0, 15.0, 40 * 32).reshape(40, 32), F32)
    w = jnp.asarray(np.eye(32, 16) * 40.0, F32)
    p = f64(x) @ f64(w)
    got = jax.grad(lambda x: jnp.sum(tg.gemm(x, w, activation=act, out_dtype=F32)))(x)
    want = dact64(act, p) @ f64(w).T
    assert np.isfinite(f64(got)).all()
    np.testing.assert_allclose(f64(got), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    q = jnp.asarray(np.linspace(-15.0, 15.0, 40 * 32).reshape(40, 32), jnp.float8_e4m3fn)
    wq = jnp.asarray(np.eye(32, 16), jnp.float8_e4m3fn)
    pq = f64(q) @ f64(wq) * 40.0
    gs = jax.grad(lambda s: jnp.sum(tg.scaled_matmul(q, wq, s, 1.0, activation=act,
                                                     out_dtype=F32)))(jnp.float32(40.0))
    want_s = np.sum(dact64(act, pq) * pq / 40.0)
    assert np.isfinite(float(gs)) and abs(float(gs) - want_s) <= 1e-5 * np.abs(pq).sum()


# ---------------------------------------------------------------------------------------------
# Jaxprs of AD.

TRANSCENDENTAL = {"tanh", "erf", "erfc", "exp", "exp2", "logistic", "log1p", "log"}


@pytest.mark.parametrize("with_c", [False, True], ids=["bias", "bias_c"])
@pytest.mark.parametrize("act", ACTS, ids=ACT_IDS)
def test_grad_jaxpr_fused(act, with_c):
    """The vjp of gemm(x, w, [c], bias, act): one fused forward tcgemm, with aux=True (it
    writes pre) for an activation; one tcgemm_dact reading that pre (g and the bias gradient
    in one pass); the two gradient products as tcgemms; no dot_general, no reduce_sum, no
    activation math in XLA: nothing else but reshapes, except C's own gradient (beta * g in
    C's dtype: a convert and a multiply, which only produce that gradient)."""
    x, wt = S((2, M, K), BF16), S((K, N), BF16)
    bias, c = S((N,), F32), S((2, M, N), F32)
    f = lambda x, wt, bias, *c: tg.gemm(x, wt, *c, beta=1.0, bias=bias,  # noqa: E731
                                        activation=act)
    primals = (x, wt, bias) + ((c,) if with_c else ())
    jx = jax.make_jaxpr(lambda ct, *p: jax.vjp(f, *p)[1](ct))(S((2, M, N), BF16), *primals)
    names = {e.primitive.name for e in eqns(jx)}
    assert not names & DOT_LIKE and "reduce_sum" not in names and not names & TRANSCENDENTAL
    c_path = {"convert_element_type", "mul"} if with_c else set()
    assert names <= {"reshape", "tcgemm", "tcgemm_dact"} | c_path, names
    dc = jx.jaxpr.outvars[-1]
    for e in eqns(jx):
        if e.primitive.name in c_path:  # only on the way to dc
            assert e.outvars[0] is dc or any(
                e.outvars[0] in u.invars and u.primitive.name in c_path | {"reshape"}
                for u in eqns(jx)), e
    gemms = prims(jx, "tcgemm")
    assert len(gemms) == 3
    (fwd,) = [e for e in gemms if e.params["has_bias"]]
    assert fwd.params["activation"] == (act or "none") and fwd.params["has_c"] == with_c
    assert fwd.params["aux"] == (act is not None) and len(fwd.outvars) == 1 + fwd.params["aux"]
    for e in gemms:
        if e is not fwd:
            assert e.params["activation"] == "none" and not e.params["has_bias"]
    (dact,) = prims(jx, "tcgemm_dact")
    assert dact.params["has_dbias"] and dact.params["has_g"] == (act is not None)
    if act is not None:
        assert dact.invars[1] is fwd.outvars[1]  # reads the forward's pre-activation


def test_grad_jaxpr_every_product_is_ours():
    """make_jaxpr(grad(...)) of a small MLP of tg.gemm layers: every product a tcgemm."""
    x, w1, w2 = S((4, 16), F16), S((16, 32), F16), S((32, 8), F16)
    b1, b2 = S((32,), F32), S((8,), F32)

    def loss(x, w1, b1, w2, b2):
        h = tg.gemm(x, w1, bias=b1, activation="gelu_tanh")
        return jnp.sum(tg.gemm(h, w2, bias=b2, activation="silu", out_dtype=F32))
    jx = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(x, w1, b1, w2, b2)
    assert not [e for e in eqns(jx) if e.primitive.name in DOT_LIKE]
    # two fused forwards (aux), then dh, dw2, dx, dw1; the epilogues' backward: two tcgemm_dact
    assert len(prims(jx, "tcgemm")) == 2 + 4 and len(prims(jx, "tcgemm_dact")) == 2
    assert len([e for e in prims(jx, "tcgemm") if e.params["aux"]]) == 2


def test_jvp_jaxpr():
    """jvp: one forward tcgemm with aux, tangent products as tcgemms, the epilogue's tangent
    act'(pre) * (t + dbias) as tcgemm_dbcast."""
    f = lambda a, b, bias: tg.gemm(a, b, bias=bias, activation="gelu")  # noqa: E731
    args = (S((M, K), F16), S((K, N), F16), S((N,), F32))
    jx = jax.make_jaxpr(lambda p, t: jax.jvp(f, p, t))(args, args)
    gemms = prims(jx, "tcgemm")
    assert len([e for e in gemms if e.params["aux"]]) == 1 and len(gemms) == 3
    assert len(prims(jx, "tcgemm_dbcast")) == 1
    assert not [e for e in eqns(jx) if e.primitive.name in DOT_LIKE]


# ---------------------------------------------------------------------------------------------
# Errors: raised at trace time, naming shapes and dtypes.

def h(*shape, dt=F16):
    return jnp.ones(shape, dt)


ERRORS = [  # (id, thunk, exception, regex)
    ("c_shape", lambda: tg.gemm(h(2, 4, 8), h(8, 3), h(4, 2, dt=F32)), ValueError,
     r"c\(4, 2\) does not broadcast to the result \(2, 4, 3\).*a\(2, 4, 8\) float16"),
    ("c_batch_beyond_result", lambda: tg.gemm(h(4, 8), h(8, 3), h(2, 4, 3, dt=F32)), ValueError,
     r"c\(2, 4, 3\).*\(4, 3\)"),
    ("bias_shape", lambda: tg.gemm(h(4, 8), h(8, 3), bias=h(4, dt=F32)), ValueError,
     r"bias must have shape \(3,\).*\(4,\) float32"),
    ("bias_2d", lambda: tg.gemm(h(4, 8), h(8, 3), bias=h(1, 3, dt=F32)), ValueError,
     r"\(3,\).*\(1, 3\)"),
    ("bias_int", lambda: tg.gemm(h(4, 8), h(8, 3), bias=h(3, dt=np.int32)), TypeError, r"int32"),
    ("unknown_activation", lambda: tg.gemm(h(4, 8), h(8, 3), activation="tanh"), ValueError,
     r"unknown activation 'tanh'.*'relu'.*'silu'"),
    ("activation_case", lambda: tg.gemm(h(4, 8), h(8, 3), activation="GELU"),
     ValueError, r"'GELU'"),
    ("mixed_dtypes", lambda: tg.gemm(h(4, 8), h(8, 3, dt=BF16)), TypeError,
     r"float16, both bfloat16 or both float32.*a\(4, 8\) float16, b\(8, 3\) bfloat16"),
    ("int32_operands", lambda: tg.gemm(h(4, 8, dt=np.int32), h(8, 3, dt=np.int32)), TypeError,
     r"both float32; got a\(4, 8\) int32"),
    ("c_dtype", lambda: tg.gemm(h(4, 8), h(8, 3), h(4, 3, dt=BF16)), TypeError,
     r"c must be of out_dtype \(float16\) or float32; got bfloat16"),
    ("c_dtype_int", lambda: tg.gemm(h(4, 8), h(8, 3), h(4, 3, dt=np.int32), out_dtype=BF16),
     TypeError, r"\(bfloat16\) or float32; got int32"),
    ("alpha_vector", lambda: tg.gemm(h(4, 8), h(8, 3), alpha=h(2, dt=F32)), ValueError,
     r"alpha must be a scalar; got shape \(2,\)"),
    ("beta_matrix", lambda: tg.gemm(h(4, 8), h(8, 3), h(4, 3), beta=h(4, 3)), ValueError,
     r"beta must be a scalar; got shape \(4, 3\)"),
    ("k_mismatch", lambda: tg.gemm(h(4, 8), h(7, 3)), ValueError, r"K = 8 vs 7"),
    ("k_mismatch_transposed", lambda: tg.gemm(h(4, 8), h(8, 3), transpose_b=True), ValueError,
     r"K = 8 vs 3.*transpose_b=True"),
    ("rank1", lambda: tg.gemm(h(8), h(8, 3)), ValueError, r"rank >= 2.*a\(8,\)"),
    ("batch", lambda: tg.gemm(h(2, 4, 8), h(3, 8, 3)), ValueError,
     r"batch dimensions do not broadcast.*\(2, 4, 8\).*\(3, 8, 3\)"),
    ("out_dtype", lambda: tg.gemm(h(4, 8), h(8, 3), out_dtype=np.int8), TypeError, r"int8"),
]


@pytest.mark.parametrize("thunk,exc,pattern", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors(thunk, exc, pattern):
    with pytest.raises(exc, match=pattern):
        thunk()
    with pytest.raises(exc, match=pattern):  # at trace time, under jit too
        jax.jit(lambda: thunk())()


# ---------------------------------------------------------------------------------------------
# CUDA lowering from the CPU host (the custom call's epilogue attributes).

@pytest.fixture
def cuda_lowering():
    if not _ffi.available():
        pytest.skip(NO_MODULE)


def cuda_text(f, *args, **jit_kw):
    return jax.jit(f, **jit_kw).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _num(attr):  # "1.500000e+00 : f32" -> 1.5
    return float(attr.split(":")[0])


def test_cuda_lowering_epilogue_attributes(cuda_lowering):
    a, b, c, bias = S((2, M, K), F16), S((K, N), F16), S((M, N), F32), S((N,), F32)
    f = lambda a, b, c, bias: tg.gemm(a, b, c, alpha=1.5, beta=0.25, bias=bias,  # noqa: E731
                                      activation="gelu_tanh", out_dtype=BF16)
    (call,) = custom_calls(cuda_text(f, a, b, c, bias))
    assert (call["has_c"], call["has_bias"], call["has_scale"], call["aux"]) == (
        "true", "true", "false", "false")
    assert _num(call["alpha"]) == 1.5 and _num(call["beta"]) == 0.25
    assert int(call["activation"].split()[0]) == 3  # problem.ACTIVATIONS.index("gelu_tanh")
    assert call["results"][0] == f"tensor<2x{M}x{N}xbf16>" and len(call["results"]) == 2
    assert "tensor<1x7x10xf32>" in call["line"] and "tensor<1x10xf32>" in call["line"]  # c, bias


def test_cuda_lowering_aux_and_dact(cuda_lowering):
    """With aux the call has 3 results (d, workspace, pre); under grad the forward is that call
    and the backward has one tcgemm_dact call."""
    a, b = S((1, M, K), BF16), S((1, K, N), BF16)
    (call,) = custom_calls(cuda_text(lambda a, b: tcgemm(a, b, activation="silu", aux=True),
                                     a, b))
    assert call["aux"] == "true" and int(call["activation"].split()[0]) == 4
    assert call["results"][0] == call["results"][2] == f"tensor<1x{M}x{N}xbf16>"
    assert call["results"][1].endswith("xf32>") and len(call["results"]) == 3
    x, w, bias = S((M, K), BF16), S((K, N), BF16), S((N,), F32)
    loss = lambda x, w, bias: jnp.sum(tg.gemm(x, w, bias=bias, activation="relu")  # noqa: E731
                                      .astype(F32))
    text = cuda_text(jax.grad(loss, argnums=(0, 1, 2)), x, w, bias)
    calls = custom_calls(text)
    (fwd,) = [c for c in calls if c["aux"] == "true"]
    assert len(calls) == 3 and len(fwd["results"]) == 3 and fwd["has_bias"] == "true"
    assert len(custom_calls(text, "tcgemm_dact")) == 1


def test_cuda_lowering_traced_scale_and_donated_c(cuda_lowering):
    """Traced alpha / beta: a third float32[2] operand (has_scale); overwrite_c with c donated:
    the result aliases c (no second M x N buffer)."""
    a, b, c = S((M, K), F16), S((K, N), F16), S((M, N), F16)
    f = lambda a, b, c, al: tg.gemm(a, b, c, alpha=al, beta=1.0)  # noqa: E731
    (call,) = custom_calls(cuda_text(f, a, b, c, S((), F32)))
    assert call["has_scale"] == "true" and "tensor<2xf32>" in call["line"]
    g = lambda a, b, c: tg.gemm(a, b, c, beta=1.0, overwrite_c=True)  # noqa: E731
    (call,) = custom_calls(cuda_text(g, a, b, c, donate_argnums=2))
    assert "output_operand_aliases" in call["line"]
    (call,) = custom_calls(cuda_text(lambda a, b, c: tg.gemm(a, b, c, beta=1.0), a, b, c))
    assert "output_operand_aliases" not in call["line"]
