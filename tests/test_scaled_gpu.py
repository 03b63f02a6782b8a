"""GPU tests of tg.scaled_matmul on the sm90 8-bit kernels (issue 26), and on the sm80 int8
kernels (every row forced): int8 x int8 and the fp8 pairs, every scale form the kernels take
(none, per-tensor, per-row, per-column and their mixes), every output dtype, the fused
epilogue (bias, activation, beta * C with C full, per-row or per-column), b as (K, N) and as
(N, K), shapes that are not tile multiples.

References: float64 numpy of the quantised values (the operands as stored), the scales applied
to the exact product, then the epilogue (conftest.epilogue64); int8 -> int32 is compared
bit-exactly with the int64 product. Every product runs twice into fresh poisoned buffers
donated for its output (conftest.poisoned): an element never written keeps the poison, a racy
one differs between the runs. Each case also asserts that the kernel ran (the compiled HLO
calls the tcgemm custom call), products with K not a multiple of 16 included (a and b padded
with zeros along K).
"""
from __future__ import annotations

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm import configs

from conftest import act64, bound, epilogue64, f64, poisoned, rel_err, scaled_ref64, seed_of

pytestmark = pytest.mark.gpu

E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
I8, I32, F32 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float32)
F16, BF16 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16)
PAIRS = ((E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3), (I8, I8))
# float32 results of fp8 operands: Hopper's fp8 wgmma sums a k tile (128 of K) with fewer bits
# than float32 before the kernel adds it into float32 (benchmarks/NOTES.md, v34: measured
# relative errors); the bound of the other dtypes is the output rounding's.
FP8_F32_BOUND = 2e-4


def _sm90():
    return configs.device_arch() == (9, 0)


def _sm80_up():  # int8 runs on our kernels from 8.0 on (sm90 rows on 9.0, sm80 rows elsewhere)
    return configs.device_arch() is not None and configs.device_arch() >= (8, 0)


NOT_SM90 = "the 8-bit kernels run on compute capability 9.0 only"
NOT_SM80 = "the int8 kernels need compute capability 8.0+"


def quantised(rng, shape, dtype):
    """Random values of an 8-bit dtype: int8 uniform in [-127, 127]; fp8 N(0, 1) rounded."""
    if dtype == I8:
        return rng.integers(-127, 128, size=shape).astype(np.int8)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def scales(rng, form, n):
    """A positive float32 scale array of `form` (None, "tensor", or length n)."""
    if form is None:
        return None
    if form == "tensor":
        return np.float32(rng.uniform(0.5, 2.0))
    return rng.uniform(0.5, 2.0, size=n).astype(np.float32)


