"""Sharded jit of the 8-bit call (tg.scaled_matmul, int8 dot_general; scaled.tcgemm_scaled_p and
its rule in sharding.py) over 4 CPU devices, with the kernel path forced on (plan fixed): on the
CPU its lowering is the reference, and over several devices it goes through the same
custom_partitioning rule as on CUDA, so the compiled HLO shows what each device runs:

* batch / M / N sharded: every product on the local shard, no operand gathered, no sum;
* K sharded: local products, one all-reduce (float32; int32 for int8 -> int32), the epilogue
  (c, bias, activation, beta) after it; block scales: each device takes its 128-slices;
* shards the kernels cannot take (K not in 16-element pieces, block-scaled N / K not in whole
  128-blocks) are gathered instead: correct either way.
Values against the unsharded call (same path): bitwise where nothing is summed across devices,
float32 summation order otherwise; int8 -> int32 exact. Inside `jax.set_mesh` with explicit axes
(test_under_set_mesh), on the lax path too: results typed as lax types them, a sequence-sharded
x kept apart from its batch.
"""
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_tcgemm as tg
from test_scaled_batch_cpu import CFG, _operands, _rng, _scale, _same
from test_scaled_cpu import E4M3, E5M2, F32, I8, BF16
from test_sharding import cpu_mesh, gemm_result_shapes

I32 = np.dtype(np.int32)
FORMS = {"tensor": ("tensor", "tensor"), "outer": ("row", "column"), "block": ("block", "block"),
         "int32": (None, None)}


@pytest.fixture(autouse=True)
def kernel_path(monkeypatch):
    from jax_tcgemm import scaled
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: (CFG, 1))
    with jax.default_device(jax.devices("cpu")[0]):
        yield scaled


@pytest.fixture(scope="module", params=[AxisType.Explicit, AxisType.Auto], ids=str)
def mesh(request):
    return cpu_mesh((4,), ("d",), request.param)


def _specs(kind, tb, form, batched):
    """PartitionSpecs of (a, b, sa, sb) sharding `kind` (a (.., M, K), b (.., K, N) or
    (.., N, K), scales in their forms)."""
    lead = ("d",) if kind == "batch" else (None,) if batched else ()
    m, n, k = ("d" if kind == x else None for x in ("M", "N", "K"))
    a = P(*lead, m, k)
    b = P(*lead, *((n, k) if tb else (k, n)))
    sa = {"tensor": P(), "row": P(*lead, m), "block": P(*lead, m, None), None: None}
    sb = {"tensor": P(), "column": P(*lead, n), "block": P(*lead, None, None), None: None}
    return a, b, sa[FORMS[form][0]], sb[FORMS[form][1]]


def _run(mesh, kind, form, tb=False, batch=(), m=64, n=256, k=512, epilogue=True):
    """(sharded result, unsharded result, compiled HLO text) of one product."""
    pair = (I8, I8) if form == "int32" else (E4M3, E5M2)
    rng = _rng("shard", kind, form, tb, batch, m, n, k)
    a, b, sa, sb = _operands(rng, pair, batch, m, n, k, tb, *FORMS[form])
    int_out = form == "int32"
    c = None if int_out or not epilogue else _scale(rng, batch + (m, n))
    bias = None if int_out or not epilogue else _scale(rng, (n,))

    def f(a, b, sa, sb, c, bias):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=I32 if int_out else F32, c=c,
                                beta=0.5 if c is not None else 0.0, bias=bias,
                                activation="gelu" if epilogue and not int_out else None,
                                transpose_b=tb)
    specs = _specs(kind, tb, form, bool(batch)) + (
        None if c is None else P(*(("d",) if kind == "batch" else (None,) * len(batch)),
                                 "d" if kind == "M" else None, "d" if kind == "N" else None),
        None if bias is None else P("d" if kind == "N" else None))
    args = [x if s is None else jax.device_put(x, NamedSharding(mesh, s))
            for x, s in zip((a, b, sa, sb, c, bias), specs)]
    g = jax.jit(f)
    return g(*args), jax.jit(f)(a, b, sa, sb, c, bias), g.lower(*args).compile().as_text()


