"""layers.Fp8DotGeneralOp (issue 26, Flax) against flax.linen.Fp8DotGeneralOp, on CPU: the same
variable tree (collections, names, shapes, dtypes, init values), the same forward outputs and
gradients (params and the fp8 meta updates of the '_overwrite_with_gradient' collection) over a
few training steps of a small Dense model from the same init on the same data, under jit; its
three products per layer are tg.scaled_matmul calls with the recipe's dtype pairs; general
dimension numbers; plus examples/train_fp8.py at a tiny size.

Bounds: float32 compute, the two ops differ only in where the per-tensor scales are applied
(the stock op multiplies dequantised float32 operands; ours scales the float32 accumulator), a
few float32 ulps per product. The first step's outputs and gradients are exact (all scales 1).
"""
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nn = pytest.importorskip("flax.linen")
fp8_ops = pytest.importorskip("flax.linen.fp8_ops")
from jax_tcgemm import layers  # noqa: E402  (imports flax)
from test_flax import load_example  # noqa: E402  (examples run from their file paths)

OWG = fp8_ops.OVERWRITE_WITH_GRADIENT
STOCK, OURS = fp8_ops.Fp8DotGeneralOp, layers.Fp8DotGeneralOp
F32_RTOL = 2e-6  # a few float32 ulps (module docstring)

pytestmark = pytest.mark.filterwarnings("ignore:The Fp8DotGeneralOp is deprecated")


class MLP(nn.Module):
    op: object
    dtype: object = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(32, dot_general_cls=self.op, dtype=self.dtype)(x))
        return nn.Dense(8, dot_general_cls=self.op, dtype=self.dtype)(x)


def data(n=16, k=24):
    x = jax.random.normal(jax.random.PRNGKey(1), (n, k), jnp.float32)
    y = jax.random.normal(jax.random.PRNGKey(2), (n, 8), jnp.float32)
    return x, y


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def assert_trees_close(a, b, rtol):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for path, u, v in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(a),
                          jax.tree.leaves(b)):
        assert u.dtype == v.dtype and u.shape == v.shape, path[0]
        assert rel(u, v) <= rtol, (jax.tree_util.keystr(path[0]), rel(u, v))


def describe(tree):
    return jax.tree.map(lambda a: (a.shape, a.dtype), tree)


def test_variable_tree_matches_stock():
    x, _ = data()
    stock, ours = MLP(STOCK).init(jax.random.PRNGKey(0), x), MLP(OURS).init(
        jax.random.PRNGKey(0), x)
    assert describe(ours) == describe(stock)
    assert set(ours) == {"params", OWG}
    meta = ours[OWG]["Dense_0"]["Fp8DotGeneralOp_0"]
    assert sorted(meta) == sorted(f"{w}_{v}" for w in ("input", "kernel", "output_grad")
                                  for v in ("scale", "amax_history"))
    assert meta["input_scale"].shape == (1,) and meta["input_amax_history"].shape == (1024,)
    assert_trees_close(ours, stock, 0.0)  # same init values (params from the same RNG)
    # a checkpoint of the stock op runs in ours, and vice versa
    np.testing.assert_array_equal(MLP(OURS).apply(stock, x), MLP(STOCK).apply(stock, x))
    short = functools.partial(OURS, amax_history_length=16)
    assert MLP(short).init(jax.random.PRNGKey(0), x)[OWG]["Dense_1"]["Fp8DotGeneralOp_0"][
        "kernel_amax_history"].shape == (16,)


def train(op, steps, lr=0.1, dtype=jnp.float32, jit=True):
    """SGD steps on MLP(op); per step (loss, output, grads), and the final variables."""
    x, y = data()
    model = MLP(op, dtype)
    v = model.init(jax.random.PRNGKey(0), x)

    def loss_fn(v, x):
        out = model.apply(v, x)
        return jnp.mean(jnp.square(out.astype(jnp.float32) - y)), out

    grad = jax.value_and_grad(loss_fn, has_aux=True)
    grad = jax.jit(grad) if jit else grad
    trace = []
    for i in range(steps):
        (loss, out), g = grad(v, x * (1 + 0.5 * i))  # moving amax: the scales change
        trace.append((loss, out, g))
        v = {"params": jax.tree.map(lambda p, d: p - lr * d, v["params"], g["params"]),
             OWG: g[OWG]}
    return trace, v


