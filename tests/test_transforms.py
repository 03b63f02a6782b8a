"""Transformation bars for tg.matmul / tg.dot_general: jax.test_util.check_grads, grad of grad,
linearize, jvp / vjp against lax.dot_general's, vmap of grad, gradient dtypes, the layout flags
of the gradient GEMMs, and dot_general dimension-number patterns beyond test_cpu.py's.

Numerics run on CPU (through the primitive's lax.dot_general lowering) and, where the kernel's
own rounding matters, again on the GPU (the `platform` fixture's second param is marked `gpu`).
Jaxpr and dtype checks are trace-level: they are the same on every backend and run once.
What test_cpu.py covers is not repeated here: the primitive's grad jaxpr per layout, grads of
the primitive vs jnp.matmul, jvp and vmap(grad) of matmul, vmap numerics.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jax_tcgemm as tg

from conftest import assert_close, bound, f64, rand, rel_err
from test_cpu import DOT_GENERAL_CASES, LAYOUT_IDS, LAYOUTS, prims

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
IN_DTYPES = (F16, BF16)
UNIT_ROUNDOFF = {F16: 2.0 ** -11, BF16: 2.0 ** -8}


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def platform(request):
    """Runs the test on the CPU (fallback lowering) and, marked `gpu`, on the GPU (kernel)."""
    with jax.default_device(jax.devices(request.param)[0]):
        yield request.param


def on_cpu():  # for tests of the CPU fallback only, also on a GPU host
    return jax.default_device(jax.devices("cpu")[0])


def only_tcgemm_products(jaxpr, n):
    """The jaxpr computes its products with exactly n tcgemm equations and no dot_general."""
    assert len(prims(jaxpr, "tcgemm")) == n and not prims(jaxpr, "dot_general"), jaxpr


def dg(dims, pet=None):
    return lambda x, y: tg.dot_general(x, y, dims, preferred_element_type=pet)


def dg_spec(lhs_ndim, rhs_ndim, dims):
    """lax.dot_general's dimension numbers as einsum operand / result subscripts."""
    (lc, rc), (lb, rb) = dims
    lhs = [chr(ord("a") + i) for i in range(lhs_ndim)]
    rhs = [chr(ord("n") + i) for i in range(rhs_ndim)]
    for i, j in zip(list(lc) + list(lb), list(rc) + list(rb)):
        rhs[j] = lhs[i]
    out = ([lhs[i] for i in lb] + [c for i, c in enumerate(lhs) if i not in lc + lb]
           + [c for j, c in enumerate(rhs) if j not in rc + rb])
    return "".join(lhs), "".join(rhs), "".join(out)


def dg64(x, y, dims):
    """float64 lax.dot_general(x, y, dims) of the (already rounded) inputs."""
    l, r, o = dg_spec(np.ndim(x), np.ndim(y), dims)
    return np.einsum(f"{l},{r}->{o}", f64(x), f64(y))


def dg_vjp64(x, y, dims, ct):
    """float64 cotangents (d lhs, d rhs) of lax.dot_general for the output cotangent ct."""
    l, r, o = dg_spec(np.ndim(x), np.ndim(y), dims)
    return (np.einsum(f"{o},{r}->{l}", f64(ct), f64(y)),
            np.einsum(f"{l},{o}->{r}", f64(x), f64(ct)))