def block_scales(rng, m, n, k, transpose_b):
    """DeepSeek-V3 block scales in [0.5, 2]: a's (M, ceil(K/128)), b's (ceil(K/128),
    ceil(N/128)) or, with transpose_b, (ceil(N/128), ceil(K/128)) (b's layout)."""
    kb, nb = -(-k // 128), -(-n // 128)
    sa = rng.uniform(0.5, 2, (m, kb)).astype(np.float32)
    sb = rng.uniform(0.5, 2, (nb, kb) if transpose_b else (kb, nb)).astype(np.float32)
    return sa, sb


def reference(a, b, sa, sb, c, bias, beta, activation, transpose_b):
    """float64 result of the quantised operands (b as given), scales, epilogue. A 2-D sa is the
    block form: sa (M, Kb), sb (Kb, Nb) or, with transpose_b, (Nb, Kb); each 128-slice of K's
    exact partial product scaled by its blocks' scales."""
    acc = scaled_ref64(a, b, sa, sb, transpose_b=transpose_b,
                       block=sa is not None and np.ndim(sa) == 2)
    return epilogue64(acc, c, bias, beta=beta, activation=activation)[0]


def uses_kernel(fn, *args) -> bool:
    return 'custom_call_target="tcgemm"' in jax.jit(fn).lower(*args).compile().as_text()


def run_poisoned(fn, out_aval, *args):
    """fn(*args) twice, each into a fresh poisoned buffer (NaN; int32: INT32_MIN) donated for
    its output; returns (host result, both runs equal bitwise)."""
    fill = np.iinfo(np.int32).min if out_aval.dtype == I32 else np.nan

    def poison():
        return [jax.device_put(np.full(out_aval.shape, fill, out_aval.dtype))]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers.*")
        run = poisoned(lambda *xs: [fn(*xs)], poison(), *args)
        first = np.asarray(run(poison(), *args)[0][0])
        second = np.asarray(run(poison(), *args)[0][0])
    return second, np.array_equal(first.view(np.uint8), second.view(np.uint8))


def check_fp8(fails, what, fn, args, want, out_dtype, k):
    """An fp8 product fn(*args) on the kernel, run twice into poisoned outputs, against float64
    `want`: each miss is appended to `fails`."""
    if not uses_kernel(fn, *args):
        fails.append(f"{what}: the compiled product does not call the kernel")
        return
    out, same = run_poisoned(fn, jax.eval_shape(fn, *args), *args)
    tol = FP8_F32_BOUND if out_dtype == F32 else bound(out_dtype, k)
    err = rel_err(out, want)
    if not same or not err <= tol:
        fails.append(f"{what}: same={same}, rel err {err:.3g} > {tol:.3g}")


SHAPES = ((200, 136, 512), (129, 300, 1040), (1, 1, 16), (64, 128, 128), (517, 1000, 4096))
FORMS = ((None, None), ("tensor", "tensor"), ("row", "column"), ("tensor", "column"),
         ("row", "tensor"))
EPILOGUES = ((None, None, None), ("bias", "gelu_tanh", None), ("full", "relu", 0.5),
             ("row", None, -1.25), ("col", "silu", 2.0))


def _cases(pair):
    """(shape, transpose_b, out_dtype, forms, epilogue) combinations, cycled so that every
    shape meets both layouts, every output dtype, every scale form and every epilogue."""
    outs = (BF16, F16, F32)
    out = []
    for i, (shape, tb) in enumerate(itertools.product(SHAPES, (False, True))):
        out.append((shape, tb, outs[i % 3], FORMS[i % len(FORMS)], EPILOGUES[i % len(EPILOGUES)]))
    out.append((SHAPES[0], True, outs[1], FORMS[2], EPILOGUES[2]))
    return out


@pytest.mark.skipif(not _sm80_up(), reason=NOT_SM80)
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].name}x{p[1].name}")
def test_scaled_products(pair):
    ta, tb_dtype = pair
    if ta != I8 and not _sm90():
        pytest.skip(NOT_SM90)
    fails = []
    for shape, tb, out_dtype, (fa, fb), (cform, act, beta) in _cases(pair):
        m, n, k = shape
        rng = np.random.default_rng(seed_of("scaled", ta.name, tb_dtype.name, shape, tb,
                                            out_dtype.name, fa, fb, cform, act))
        a = quantised(rng, (m, k), ta)
        b = quantised(rng, (n, k) if tb else (k, n), tb_dtype)
        sa = scales(rng, fa, m)
        sb = scales(rng, fb, n)
        if ta == I8:  # int8 sums reach ~1e6: results of order 1 (finite in float16)
            if sa is None:
                a, b = a // 16, b // 16
            else:
                sa = (sa * np.float32(1 / 4096)).astype(np.float32)
        c = {None: None, "bias": None, "full": rng.standard_normal((m, n)),
             "row": rng.standard_normal((m, 1)), "col": rng.standard_normal((n,))}[cform]
        c = None if c is None else c.astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) if cform == "bias" else None
        what = (f"{ta.name}x{tb_dtype.name} {m}x{n}x{k} transpose_b={tb} -> {out_dtype.name} "
                f"scales {fa}/{fb} c={cform} act={act} beta={beta}")

        def fn(a, b, sa, sb, c, bias, beta_arr):
            return tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, c=c, bias=bias,
                                    activation=act, beta=beta_arr, transpose_b=tb)
        args = (a, b, sa, sb, c, bias, np.float32(beta or 0.0))
        if not uses_kernel(fn, *args):
            fails.append(f"{what}: the compiled product does not call the kernel")
            continue
        out, same = run_poisoned(fn, jax.eval_shape(fn, *args), *args)
        want = reference(a, b, sa, sb, c, bias, beta or 0.0, act, tb)
        if not same:
            fails.append(f"{what}: two identical calls differ")
        tol = FP8_F32_BOUND if (out_dtype == F32 and ta != I8) else bound(out_dtype, k)
        err = rel_err(out, want)
        if out.dtype != out_dtype or not err <= tol:
            fails.append(f"{what}: {out.dtype}, rel err {err:.3g} > {tol:.3g}")
    assert not fails, "\n".join(fails)


