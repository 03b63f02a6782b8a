"""Flax tests: linen Dense / DenseGeneral and nnx Linear / LinearGeneral / Einsum with
tg.dot_general give the stock layers' outputs and gradients (w.r.t. params and inputs), and
really run tcgemm; the fused layers of jax_tcgemm.layers (linen Dense and nnx Linear with the
bias and activation in one tg.gemm) equal the stock layer followed by the activation and keep
its parameters; plus the examples/train_mlp.py training comparison.

Each layer runs on CPU (the primitive's lax.dot_general lowering) and, marked `gpu`, on the GPU
(our kernel). Ours and the stock layer share the same random params; both are compared with a
float32 (Precision.HIGHEST) run of the stock layer on the same rounded values, within
conftest's per-dtype bounds, and with each other (within 2x the stock layer's own error).
"""
import functools
import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg

from conftest import bound, f64, rand, rel_err
from test_cpu import prims
from test_transforms import BF16, F16, F32, platform  # noqa: F401  (platform: a fixture)

nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")
from jax_tcgemm import layers  # noqa: E402  (imports flax)

HI = lax.Precision.HIGHEST
EINSUM_OURS = functools.partial(jnp.einsum, _dot_general=tg.dot_general)


def linen_layer(cls, **kw):
    def build(dtype, ours, precision=None):
        mod = cls(**kw, dtype=dtype, param_dtype=dtype, precision=precision,
                  dot_general=tg.dot_general if ours else None)
        return mod.apply, lambda x: jax.eval_shape(mod.init, jax.random.PRNGKey(0), x)
    return build