def local_shape(kind, m, n, parts):
    """The local result (rows, columns) of a product sharded along `kind` over `parts`."""
    return {"M": (m // parts, n), "N": (m, n // parts), "K": (m, n), "batch": (m, n)}[kind]


def _check_hlo(text, kind, local, summed=None):
    """Every product on the local shard; nothing gathered; an all-reduce only for K."""
    shapes = gemm_result_shapes(text)
    assert shapes and all(s == tuple(d for d in local if d != 1) for s in shapes), (shapes, local)
    assert "all-gather" not in text and "all-to-all" not in text, text
    reduces = re.findall(r"= (\w+)\[[\d,]*\][^=]*all-reduce(?:-start)?\(", text)
    if kind == "K":
        assert reduces and set(reduces) == {summed}, (reduces, text)
    else:
        assert not reduces, text


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("kind", ["M", "N", "K"])
@pytest.mark.parametrize("tb", [False, True], ids=["KN", "NK"])
def test_sharded_scaled_matmul(mesh, kind, form, tb):
    got, want, text = _run(mesh, kind, form, tb)
    if kind == "N" and form == "block":  # 64 columns per device: not whole 128-blocks
        _check_hlo(text.replace("all-gather", ""), "M", (64, 256))
        assert "all-gather" in text
    else:
        _check_hlo(text, kind, local_shape(kind, 64, 256, 4), "s32" if form == "int32" else "f32")
    check_values(got, want, summed=kind == "K")


def check_values(got, want, summed):
    """got equals want (the unsharded call): exactly up to _same's rounding, or within float32
    summation-order bounds where partial products were summed across devices."""
    if not summed or np.dtype(got.dtype) == I32:
        return _same(got, want)
    w = np.asarray(want, np.float32)
    np.testing.assert_allclose(np.asarray(got, np.float32), w, rtol=2e-5,
                               atol=2e-5 * float(np.abs(w).max()))


@pytest.mark.parametrize("form", ["outer", "block", "int32"])
def test_batch_of_b_sharded(mesh, form):
    """A batch of b (one launch of 4 items), its batch dim sharded: one item per device."""
    got, want, text = _run(mesh, "batch", form, batch=(4,), m=24, n=256, k=256)
    _check_hlo(text, "batch", (24, 256))
    _same(got, want)


def test_block_n_in_whole_blocks_and_k_slices():
    """Block scales: N = 512 over 4 devices (one 128-block each) and K = 1024 (two 128-slices
    each) are sharded; each device slices its blocks of the replicated scale grids."""
    mesh = cpu_mesh((2, 2), ("x", "y"), AxisType.Auto)
    rng = _rng("2d-block")
    a, b, sa, sb = _operands(rng, (E4M3, E4M3), (), 48, 512, 1024, False, "block", "block")
    f = jax.jit(partial(tg.scaled_matmul, out_dtype=F32))
    args = [jax.device_put(x, NamedSharding(mesh, s))
            for x, s in zip((a, b, sa, sb), (P(None, "x"), P("x", "y"), P(), P()))]
    text = f.lower(*args).compile().as_text()
    _check_hlo(text, "K", (48, 256), "f32")
    want = f(a, b, sa, sb)
    np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(want), rtol=2e-5,
                               atol=2e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("k", [40, 200])
def test_k_not_in_kernel_pieces_is_gathered(k):
    """K = 40 over 4 devices is 10 per device (the kernels take K in 16s), K = 200 with block
    scales is not whole 128-slices: K is gathered, the product stays correct."""
    mesh = cpu_mesh((4,), ("d",), AxisType.Auto)
    form = ("tensor", "tensor") if k == 40 else ("block", "block")
    a, b, sa, sb = _operands(_rng("gather", k), (E4M3, E4M3), (), 32, 128, k, False, *form)

    def f(a, b):
        a = jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P(None, "d")))
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=F32)
    x, y = (jax.device_put(v, NamedSharding(mesh, P())) for v in (a, b))
    assert "CustomSPMDPartitioning" in jax.jit(f).lower(x, y).as_text()
    _same(jax.jit(f)(x, y), jax.jit(f)(a, b))