@pytest.mark.skipif(not _sm80_up(), reason=NOT_SM80)
@pytest.mark.parametrize("shape", [(200, 136, 512), (1, 300, 64), (1000, 1000, 4096),
                                   (3, 4, 5, 32), (300, 1024, 784)])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_int8_exact(shape, transpose_b):
    """int8 x int8 -> int32 on the kernel: bit-exact, batch dims of a folded into M."""
    *batch, m, n, k = shape
    rng = np.random.default_rng(seed_of("int8", shape, transpose_b))
    a = quantised(rng, (*batch, m, k), I8)
    b = quantised(rng, (n, k) if transpose_b else (k, n), I8)

    def fn(a, b):
        return tg.scaled_matmul(a, b, None, None, out_dtype=jnp.int32, transpose_b=transpose_b)
    assert uses_kernel(fn, a, b)
    out, same = run_poisoned(fn, jax.eval_shape(fn, a, b), a, b)
    want = a.astype(np.int64) @ (b.T if transpose_b else b).astype(np.int64)
    assert same and out.dtype == I32
    np.testing.assert_array_equal(out, want.astype(np.int32))


@pytest.mark.skipif(not _sm80_up(), reason=NOT_SM80)
@pytest.mark.parametrize("out_dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("transpose_b", [False, True])
def test_scales_far_from_one(out_dtype, transpose_b):
    """Per-row scales over 2^-70..2^30 and per-column ones over 2^-30..2^70 (their products
    normal floats), no epilogue: the short store path, each value times the product of its
    scales (the column scales read in pairs, one by one at odd N). int8 x int8 (exact int32
    sums): every element within its output rounding of the float64 value, zeros exact."""
    rng = np.random.default_rng(seed_of("far-scales", transpose_b, str(out_dtype)))
    m, n, k = 300, 521, 256
    a = quantised(rng, (m, k), I8)
    b = quantised(rng, (n, k) if transpose_b else (k, n), I8)
    sa = np.exp2(rng.uniform(-70, 30, m)).astype(np.float32)
    sb = np.exp2(rng.uniform(-30, 70, n)).astype(np.float32)

    def fn(a, b, sa, sb):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, transpose_b=transpose_b)
    assert uses_kernel(fn, a, b, sa, sb)
    out, same = run_poisoned(fn, jax.eval_shape(fn, a, b, sa, sb), a, b, sa, sb)
    want = reference(a, b, sa, sb, None, None, 0.0, None, transpose_b)
    tol = 3 * 2.0 ** -24 if out_dtype == F32 else 2.0 ** -8
    bad = np.abs(f64(out) - want) > tol * np.abs(want)
    assert same and not bad.any(), (same, int(bad.sum()), f64(out)[bad][:4], want[bad][:4])


