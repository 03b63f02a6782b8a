"""CPU tests of tg.scaled_matmul (issue 26): its lax path, the reference of the fp8 / int8
kernels to come.

* Numerics against a float64 numpy reference of the same quantised values: every dtype pair x
  scale form x out dtype, both layouts of b, M / N / K no multiple of 128 (K with a partial
  last block), leading batch dims of a with their scale forms. int8: int32 output bit-exact
  (also past 2^24), scaled float32 output bit-exact against the float32 formula.
* The epilogue (activations, bias, c in its broadcast forms, beta static and traced) composed
  with each scale family.
* jit, vmap (over a, over b), grad / jvp w.r.t. the scales (float64 formulas), c, bias, beta,
  grad(grad); differentiating a or b is a TypeError.
* No dequantised copy: no M x K or K x N float array in the jaxpr.
* Every trace-time error, naming shapes and dtypes: test_scaled_errors_cpu.py.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import jax_tcgemm as tg

from conftest import assert_close, epilogue64, f64, rel_err, scaled_ref64, seed_of

E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
I8, I32, F16, BF16, F32 = (np.dtype(np.int8), np.dtype(np.int32), np.dtype(jnp.float16),
                           np.dtype(jnp.bfloat16), np.dtype(np.float32))
PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3), (I8, I8)]
PAIR_IDS = ["e4m3xe4m3", "e4m3xe5m2", "e5m2xe4m3", "s8xs8"]
OUTS = [BF16, F16, F32]
# (a_scale form, b_scale form): "tensor" (), "tensor1" (1,), "row" (M,), "column" (N,),
# "block" (M, Kb) / (Kb, Nb), None: no scales.
FORMS = [("tensor", "tensor"), ("tensor1", "tensor1"), ("row", "column"), ("row", "tensor"),
         ("tensor", "column"), ("block", "block"), (None, None)]
FORM_IDS = [f"{x}-{y}" for x, y in FORMS]
M, N, K = 37, 150, 300  # Nb = 2 (last one partial), Kb = 3 (last one partial)
S = jax.ShapeDtypeStruct


@pytest.fixture(autouse=True)
def _on_cpu():  # the lax path on the CPU, also on a GPU host
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def cdiv(x, y):
    return -(-x // y)


def quant(rng, shape, dtype, lim=128):
    """Fresh random quantised values (never constant): int8 uniform in [-lim, lim), fp8 a
    rounded normal (e5m2 with a wider spread: it has the range)."""
    if dtype == I8:
        return jnp.asarray(rng.integers(-lim, lim, shape, dtype=np.int8))
    sd = 4.0 if dtype == E5M2 else 1.0
    return jnp.asarray((rng.standard_normal(shape) * sd).astype(np.float32)).astype(dtype)


def make_scale(rng, form, side, m, n, k, transpose_b=False, batch=()):
    if form is None:
        return None
    if form == "tensor":
        shape = ()
    elif form == "tensor1":
        shape = (1,)
    elif form == "row":
        shape = batch + (m,)
    elif form == "column":
        shape = (n,)
    elif side == "a":
        shape = batch + (m, cdiv(k, 128))
    else:
        shape = (cdiv(n, 128), cdiv(k, 128)) if transpose_b else (cdiv(k, 128), cdiv(n, 128))
    return jnp.asarray(rng.uniform(0.25, 2.0, shape).astype(np.float32))


def case(pair, fa, fb, *, m=M, n=N, k=K, transpose_b=False, batch=(), seed=()):
    rng = np.random.default_rng(seed_of(pair, fa, fb, m, n, k, transpose_b, batch, seed))
    lim = 128 if fa is not None else 16  # unscaled int8 sums: finite in a float16 output
    a = quant(rng, batch + (m, k), pair[0], lim)
    b = quant(rng, (n, k) if transpose_b else (k, n), pair[1], lim)
    sa = make_scale(rng, fa, "a", m, n, k, transpose_b, batch)
    sb = make_scale(rng, fb, "b", m, n, k, transpose_b)
    if pair[0] == I8 and sa is not None:
        sa = sa * np.float32(1 / 4096)  # int8 sums reach ~1e5: outputs of order 10
    return a, b, sa, sb


def ref64(a, b, sa, sb, transpose_b=False):
    """float64 sum_k a b * scales of the quantised values; a (..., M, K) (conftest.scaled_ref64,
    block scales where sa has a's rank)."""
    return scaled_ref64(a, b, sa, sb, transpose_b=transpose_b,
                        block=sa is not None and np.ndim(sa) >= np.ndim(a))


# ---------------------------------------------------------------------------------------------
# Numerics.

@pytest.mark.parametrize("out_dtype", OUTS, ids=str)
@pytest.mark.parametrize("forms", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_numerics(pair, forms, out_dtype):
    a, b, sa, sb = case(pair, *forms)
    out = tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype)
    assert out.shape == (M, N) and out.dtype == out_dtype
    assert_close(out, ref64(a, b, sa, sb), out_dtype, K, f"{pair} {forms}")


@pytest.mark.parametrize("forms", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_transpose_b(pair, forms):
    """b (N, K) (K-major, as Hopper fp8 wgmma reads it), its block grid (Nb, Kb)."""
    a, b, sa, sb = case(pair, *forms, transpose_b=True, m=20, n=260, k=130)  # Nb 3, Kb 2
    out = tg.scaled_matmul(a, b, sa, sb, out_dtype=F32, transpose_b=True)
    assert_close(out, ref64(a, b, sa, sb, transpose_b=True), F32, 130)
    if sa is not None and forms[1] == "block":  # the same numbers as b (K, N)
        bt = jnp.asarray(np.asarray(b).T)
        again = tg.scaled_matmul(a, bt, sa, sb.T, out_dtype=F32)
        assert rel_err(again, out) < 1e-6  # (XLA's summation order may differ by layout)


@pytest.mark.parametrize("k", [1, 127, 128, 129, 256, 400])
def test_block_k_edges(k):
    """K below, at and past block multiples: full blocks in the loop, a partial last one."""
    a, b, sa, sb = case((E4M3, E4M3), "block", "block", m=9, n=131, k=k)
    out = tg.scaled_matmul(a, b, sa, sb, out_dtype=F32)
    assert_close(out, ref64(a, b, sa, sb), F32, k)


@pytest.mark.parametrize("forms", [("tensor", "tensor"), ("row", "column"), ("block", "block"),
                                   ("row", "tensor")], ids=str)
def test_batched_a(forms):
    """a (2, 3, M, K): rows of the batch folded into M; a's scales per batch item or shared."""
    batch = (2, 3)
    a, b, sa, sb = case((E4M3, E5M2), *forms, batch=batch, m=17, n=140, k=200)
    out = tg.scaled_matmul(a, b, sa, sb, out_dtype=F32)
    assert out.shape == batch + (17, 140)
    assert_close(out, ref64(a, b, sa, sb), F32, 200)
    if forms[0] in ("row", "block"):  # a scale shared by the first batch dim (size 1 there)
        sa1 = sa[:1]
        out1 = tg.scaled_matmul(a, b, sa1, sb, out_dtype=F32)
        assert_close(out1, ref64(a, b, jnp.broadcast_to(sa1, sa.shape), sb), F32, 200)


def test_int8_int32_bit_exact():
    """int8 x int8 -> int32 without scales: the exact integer product, also past 2^24 (where
    float32 would round) and with batch dims and transpose_b."""
    rng = np.random.default_rng(seed_of("int32"))
    k = 1100
    a = rng.integers(-128, 128, (2, 33, k), dtype=np.int8)
    a[0, 0] = -128  # row 0 x column 0: 1100 * 16384 = 18022400 > 2^24
    b = rng.integers(-128, 128, (k, 45), dtype=np.int8)
    b[:, 0] = -128
    want = a.astype(np.int64) @ b.astype(np.int64)
    assert want[0, 0, 0] > 2 ** 24
    out = tg.scaled_matmul(jnp.asarray(a), jnp.asarray(b), None, None, out_dtype=jnp.int32)
    assert out.dtype == I32 and np.array_equal(np.asarray(out), want)
    out_t = tg.scaled_matmul(jnp.asarray(a), jnp.asarray(b.T.copy()), None, None,
                             out_dtype=jnp.int32, transpose_b=True)
    assert np.array_equal(np.asarray(out_t), want)


@pytest.mark.parametrize("forms", [("row", "column"), ("tensor", "tensor"), ("tensor", "column")],
                         ids=str)
def test_int8_scaled_bit_exact(forms):
    """int8 with per-tensor / per-row / per-column scales to float32: exactly
    float32(int32 acc) * (float32(sa) * float32(sb)), each product rounded once."""
    a, b, sa, sb = case((I8, I8), *forms, n=70, k=520)
    out = np.asarray(tg.scaled_matmul(a, b, sa, sb, out_dtype=F32))
    acc = (np.asarray(a).astype(np.int64) @ np.asarray(b).astype(np.int64)).astype(np.float32)
    SA, SB = np.asarray(sa), np.asarray(sb)
    s = (SA[:, None] if SA.ndim == 1 else SA) * SB
    assert np.array_equal(out, acc * s.astype(np.float32))


def test_int8_block_partials_exact():
    """int8 block partial products (<= 128 * 2^14 = 2^21) are exact in float32: a float32
    output differs from the float64 reference only by the scaling and summation roundings."""
    a, b, sa, sb = case((I8, I8), "block", "block", m=16, n=129, k=1000)
    out = tg.scaled_matmul(a, b, sa, sb, out_dtype=F32)
    assert rel_err(out, ref64(a, b, sa, sb)) < 1e-6


def test_python_scalar_scales():
    a, b, _, _ = case((E4M3, E4M3), None, None)
    out = tg.scaled_matmul(a, b, 0.5, 3, out_dtype=F32)
    assert_close(out, 1.5 * ref64(a, b, None, None), F32, K)


# ---------------------------------------------------------------------------------------------
# The epilogue (jax_tcgemm.epilogue: the same rules as tg.gemm).

ACTS = (None, "relu", "gelu", "gelu_tanh", "silu")


@pytest.mark.parametrize("activation", ACTS, ids=str)
@pytest.mark.parametrize("forms,pair", [(("row", "column"), (E4M3, E4M3)),
                                        (("block", "block"), (E5M2, E4M3)),
                                        (("tensor", "column"), (I8, I8))], ids=str)
def test_epilogue(forms, pair, activation):
    a, b, sa, sb = case(pair, *forms, seed="epi")
    rng = np.random.default_rng(seed_of("epi", forms, activation))
    bias = jnp.asarray(rng.standard_normal(N).astype(np.float32))
    ab = ref64(a, b, sa, sb)
    for c_shape, c_dtype, beta in [((M, N), F32, 0.5), ((M, 1), BF16, -2.0), ((N,), F32, 1.0)]:
        c = jnp.asarray(rng.standard_normal(c_shape).astype(np.float32)).astype(c_dtype)
        for out_dtype in (F32, BF16):
            if c_dtype not in (F32, out_dtype):
                continue
            out = tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, bias=bias, c=c,
                                   beta=beta, activation=activation)
            want = epilogue64(ab, c, bias, beta=beta, activation=activation)[0]
            assert_close(out, want, out_dtype, K, f"c{c_shape} {c_dtype} beta={beta}")


def test_epilogue_traced_beta_and_batched_c():
    a, b, sa, sb = case((E4M3, E4M3), "block", "block", batch=(3,), m=10, n=40, k=150)
    rng = np.random.default_rng(seed_of("batched c"))
    c = jnp.asarray(rng.standard_normal((3, 1, 40)).astype(np.float32))
    f = jax.jit(lambda beta: tg.scaled_matmul(a, b, sa, sb, out_dtype=F32, c=c, beta=beta,
                                              activation="silu"))
    out = f(jnp.float32(0.75))
    want = epilogue64(ref64(a, b, sa, sb), c, None, beta=0.75, activation="silu")[0]
    assert_close(out, want, F32, 150)


# ---------------------------------------------------------------------------------------------
# Transformations.

def test_jit_matches_eager():
    for forms in (("row", "column"), ("block", "block")):
        a, b, sa, sb = case((E4M3, E5M2), *forms)
        eager = tg.scaled_matmul(a, b, sa, sb, bias=jnp.ones(N, F32), activation="gelu")
        jitted = jax.jit(lambda *x: tg.scaled_matmul(*x, bias=jnp.ones(N, F32),
                                                     activation="gelu"))(a, b, sa, sb)
        assert np.array_equal(np.asarray(eager, np.float32), np.asarray(jitted, np.float32))


@pytest.mark.parametrize("forms", [("row", "column"), ("block", "block")], ids=str)
def test_vmap(forms):
    """vmap over a and its scales, and over b and its scales (a batched b)."""
    items = [case((E4M3, E4M3), *forms, m=11, n=130, k=140, seed=i) for i in range(3)]
    a, b, sa, sb = (jnp.stack(x) for x in zip(*items))
    f = lambda a, b, sa, sb: tg.scaled_matmul(a, b, sa, sb, out_dtype=F32)  # noqa: E731
    out_a = jax.vmap(f, (0, None, 0, None))(a, b[0], sa, sb[0])
    out_b = jax.vmap(f, (None, 0, None, 0))(a[0], b, sa[0], sb)
    for i in range(3):
        assert_close(out_a[i], ref64(a[i], b[0], sa[i], sb[0]), F32, 140)
        assert_close(out_b[i], ref64(a[0], b[i], sa[0], sb[i]), F32, 140)


def _grads64(a, b, sa, sb, w, transpose_b=False):
    """d sum(w * D) / d sa, d sb in float64: D is linear in each scale (basis vectors)."""
    def grad_of(x, other, first):
        g = np.zeros(x.shape)
        for idx in np.ndindex(*x.shape):
            e = np.zeros(x.shape)
            e[idx] = 1.0
            d = ref64(a, b, e, other, transpose_b) if first else ref64(a, b, other, e, transpose_b)
            g[idx] = np.sum(w * d)
        return g
    return grad_of(f64(sa), f64(sb), True), grad_of(f64(sb), f64(sa), False)


@pytest.mark.parametrize("forms", [("tensor", "tensor"), ("row", "column"), ("row", "tensor"),
                                   ("block", "block")], ids=str)
def test_grad_scales(forms):
    a, b, sa, sb = case((E4M3, E5M2), *forms, m=9, n=140, k=260)
    w = np.random.default_rng(seed_of("w", forms)).standard_normal((9, 140))
    wj = jnp.asarray(w.astype(np.float32))
    loss = lambda sa, sb: jnp.sum(wj * tg.scaled_matmul(a, b, sa, sb, out_dtype=F32))  # noqa
    ga, gb = jax.grad(loss, (0, 1))(sa, sb)
    wa, wb = _grads64(a, b, sa, sb, w)
    assert ga.shape == sa.shape and gb.shape == sb.shape and ga.dtype == gb.dtype == F32
    assert rel_err(ga, wa) < 1e-5 and rel_err(gb, wb) < 1e-5
    # transpose_b: the same gradients (b_scale's grid transposed with b)
    bt = jnp.asarray(np.asarray(b).T)
    sbt = sb.T if forms[1] == "block" else sb
    gat, gbt = jax.grad(lambda sa, sb: jnp.sum(wj * tg.scaled_matmul(
        a, bt, sa, sb, out_dtype=F32, transpose_b=True)), (0, 1))(sa, sbt)
    assert rel_err(gat, wa) < 1e-5 and rel_err(gbt.T if forms[1] == "block" else gbt, wb) < 1e-5
    # jvp: D(d sa, sb) + D(sa, d sb)
    dsa, dsb = sa * 0.3 + 0.1, sb * -0.7 + 0.2
    _, tan = jax.jvp(lambda sa, sb: tg.scaled_matmul(a, b, sa, sb, out_dtype=F32),
                     (sa, sb), (dsa, dsb))
    want = ref64(a, b, dsa, sb) + ref64(a, b, sa, dsb)
    assert rel_err(tan, want) < 1e-5


def _dequant_composite(a, b, sa, sb, **kw):
    """The dequantise-then-dot composite in plain jnp (float32, HIGHEST): AD cross-check."""
    A, B = a.astype(F32), b.astype(F32)
    kb = cdiv(a.shape[-1], 128)
    if sa.ndim == 2:
        A = A * jnp.repeat(sa, 128, axis=1)[:, :a.shape[-1]]
        B = B * jnp.repeat(jnp.repeat(sb, 128, axis=0), 128, axis=1)[:b.shape[0], :b.shape[1]]
    else:
        A = A * (sa[:, None] if sa.ndim == 1 else sa)
        B = B * sb
    del kb
    p = jnp.matmul(A, B, precision=jax.lax.Precision.HIGHEST)
    pre = p + kw["beta"] * kw["c"] + kw["bias"]
    return jax.nn.gelu(pre, approximate=True)


@pytest.mark.parametrize("forms", [("row", "column"), ("block", "block")], ids=str)
def test_grad_epilogue_and_second_order(forms):
    """grad through the epilogue w.r.t. scales, c, bias, traced beta; grad(grad) w.r.t. the
    scales: against jax's AD of the dequantise-then-dot composite."""
    a, b, sa, sb = case((E4M3, E4M3), *forms, m=12, n=133, k=270)
    rng = np.random.default_rng(seed_of("grad epi", forms))
    c = jnp.asarray(rng.standard_normal((12, 133)).astype(np.float32))
    bias = jnp.asarray(rng.standard_normal(133).astype(np.float32))
    beta = jnp.float32(0.6)

    def ours(sa, sb, c, bias, beta):
        return jnp.sum(jnp.sin(tg.scaled_matmul(a, b, sa, sb, out_dtype=F32, c=c, beta=beta,
                                                bias=bias, activation="gelu_tanh")))

    def theirs(sa, sb, c, bias, beta):
        return jnp.sum(jnp.sin(_dequant_composite(a, b, sa, sb, c=c, beta=beta, bias=bias)))

    args = (sa, sb, c, bias, beta)
    g1 = jax.grad(ours, range(5))(*args)
    g2 = jax.grad(theirs, range(5))(*args)
    for x, y in zip(g1, g2):
        assert rel_err(x, y) < 1e-4
    h1 = jax.grad(lambda sa: jnp.sum(jax.grad(ours, 1)(sa, sb, c, bias, beta)))(sa)
    h2 = jax.grad(lambda sa: jnp.sum(jax.grad(theirs, 1)(sa, sb, c, bias, beta)))(sa)
    assert rel_err(h1, h2) < 1e-4


def test_grad_without_scales():
    """No scales: grad w.r.t. the epilogue's float operands (bias, c) still works."""
    a, b, _, _ = case((E4M3, E5M2), None, None, m=6, n=30, k=140)
    bias = jnp.linspace(-1, 1, 30, dtype=F32)
    c = jnp.linspace(0, 2, 6 * 30, dtype=F32).reshape(6, 30)
    f = lambda bias, c: jnp.sum(tg.scaled_matmul(a, b, None, None, out_dtype=F32, c=c,  # noqa
                                                 beta=2.0, bias=bias, activation="relu"))
    gb, gc = jax.grad(f, (0, 1))(bias, c)
    mask = (ref64(a, b, None, None) + 2.0 * f64(c) + f64(bias)) > 0
    assert np.array_equal(np.asarray(gb), mask.sum(0).astype(np.float32))
    assert np.array_equal(np.asarray(gc), 2.0 * mask.astype(np.float32))


def test_grad_vmap():
    items = [case((E4M3, E4M3), "block", "block", m=5, n=129, k=129, seed=i) for i in range(2)]
    a, b, sa, sb = (jnp.stack(x) for x in zip(*items))
    loss = lambda a, sa, sb: jnp.sum(tg.scaled_matmul(a, b[0], sa, sb, out_dtype=F32) ** 2)  # noqa
    g = jax.vmap(jax.grad(loss, 1), (0, 0, None))(a, sa, sb[0])
    for i in range(2):
        assert rel_err(g[i], jax.grad(loss, 1)(a[i], sa[i], sb[0])) < 1e-6


def test_no_gradient_for_quantised_operands():
    a, b, sa, sb = case((E4M3, E4M3), "row", "column")
    f = lambda a, b: jnp.sum(tg.scaled_matmul(a, b, sa, sb, out_dtype=F32))  # noqa: E731
    for argnum, name in ((0, "a"), (1, "b")):
        with pytest.raises(TypeError, match=rf"{name} \(float8_e4m3fn\) is quantised data"):
            jax.grad(f, argnum)(a, b)
    # a quantiser in front (astype to fp8): the same error, never an fp8-rounded gradient
    x = jnp.ones((M, K), F32) * 0.5
    with pytest.raises(TypeError, match="quantised data"):
        jax.grad(lambda x: jnp.sum(tg.scaled_matmul(x.astype(E4M3), b, sa, sb)))(x)
    ai, bi, sai, sbi = case((I8, I8), "row", "column")
    with pytest.raises(TypeError):  # jax's own: grad of an integer input
        jax.grad(lambda a: jnp.sum(tg.scaled_matmul(a, bi, sai, sbi, out_dtype=F32)))(ai)


@pytest.mark.parametrize("forms", [("row", "column"), ("block", "block")], ids=str)
def test_no_dequantised_copy(forms):
    """No float M x K or K x N array anywhere in the jaxpr (forward, and under grad): scales
    go to the float32 accumulator / per-block partial products, never to a or b."""
    m, n, k = 24, 136, 392
    a, b, sa, sb = case((E4M3, E4M3), *forms, m=m, n=n, k=k)
    fwd = jax.make_jaxpr(lambda *x: tg.scaled_matmul(*x))(a, b, sa, sb)
    bwd = jax.make_jaxpr(jax.grad(lambda sa, sb: jnp.sum(tg.scaled_matmul(
        a, b, sa, sb, out_dtype=F32)), (0, 1)))(sa, sb)
    for jaxpr in (fwd, bwd):
        text = str(jaxpr)
        assert not re.search(rf"(f32|bf16|f16)\[({m},{k}|{k},{n})\]", text), text


# ---------------------------------------------------------------------------------------------
# The kernel path's wrapper (scaled._fused: the kernel on CUDA, the reference elsewhere, the
# reference's derivatives), forced on here: on the CPU its lowering is the reference, so its
# results equal the lax path's exactly and its AD rule is checked against the lax path's.

@pytest.fixture
def kernel_path(monkeypatch):
    from jax_tcgemm import scaled
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: ("sm90_128x128x64_s6_g2", 1))
    return scaled