def nnx_layer(cls, *args, op="dot_general", ours_op=tg.dot_general, **kw):
    def build(dtype, ours, precision=None):
        extra = {op: ours_op} if ours else {}
        mod = nnx.eval_shape(lambda: cls(*args, **kw, **extra, dtype=dtype, param_dtype=dtype,
                                         precision=precision, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(mod)
        return (lambda p, x: nnx.merge(graphdef, p)(x)), lambda x: state
    return build


LAYERS = {  # id -> (build(dtype, ours, precision) -> (apply(params, x), abstract init(x)), x shape)
    "linen_Dense": (linen_layer(nn.Dense, features=257), (4, 65, 300)),
    "linen_DenseGeneral": (  # two contracting axes, two feature axes, a batch dim
        linen_layer(nn.DenseGeneral, features=(5, 7), axis=(-2, -1), batch_dims=(0,)),
        (6, 33, 12, 10)),
    "nnx_Linear": (nnx_layer(nnx.Linear, 300, 257), (4, 65, 300)),
    "nnx_LinearGeneral": (  # contracting axes 1 and 3, around a free one: one operand copy
        nnx_layer(nnx.LinearGeneral, (12, 10), (5, 7), axis=(1, -1)), (6, 12, 33, 10)),
    "nnx_Einsum": (  # attention-style projection: two kernel feature axes, bias (H, Dh)
        nnx_layer(nnx.Einsum, "btd,dhk->bthk", (96, 6, 40), (6, 40), op="einsum_op",
                  ours_op=EINSUM_OURS), (4, 65, 96)),
}


def vjp_of(apply):
    """(params, x, ct) -> (out, (d params, d x))."""
    def f(params, x, ct):
        out, pull = jax.vjp(apply, params, x)
        return out, pull(ct.astype(out.dtype))
    return f


def randomize(tree, dtype, tag):
    """Fresh random values (a non-zero bias included) for every leaf of an abstract param tree."""
    def leaf(path, p):
        return rand((tag, jax.tree_util.keystr(path)), p.shape, dtype)
    return jax.tree_util.tree_map_with_path(leaf, tree)


@pytest.mark.parametrize("dtype", (BF16, F16), ids=str)
@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_drop_in(platform, layer, dtype):  # noqa: F811
    build, x_shape = LAYERS[layer]
    tag = (layer, dtype.name)
    x = rand((tag, "x"), x_shape, dtype)
    (apply_ours, _), (apply_stock, init) = build(dtype, True), build(dtype, False)
    apply_ref, _ = build(F32, False, precision=HI)
    params = randomize(init(x), dtype, tag)
    out_shape = jax.eval_shape(apply_stock, params, x).shape
    ct = rand((tag, "ct"), out_shape, dtype)  # representable in dtype: the float32 run sees it

    @jax.jit  # one compile for the three
    def run(params, x, ct):
        up = lambda t: jax.tree.map(lambda v: v.astype(F32), t)  # noqa: E731
        return (vjp_of(apply_ours)(params, x, ct), vjp_of(apply_stock)(params, x, ct),
                vjp_of(apply_ref)(up(params), up(x), up(ct)))

    flat = [jax.tree_util.tree_flatten_with_path(t)[0] for t in run(params, x, ct)]
    for (path, got), (_, theirs), (_, want) in zip(*flat):
        what = f"{layer} {dtype} {jax.tree_util.keystr(path)}"  # out, then grads of params, x
        assert got.shape == theirs.shape == want.shape and got.dtype == theirs.dtype == dtype, what
        err, stock_err = rel_err(got, f64(want)), rel_err(theirs, f64(want))
        # The bias gradient is no product: flax sums the cotangent over hundreds of rows in
        # the half dtype, in both layers alike, beyond the product bound; there the stock
        # layer's own error sets the bar.
        lim = 2 * max(bound(dtype), stock_err) if "bias" in what else bound(dtype)
        assert err <= lim, f"{what}: {err:.3g} vs float32 > {lim:.3g}"
        assert rel_err(got, f64(theirs)) <= 2 * max(bound(dtype), stock_err), what
    # Our kernel really computes all three products (forward, d params, d input) ...
    jx = jax.make_jaxpr(vjp_of(apply_ours))(params, x, ct)
    assert len(prims(jx, "tcgemm")) == 3 and not prims(jx, "dot_general"), jx
    if platform == "gpu":  # ... and on the GPU they are our custom call in the compiled HLO
        hlo = jax.jit(vjp_of(apply_ours)).lower(params, x, ct).compile().as_text()
        assert hlo.count('custom_call_target="tcgemm"') == 3, hlo


def test_nnx_linear_passes_out_sharding():
    """nnx always passes out_sharding to dot_general; given one, our output has it."""
    mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,),
                         devices=jax.devices("cpu")[:1])
    with jax.default_device(jax.devices("cpu")[0]):
        layer = nnx.Linear(24, 10, dtype=jnp.float16, param_dtype=jnp.float16,
                           rngs=nnx.Rngs(0), dot_general=tg.dot_general)
    x = rand(13, (6, 24), F16)
    spec = jax.sharding.PartitionSpec("x", None)
    with jax.set_mesh(mesh), jax.default_device(jax.devices("cpu")[0]):
        x = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
        out = jax.jit(lambda x: layer(x, out_sharding=spec))(x)
    assert out.sharding.spec == spec and out.dtype == F16 and out.shape == (6, 10)
    want = f64(x) @ f64(layer.kernel[...]) + f64(layer.bias[...])
    assert rel_err(out, want) <= bound(F16)


# ---------------------------------------------------------------------------------------------
# jax_tcgemm.layers: fused Dense (linen) and Linear (nnx).