@pytest.mark.skipif(not _sm90(), reason=NOT_SM90)
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].name}x{p[1].name}")
def test_k_not_a_multiple_of_16(pair):
    """K not a multiple of 16 runs on the kernel too, a and b padded with zeros along K
    (scaled._padded_plan), against the float64 reference; int8 -> int32 bit-exact at K = 33-35
    and 63, where XLA's own int8 GEMM gave twice the product on the H200 (jax 0.11.2)."""
    ta, tb_dtype = pair
    for k, tb in ((1033, False), (33, True), (63, False), (130, True)):
        rng = np.random.default_rng(seed_of("padk", ta.name, tb_dtype.name, k))
        a = quantised(rng, (96, k), ta)
        b = quantised(rng, (80, k) if tb else (k, 80), tb_dtype)
        sa, sb = scales(rng, "row", 96), scales(rng, "tensor", 1)

        def fn(a, b, sa, sb):
            return tg.scaled_matmul(a, b, sa, sb, out_dtype=jnp.float32, transpose_b=tb)
        assert uses_kernel(fn, a, b, sa, sb), k
        out = np.asarray(jax.jit(fn)(a, b, sa, sb))
        want = reference(a, b, sa, sb, None, None, 0.0, None, tb)
        tol = FP8_F32_BOUND if ta != I8 else bound(F32, k)
        assert rel_err(out, want) <= tol, (k, rel_err(out, want))
    if ta == I8:
        for k in (33, 34, 35, 63, 1):
            rng = np.random.default_rng(seed_of("padk32", k))
            a, b = quantised(rng, (131, k), I8), quantised(rng, (681, k), I8)

            def f32(a, b):
                return tg.scaled_matmul(a, b, None, None, out_dtype=jnp.int32, transpose_b=True)
            assert uses_kernel(f32, a, b), k
            np.testing.assert_array_equal(np.asarray(jax.jit(f32)(a, b)),
                                          a.astype(np.int64) @ b.T.astype(np.int64))
        # int8 with block scales runs on lax (no kernel takes it): its 128-slices' tails of 33
        # and 63 are padded there too (scaled._int_dot)
        for k, tb in ((161, True), (191, False), (1057, False)):
            rng = np.random.default_rng(seed_of("padk-block", k))
            a = quantised(rng, (70, k), I8)
            b = quantised(rng, (90, k) if tb else (k, 90), I8)
            sa, sb = block_scales(rng, 70, 90, k, tb)

            def fb(a, b, sa, sb):
                return tg.scaled_matmul(a, b, sa, sb, out_dtype=jnp.float32, transpose_b=tb)
            assert not uses_kernel(fb, a, b, sa, sb)
            err = rel_err(np.asarray(jax.jit(fb)(a, b, sa, sb)),
                          reference(a, b, sa, sb, None, None, 0.0, None, tb))
            assert err <= bound(F32, k), (k, err)


@pytest.mark.skipif(not _sm90(), reason=NOT_SM90)
def test_grad_wrt_scales_and_vmap():
    """grad with respect to the scales, bias and c through the kernel path equals the lax
    path's; vmap over a batch of b runs (sequentially) and matches the per-item products."""
    rng = np.random.default_rng(seed_of("grad-scaled"))
    a, b = quantised(rng, (64, 256), E4M3), quantised(rng, (256, 96), E4M3)
    sa, sb = np.float32(0.75), rng.uniform(0.5, 2, 96).astype(np.float32)
    bias = rng.standard_normal(96).astype(np.float32)

    def loss(sa, sb, bias):
        y = tg.scaled_matmul(a, b, sa, sb, out_dtype=jnp.float32, bias=bias,
                             activation="gelu_tanh")
        return jnp.sum(y * y)
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(sa, sb, bias)
    pre = f64(a) @ f64(b) * float(sa) * f64(sb) + f64(bias)
    from conftest import act_grad64
    y = act64("gelu_tanh", pre)
    dpre = 2 * y * act_grad64("gelu_tanh", pre)
    ab = f64(a) @ f64(b)
    want = ((dpre * ab * f64(sb)).sum(), (dpre * ab * float(sa)).sum(0), dpre.sum(0))
    for got, w in zip(g, want):
        assert rel_err(np.asarray(got), w) <= 1e-3
    bs = quantised(rng, (3, 256, 96), E4M3)
    f = jax.vmap(lambda bb: tg.scaled_matmul(a, bb, sa, sb, out_dtype=jnp.float32))
    out = np.asarray(jax.jit(f)(bs))
    for i in range(3):
        want = f64(a) @ f64(bs[i]) * float(sa) * f64(sb)
        assert rel_err(out[i], want) <= FP8_F32_BOUND