@pytest.mark.parametrize("forms", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_kernel_wrapper_values(kernel_path, pair, forms):
    a, b, sa, sb = case(pair, *forms, m=21, n=140, k=272, seed="wrap")
    c = jnp.asarray(np.random.default_rng(1).standard_normal((21, 140)).astype(np.float32))

    def f(a, b, sa, sb, c, beta):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=BF16, c=c, beta=beta,
                                activation="silu")
    got = jax.jit(f)(a, b, sa, sb, c, jnp.float32(0.5))
    assert "custom_jvp_call" in str(jax.make_jaxpr(f)(a, b, sa, sb, c, jnp.float32(0.5)))
    kernel_path.kernel_config, saved = (lambda *a: None), kernel_path.kernel_config
    want = jax.jit(f)(a, b, sa, sb, c, jnp.float32(0.5))
    kernel_path.kernel_config = saved
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_kernel_wrapper_int32(kernel_path):
    a, b, _, _ = case(PAIRS[3], None, None, m=19, n=33, k=160, seed="wrap32")
    got = jax.jit(lambda a, b: tg.scaled_matmul(a, b, None, None, out_dtype=I32))(a, b)
    want = np.asarray(a, np.int64) @ np.asarray(b, np.int64)
    assert got.dtype == I32
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("forms", [("tensor", "tensor"), ("row", "column"), ("block", "block")],
                         ids=str)
