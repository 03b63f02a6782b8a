"""GPU tests of batched 8-bit products: tg.scaled_matmul with a batch of b, its jax.vmap (over
b, over a, nested), int8 dot_general / matmul with batch dims. Each is one launch of the
8-bit kernels (the compiled HLO has one tcgemm call and no loop), checked item by item against
float64 references of the quantised values (test_scaled_gpu.reference), into poisoned outputs
run twice; int8 -> int32 bit-exact; block scales included. Every sm90 row with 8-bit kernels and every sm80 int8 row
is forced once on a batch with b at its own stride and once with b shared (stride 0)."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm import configs

from conftest import bound, rel_err, seed_of
from test_scaled_gpu import (BF16, E4M3, E5M2, F16, F32, FP8_F32_BOUND, I8, I32, NOT_SM80,
                             NOT_SM90, _sm80_up, _sm90, block_scales, quantised, reference,
                             run_poisoned)

pytestmark = pytest.mark.gpu


def one_launch(fn, *args) -> bool:
    text = jax.jit(fn).lower(*args).compile().as_text()
    return text.count('custom_call_target="tcgemm"') == 1 and " while(" not in text


def item(x, i):
    return x if x is None or np.ndim(x) == 0 else x[i]


def check(fails, what, fn, args, wants, out_dtype, k, launches_once=True):
    """fn(*args) (items stacked on axis 0) against the float64 items `wants`."""
    if launches_once and not one_launch(fn, *args):
        fails.append(f"{what}: not one launch of the kernel")
        return
    out, same = run_poisoned(fn, jax.eval_shape(fn, *args), *args)
    if out_dtype == I32:
        if not same or not np.array_equal(out, np.stack(wants).astype(np.int32)):
            fails.append(f"{what}: int32 not exact (same={same})")
        return
    fp8_f32 = out_dtype == F32 and np.dtype(args[0].dtype) != I8
    tol = FP8_F32_BOUND if fp8_f32 else bound(out_dtype, k)
    errs = [rel_err(out[i], w) for i, w in enumerate(wants)]
    if not same or not max(errs) <= tol:
        fails.append(f"{what}: same={same}, rel errs {[f'{e:.3g}' for e in errs]} > {tol:.3g}")


CASES = (  # (batch, m, n, k, transpose_b, out_dtype, scales, epilogue)
    (3, 37, 150, 272, False, BF16, "row-column", "bias-gelu_tanh"),
    (3, 129, 300, 1040, True, F32, "tensor", "c-full"),
    (2, 1, 136, 512, False, F16, "row-column", None),
    (4, 200, 136, 200, True, BF16, "tensor", "c-col-relu"),  # K padded to 208
    (3, 64, 128, 128, False, I32, None, None),
)


def _case(rng, pair, case):
    """a (B, M, K), b (B, ...), per-item scales, c, bias of one CASES row, and the float64
    items."""
    bsz, m, n, k, tb, out_dtype, form, epi = case
    if out_dtype == I32 and pair[0] != I8:
        out_dtype, form = F32, "tensor"
    a = quantised(rng, (bsz, m, k), pair[0])
    b = quantised(rng, (bsz, n, k) if tb else (bsz, k, n), pair[1])
    if pair[0] == I8 and out_dtype != I32:
        a, b = a // 4, b // 4
    sa = sb = None
    if form == "tensor":
        sa, sb = np.float32(0.75), np.float32(rng.uniform(0.5, 2))
    elif form == "row-column":
        sa = rng.uniform(0.5, 2, (bsz, m)).astype(np.float32)
        sb = rng.uniform(0.5, 2, (bsz, n)).astype(np.float32)
    if pair[0] == I8 and sa is not None:
        sa = (sa / np.float32(256)).astype(np.float32)
    c = bias = None
    act, beta = None, 0.0
    if epi == "bias-gelu_tanh":
        bias, act = rng.standard_normal(n).astype(np.float32), "gelu_tanh"
    elif epi == "c-full":
        c, beta = rng.standard_normal((bsz, m, n)).astype(np.float32), 0.5
    elif epi == "c-col-relu":
        c, beta, act = rng.standard_normal((n,)).astype(np.float32), -1.25, "relu"
    wants = []
    for i in range(bsz):
        if out_dtype == I32:
            bi = b[i].T if tb else b[i]
            wants.append(a[i].astype(np.int64) @ bi.astype(np.int64))
            continue
        ci = None if c is None else (c[i] if c.ndim == 3 else c)
        wants.append(reference(a[i], b[i], item(sa, i), item(sb, i), ci, bias, beta, act, tb))

    def fn(a, b, sa, sb, c, bias):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, c=c, bias=bias,
                                activation=act, beta=beta, transpose_b=tb)
    return fn, (a, b, sa, sb, c, bias), wants, out_dtype, k


PAIRS = ((E4M3, E4M3), (E5M2, E4M3), (I8, I8))


@pytest.mark.skipif(not _sm80_up(), reason=NOT_SM80)
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].name}x{p[1].name}")
def test_batch_of_b(pair):
    """a (B, M, K) x b (B, K, N) / (B, N, K): one launch, every item right."""
    if pair[0] != I8 and not _sm90():
        pytest.skip(NOT_SM90)
    fails = []
    for case in CASES:
        rng = np.random.default_rng(seed_of("batch-b", pair[0].name, case))
        fn, args, wants, out_dtype, k = _case(rng, pair, case)
        check(fails, f"{pair[0].name} {case}", fn, args, wants, out_dtype, k)
    assert not fails, "\n".join(fails)


@pytest.mark.skipif(not _sm90(), reason=NOT_SM90)
def test_vmaps():
    """jax.vmap over b (and its per-column scales), over a with b shared (the items' rows join),
    nested (2 x 3 items), and of per-tensor scales per item: one launch each."""
    rng = np.random.default_rng(seed_of("vmaps"))
    m, n, k = 45, 200, 384
    a = quantised(rng, (2, m, k), E4M3)
    b = quantised(rng, (3, n, k), E4M3)
    sa = rng.uniform(0.5, 2, (2, m)).astype(np.float32)
    sb = rng.uniform(0.5, 2, (3, n)).astype(np.float32)
    st = rng.uniform(0.5, 2, 3).astype(np.float32)

    def f(a, b, sa, sb):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=F32, transpose_b=True)
    fails = []
    over_b = jax.vmap(f, in_axes=(None, 0, None, 0))
    check(fails, "over b", over_b, (a[0], b, sa[0], sb),
          [reference(a[0], b[j], sa[0], sb[j], None, None, 0, None, True) for j in range(3)],
          F32, k)
    over_a = jax.vmap(f, in_axes=(0, None, 0, None))
    check(fails, "over a", over_a, (a, b[0], sa, sb[0]),
          [reference(a[i], b[0], sa[i], sb[0], None, None, 0, None, True) for i in range(2)],
          F32, k)
    nested = jax.vmap(over_b, in_axes=(0, None, 0, None))
    args = (a, b, sa, sb)
    if not one_launch(nested, *args):
        fails.append("nested: not one launch")
    out, same = run_poisoned(nested, jax.eval_shape(nested, *args), *args)
    errs = [rel_err(out[i, j], reference(a[i], b[j], sa[i], sb[j], None, None, 0, None, True))
            for i in range(2) for j in range(3)]
    if not same or max(errs) > FP8_F32_BOUND:
        fails.append(f"nested: same={same}, errs {errs}")
    per_tensor = jax.vmap(f, in_axes=(None, 0, 0, 0))
    check(fails, "per-tensor scales per item", per_tensor, (a[0], b, st, st[::-1].copy()),
          [reference(a[0], b[j], st[j], st[2 - j], None, None, 0, None, True)
           for j in range(3)], F32, k)
    assert not fails, "\n".join(fails)


@pytest.mark.skipif(not _sm90(), reason=NOT_SM90)
def test_block_scales_over_a_batch_of_b():
    """Block scales with a batch of b: one launch, each item's scales (or scales shared by the
    items: stride 0); with b shared, vmap over a joins the items' rows."""
    rng = np.random.default_rng(seed_of("batch-block"))
    m, n, k = 70, 260, 640
    a = quantised(rng, (3, m, k), E4M3)
    b = quantised(rng, (3, k, n), E4M3)
    sab = [block_scales(rng, m, n, k, False) for _ in range(3)]
    sa = np.stack([x for x, _ in sab])
    sb = np.stack([y for _, y in sab])

    def f(a, b, sa, sb):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=BF16)
    fails = []
    check(fails, "batch of b", f, (a, b, sa, sb),
          [reference(a[i], b[i], sa[i], sb[i], None, None, 0, None, False) for i in range(3)],
          BF16, k)
    check(fails, "batch of b, shared scales", f, (a, b, sa[:1], sb[:1]),
          [reference(a[i], b[i], sa[0], sb[0], None, None, 0, None, False) for i in range(3)],
          BF16, k)
    over_a = jax.vmap(f, in_axes=(0, None, 0, None))
    check(fails, "over a", over_a, (a, b[0], sa, sb[0]),
          [reference(a[i], b[0], sa[i], sb[0], None, None, 0, None, False) for i in range(3)],
          BF16, k)
    assert not fails, "\n".join(fails)


