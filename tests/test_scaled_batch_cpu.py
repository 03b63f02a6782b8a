"""CPU tests of batched 8-bit products (tg.scaled_matmul with a batch of b, its jax.vmap, int8
dot_general / matmul with batch dims): one custom call, whatever is batched.

* Numerics: every batched form equals the per-item products (the lax path, item by item), with
  the kernel path's wrapper forced on (scaled._call and its vmap rule: on the CPU its lowering
  is the reference), so the rule's operand layouts (rows joined, batch joined, per item) are
  checked value for value; int8 -> int32 against numpy int64.
* Lowering for CUDA (from the CPU host, plan forced): one tcgemm call with the joined batch or
  rows, no loop (block scales too); a per-item beta: one call per item (a loop), as documented.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm import _ffi
from conftest import seed_of
from test_cpu import cuda_text, custom_calls
from test_scaled_cpu import E4M3, E5M2, F32, I8, BF16, cdiv, quant

CFG = "sm90_128x128x64_s6_g2"


@pytest.fixture(autouse=True)
def _on_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture(params=["lax", "kernel"])
def path(request, monkeypatch):
    """Each test on the lax path and on the kernel path's wrapper (plan forced, every batched
    call planned again by the vmap rule)."""
    from jax_tcgemm import scaled
    if request.param == "kernel":
        monkeypatch.setattr(scaled, "kernel_config", lambda *a: (CFG, 1))
    return request.param


def _rng(*tag):
    return np.random.default_rng(seed_of("scaled-batch", *tag))


def _scale(rng, shape):
    return jnp.asarray(rng.uniform(0.25, 2.0, shape).astype(np.float32))


def _operands(rng, pair, bshape, m, n, k, transpose_b, fa, fb, b_batch=None):
    """a (bshape, m, k); b (b_batch or bshape, k, n) ((..., n, k) with transpose_b); scales of
    the forms fa / fb with the same batch dims."""
    bb = bshape if b_batch is None else b_batch
    a = quant(rng, bshape + (m, k), pair[0], 16)
    b = quant(rng, bb + ((n, k) if transpose_b else (k, n)), pair[1], 16)
    kb, nb = cdiv(k, 128), cdiv(n, 128)
    sa = {None: None, "tensor": _scale(rng, ()), "row": _scale(rng, bshape + (m,)),
          "block": _scale(rng, bshape + (m, kb))}[fa]
    sb = {None: None, "tensor": _scale(rng, ()), "column": _scale(rng, bb + (n,)),
          "block": _scale(rng, bb + ((nb, kb) if transpose_b else (kb, nb)))}[fb]
    return a, b, sa, sb


def _same(got, want):
    """int32 bit-exact; float outputs up to the float32 rounding of a differently fused
    epilogue (bfloat16: one unit in the last place)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    if got.dtype == np.int32:
        np.testing.assert_array_equal(got, want)
        return
    tol = 1e-5 if got.dtype == np.float32 else 8e-3
    g, w = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * 1e-2 * float(np.abs(w).max()))


def _per_item(fn, *xs):
    """fn over the leading dim of the operands that have it (None / 0-d: shared), stacked."""
    size = max(x.shape[0] for x in xs if x is not None and x.ndim > 0)
    pick = [lambda i, x=x: x if x is None or x.ndim == 0 else x[i] for x in xs]
    return jnp.stack([fn(*(p(i) for p in pick)) for i in range(size)])