# ---------------------------------------------------------------------------------------------
# jax.test_util.check_grads.
#
# How the finite differences are made meaningful in half precision:
# * f is a scalar bilinear form  f(a, b) = sum(C * op(a, b))  (C a fixed random float32 array),
#   so check_grads compares scalars only: its tolerances get multiplied by the array size, which
#   would make them vacuous on array outputs.
# * Central differences of a bilinear (or linear) map are exact for every eps (the eps^2 terms
#   cancel), so eps = 1 leaves only rounding, no truncation error.
# * The arguments are float32 and cast to float16/bfloat16 inside f (the mixed-precision path:
#   float32 master values, half-precision GEMMs on the kernel). check_grads' own arithmetic
#   (tangents, differences, inner products) then stays float32; with half-precision arguments
#   numpy would accumulate its inner products in bfloat16, an error larger than ours.
# * What remains is the half-precision rounding of x +- eps*v, of the cotangent and of the
#   gradients: each term of the random-sign sums check_grads compares carries <= u relative
#   error (u = unit roundoff) and they add in quadrature, so the error is ~ a few u times
#   S = ||C * op(a, b)||_F while the sum itself may cancel to far below S. Hence
#   atol = 8 u S and rtol = 8 u. A real defect (wrong layout flag, missing batch reduction,
#   dropped term) is off by O(S): test_check_grads_bar_rejects_a_wrong_gradient shows it fails.
# * Second order: grad f is linear in (a, b), so h = <D, grad f> (D fixed random) is linear
#   too, and check_grads(h, order=1) is exact as well: its reverse mode is grad of grad (the
#   transposes of the transposes), its forward mode forward-over-reverse. (check_grads(f,
#   order=2) in reverse mode would differentiate x -> f(x) grad f(x), a cubic, whose eps^2
#   error only a small eps avoids, while the half-precision rounding grows as u/eps.)

CHECK_CASES = [  # (id, op(a, b), a shape, b shape, output shape)
    ("matmul_shared_b", lambda pet: lambda a, b: tg.matmul(a, b, out_dtype=pet),
     (3, 9, 13), (13, 6), (3, 9, 6)),
    ("dg_batch_middle", lambda pet: dg((((2,), (0,)), ((1,), (1,))), pet),
     (5, 2, 7), (7, 2, 3), (2, 5, 3)),
    ("dg_two_contracting_TT", lambda pet: dg((((0, 1), (2, 1)), ((), ())), pet),
     (4, 3, 6), (5, 3, 4), (6, 5)),
]


def f_terms(op, dt, out_shape, seed):
    """The terms of f(a, b) = sum(C * op(a_dt, b_dt)), a bilinear scalar of float32 a, b."""
    C = rand((seed, "C"), out_shape, F32)
    return lambda x, y: C * op(x.astype(dt), y.astype(dt)).astype(F32)


def h_terms(f, shapes, seed):
    """The terms of h(a, b) = <D, grad f(a, b)>, linear in (a, b)."""
    D = [rand((seed, "D", i), s, F32) for i, s in enumerate(shapes)]

    def terms(x, y):
        g = jax.grad(f, argnums=(0, 1))(x, y)
        return jnp.concatenate([(d * gi).ravel() for d, gi in zip(D, g)])
    return terms


def check(terms, args, dt, modes=("fwd", "rev")):  # ("lin": test_linearize)
    """check_grads of sum(terms) at args, atol = 8 u S with S = ||terms(args)||, rtol = 8 u;
    returns the (jitted) scalar function."""
    fn = jax.jit(lambda x, y: jnp.sum(terms(x, y)))
    s, u = float(np.linalg.norm(jax.jit(terms)(*args))), UNIT_ROUNDOFF[dt]
    check_grads(fn, args, order=1, modes=modes, eps=1.0, atol=8 * u * s, rtol=8 * u)
    return fn


@pytest.mark.parametrize("case,dt,out_dtype", [  # each op once; the dtype pairs spread over them
    (CHECK_CASES[0], F16, F32), (CHECK_CASES[1], BF16, F32), (CHECK_CASES[2], BF16, BF16)],
    ids=lambda v: v[0] if isinstance(v, tuple) else str(v))
def test_check_grads(platform, case, dt, out_dtype):
    name, make_op, a_shape, b_shape, out_shape = case
    seed = (name, dt.name, out_dtype.name)
    a, b = rand((seed, "a"), a_shape, dt).astype(F32), rand((seed, "b"), b_shape, dt).astype(F32)
    f = check(f_terms(make_op(out_dtype), dt, out_shape, seed), (a, b), dt)
    h = check(h_terms(f, (a_shape, b_shape), seed), (a, b), dt)
    jx = jax.make_jaxpr(jax.grad(h, argnums=(0, 1)))(a, b)  # reverse over reverse
    assert prims(jx, "tcgemm") and not prims(jx, "dot_general")