ACTS = (None, "relu", "gelu", "gelu_tanh", "silu")
STOCK_ACT = {None: lambda y: y, "relu": jax.nn.relu, "silu": jax.nn.silu,  # what each name means
             "gelu": functools.partial(jax.nn.gelu, approximate=False),
             "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True)}
IN, OUT, X_SHAPE = 160, 136, (3, 41, 160)


def fused_layer(kind, activation, use_bias=True):
    """build(dtype, fused, precision=None) -> (apply(params, x), abstract init(x)): the fused
    layer, or (fused=False) the stock layer followed by the activation."""
    act = STOCK_ACT[activation]

    def build(dtype, fused, precision=None):
        kw = dict(use_bias=use_bias, dtype=dtype, param_dtype=dtype, precision=precision)
        if kind == "linen":
            mod = (layers.Dense(OUT, activation=activation, **kw) if fused else nn.Dense(OUT, **kw))
            apply = mod.apply if fused else (lambda p, x: act(mod.apply(p, x)))
            return apply, lambda x: jax.eval_shape(mod.init, jax.random.PRNGKey(0), x)
        mod = nnx.eval_shape(lambda: (
            layers.Linear(IN, OUT, activation=activation, **kw, rngs=nnx.Rngs(0)) if fused
            else nnx.Linear(IN, OUT, **kw, rngs=nnx.Rngs(0))))
        graphdef, state = nnx.split(mod)
        if fused:
            return (lambda p, x: nnx.merge(graphdef, p)(x)), lambda x: state
        return (lambda p, x: act(nnx.merge(graphdef, p)(x))), lambda x: state
    return build


@pytest.mark.parametrize("dtype", (BF16, F16), ids=str)
@pytest.mark.parametrize("activation", ACTS, ids=str)
@pytest.mark.parametrize("kind", ("linen", "nnx"))
def test_fused_layer_equals_stock_then_activation(platform, kind, activation, dtype):  # noqa: F811
    """Output and gradients (params, input) of the fused layer against a float32 HIGHEST run of
    the stock layer + activation on the same rounded values (within the dtype's bound), and
    against the stock layer in `dtype` (within 2x its own error); one tcgemm launch forward
    (bias and activation in it), three products in the backward, no dot_general."""
    build = fused_layer(kind, activation)
    tag = ("fused", kind, str(activation), dtype.name)
    x = rand((tag, "x"), X_SHAPE, dtype)
    (apply_ours, init), (apply_stock, _) = build(dtype, True), build(dtype, False)
    apply_ref, _ = build(F32, False, precision=HI)
    params = randomize(init(x), dtype, tag)
    ct = rand((tag, "ct"), X_SHAPE[:-1] + (OUT,), dtype)

    @jax.jit
    def run(params, x, ct):
        up = lambda t: jax.tree.map(lambda v: v.astype(F32), t)  # noqa: E731
        return (vjp_of(apply_ours)(params, x, ct), vjp_of(apply_stock)(params, x, ct),
                vjp_of(apply_ref)(up(params), up(x), up(ct)))

    flat = [jax.tree_util.tree_flatten_with_path(t)[0] for t in run(params, x, ct)]
    assert len(flat[0]) == 4  # out, d bias, d kernel, d x
    for (path, got), (_, theirs), (_, want) in zip(*flat):
        what = f"{kind} {activation} {dtype} {jax.tree_util.keystr(path)}"
        assert got.shape == theirs.shape == want.shape and got.dtype == theirs.dtype == dtype, what
        err, stock_err = rel_err(got, f64(want)), rel_err(theirs, f64(want))
        assert err <= bound(dtype), f"{what}: {err:.3g} vs float32 > {bound(dtype):.3g}"
        assert rel_err(got, f64(theirs)) <= 2 * max(bound(dtype), stock_err), what
    fwd = jax.make_jaxpr(apply_ours)(params, x)
    [eq] = prims(fwd, "tcgemm")
    assert eq.params["activation"] == (activation or "none") and eq.params["has_bias"], fwd
    assert not prims(fwd, "dot_general")
    jx = jax.make_jaxpr(vjp_of(apply_ours))(params, x, ct)
    assert len(prims(jx, "tcgemm")) == 3 and not prims(jx, "dot_general"), jx
    if platform == "gpu":
        hlo = jax.jit(apply_ours).lower(params, x).compile().as_text()
        assert hlo.count('custom_call_target="tcgemm"') == 1, hlo


@pytest.mark.parametrize("kind", ("linen", "nnx"))
def test_fused_layer_params_interchange(kind):
    """Same parameter names, shapes, dtypes and initial values as the stock layer (the same
    initializers and RNG draws): a stock checkpoint runs in the fused layer and back."""
    x = rand(("params", kind), (5, IN), BF16)
    kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.float32)
    with jax.default_device(jax.devices("cpu")[0]):
        if kind == "linen":
            fused, stock = layers.Dense(OUT, activation="gelu_tanh", **kw), nn.Dense(OUT, **kw)
            p_fused = fused.init(jax.random.PRNGKey(3), x)
            p_stock = stock.init(jax.random.PRNGKey(3), x)
            run_fused = lambda p: fused.apply(p, x)  # noqa: E731
            run_stock = lambda p: jax.nn.gelu(stock.apply(p, x), approximate=True)  # noqa: E731
        else:
            fused = layers.Linear(IN, OUT, activation="gelu_tanh", **kw, rngs=nnx.Rngs(3))
            stock = nnx.Linear(IN, OUT, **kw, rngs=nnx.Rngs(3))
            assert isinstance(fused, nnx.Linear) and fused.activation == "gelu_tanh"
            p_fused, p_stock = nnx.state(fused, nnx.Param), nnx.state(stock, nnx.Param)
            g_fused, g_stock = nnx.graphdef(fused), nnx.graphdef(stock)
            run_fused = lambda p: nnx.merge(g_fused, p)(x)  # noqa: E731
            run_stock = lambda p: jax.nn.gelu(nnx.merge(g_stock, p)(x), approximate=True)  # noqa: E731
        names = lambda t: [(jax.tree_util.keystr(k), v.shape, v.dtype)  # noqa: E731
                           for k, v in jax.tree_util.tree_flatten_with_path(t)[0]]
        assert names(p_fused) == names(p_stock)
        assert [n for n, _, _ in names(p_fused)] == (
            ["['params']['bias']", "['params']['kernel']"] if kind == "linen"
            else ["['bias'].value", "['kernel'].value"])
        assert [s for _, s, _ in names(p_fused)] == [(OUT,), (IN, OUT)]
        for a, b in zip(jax.tree.leaves(p_fused), jax.tree.leaves(p_stock)):
            np.testing.assert_array_equal(a, b)
        p = randomize(p_stock, F32, ("params", kind))  # a trained "stock checkpoint"
        out_fused, out_stock = run_fused(p), run_stock(p)  # one checkpoint, either layer
        bias, kernel = (f64(v.astype(BF16)) for v in jax.tree.leaves(p))  # as promoted
    pre = f64(x) @ kernel + bias
    want = 0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre ** 3)))
    assert out_fused.dtype == out_stock.dtype == BF16 and out_fused.shape == (5, OUT)
    assert rel_err(out_fused, want) <= bound(BF16)
    assert rel_err(out_fused, f64(out_stock)) <= 2 * max(bound(BF16), rel_err(out_stock, want))