FORMS = [(None, None), ("tensor", "tensor"), ("row", "column"), ("tensor", "column"),
         ("block", "block")]


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("forms", FORMS, ids=str)
@pytest.mark.parametrize("pair", [(E4M3, E4M3), (E5M2, E4M3), (I8, I8)], ids=str)
def test_batch_of_b_is_the_per_item_products(path, pair, forms, transpose_b):
    """a (3, M, K) with b (3, K, N): each item's product, its scales, c (per item) and bias."""
    if forms == ("block", "block") and pair[0] == I8:
        pytest.skip("block scales are fp8's")
    rng = _rng("bb", pair, forms, transpose_b)
    m, n, k = 21, 140, 272
    a, b, sa, sb = _operands(rng, pair, (3,), m, n, k, transpose_b, *forms)
    c = jnp.asarray(rng.standard_normal((3, m, n)).astype(np.float32))
    bias = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    if forms == (None, None) and pair[0] == I8:
        def f(a, b, sa, sb, c):
            return tg.scaled_matmul(a, b, None, None, out_dtype=jnp.int32,
                                    transpose_b=transpose_b)
    else:
        def f(a, b, sa, sb, c):
            return tg.scaled_matmul(a, b, sa, sb, out_dtype=F32, c=c, beta=0.5, bias=bias,
                                    activation="gelu_tanh", transpose_b=transpose_b)
    got = jax.jit(f)(a, b, sa, sb, c)
    want = _per_item(f, a, b, sa, sb, c)
    assert got.shape == (3, m, n)
    _same(got, want)


@pytest.mark.parametrize("forms", FORMS, ids=str)
def test_vmap_over_b_and_over_a(path, forms):
    """jax.vmap of the 2-D product over b (and its scales, c), over a (and its scales), over
    both, and nested: each equals the per-item products."""
    pair = (E4M3, E4M3)
    rng = _rng("vm", forms)
    m, n, k = 9, 130, 160
    a, b, sa, sb = _operands(rng, pair, (4,), m, n, k, False, *forms)
    c = jnp.asarray(rng.standard_normal((4, 1, n)).astype(np.float32))

    def f(a, b, sa, sb, c):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=BF16, c=c, beta=2.0)
    one = (lambda x, i: x if x is None or x.ndim == 0 else x[i])
    over_b = (None, 0, None, None if forms[1] in (None, "tensor") else 0, 0)
    over_a = (0, None, None if forms[0] in (None, "tensor") else 0, None, None)
    cases = [(over_b, (one(a, 0), b, one(sa, 0), sb, c)),
             (over_a, (a, one(b, 0), sa, one(sb, 0), one(c, 0))),
             ((0, 0, over_a[2], over_b[3], 0), (a, b, sa, sb, c))]
    for axes, args in cases:
        got = jax.jit(jax.vmap(f, in_axes=axes))(*args)
        want = jnp.stack([f(*(x if ax is None else x[i] for x, ax in zip(args, axes)))
                          for i in range(4)])
        _same(got, want)
    # nested: an outer vmap over a, an inner one over b (one launch of 2 x 4 items)
    g = jax.vmap(jax.vmap(f, in_axes=over_b), in_axes=(0, None, over_a[2], None, None))
    got = jax.jit(g)(a[:2], b, None if sa is None or sa.ndim == 0 else sa[:2], sb, c) \
        if forms[0] not in (None, "tensor") else jax.jit(g)(a[:2], b, sa, sb, c)
    for i in range(2):
        for j in range(4):
            want = f(a[i], b[j], one(sa, i) if forms[0] not in (None, "tensor") else sa,
                     one(sb, j) if forms[1] not in (None, "tensor") else sb, c[j])
            _same(got[i, j], want)


def test_vmap_of_per_tensor_scales_and_beta(path):
    """Per-item per-tensor scales (become the call's row / column scales) and a per-item beta
    (one call per item) equal the per-item products."""
    rng = _rng("pt")
    a, b, _, _ = _operands(rng, (E4M3, E4M3), (3,), 17, 150, 200, True, None, None)
    sa, sb, beta = _scale(rng, (3,)), _scale(rng, (3,)), _scale(rng, (3,))
    c = jnp.asarray(rng.standard_normal((17, 150)).astype(np.float32))

    def f(a, b, sa, sb, beta):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=F32, c=c, beta=beta, transpose_b=True)
    for axes in ((0, None, 0, 0, None), (None, 0, 0, 0, None), (0, 0, None, None, 0)):
        args = [x if ax is not None else (x[0] if x.ndim > 0 and x.shape[0] == 3 else x)
                for x, ax in zip((a, b, sa, sb, beta), axes)]
        got = jax.jit(jax.vmap(f, in_axes=axes))(*args)
        want = jnp.stack([f(*(x if ax is None else x[i] for x, ax in zip(args, axes)))
                          for i in range(3)])
        _same(got, want)