def test_check_grads_bar_rejects_a_wrong_gradient():
    """The tolerances above are not vacuous: a VJP that forgets to transpose b (what a wrong
    layout flag does; b square so the shapes still fit) fails the same check (bfloat16, the
    loosest tolerance)."""
    dt = BF16
    a, b = rand(("bar_a",), (9, 8), dt).astype(F32), rand(("bar_b",), (8, 8), dt).astype(F32)
    good = lambda x, y: tg.matmul(x, y, out_dtype=F32)  # noqa: E731
    bad = jax.custom_vjp(good)
    tn = (((0,), (0,)), ((), ()))  # A^T dC by layout (an explicit .T meets an XLA CPU bug)
    bad.defvjp(lambda x, y: (good(x, y), (x, y)),
               lambda res, ct: (tg.matmul(ct.astype(res[0].dtype), res[1]),  # b, not b^T
                                tg.dot_general(res[0], ct.astype(res[0].dtype), tn)))
    with on_cpu():
        check(f_terms(good, dt, (9, 8), "bar"), (a, b), dt, modes=("rev",))
        with pytest.raises(AssertionError):
            check(f_terms(bad, dt, (9, 8), "bar"), (a, b), dt, modes=("rev",))


# ---------------------------------------------------------------------------------------------
# Grad of grad, linearize, vmap of grad: values against float64/float32 references.

@pytest.mark.parametrize("dt", IN_DTYPES, ids=str)
def test_grad_of_grad(platform, dt):
    """Hessian-vector product of L(a, b) = 1/2 ||a @ b||^2 (float32 out), by grad of grad,
    against jnp.matmul's and the float64 formula; every product in it is a tcgemm."""
    a, b = rand(("gg_a", dt.name), (2, 11, 9), dt), rand(("gg_b", dt.name), (9, 7), dt)
    v = rand(("gg_v", dt.name), a.shape, dt)

    def hvp(mm):
        def v_dot_grad(x, y):  # <v, dL/da> = <v, (a b) b^T>
            ga = jax.grad(lambda x, y: 0.5 * jnp.sum(jnp.square(mm(x, y))))(x, y)
            return jnp.sum(ga.astype(F32) * v.astype(F32))
        return jax.jit(jax.grad(v_dot_grad, argnums=(0, 1)))

    ours = hvp(lambda x, y: tg.matmul(x, y, out_dtype=F32))
    theirs = hvp(lambda x, y: jnp.matmul(x, y, preferred_element_type=F32))
    A, B, V = f64(a), f64(b), f64(v)
    # d/da <v, a b b^T> = v b b^T;  d/db <v, a b b^T> = sum_batch(a^T v b + v^T a b)
    want = (V @ B @ B.T, (np.swapaxes(A, 1, 2) @ V @ B + np.swapaxes(V, 1, 2) @ A @ B).sum(0))
    for got, jn, ref, what in zip(ours(a, b), theirs(a, b), want, ("a", "b")):
        assert got.dtype == jn.dtype == dt and got.shape == ref.shape
        tol = 2 * max(bound(dt), rel_err(jn, ref))  # several roundings to dt on the way
        assert rel_err(got, ref) <= tol, f"d{what}"
    only_tcgemm_products(jax.make_jaxpr(ours)(a, b), 6)


@pytest.mark.parametrize("dt", IN_DTYPES, ids=str)
def test_linearize(platform, dt):
    dims = (((1,), (2,)), ((0,), (0,)))  # batched TT
    a, b = rand(("lin_a", dt.name), (3, 17, 10), dt), rand(("lin_b", dt.name), (3, 12, 17), dt)
    da, db = rand(("lin_da", dt.name), a.shape, dt), rand(("lin_db", dt.name), b.shape, dt)
    out, f_lin = jax.linearize(dg(dims, F32), a, b)
    assert_close(out, dg64(a, b, dims), F32, 17, "primal")
    jvp64 = dg64(da, b, dims) + dg64(a, db, dims)
    assert_close(f_lin(da, db), jvp64, F32, 17, "tangent")
    assert_close(jax.jit(f_lin)(2 * da, 2 * db), 2 * jvp64, F32, 17, "linear in the tangent")
    only_tcgemm_products(jax.make_jaxpr(f_lin)(da, db), 2)