def test_kernel_wrapper_grads(kernel_path, forms):
    """grad wrt the scales, bias, c and beta through the wrapper equals the lax path's;
    vmap over a runs; differentiating a is the same TypeError."""
    a, b, sa, sb = case((E4M3, E4M3), *forms, m=9, n=140, k=260, seed="wrapgrad")
    rng = np.random.default_rng(2)
    bias = jnp.asarray(rng.standard_normal(140).astype(np.float32))
    c = jnp.asarray(rng.standard_normal((9, 140)).astype(np.float32))

    def loss(sa, sb, bias, c, beta):
        y = tg.scaled_matmul(a, b, sa, sb, out_dtype=F32, bias=bias, c=c, beta=beta,
                             activation="gelu_tanh")
        return jnp.sum(y * y)
    args = (sa, sb, bias, c, jnp.float32(0.75))
    got = jax.grad(loss, argnums=(0, 1, 2, 3, 4))(*args)
    saved = kernel_path.kernel_config
    kernel_path.kernel_config = lambda *a: None
    want = jax.grad(loss, argnums=(0, 1, 2, 3, 4))(*args)
    kernel_path.kernel_config = saved
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
    out = jax.vmap(lambda x: tg.scaled_matmul(x, b, sa, sb, out_dtype=F32))(a[None])
    assert out.shape == (1, 9, 140)
    with pytest.raises(TypeError, match="quantised data"):
        jax.jvp(lambda x: tg.scaled_matmul(x, b, sa, sb, out_dtype=F32), (a,), (a,))