def test_training_steps_match_stock():
    steps = 5
    (ref, v_ref), (got, v_got) = train(STOCK, steps), train(OURS, steps)
    for i, ((l0, o0, g0), (l1, o1, g1)) in enumerate(zip(ref, got)):
        tol = 0.0 if i == 0 else F32_RTOL  # step 0: all scales 1, both exact
        # the loss is XLA's mean of the same outputs in two programs: its summation order
        # follows each program's fusion (jax 0.12.1 on CPU: 1 ulp apart at step 0)
        assert rel(o1, o0) <= tol and rel(l1, l0) <= F32_RTOL, i
        assert_trees_close(g1, g0, tol)
    # the meta updates happened: scales moved off 1, one amax per step in each history (the
    # newest at [0], the older ones rolled to the end)
    meta = v_got[OWG]["Dense_1"]["Fp8DotGeneralOp_0"]
    for w in ("input", "kernel", "output_grad"):
        assert float(meta[f"{w}_scale"][0]) != 1.0
        assert np.count_nonzero(np.asarray(meta[f"{w}_amax_history"])) == steps
    assert_trees_close(v_got, v_ref, F32_RTOL)


def test_training_steps_through_kernel_wrapper(monkeypatch):
    """The same training steps with every product through scaled_matmul's kernel-path wrapper
    (scaled._fused: on a GPU of compute capability 9.0 the fp8 kernels; on the CPU its
    reference) equal the lax path's bit for bit: the wrapper's custom_jvp inside the op's
    custom_vjp, under jit and grad, changes nothing."""
    from jax_tcgemm import scaled
    ref, v_ref = train(OURS, 3)
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: ("sm90_128x128x64_s6_g2", 1))
    got, v_got = train(OURS, 3)
    for (l0, o0, g0), (l1, o1, g1) in zip(ref, got):
        assert rel(o1, o0) == 0 and rel(l1, l0) == 0
        assert_trees_close(g1, g0, 0.0)
    assert_trees_close(v_got, v_ref, 0.0)


def test_no_jit_matches_jit():
    (a, _), (b, _) = train(OURS, 2, jit=False), train(OURS, 2)
    for (l0, o0, g0), (l1, o1, g1) in zip(a, b):
        assert rel(o0, o1) <= F32_RTOL and rel(l0, l1) <= F32_RTOL
        assert_trees_close(g0, g1, F32_RTOL)