@pytest.mark.parametrize("dt", IN_DTYPES, ids=str)
def test_vmap_of_grad_per_example(platform, dt):
    """Per-example weight gradients (vmap over grad; as in DP-SGD) of a Dense-like dot_general
    with a shared weight: one batched tcgemm per product, no dot_general."""
    dims = (((1,), (0,)), ((), ()))
    w = rand(("pe_w", dt.name), (24, 10), dt)
    x, ct = rand(("pe_x", dt.name), (6, 5, 24), dt), rand(("pe_c", dt.name), (6, 5, 10), F32)
    def loss(w, x, c):
        return jnp.sum(c * tg.dot_general(x, w, dims, preferred_element_type=F32))
    per_ex = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, 0, 0)))
    gw, gx = per_ex(w, x, ct)
    c64 = f64(ct.astype(dt))  # the cotangent is rounded to the operand dtype first
    assert gw.shape == (6, 24, 10) and gx.shape == x.shape and gw.dtype == gx.dtype == dt
    assert_close(gw, np.swapaxes(f64(x), 1, 2) @ c64, dt, 5, "per-example dW")
    assert_close(gx, c64 @ f64(w).T, dt, 10, "per-example dx")
    only_tcgemm_products(jax.make_jaxpr(per_ex)(w, x, ct), 3)


# ---------------------------------------------------------------------------------------------
# Gradient dtypes and the gradient GEMMs' layout flags.

@pytest.mark.parametrize("dt_a,dt_b", [(F16, F16), (BF16, BF16), (F16, BF16), (F32, F32),
                                       (F16, F32)], ids=str)
@pytest.mark.parametrize("out_dtype", (None, F16, BF16, F32), ids=str)
def test_grad_dtypes_follow_inputs(dt_a, dt_b, out_dtype):
    """Gradients keep the operand dtypes, as jnp.dot's do, for every in/out dtype combination
    (kernel dtypes and fallback ones), through matmul and dot_general."""
    S = jax.ShapeDtypeStruct
    a, b = S((2, 5, 7), dt_a), S((7, 3), dt_b)
    dims = (((2,), (0,)), ((), ()))
    fns = {
        "jnp.dot": lambda x, y: jnp.dot(x, y, preferred_element_type=out_dtype),
        "tg.matmul": lambda x, y: tg.matmul(x, y, out_dtype=out_dtype),
        "tg.dot_general": lambda x, y: tg.dot_general(x, y, dims,
                                                      preferred_element_type=out_dtype)}
    for name, fn in fns.items():
        loss = lambda x, y: fn(x, y).astype(F32).sum()  # noqa: B023, E731
        g = jax.eval_shape(jax.grad(loss, argnums=(0, 1)), a, b)
        assert (g[0].dtype, g[1].dtype) == (dt_a, dt_b), name
        assert (g[0].shape, g[1].shape) == (a.shape, b.shape), name


LAYOUT_DIMS = {  # (transpose_a, transpose_b) -> (lhs shape, rhs shape, dimension numbers)
    (False, False): ((2, 5, 7), (2, 7, 3), (((2,), (1,)), ((0,), (0,)))),
    (False, True): ((2, 5, 7), (2, 3, 7), (((2,), (2,)), ((0,), (0,)))),
    (True, False): ((2, 7, 5), (2, 7, 3), (((1,), (1,)), ((0,), (0,)))),
    (True, True): ((2, 7, 5), (2, 3, 7), (((1,), (2,)), ((0,), (0,)))),
}


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("batched", (True, False), ids=("batched", "unbatched"))
def test_grad_jaxpr_dot_general_flipped_flags_no_transposes(ta, tb, batched):
    """Through tg.dot_general (the public path, with its reshapes): the forward product takes
    the layout as stored, the two gradient products are tcgemms with flipped flags, and no
    `transpose` equation (a copy) appears anywhere."""
    lhs, rhs, dims = LAYOUT_DIMS[ta, tb]
    if not batched:
        lhs, rhs = lhs[1:], rhs[1:]
        dims = (tuple(tuple(d - 1 for d in side) for side in dims[0]), ((), ()))
    g = jax.value_and_grad(lambda x, y: dg(dims, F32)(x, y).sum(), argnums=(0, 1))
    jx = jax.make_jaxpr(g)(jnp.ones(lhs, BF16), jnp.ones(rhs, BF16))
    gemms = prims(jx, "tcgemm")
    only_tcgemm_products(jx, 3)
    assert not prims(jx, "transpose"), jx
    flags = [(e.params["transpose_a"], e.params["transpose_b"]) for e in gemms]
    assert flags[0] == (ta, tb)
    want_da = (False, not tb) if not ta else (tb, True)   # dA = dC op(B)^T (or dA^T)
    want_db = (not ta, False) if not tb else (True, ta)   # dB = op(A)^T dC (or dB^T)
    assert sorted(flags[1:]) == sorted([want_da, want_db])