@pytest.mark.skipif(not _sm80_up(), reason=NOT_SM80)
@pytest.mark.parametrize("k", [33, 64, 1000])
def test_int8_dot_general_and_matmul_batched(k):
    """int8 dot_general with batch dims (rhs (B, K, N) and (B, N, K)) and matmul with
    broadcast batch dims: one launch, bit-exact (K = 33: where XLA's own int8 GEMM gave twice
    the product on the H200, benchmarks/NOTES.md v62)."""
    rng = np.random.default_rng(seed_of("int8-batched", k))
    x = quantised(rng, (4, 50, k), I8)
    fails = []
    for dims, y in (((((2,), (1,)), ((0,), (0,))), quantised(rng, (4, k, 70), I8)),
                    ((((2,), (2,)), ((0,), (0,))), quantised(rng, (4, 70, k), I8))):
        def fn(x, y, dims=dims):
            return tg.dot_general(x, y, dims, preferred_element_type=jnp.int32)
        yk = y if dims[0][1] == (1,) else y.transpose(0, 2, 1)
        check(fails, f"dot_general {dims}", fn, (x, y),
              [x[i].astype(np.int64) @ yk[i].astype(np.int64) for i in range(4)], I32, k)
    y = quantised(rng, (3, 1, k, 20), I8)

    def mm(x, y):
        return tg.matmul(x, y, out_dtype=jnp.int32)
    out = np.asarray(jax.jit(mm)(x, y))
    if not one_launch(mm, x, y):
        fails.append("matmul: not one launch")
    if not np.array_equal(out, np.matmul(x.astype(np.int64), y.astype(np.int64))):
        fails.append("matmul: not exact")
    assert not fails, "\n".join(fails)