@pytest.mark.skipif(not _sm90(), reason=NOT_SM90)
@pytest.mark.parametrize("pair", PAIRS[:3], ids=lambda p: f"{p[0].name}x{p[1].name}")
def test_block_scales(pair):
    """DeepSeek-V3 block scales (a: 1 x 128, b: 128 x 128) in the kernel's main loop: shapes
    whose M, N and K are not multiples of 128 (the last block partial), b in both layouts,
    with and without an epilogue; against float64 applying each block's scales to its exact
    partial product."""
    ta, tb_dtype = pair
    fails = []
    for (m, n, k), tb, out_dtype, epi in (((200, 300, 528), False, BF16, False),
                                          ((129, 128, 1024), True, F32, True),
                                          ((1, 1000, 4112), True, F16, False),
                                          ((515, 260, 144), False, F32, False)):
        rng = np.random.default_rng(seed_of("block", ta.name, tb_dtype.name, m, n, k, tb))
        a = quantised(rng, (m, k), ta)
        b = quantised(rng, (n, k) if tb else (k, n), tb_dtype)
        sa, sb = block_scales(rng, m, n, k, tb)
        bias = rng.standard_normal(n).astype(np.float32) if epi else None
        act = "relu" if epi else None

        def fn(a, b, sa, sb, bias):
            return tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, bias=bias,
                                    activation=act, transpose_b=tb)
        what = f"{ta.name}x{tb_dtype.name} {m}x{n}x{k} transpose_b={tb} -> {out_dtype.name}"
        check_fp8(fails, what, fn, (a, b, sa, sb, bias),
                  reference(a, b, sa, sb, None, bias, 0.0, act, tb), out_dtype, k)
    assert not fails, "\n".join(fails)


FP8_ROWS = tuple(c.name for c in configs.CONFIGS if c.fp8 and c.kind == "sm90")  # (narrow:
# test_narrow_gpu)


@pytest.mark.skipif(not _sm90(), reason=NOT_SM90)
@pytest.mark.parametrize("row", FP8_ROWS)
def test_every_fp8_row(row, monkeypatch):
    """Each sm90 row with fp8 kernels, forced (whatever the planner would pick), with 1-3 K
    slices: block and per-tensor scales, M not a multiple of 4 (the staged rows' padded scale
    rows), both b layouts, e4m3 / e5m2 pairs, bfloat16 and float32 out, N of one to nine
    column tiles, two tile rows with K split in two, and more tiles than SMs (blocks walk
    several items, of 5, 2 and 1 k tiles); against float64."""
    from jax_tcgemm import scaled
    fails = []
    for (m, n, k), tb, split, pair, out_dtype in (((130, 300, 1024), False, 1, PAIRS[0], F32),
                                                 ((130, 300, 1024), False, 3, PAIRS[1], BF16),
                                                 ((509, 260, 640), True, 1, PAIRS[2], BF16),
                                                 ((509, 260, 640), True, 2, PAIRS[0], F32),
                                                 ((97, 129, 512), True, 1, PAIRS[1], F32),
                                                 ((70, 1100, 384), True, 1, PAIRS[0], BF16),
                                                 ((250, 512, 1024), False, 2, PAIRS[2], F32),
                                                 ((2100, 2600, 640), False, 1, PAIRS[0], BF16),
                                                 ((2100, 2600, 256), True, 1, PAIRS[1], F32),
                                                 ((2100, 2600, 256), False, 2, PAIRS[2], BF16)):
        monkeypatch.setattr(scaled, "kernel_config", lambda *_, p=(row, split): p)
        for block in (True, False):
            rng = np.random.default_rng(seed_of("row", row, m, split, block))
            a = quantised(rng, (m, k), pair[0])
            b = quantised(rng, (n, k) if tb else (k, n), pair[1])
            sa, sb = (block_scales(rng, m, n, k, tb) if block else
                      (scales(rng, "tensor", m), scales(rng, "tensor", n)))

            def fn(a, b, sa, sb):
                return tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, transpose_b=tb)
            what = (f"{row} split {split} {pair[0].name}x{pair[1].name} {m}x{n}x{k} "
                    f"transpose_b={tb} block={block} -> {out_dtype.name}")
            check_fp8(fails, what, fn, (a, b, sa, sb),
                      reference(a, b, sa, sb, None, None, 0.0, None, tb), out_dtype, k)
    assert not fails, "\n".join(fails)


INT8_SM80_ROWS = tuple(c.name for c in configs.CONFIGS if c.int8 and c.kind == "sm80")
BYTE_SM90_ROWS = tuple(c.name for c in configs.CONFIGS
                       if (c.int8 or c.fp8) and c.kind == "sm90")


