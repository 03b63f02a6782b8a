"""Flax drop-in tests: linen Dense / DenseGeneral and nnx Linear / LinearGeneral / Einsum with
tg.dot_general give the stock layers' outputs and gradients (w.r.t. params and inputs), and
really run tcgemm; plus the examples/train_mlp.py training comparison.

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
    [(hist, n_tcgemm)] = runs
    ours, stock = hist["tcgemm"][0], hist["jnp"][0]
    assert rc == 0 and printed.strip().endswith("OK"), printed
    assert n_tcgemm == 8  # 3 forward + 3 weight-gradient + 2 input-gradient products
    assert len(ours) == len(stock) == 40 and np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, stock, rtol=ex.RTOL)
    assert np.mean(ours[-5:]) < 0.5 * np.mean(ours[:5])
    assert "median step time" in printed