def fro(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_bf16_compute_close_to_stock():
    """bfloat16 compute: step 0 (scales 1) is exact; afterwards the stock op's bf16 roundings
    (the dequantised operands, the bf16 products) move values across fp8 rounding boundaries of
    the next quantisation (an e4m3 ulp is 2^-3 relative, an e5m2 ulp 2^-2), so only the
    Frobenius distance is bounded, at a fraction of those ulps."""
    (ref, _), (got, _) = train(STOCK, 3, dtype=jnp.bfloat16), train(OURS, 3, dtype=jnp.bfloat16)
    for i, ((l0, o0, g0), (l1, o1, g1)) in enumerate(zip(ref, got)):
        assert o1.dtype == o0.dtype == jnp.bfloat16
        if i == 0:
            assert_trees_close(g1, g0, 0.0)
            assert rel(o1, o0) == 0.0
        assert fro(o1, o0) <= 2.0 ** -4 and rel(l1, l0) <= 2.0 ** -5
        for u, w in zip(jax.tree.leaves(g1["params"]), jax.tree.leaves(g0["params"])):
            assert u.dtype == w.dtype and fro(u, w) <= 2.0 ** -2


def test_products_are_scaled_matmul(monkeypatch):
    calls = []
    real = layers.scaled_matmul

    def recording(a, b, **kw):
        calls.append((np.dtype(a.dtype).name, np.dtype(b.dtype).name, kw["transpose_b"],
                      tuple(kw["a_scale"].shape), tuple(kw["b_scale"].shape)))
        return real(a, b, **kw)

    monkeypatch.setattr(layers, "scaled_matmul", recording)
    train(OURS, 1, jit=False)
    e4, e5 = "float8_e4m3fn", "float8_e5m2"
    fwd, dgrad, wgrad = (e4, e4, False, (1,), (1,)), (e5, e4, True, (1,), (1,)), \
        (e4, e5, False, (1,), (1,))
    # init and the loss each run 2 forwards; the backward a dgrad and a wgrad per layer
    assert sorted(calls) == sorted([fwd] * 4 + [dgrad, wgrad] * 2)


@pytest.mark.parametrize("dn,xs,ks", [
    ((((2,), (0,)), ((), ())), (2, 5, 12), (12, 7)),            # leading dims folded
    ((((1, 2), (1, 0)), ((0,), (2,))), (3, 4, 6, 5), (6, 4, 3)),  # batch, two contracting
    ((((0,), (1,)), ((), ())), (9, 5), (7, 9)),                 # transposed operands
])
def test_dimension_numbers_match_stock(dn, xs, ks):
    x = jax.random.normal(jax.random.PRNGKey(3), xs) * 3
    k = jax.random.normal(jax.random.PRNGKey(4), ks)

    def run(op):
        mod = op(amax_history_length=4)
        v = mod.init(jax.random.PRNGKey(0), x, k, dn)
        v = jax.tree.map(lambda a: a + 0.5, v)  # scales 1.5, histories 0.5: non-trivial

        def f(v, x, k):
            out = mod.apply(v, x, k, dn)
            return jnp.sum(out * jnp.cos(out)), out
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(v, x, k)

    (l0, o0), g0 = run(STOCK)
    (l1, o1), g1 = run(OURS)
    assert o1.shape == o0.shape == jax.lax.dot_general(x, k, dn).shape
    assert rel(o1, o0) <= F32_RTOL
    assert_trees_close(g1, g0, F32_RTOL)


def test_errors():
    x, k = jnp.ones((4, 8)), jnp.ones((8, 3))
    dn = (((1,), (0,)), ((), ()))
    nanoo = OURS(e4m3_dtype=jnp.float8_e4m3fnuz, e5m2_dtype=jnp.float8_e5m2fnuz)
    with pytest.raises(TypeError, match="fnuz"):
        nanoo.init(jax.random.PRNGKey(0), x, k, dn)
    with pytest.raises(TypeError, match="compute"):
        OURS().init(jax.random.PRNGKey(0), x, k.astype(jnp.int32), dn)


# ---------------------------------------------------------------------------------------------
# examples/train_fp8.py at a tiny size.

def test_example_train_fp8(monkeypatch, capsys):
    ex = load_example("train_fp8", monkeypatch)
    runs, train_both = [], ex.train_both

    def recording(*args, **kw):
        runs.append(train_both(*args, **kw))
        return runs[-1]

    monkeypatch.setattr(ex, "train_both", recording)
    with jax.default_device(jax.devices("cpu")[0]), warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the example silences the stock op's
        rc = ex.main(["--steps", "30", "--batch", "32", "--width", "32", "--lr", "1e-2"])
    printed = capsys.readouterr().out
    [(hist, final)] = runs
    ours, stock = hist["tcgemm"][0], hist["stock"][0]
    assert rc == 0 and printed.strip().endswith("OK"), printed
    assert "median step time" in printed and "final loss" in printed
    assert len(ours) == len(stock) == 30 and np.all(np.isfinite(ours))
    assert ours[0] == stock[0]  # same init, same data, scales 1: the first step is exact
    np.testing.assert_allclose(ours, stock, rtol=ex.RTOL_F32)
    meta = final["tcgemm"][OWG]["Dense_0"]["Fp8DotGeneralOp_0"]
    assert meta["output_grad_amax_history"].shape == (16,)
    assert float(meta["output_grad_scale"][0]) != 1.0  # the meta updates were applied