def check_forced(fails, monkeypatch, row, split, shape, tb, out_dtype, forms, epi,
                 pair=(I8, I8), block=False):
    """One product forced onto (row, split) (scaled.kernel_config), shape (*batch, M, N, K), b
    (N, K) if tb else (K, N), against float64 (int32: bit-exact), run twice into poisoned
    outputs; each miss appended to `fails`. forms: a's and b's scale forms (scales()), or
    `block`: fp8 block scales; epi: (C form None / "bias" / "full" / "col", activation, beta)."""
    from jax_tcgemm import scaled
    *batch, m, n, k = shape
    monkeypatch.setattr(scaled, "kernel_config", lambda *_, p=(row, split): p)
    rng = np.random.default_rng(seed_of("forced", row, split, shape, tb, pair[0].name,
                                        pair[1].name, out_dtype.name, forms, epi, block))
    int8 = pair[0] == I8
    a = quantised(rng, (*batch, m, k), pair[0])
    b = quantised(rng, (n, k) if tb else (k, n), pair[1])
    rows = int(np.prod(batch, dtype=int)) * m
    if block:
        sa, sb = block_scales(rng, rows, n, k, tb)
    else:
        sa, sb = scales(rng, forms[0], rows), scales(rng, forms[1], n)
    if int8 and out_dtype != I32:  # sums of order 1 (finite in float16)
        if sa is None:
            a, b = a // 16, b // 16
        else:
            sa = (sa * np.float32(1 / 4096)).astype(np.float32)
    cform, act, beta = epi
    c = {None: None, "bias": None, "full": rng.standard_normal((*batch, m, n)),
         "col": rng.standard_normal((n,))}[cform]
    c = None if c is None else c.astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if cform == "bias" else None
    what = (f"{row} split {split} {pair[0].name}x{pair[1].name} {tuple(shape)} transpose_b={tb} "
            f"-> {out_dtype.name} scales {'block' if block else forms} epilogue {epi}")

    def fn(a, b, sa, sb, c, bias):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, transpose_b=tb, c=c,
                                beta=beta or 0.0, bias=bias, activation=act)
    a_scale = (sa.reshape(*batch, m, -1) if block else
               sa.reshape(*batch, m) if forms[0] == "row" else sa)
    args = (a, b, a_scale, sb, c, bias)
    if not uses_kernel(fn, *args):
        fails.append(f"{what}: the compiled product does not call the kernel")
        return
    out, same = run_poisoned(fn, jax.eval_shape(fn, *args), *args)
    out = out.reshape(rows, n)
    c2 = None if c is None else c.reshape(-1, n)  # full: (rows, N); per-column: (1, N)
    want = reference(a.reshape(rows, k), b, sa, sb, c2, bias, beta or 0.0, act, tb)
    if out_dtype == I32:
        if not (same and np.array_equal(out, want.astype(np.int64))):
            fails.append(f"{what}: same={same}, not exact")
        return
    tol = FP8_F32_BOUND if (out_dtype == F32 and not int8) else bound(out_dtype, k)
    err = rel_err(out, want)
    if not same or not err <= tol:
        fails.append(f"{what}: same={same}, rel err {err:.3g} > {tol:.3g}")


@pytest.mark.skipif(not _sm90(), reason=NOT_SM90)
@pytest.mark.parametrize("row", BYTE_SM90_ROWS)
def test_row_column_scales_on_every_sm90_row(row, monkeypatch):
    """Per-row / per-column scales and no other epilogue term (W8A8, per-token / per-channel
    fp8: the short store path, each panel's column scales loaded together) on each sm90 row
    with 8-bit kernels, forced with 1 and 2 K slices: int8 and fp8 pairs, N odd (column scales
    one by one) and a multiple of 8 that is no tile multiple, M past the last whole tile, a batch
    folded into M, bfloat16 / float16 / float32 out; then more tiles than SMs (blocks walk
    several items), with the scales alone and with bias + gelu_tanh (the full epilogue); against
    float64."""
    c = next(c for c in configs.CONFIGS if c.name == row)
    pairs = ([(I8, I8)] if c.int8 else []) + ([PAIRS[0], PAIRS[2]] if c.fp8 else [])
    fails = []
    for shape, tb, split, out_dtype, forms in (
            ((300, 521, 512), True, 1, BF16, ("row", "column")),
            ((130, 264, 1024), False, 2, F32, ("row", "column")),
            ((2, 97, 392, 256), True, 1, F16, ("tensor", "column")),
            ((200, 136, 384), True, 2, BF16, ("row", "tensor"))):
        for pair in pairs:
            check_forced(fails, monkeypatch, row, split, shape, tb, out_dtype, forms,
                         (None, None, None), pair=pair)
    for pair in pairs:
        for epi in ((None, None, None), ("bias", "gelu_tanh", None)):
            check_forced(fails, monkeypatch, row, 1, (1500, 2600, 384), False, BF16,
                         ("row", "column"), epi, pair=pair)
    assert not fails, "\n".join(fails)