def test_broadcast_batch_dims(path):
    """Batch dims of a and b broadcast as in jnp.matmul: a (2, 1, M, K) x b (3, K, N)."""
    rng = _rng("bc")
    a = quant(rng, (2, 1, 11, 96), E4M3)
    b = quant(rng, (3, 96, 40), E4M3)
    sa, sb = _scale(rng, (2, 1, 11)), _scale(rng, (3, 40))
    got = jax.jit(lambda *x: tg.scaled_matmul(*x, out_dtype=F32))(a, b, sa, sb)
    assert got.shape == (2, 3, 11, 40)
    for i in range(2):
        for j in range(3):
            want = tg.scaled_matmul(a[i, 0], b[j], sa[i, 0], sb[j], out_dtype=F32)
            _same(got[i, j], want)
    # b with batch dims of 1 only is shared: a's batch folds into the rows
    got = tg.scaled_matmul(a[:, 0], b[:1], sa[:, 0], sb[:1], out_dtype=F32)
    assert got.shape == (2, 11, 40)
    _same(got[1], tg.scaled_matmul(a[1, 0], b[0], sa[1, 0], sb[0], out_dtype=F32))


def test_grad_of_scales_under_vmap_over_b(path):
    """grad with respect to per-item scales and the bias, vmapped over b, equals the per-item
    gradients."""
    rng = _rng("gv")
    a, b, sa, sb = _operands(rng, (E4M3, E5M2), (3,), 12, 140, 130, False, "row", "column")
    bias = jnp.asarray(rng.standard_normal(140).astype(np.float32))

    def loss(sa, sb, bias, b):
        y = tg.scaled_matmul(a[0], b, sa, sb, out_dtype=F32, bias=bias, activation="relu")
        return jnp.sum(y * y)
    g = jax.grad(loss, argnums=(0, 1, 2))
    got = jax.jit(jax.vmap(g, in_axes=(None, 0, None, 0)))(sa[0], sb, bias, b)
    for i in range(3):
        want = g(sa[0], sb[i], bias, b[i])
        for x, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(x[i]), np.asarray(w), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dims, lhs_shape, rhs_shape", [
    ((((2,), (1,)), ((0,), (0,))), (3, 9, 37), (3, 37, 20)),   # (B, M, K) x (B, K, N)
    ((((2,), (2,)), ((0,), (0,))), (3, 9, 37), (3, 20, 37)),   # (B, M, K) x (B, N, K)
    ((((1,), (0,)), ((2,), (2,))), (9, 37, 3), (37, 20, 3)),   # batch dim last
    ((((3, 1), (1, 2)), ((0,), (0,))), (2, 5, 4, 9), (2, 9, 5, 7)),  # two contracting dims
], ids=["bmk-bkn", "bmk-bnk", "batch-last", "two-k"])
def test_int8_dot_general_with_batch_dims(path, dims, lhs_shape, rhs_shape):
    """int8 x int8 -> int32 dot_general with batch dims is one (batched) product of ours, exact
    against numpy int64, K not a multiple of 16 included."""
    rng = _rng("dg", lhs_shape)
    x = jnp.asarray(rng.integers(-128, 128, lhs_shape, dtype=np.int8))
    y = jnp.asarray(rng.integers(-128, 128, rhs_shape, dtype=np.int8))
    got = jax.jit(lambda x, y: tg.dot_general(x, y, dims, preferred_element_type=jnp.int32))(
        x, y)
    want = jax.lax.dot_general(x.astype(jnp.int32), y.astype(jnp.int32), dims)
    assert got.dtype == jnp.int32 and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_int8_matmul_with_batch_dims(path):
    rng = _rng("mm")
    x = jnp.asarray(rng.integers(-128, 128, (2, 1, 7, 40), dtype=np.int8))
    y = jnp.asarray(rng.integers(-128, 128, (3, 40, 9), dtype=np.int8))
    got = tg.matmul(x, y, out_dtype=jnp.int32)
    want = np.matmul(np.asarray(x, np.int64), np.asarray(y, np.int64))
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), want)