def make_fn(kind, fused, x, **kw):
    """x -> layer(x) of a fused (activation in kw) or stock layer, params from seed 1."""
    if not fused:
        kw = {k: v for k, v in kw.items() if k != "activation"}
    if kind == "linen":
        mod = (layers.Dense if fused else nn.Dense)(OUT, **kw)
        params = mod.init(jax.random.PRNGKey(1), x)
        return lambda x: mod.apply(params, x)
    return (layers.Linear if fused else nnx.Linear)(IN, OUT, **kw, rngs=nnx.Rngs(1))


@pytest.mark.parametrize("kind", ("linen", "nnx"))
def test_fused_layer_fallbacks_and_errors(kind):
    """float32 computation (dtype float32, or float32 params with dtype None) and a custom
    dot_general take the stock path: bit-identical to the stock layer + activation; without
    a bias (use_bias=False) the activation alone is fused; an unknown activation is a
    ValueError."""
    x = rand(("fallback", kind), (7, IN), BF16)
    custom = functools.partial(lax.dot_general)  # not lax.dot_general itself: nnx's default
    with jax.default_device(jax.devices("cpu")[0]):
        for kw in (dict(dtype=jnp.float32), dict(),
                   dict(dtype=jnp.float32, param_dtype=jnp.bfloat16),
                   dict(dtype=jnp.bfloat16, dot_general=custom)):
            fused = make_fn(kind, True, x, activation="silu", **kw)
            stock = make_fn(kind, False, x, **kw)
            jx = jax.make_jaxpr(fused)(x)
            assert not prims(jx, "tcgemm") and prims(jx, "dot_general"), (kw, jx)
            np.testing.assert_array_equal(fused(x), jax.nn.silu(stock(x)))
        kw = dict(use_bias=False, param_dtype=jnp.bfloat16)  # the same kernel in both
        fused = make_fn(kind, True, x, activation="relu", dtype=jnp.bfloat16, **kw)
        [eq] = prims(jax.make_jaxpr(fused)(x), "tcgemm")
        assert not eq.params["has_bias"] and eq.params["activation"] == "relu"
        # float32 on bf16 values: products exact, float32 sums (~1e-7) as the reference
        out, want = fused(x), jax.nn.relu(make_fn(kind, False, x, dtype=jnp.float32, **kw)(x))
        with pytest.raises(ValueError, match="unknown activation 'tanh'"):
            make_fn(kind, True, x, activation="tanh", dtype=jnp.bfloat16)(x)
    assert out.dtype == BF16 and want.dtype == F32
    assert rel_err(out, f64(want)) <= bound(BF16)