@pytest.mark.skipif(not _sm80_up(), reason=NOT_SM80)
@pytest.mark.parametrize("row", INT8_SM80_ROWS)
def test_every_int8_sm80_row(row, monkeypatch):
    """Each sm80 row's int8 kernel (mma.sync m16n8k32 on int8 pairs: what int8 runs on off
    Hopper; it runs on any GPU from 8.0 on, an H100/H200 too), forced with 1, 2, 3 and 16 K
    slices (on sm_90 hardware 2-8 reduce in a cluster, by push or pull, 16 through the
    workspace): int32 bit-exact, W8A8 (per-row / per-column / per-tensor scales) with bias,
    activation or beta * C into bfloat16 / float16 / float32; both b layouts, a batch folded
    into M, shapes that are not tile multiples, K below one k tile."""
    fails = []
    for shape, tb, split, out_dtype, forms, epi in (
            ((130, 300, 1040), False, 1, I32, (None, None), (None, None, None)),
            ((130, 300, 1040), True, 2, I32, (None, None), (None, None, None)),
            ((509, 260, 640), True, 3, BF16, ("row", "column"), ("bias", "gelu_tanh", None)),
            ((77, 136, 2048), False, 16, F32, ("tensor", "column"), ("full", None, 0.5)),
            ((3, 50, 200, 256), True, 2, F16, ("row", "tensor"), ("col", "silu", -1.0)),
            ((1, 64, 16), True, 1, I32, (None, None), (None, None, None)),
            ((33, 8, 48), False, 3, BF16, (None, None), ("bias", "relu", None))):
        check_forced(fails, monkeypatch, row, split, shape, tb, out_dtype, forms, epi)
    assert not fails, "\n".join(fails)


@pytest.mark.skipif(not _sm80_up(), reason=NOT_SM80)
def test_fp8_on_an_sm80_row_is_an_error(monkeypatch):
    """fp8 has no sm80 kernel: forced onto an sm80 row, the call fails with the handler's
    message (no silent wrong answer)."""
    from jax_tcgemm import scaled
    monkeypatch.setattr(scaled, "kernel_config", lambda *_: (INT8_SM80_ROWS[0], 1))
    rng = np.random.default_rng(seed_of("fp8sm80"))
    a, b = quantised(rng, (64, 128), E4M3), quantised(rng, (64, 128), E4M3)
    with pytest.raises(Exception, match=r"8-bit operands run on the sm90 kernels on compute "
                                        r"capability 9.0 only \(int8 also on the sm80 and narrow "
                                        r"rows\)"):
        jax.block_until_ready(jax.jit(lambda a, b: tg.scaled_matmul(
            a, b, 1.0, 1.0, transpose_b=True))(a, b))


@pytest.mark.skipif(not _sm80_up(), reason=NOT_SM80)
@pytest.mark.parametrize("dims", [(((1,), (0,)), ((), ())), (((2,), (1,)), ((), ())),
                                  (((0,), (0,)), ((), ()))], ids=str)
def test_int8_dot_general(dims):
    """tg.dot_general of int8 operands with preferred_element_type=int32 runs the int8 kernel
    (one contracting dim, a 2-D rhs) and equals lax bit for bit; so does tg.matmul with
    out_dtype=int32."""
    (lc, rc), _ = dims
    rng = np.random.default_rng(seed_of("int8dg", dims))
    lshape = {1: (70, 256), 2: (3, 50, 256), 0: (256, 70)}[lc[0]]
    rshape = (256, 90) if rc[0] == 0 else (90, 256)
    a, b = quantised(rng, lshape, I8), quantised(rng, rshape, I8)

    def fn(a, b):
        return tg.dot_general(a, b, dims, preferred_element_type=jnp.int32)
    assert uses_kernel(fn, a, b)
    got = np.asarray(jax.jit(fn)(a, b))
    want = np.asarray(jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.int32))
    np.testing.assert_array_equal(got, want)
    if lc[0] == len(lshape) - 1 and rc[0] == 0:  # tg.matmul's form: the same kernel
        def mm(a, b):
            return tg.matmul(a, b, out_dtype=jnp.int32)
        assert uses_kernel(mm, a, b)
        np.testing.assert_array_equal(np.asarray(jax.jit(mm)(a, b)), want)