# ---------------------------------------------------------------------------------------------
# The CUDA lowering (plan forced): one call.

needs_ext = pytest.mark.skipif(not _ffi.available(), reason="the extension is not built")


def _batch_of(call, which):
    """The leading (batch) dim of operand `which` of a tcgemm call (0: a, 1: b, -1: result)."""
    if which == -1:
        return int(re.match(r"tensor<(\d+)x", call["results"][0]).group(1))
    ops = re.findall(r"tensor<([0-9x]+)x[a-zA-Z]", call["line"].split("->")[0].split(":")[-1])
    return int(ops[which].split("x")[0])


@needs_ext
def test_lowering_one_call(monkeypatch):
    from jax_tcgemm import scaled
    asked = []
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: asked.append(a) or (CFG, 1))
    rng = _rng("low")
    a, b, sa, sb = _operands(rng, (E4M3, E4M3), (5,), 24, 256, 256, False, "row", "column")

    def f(a, b, sa, sb):
        return tg.scaled_matmul(a, b, sa, sb)
    # a batch of b: one call of 5 items, b at its own stride
    text = cuda_text(f, a, b, sa, sb)
    (call,) = custom_calls(text)
    assert "stablehlo.while" not in text and _batch_of(call, -1) == 5 and _batch_of(call, 1) == 5
    assert asked[-1] == ("fp8", 24, 256, 256, "outer", 5, False)
    # vmap over a with b shared: the items' rows join (one item of 5 x 24 rows)
    text = cuda_text(jax.vmap(f, in_axes=(0, None, 0, None)), a, b[0], sa, sb[0])
    (call,) = custom_calls(text)
    assert "stablehlo.while" not in text and "tensor<1x120x256xf8E4M3FN>" in call["line"]
    assert asked[-1] == ("fp8", 120, 256, 256, "outer", 1, False)
    # nested vmaps (a outer, b inner): one call of 5 x 5 items
    g = jax.vmap(jax.vmap(f, in_axes=(None, 0, None, 0)), in_axes=(0, None, 0, None))
    text = cuda_text(g, a, b, sa, sb)
    (call,) = custom_calls(text)
    assert "stablehlo.while" not in text and _batch_of(call, -1) == 25
    # int8 dot_general with a batch dim: one call
    x, y = jnp.ones((4, 8, 64), jnp.int8), jnp.ones((4, 64, 32), jnp.int8)
    text = cuda_text(lambda x, y: tg.dot_general(x, y, (((2,), (1,)), ((0,), (0,))),
                                                 preferred_element_type=jnp.int32), x, y)
    (call,) = custom_calls(text)
    assert _batch_of(call, -1) == 4 and call["pack"] == "true"
    # block scales over a batch of b: one call, each item's scales stacked along the rows
    # ((3 Kb, M padded to 4) and (3 Kb, Nb))
    a, b, sa, sb = _operands(rng, (E4M3, E4M3), (3,), 22, 256, 384, False, "block", "block")
    text = cuda_text(f, a, b, sa, sb)
    (call,) = custom_calls(text)
    assert "stablehlo.while" not in text and _batch_of(call, -1) == 3
    assert "tensor<9x24xf32>" in call["line"] and "tensor<9x2xf32>" in call["line"]
    # ... and a per-item beta: one call per item (a loop)
    c = jnp.ones((22, 256), jnp.float32)
    text = cuda_text(jax.vmap(lambda a, beta: tg.scaled_matmul(a, b[0], sa[0], sb[0], c=c,
                                                               beta=beta)), a, jnp.ones(3))
    (call,) = custom_calls(text)
    assert "stablehlo.while" in text and _batch_of(call, -1) == 1