def test_fused_linear_out_sharding():
    """nnx: a given out_sharding is honoured on the fused path as on the stock one."""
    mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,),
                         devices=jax.devices("cpu")[:1])
    with jax.default_device(jax.devices("cpu")[0]):
        layer = layers.Linear(24, 10, activation="gelu", dtype=jnp.float16,
                              param_dtype=jnp.float16, rngs=nnx.Rngs(0))
    x = rand(14, (6, 24), F16)
    spec = jax.sharding.PartitionSpec("x", None)
    with jax.set_mesh(mesh), jax.default_device(jax.devices("cpu")[0]):
        x = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
        out = jax.jit(lambda x: layer(x, out_sharding=spec))(x)
        assert prims(jax.make_jaxpr(lambda x: layer(x, out_sharding=spec))(x), "tcgemm")
    assert out.sharding.spec == spec and out.dtype == F16 and out.shape == (6, 10)
    pre = f64(x) @ f64(layer.kernel[...]) + f64(layer.bias[...])
    want = np.asarray(jax.nn.gelu(jnp.asarray(pre, jnp.float32), approximate=False), np.float64)
    assert rel_err(out, want) <= bound(F16)


# ---------------------------------------------------------------------------------------------
# examples/train_mlp.py: the tcgemm MLP trains like the stock one.

def load_example(name, monkeypatch):
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # dataclasses (flax Modules) look it up
    spec.loader.exec_module(mod)
    return mod


def test_example_train_mlp(monkeypatch, capsys):
    ex = load_example("train_mlp", monkeypatch)
    runs, train_both = [], ex.train_both

    def recording(*args, **kw):  # main's own run, kept for the checks below
        runs.append(train_both(*args, **kw))
        return runs[-1]

    monkeypatch.setattr(ex, "train_both", recording)
    with jax.default_device(jax.devices("cpu")[0]):
        rc = ex.main(["--steps", "40", "--batch", "64", "--width", "64", "--depth", "2",
                      "--lr", "1e-2"])
    printed = capsys.readouterr().out
    [(hist, n_tcgemm, n_dot)] = runs
    ours, stock = hist["tcgemm"][0], hist["jnp"][0]
    assert rc == 0 and printed.strip().endswith("OK"), printed
    assert n_tcgemm == 8 and n_dot == 0  # 3 forward + 3 weight-gradient + 2 input-gradient
    with jax.default_device(jax.devices("cpu")[0]):  # the GELU of each hidden layer is fused
        mlp, x = ex.MLP(64, 2, fused=True), jnp.ones((4, 64), jnp.float32)
        fwd = jax.make_jaxpr(mlp.apply)(mlp.init(jax.random.PRNGKey(0), x), x)
    assert [e.params["activation"] for e in prims(fwd, "tcgemm")] == ["gelu_tanh"] * 2 + ["none"]
    assert "final loss" in printed
    assert len(ours) == len(stock) == 40 and np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, stock, rtol=ex.RTOL)
    assert np.mean(ours[-5:]) < 0.5 * np.mean(ours[:5])
    assert "median step time" in printed


def test_example_train_f32(monkeypatch, capsys):
    """examples/train_f32.py: both float32 models train alike at HIGHEST, every product of
    ours is tcgemm (forward, weight and input gradients) and carries HIGHEST."""
    ex = load_example("train_f32", monkeypatch)
    with jax.default_device(jax.devices("cpu")[0]):
        rc = ex.main(["--steps", "30", "--batch", "64", "--width", "64", "--depth", "2",
                      "--lr", "1e-2"])
        printed = capsys.readouterr().out
        assert rc == 0 and printed.strip().endswith("OK"), printed
        assert "tcgemm 8, dot_general 0" in printed
        mlp, x = ex.MLP(64, 2, ours=True), jnp.ones((4, 64), jnp.float32)
        p = mlp.init(jax.random.PRNGKey(0), x)
        jx = jax.make_jaxpr(jax.grad(lambda p: mlp.apply(p, x).sum()))(p)
        eqs = [e for e in jx.jaxpr.eqns if e.primitive.name == "tcgemm"]
        hi = jax.lax.Precision.HIGHEST
        assert eqs and all(e.params["precision"] == (hi, hi) for e in eqs)