@pytest.mark.skipif(not _sm90(), reason=NOT_SM90)
def test_scaled_fuzz(monkeypatch):
    """Seeded fuzz over random shapes (K a multiple of 16, or not: padded), dtype pairs,
    scale forms (block included), output dtypes, epilogues and b layouts:
    $TCGEMM_SCALED_FUZZ_CASES cases (default 200; seed $TCGEMM_FUZZ_SEED), each against
    float64 of the quantised values, into a poisoned output. Half the int8 cases run forced on
    a random sm80 row with 1-9 K slices (the int8 kernels of other GPUs; drawn from a second
    stream, so the cases are those of the plain fuzz)."""
    import os
    from jax_tcgemm import scaled
    n_cases = int(os.environ.get("TCGEMM_SCALED_FUZZ_CASES", "200"))
    seed = int(os.environ.get("TCGEMM_FUZZ_SEED", "0"))
    rng, pick = np.random.default_rng(seed + 26), np.random.default_rng(seed + 80)
    planned = scaled.kernel_config
    fails, n_forced = [], 0
    for i in range(n_cases):
        ta, tbd = PAIRS[rng.integers(len(PAIRS))]
        m, n = (int(x) for x in rng.integers(1, 700, 2))
        k = int(rng.integers(1, 80)) * 16 + (int(rng.integers(1, 16)) if rng.random() < 0.1 else 0)
        tb = bool(rng.random() < 0.5)
        forms = FORMS + ((("block", "block"),) if ta != I8 else ())
        fa, fb = forms[rng.integers(len(forms))]
        outs = (BF16, F16, F32) + ((I32,) if ta == I8 and fa is None else ())
        out_dtype = outs[rng.integers(len(outs))]
        act = None if out_dtype == I32 else (None, "relu", "gelu_tanh", "silu")[rng.integers(4)]
        a = quantised(rng, (m, k), ta)
        b = quantised(rng, (n, k) if tb else (k, n), tbd)
        if fa == "block":
            sa, sb = block_scales(rng, m, n, k, tb)
        else:
            sa, sb = scales(rng, fa, m), scales(rng, fb, n)
        if ta == I8 and out_dtype != I32:
            if sa is None:
                a, b = a // 16, b // 16
            else:
                sa = (sa * np.float32(1 / 4096)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) if act else None
        row = (INT8_SM80_ROWS[pick.integers(len(INT8_SM80_ROWS))], int(pick.integers(1, 10)))
        forced = ta == I8 and pick.random() < 0.5
        n_forced += forced
        monkeypatch.setattr(scaled, "kernel_config", (lambda *_: row) if forced else planned)

        def fn(a, b, sa, sb, bias):
            return tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, bias=bias,
                                    activation=act, transpose_b=tb)
        args = (a, b, sa, sb, bias)
        out, same = run_poisoned(fn, jax.eval_shape(fn, *args), *args)
        want = reference(a, b, sa, sb, None, bias, 0.0, act, tb)
        what = (f"case {i}: {ta.name}x{tbd.name} {m}x{n}x{k} transpose_b={tb} -> "
                f"{out_dtype.name} scales {fa}/{fb} act={act}{f' on {row}' if forced else ''}")
        if out_dtype == I32:
            ok = same and np.array_equal(out, want.astype(np.int64))
            if not ok:
                fails.append(f"{what}: not exact")
            continue
        tol = FP8_F32_BOUND if (out_dtype == F32 and ta != I8) else bound(out_dtype, k)
        err = rel_err(out, want)
        if not same or not err <= tol:
            fails.append(f"{what}: same={same}, rel err {err:.3g} > {tol:.3g}")
    print(f"scaled fuzz: {n_cases} cases ({n_forced} int8 on sm80 rows), {len(fails)} failures")
    assert not fails, "\n".join(fails[:40])