# (the narrow rows, which take few rows of a with b (K, N) only: test_narrow_gpu.test_batch_of_b)
ROWS = tuple(c.name for c in configs.CONFIGS if (c.fp8 or c.int8) and c.kind != "narrow")


@pytest.mark.skipif(not _sm80_up(), reason=NOT_SM80)
@pytest.mark.parametrize("row", ROWS)
def test_every_row_batched(row, monkeypatch):
    """Each row with 8-bit kernels, forced, 1 and 2 K slices, on a batch of 3 with b at its own
    stride (int8 rows: int32 exact; fp8 rows: per-row / per-column scales and beta * C, and
    block scales) and with b shared at stride 0 (vmap over a and per-item column scales into
    float32)."""
    cfg = configs.BY_NAME[row]
    if cfg.kind == "sm90" and not _sm90():
        pytest.skip(NOT_SM90)
    from jax_tcgemm import scaled
    fails = []
    pairs = [(I8, I8)] * cfg.int8 + [(E4M3, E5M2)] * cfg.fp8
    for split, pair, tb in itertools.product((1, 2), pairs, (False, True)):
        monkeypatch.setattr(scaled, "kernel_config", lambda *_, p=(row, split): p)
        rng = np.random.default_rng(seed_of("row-batched", row, split, pair[0].name, tb))
        m, n, k = 77, 144, 1024
        a = quantised(rng, (3, m, k), pair[0])
        b = quantised(rng, (3, n, k) if tb else (3, k, n), pair[1])
        bk = np.swapaxes(b, 1, 2) if tb else b
        what = f"{row} split {split} {pair[0].name} transpose_b={tb}"
        if pair[0] == I8:
            def f(a, b, tb=tb):
                return tg.scaled_matmul(a, b, None, None, out_dtype=I32, transpose_b=tb)
            check(fails, what + " batch of b", f, (a, b),
                  [a[i].astype(np.int64) @ bk[i].astype(np.int64) for i in range(3)], I32, k)
        else:
            sa = rng.uniform(0.5, 2, (3, m)).astype(np.float32)
            sb = rng.uniform(0.5, 2, (1, n)).astype(np.float32)  # shared by the items
            c = rng.standard_normal((3, m, n)).astype(np.float32)

            def f(a, b, sa, sb, c, tb=tb):
                return tg.scaled_matmul(a, b, sa, sb, out_dtype=F32, c=c, beta=0.5,
                                        transpose_b=tb)
            check(fails, what + " batch of b", f, (a, b, sa, sb, c),
                  [reference(a[i], b[i], sa[i], sb[0], c[i], None, 0.5, None, tb)
                   for i in range(3)], F32, k)
            if cfg.kind == "sm90":  # block scales of each item
                blocks = [block_scales(rng, m, n, k, tb) for _ in range(3)]
                sa, sb = (np.stack([x[j] for x in blocks]) for j in (0, 1))
                check(fails, what + " block", f, (a, b, sa, sb, None),
                      [reference(a[i], b[i], sa[i], sb[i], None, None, 0.5, None, tb)
                       for i in range(3)], F32, k)
        # b shared by the items, which differ in their column scales: the batch stays
        # (b at stride 0)
        s0 = np.float32(1 / 256 if pair[0] == I8 else 0.75)
        sb3 = rng.uniform(0.5, 2, (3, n)).astype(np.float32)

        def g(a, b, sb, tb=tb, s0=s0):
            return tg.scaled_matmul(a, b, s0, sb, out_dtype=F32, transpose_b=tb)
        check(fails, what + " b shared", jax.vmap(g, in_axes=(0, None, 0)), (a, b[0], sb3),
              [reference(a[i], b[0], s0, sb3[i], None, None, 0.0, None, tb)
               for i in range(3)], F32, k)
    assert not fails, "\n".join(fails)