# ---------------------------------------------------------------------------------------------
# dot_general: patterns beyond test_cpu.DOT_GENERAL_CASES (shapes, values, operand copies), and
# jvp / vjp against lax.dot_general's on a selection of them.

MORE_DOT_GENERAL_CASES = [  # (lhs shape, rhs shape, dimension_numbers, operand transposes)
    ((3, 5, 7), (7, 4, 3), (((2,), (0,)), ((0,), (2,))), 1),   # batch first / last
    ((5, 3, 7), (3, 7, 4), (((2,), (1,)), ((1,), (0,))), 1),   # batch middle / first
    ((2, 3, 4, 5), (4, 3, 2, 6), (((0, 1, 2), (2, 1, 0)), ((), ())), 1),  # 3 contracting, reversed
    ((3, 4, 5, 6), (4, 7, 6), (((1, 3), (0, 2)), ((), ())), 2),  # contracting between free dims
    ((4, 2, 5, 3), (3, 6, 2, 7), (((3,), (0,)), ((1,), (2,))), 2),  # free dims around batch / K
    ((2, 4, 3, 5, 6), (6, 3, 2, 7, 5), (((3, 4), (4, 0)), ((0, 2), (2, 1))), 2),  # 2 of each
    ((5, 2, 7, 3), (3, 7, 4, 2), (((2,), (1,)), ((1, 3), (3, 0))), 2),  # batch dims interleaved
    ((1, 5, 1, 7), (7, 1, 3), (((3,), (0,)), ((), ())), 0),    # unit free dims
    ((3, 5), (3, 4), (((), ()), ((0,), (0,))), 0),             # batch only: per-batch outer
    ((3, 5, 7), (3, 5, 7), (((1, 2), (1, 2)), ((0,), (0,))), 0),  # batched full contraction
    ((5, 7), (2, 3, 7), (((1,), (2,)), ((), ())), 0),          # NT, two rhs free dims
    ((7, 2, 3), (7, 4), (((0,), (0,)), ((), ())), 0),          # TN, two lhs free dims
    ((5, 7), (7,), (((1,), (0,)), ((), ())), 0),               # matrix @ vector
]
MORE_IDS = [f"{a}x{b}_{d}".replace(" ", "") for a, b, d, _ in MORE_DOT_GENERAL_CASES]