def test_plan_byte():
    """The 8-bit planner: an sm90 row with kernels of the kind on compute capability 9.0 when K
    is a multiple of 16; int8 on an sm80 row on other GPUs from 8.0 on; None elsewhere (lax)."""
    from jax_tcgemm import configs, plan8
    if not configs.CONFIGS:
        pytest.skip("the extension is not built (no config table)")
    for kind in ("int8", "fp8"):
        name, split = plan8.plan_byte(8192, 8192, 8192, kind, arch=(9, 0))
        assert getattr(configs.BY_NAME[name], kind) and split == 1
        assert configs.BY_NAME[name].kind == "sm90"
        # decode-sized int8 (M <= INT8_SM80_MAX_M) on the sm80 rows on 9.0 too; fp8 never
        for m in (1, plan8.INT8_SM80_MAX_M, plan8.INT8_SM80_MAX_M + 1):
            row = configs.BY_NAME[plan8.plan_byte(m, 4096, 4096, kind, arch=(9, 0))[0]]
            assert row.kind == ("sm80" if kind == "int8" and m <= 16 else "sm90"), (kind, m)
        assert plan8.plan_byte(100, 200, 1000, kind, arch=(9, 0)) is None  # K % 16
        assert plan8.plan_byte(128, 128, 128, kind, arch=None) is None
        assert plan8.plan_byte(128, 128, 128, kind, arch=(7, 5)) is None
    # int8 off Hopper: the sm80 rows (mma.sync m16n8k32), modelled as 16-bit products of K/2;
    # fp8 has no kernel there
    for arch in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0)):
        assert plan8.plan_byte(128, 128, 128, "fp8", arch=arch) is None
        assert plan8.plan_byte(100, 200, 1000, "int8", arch=arch) is None  # K % 16
        for shape in ((8192, 8192, 8192), (16, 4096, 4096), (1000, 3000, 784), (1, 1, 16)):
            name, split = plan8.plan_byte(*shape, "int8", arch=arch)
            row = configs.BY_NAME[name]
            assert row.kind == "sm80" and row.int8, (arch, shape, name)
            assert split in plan8.byte_splits(row.tiles(*shape[:2]), shape[2])
    # fp8 on large squares: the three-consumer fp8-only row; where it would need more waves
    # (4096 x 7168: 10 against 14 of the smaller tile), the two-consumer one, which overlaps
    # its pieces, except with block scales; int8 never on an fp8-only row
    fp8_only = {c.name for c in configs.CONFIGS if c.fp8_only}
    g3, g2 = "sm90_192x128x64_s4_g3_f8", "sm90_128x128x64_s5_g2_f8"
    assert {g3, g2} <= fp8_only
    for bs in (False, True):
        assert plan8.plan_byte(8192, 8192, 8192, "fp8", arch=(9, 0), block_scales=bs) == (g3, 1)
    assert plan8.plan_byte(4096, 7168, 16384, "fp8", arch=(9, 0)) == (g2, 1)
    assert plan8.plan_byte(4096, 7168, 16384, "fp8", arch=(9, 0), block_scales=True) == (g3, 1)
    assert plan8.plan_byte(8192, 8192, 8192, "int8", arch=(9, 0))[0] not in fp8_only
    # decode-sized M: 32 column tiles of 128 leave SMs idle, so K is split (byte_splits); the
    # slices stay within twice the SMs and at least BYTE_MIN_SLICE_K of K each
    for kind in ("int8", "fp8"):
        name, split = plan8.plan_byte(48, 4096, 4096, kind, arch=(9, 0))
        tiles = configs.BY_NAME[name].tiles(48, 4096)
        assert split > 1 and tiles * split <= 2 * 132 and 4096 // split >= plan8.BYTE_MIN_SLICE_K
        assert split in plan8.byte_splits(tiles, 4096)
    for c in configs.CONFIGS:  # C++'s HasByteKernels, as the table reports it
        coop = c.kind == "sm90" and not c.pingpong
        assert c.int8 == (c.kind in ("sm80", "narrow") or (coop and not c.fp8_only)), c.name
        assert c.fp8 == (c.kind == "narrow" or (coop and c.bm == 64 * c.consumers)), c.name