def test_int8_dot_general_batch_dims_sharded(mesh):
    """int8 dot_general with batch dims (one tcgemm_scaled call) under data parallelism over
    the batch: local products, exact int32."""
    rng = _rng("i8-dg")
    x = jnp.asarray(rng.integers(-128, 128, (8, 20, 96)), jnp.int8)
    w = jnp.asarray(rng.integers(-128, 128, (8, 96, 40)), jnp.int8)
    f = jax.jit(lambda x, w: tg.dot_general(x, w, (((2,), (1,)), ((0,), (0,))),
                                            preferred_element_type=jnp.int32))
    args = [jax.device_put(v, NamedSharding(mesh, P("d"))) for v in (x, w)]
    text = f.lower(*args).compile().as_text()
    _check_hlo(text, "batch", (2, 20, 40))
    want = np.einsum("bmk,bkn->bmn", np.asarray(x, np.int64), np.asarray(w, np.int64))
    np.testing.assert_array_equal(np.asarray(f(*args)), want)


def test_grad_of_scales_k_sharded():
    """grad with respect to the scales, bias and c with K sharded equals the unsharded one."""
    mesh = cpu_mesh((4,), ("d",), AxisType.Auto)
    rng = _rng("grad")
    a, b, sa, sb = _operands(rng, (E4M3, E4M3), (), 32, 256, 512, False, "row", "column")
    bias = _scale(rng, (256,))

    def loss(a, b, sa, sb, bias):
        y = tg.scaled_matmul(a, b, sa, sb, out_dtype=BF16, bias=bias, activation="silu")
        return jnp.sum(y.astype(F32) ** 2)
    grad = jax.jit(jax.grad(loss, argnums=(2, 3, 4)))
    args = [jax.device_put(v, NamedSharding(mesh, s))
            for v, s in zip((a, b, sa, sb, bias), (P(None, "d"), P("d"), P(), P(), P()))]
    for g, w in zip(grad(*args), grad(a, b, sa, sb, bias)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4,
                                   atol=1e-4 * float(np.abs(np.asarray(w)).max()))


@pytest.mark.parametrize("path", ["lax", "kernel"])
@pytest.mark.parametrize("case", ["S", "B", "F"])
def test_under_set_mesh(kernel_path, monkeypatch, path, case):
    """Inside `jax.set_mesh` with explicit axes (jax.make_mesh's default), x (B, S, D) sharded
    over S (sequence), B (data) or the weight over F (columns): fp8 scaled_matmul with per-row
    / per-column scales, int8 dot_general and matmul -> int32. A sequence-sharded x keeps B
    apart (explicit sharding rejects merging B into sharded rows). Results typed as lax types
    them, nothing gathered, values equal to the unsharded call's; on the lax path and on the
    kernel path."""
    if path == "lax":
        monkeypatch.setattr(kernel_path, "kernel_config", lambda *a: None)
    mesh = cpu_mesh((4,), ("d",))
    rng = _rng("set-mesh", case)
    x8 = jnp.asarray(rng.standard_normal((4, 32, 256)), E4M3)
    w8 = jnp.asarray(rng.standard_normal((256, 128)), E4M3)
    sx, sw = _scale(rng, (4, 32)), _scale(rng, (128,))
    xi = jnp.asarray(rng.integers(-128, 128, (4, 32, 64)), I8)
    wi = jnp.asarray(rng.integers(-128, 128, (64, 48)), I8)
    xs = {"S": P(None, "d"), "B": P("d"), "F": P()}[case]
    ws = P(None, "d") if case == "F" else P()
    spec = {"S": P(None, "d", None), "B": P("d", None, None), "F": P(None, None, "d")}[case]
    calls = [
        (lambda x, w, s, t: tg.scaled_matmul(x, w, s, t, out_dtype=F32), (x8, w8, sx, sw),
         (xs, ws, P(*tuple(xs)[:2]), P(*tuple(ws)[1:]))),
        (lambda x, w: tg.dot_general(x, w, (((2,), (0,)), ((), ())),
                                     preferred_element_type=jnp.int32), (xi, wi), (xs, ws)),
        (lambda x, w: tg.matmul(x, w, out_dtype=jnp.int32), (xi, wi), (xs, ws)),
    ]
    for fn, args, specs in calls:
        want = jax.jit(fn)(*args)
        with jax.set_mesh(mesh):
            placed = [jax.device_put(v, s) for v, s in zip(args, specs)]
            got = jax.jit(fn)(*placed)
            text = jax.jit(fn).lower(*placed).compile().as_text()
        assert tuple(got.sharding.spec) == tuple(spec), (got.sharding.spec, spec)
        assert "all-gather" not in text and "all-reduce" not in text
        _same(got, want)