@pytest.mark.parametrize("lhs,rhs,dims,copies", MORE_DOT_GENERAL_CASES, ids=MORE_IDS)
def test_more_dot_general_patterns(platform, lhs, rhs, dims, copies):
    """Shapes and dtypes equal lax.dot_general's, values its float32 result, one tcgemm, and
    only the operand copies the pattern needs (an operand whose batch dims do not lead, or
    whose free and contracting dims interleave, is transposed once; nothing else)."""
    k = int(np.prod([lhs[d] for d in dims[0][0]]))
    pets = (None, F32, BF16)
    ops = [(dt, pet) for dt in IN_DTYPES for pet in pets]
    args = [(rand(("mdg", lhs, dims, dt.name), lhs, dt), rand(("mdg", rhs, dims, dt.name), rhs, dt))
            for dt in IN_DTYPES]
    outs = jax.jit(lambda args: [dg(dims, pet)(*args[IN_DTYPES.index(dt)]) for dt, pet in ops])(
        args)  # one compile for all dtypes and output types
    for (dt, pet), out in zip(ops, outs):
        x, y = args[IN_DTYPES.index(dt)]
        want = jax.eval_shape(lambda a, b: lax.dot_general(a, b, dims,  # noqa: B023
                                                           preferred_element_type=pet), x, y)
        assert (out.shape, out.dtype) == (want.shape, want.dtype), (dt, pet)
        assert_close(out, dg64(x, y, dims), out.dtype, k, f"{dims} {dt}->{pet}")
        jx = jax.make_jaxpr(dg(dims, pet))(x, y)
        only_tcgemm_products(jx, 1)
        assert len(prims(jx, "transpose")) == copies


# jvp / vjp: the transpose rule is one for all patterns; these exercise what differs between
# them (operand copies, non-leading and several batch dims, K = 0, K = 1, scalar outputs).
JVP_CASES = [DOT_GENERAL_CASES[i] for i in (5, 10, 12, 14, 15, 18)] + [
    MORE_DOT_GENERAL_CASES[i][:3] for i in (3, 6, 8, 12)]
JVP_IDS = [f"{a}x{b}_{d}".replace(" ", "") for a, b, d in JVP_CASES]


@pytest.mark.parametrize("i", range(len(JVP_CASES)), ids=JVP_IDS)
def test_dot_general_jvp_vjp_vs_lax(platform, i):
    """jvp tangents and vjp cotangents of tg.dot_general (float32 output, the mixed-precision
    path) equal lax.dot_general's and the float32 reference."""
    lhs, rhs, dims = JVP_CASES[i]
    dt = IN_DTYPES[i % 2]  # alternate dtypes: the patterns, not the dtype, are under test here
    x, y = rand(("jv_x", i), lhs, dt), rand(("jv_y", i), rhs, dt)
    tx, ty = rand(("jv_tx", i), lhs, dt), rand(("jv_ty", i), rhs, dt)
    out_shape = jax.eval_shape(dg(dims, F32), x, y).shape
    ct = rand(("jv_ct", i), out_shape, dt).astype(F32)  # representable in dt: exact reference
    k = max(1, int(np.prod([lhs[d] for d in dims[0][0]])))
    fns = (dg(dims, F32), lambda a, b: lax.dot_general(a, b, dims, preferred_element_type=F32))

    @jax.jit
    def run(x, y, tx, ty, ct):
        return [(jax.jvp(f, (x, y), (tx, ty))[1], jax.vjp(f, x, y)[1](ct)) for f in fns]

    (tan, grads), (ltan, lgrads) = run(x, y, tx, ty, ct)
    assert tan.shape == ltan.shape and tan.dtype == ltan.dtype == F32
    assert_close(tan, dg64(tx, y, dims) + dg64(x, ty, dims), F32, k, "jvp")
    refs = dg_vjp64(x, y, dims, ct)
    for got, theirs, want, what in zip(grads, lgrads, refs, ("lhs", "rhs")):
        assert got.dtype == theirs.dtype == dt and got.shape == theirs.shape
        assert_close(got, want, dt, 1, f"vjp {what}")
        assert rel_err(got, f64(theirs)) <= 2 * max(bound(dt), rel_err(theirs, want))


# ---------------------------------------------------------------------------------------------
# Regression: XLA CPU (jaxlib 0.11.2) cannot run a batched bfloat16 x bfloat16 -> float32 dot
# whose lhs comes from a transpose; the CPU fallback lowering therefore upcasts to float32.

def test_cpu_fallback_bf16_transposed_lhs():
    with on_cpu():
        x, y = rand(("tl_x",), (9, 8), BF16), rand(("tl_y",), (9, 6), BF16)
        out = jax.jit(lambda x, y: tg.matmul(x.T, y, out_dtype=F32))(x, y)
        assert_close(out, f64(x).T @ f64(y), F32, 9, "x.T @ y")
