"""float32 products (issue 25) on the CPU: the precision -> algorithm rule, the operand splits
and the concatenated product each algorithm becomes (checked against float64 with lax's float32
products standing in for the kernels), the CUDA lowering's choices (the module's text, lowered
for CUDA on this machine as for an H100), and the primitive's params and transformations.
Fresh random inputs per case."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg
from jax_tcgemm import configs, f32, lowering, problem
from jax_tcgemm.primitive import tcgemm
from test_cpu import custom_calls, cuda_text, needs_module, prims

P = lax.Precision
PRESET = lax.DotAlgorithmPreset


def rand(seed, shape, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def rel_err(got, a, b):
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("precision,algo", [
    (None, "tf32"), ("default", "tf32"), ("high", "tf32"), ("highest", "f16x3"),
    (P.HIGHEST, "f16x3"), ((P.DEFAULT, P.HIGHEST), "f16x3"), ((P.HIGH, P.DEFAULT), "tf32"),
    ("tensorfloat32", "tf32"), ("float32", "f16x3"), ("bfloat16_3x", "tf32"),
    (PRESET.DEFAULT, "tf32"), (PRESET.TF32_TF32_F32, "tf32"),
    (PRESET.TF32_TF32_F32_X3, "tf32x3"), (PRESET.BF16_BF16_F32, "bf16"),
    (PRESET.BF16_BF16_F32_X3, "bf16x3"), (PRESET.BF16_BF16_F32_X6, "bf16x6"),
    (PRESET.BF16_BF16_F32_X9, "bf16x9"), (PRESET.F32_F32_F32, None),
    (PRESET.F16_F16_F32, None), (PRESET.ANY_F8_ANY_F8_F32, None), (PRESET.F64_F64_F64, None),
])
def test_algorithm_of_precision(precision, algo):
    assert problem.f32_algorithm(problem.canonical_precision(precision)) == algo


def test_default_matmul_precision_config_decides():
    with jax.default_matmul_precision("highest"):
        assert problem.f32_algorithm(problem.canonical_precision(None)) == "f16x3"
    with jax.default_matmul_precision("tensorfloat32"):
        assert problem.f32_algorithm(problem.canonical_precision(None)) == "tf32"


def _bits(x):
    return np.asarray(x).view(np.uint32)


def test_tf32_parts_are_tf32_and_exact():
    x = jnp.asarray(np.concatenate([rand(1, (4096,)), rand(2, (512,), 1e-30), rand(3, (512,), 1e30)]))
    hi, lo = f32.parts(x, "tf32x3")
    assert not (_bits(hi) & 0x1FFF).any() and not (_bits(lo) & 0x1FFF).any()  # 10-bit mantissas
    xd = np.asarray(x, np.float64)
    # hi is x rounded to nearest: |x - hi| <= 2^-11 |x|; hi + lo within 2^-22 |x|
    assert (np.abs(xd - np.asarray(hi, np.float64)) <= 2.0**-11 * np.abs(xd)).all()
    err = np.abs(xd - np.asarray(hi, np.float64) - np.asarray(lo, np.float64))
    assert (err <= 2.0**-22 * np.abs(xd) + 1e-45).all()


@pytest.mark.parametrize("algo,parts,bound", [("bf16x3", 2, 2.0**-16), ("bf16x6", 3, 2.0**-24),
                                              ("bf16", 1, 2.0**-8)])
def test_bf16_parts(algo, parts, bound):
    x = jnp.asarray(rand(4, (4096,)))
    ps = f32.parts(x, algo)
    assert len(ps) == parts and all(p.dtype == jnp.bfloat16 for p in ps)
    total = sum(np.asarray(p, np.float64) for p in ps)
    xd = np.asarray(x, np.float64)
    assert (np.abs(xd - total) <= bound * np.abs(xd)).all()


def test_non_finite_values_stay_in_the_big_part():
    """Also NaNs whose payload plus half a unit would wrap past the sign bit (the GPU's own NaN
    is 0x7FFFFFFF): they stay NaN, never -0."""
    gpu_nans = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7FFFF000], np.uint32).view(np.float32)
    x = jnp.asarray(np.concatenate([[np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1.0], gpu_nans]),
                    np.float32)
    for algo in ("tf32x3", "bf16x3"):
        assert np.isnan(np.asarray(f32.parts(x, algo)[0], np.float32)[6:]).all()
    hi, lo, _ = f32.f16_parts(x[None], 1)
    assert np.isnan(np.asarray(hi, np.float32)[0, [2, 6, 7, 8]]).all()
    assert (np.asarray(lo, np.float32)[0, [0, 1, 2, 6, 7, 8]] == 0).all()
    x = x[:6]
    for algo in ("tf32x3", "bf16x6"):
        ps = f32.parts(x, algo)
        big = np.asarray(ps[0], np.float32)
        assert np.isposinf(big[0]) and np.isneginf(big[1]) and np.isnan(big[2])
        for p in ps[1:]:
            assert np.isfinite(np.asarray(p, np.float32)[:2]).all()  # remainders of inf: 0
    for algo in ("tf32x3", "bf16x3"):  # no overflow to inf near float32's max
        hi, lo = f32.parts(x, algo)
        assert np.isfinite(np.asarray(hi, np.float32)[3:]).all()
        total = np.asarray(hi, np.float64)[3:] + np.asarray(lo, np.float64)[3:]
        xd = np.asarray(x, np.float64)[3:5]
        assert (np.abs(total[:2] - xd) <= 2.0**-16 * np.abs(xd)).all()


def test_f16_parts():
    """f16x3's parts: per row, a power of two s puts the largest finite magnitude in [2^14,
    2^15); hi is x * s in float16, hi + lo * 2^-F16_LO_SHIFT within 2^-22 of it for elements
    within 2^27 of the row's largest (below, float16's subnormals bound the error at 2^-50 of
    that largest); a zero row keeps s = 1; rows 10^+-38 apart, non-finite values (in hi, lo 0);
    a row of float32 subnormals (which XLA's arithmetic may flush to zero) stays finite and no
    larger."""
    x = rand(20, (8, 300))
    x[1] *= 1e-30
    x[2] *= 1e30
    x[3] = 0.0
    x[4] = rand(21, (300,)) * 1e-40  # float32 subnormals
    x[5, :3] = [3.4e38, -3.4e38, 1e-20]
    x[6, :3] = [np.inf, -np.inf, np.nan]
    x[7] *= 10.0 ** np.linspace(-20, 0, 300)  # 2^66 of range inside one row
    hi, lo, inv = jax.jit(f32.f16_parts, static_argnums=1)(jnp.asarray(x), 1)
    assert hi.dtype == lo.dtype == jnp.float16 and inv.shape == (8,) and inv.dtype == jnp.float32
    inv = np.asarray(inv, np.float64)
    assert (np.frexp(inv)[0] == 0.5).all() and inv[3] == 1.0  # powers of two; zero row: 1
    h = np.asarray(hi, np.float64)
    lo_ = np.asarray(lo, np.float64) * 2.0 ** -f32.F16_LO_SHIFT
    sub = (h[4] + lo_[4]) * inv[4]
    assert np.isfinite(sub).all() and (np.abs(sub) <= np.abs(x[4])).all()
    x[4] = 0.0
    h[4] = lo_[4] = 0.0
    fin = np.isfinite(x)
    top = np.where(fin, np.abs(x), 0).max(1)
    y = np.abs(np.where(fin, x, 0) / inv[:, None])  # |x * s|
    assert (np.abs(h[fin]) < 2.0**15).all()  # the shifted remainder: no larger than y or 2^-14
    assert (np.abs(lo_ * 2.0**f32.F16_LO_SHIFT) <= np.maximum(y, 2.0**-14))[fin].all()
    assert ((top / inv >= 2.0**14) | (top == 0) | (inv == 2.0**-126)).all(), (top, inv)
    xd = np.where(fin, x, 0).astype(np.float64)
    err = np.abs((h + lo_) * inv[:, None] - xd)
    tops = top[:, None].repeat(300, 1)
    assert (err[fin] <= (2.0**-22 * np.abs(xd) + 2.0**-50 * tops)[fin]).all()
    near = fin & (np.abs(xd) >= 2.0**-27 * tops)  # the remainders' 11 bits kept
    assert near[7].sum() > 100 and (err[near] <= 2.0**-22 * np.abs(xd)[near]).all()
    assert np.isposinf(h[6, 0]) and np.isneginf(h[6, 1]) and np.isnan(h[6, 2])
    assert (lo_[6, :3] == 0).all()


def both_parts(a, b, algo):
    """f32.operand_parts of a (M, K) and b (K, N), under jit as in the lowering (XLA must not
    fold the parts' conversions away): (a', b') [+ f16x3's (inv_a, inv_b)]."""
    def f(a, b):
        pa, pb = f32.operand_parts(a, algo, "a", 1), f32.operand_parts(b, algo, "b", 0)
        return (*pa, *pb) if algo == "f16x3" else (pa, pb)
    out = jax.jit(f)(a, b)
    return (out[0], out[2], out[1], out[3]) if algo == "f16x3" else out


def f16x3_emulated(a, b):
    """f16x3's product of a (M, K) and b (K, N) as the promoted kernels compute it, lax's float32
    products standing in for their float32 sums: the parts (both_parts), the terms before f16x3_lo_k times 2^-F16_LO_SHIFT, the powers of two undone
    (float64)."""
    k = a.shape[1]
    ac, bc, ia, ib = both_parts(a, b, "f16x3")
    lk = f32.f16x3_lo_k(k)
    assert ac.dtype == bc.dtype == jnp.float16 and ac.shape == (a.shape[0], f32.concat_k(k, "f16x3"))
    assert lk % 64 == 0 and not np.asarray(ac[:, 2 * k:lk]).any()  # zeros up to the boundary

    def dot(x, y):
        return np.asarray(jnp.dot(x.astype(jnp.float32), y.astype(jnp.float32),
                                  precision="highest"), np.float64)
    got = dot(ac[:, :lk], bc[:lk]) * 2.0 ** -f32.F16_LO_SHIFT + dot(ac[:, lk:], bc[lk:])
    return got * np.asarray(ia, np.float64)[:, None] * np.asarray(ib, np.float64)[None, :]


@pytest.mark.parametrize("algo", ["tf32x3", "f16x3", "bf16x6"])
def test_infinities_meet_only_big_parts(algo):
    """An infinity in a meets b's big parts only (its remainders are zeroed where they face a
    big part): inf x b stays inf where b's remainders are 0 (values exact in the parts), as in
    float32, and a NaN of the data stays NaN."""
    a = np.ones((3, 8), np.float32)
    a[0, 2], a[1, 3], a[2, 4] = np.inf, -np.inf, np.nan
    b = np.full((8, 5), 0.5, np.float32)  # exact in every part: remainders 0
    want = np.asarray(jnp.dot(a, b, precision="highest"), np.float64)
    if algo == "f16x3":
        got = f16x3_emulated(a, b)
    else:
        ac, bc = both_parts(a, b, algo)
        got = np.asarray(jnp.dot(ac.astype(jnp.float32), bc.astype(jnp.float32),
                                 precision="highest"), np.float64)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("algo,bound", [("tf32x3", 2e-6), ("f16x3", 2e-6), ("bf16x6", 2e-6),
                                        ("bf16x9", 1e-6), ("bf16x3", 4e-5), ("bf16", 1e-2)])
def test_concatenated_product_accuracy(algo, bound):
    """The algorithm's one product over K' = terms x K, with lax's float32 (HIGHEST) product
    standing in for the kernels' float32 accumulation: float64-referenced error bounds
    (3xTF32 and BF16x6: float32 accuracy, issue 25's 2e-6)."""
    m, n, k = 96, 80, 1000
    a, b = rand(5, (m, k)), rand(6, (k, n))
    if algo == "f16x3":
        product = f16x3_emulated
        assert rel_err(product(a, b), a, b) <= bound
        # rows of a and columns of b 10^+-20 apart (the powers of two's work): every element
        # within 2^-22 of |a_i| |b_j|
        a *= (10.0 ** np.random.default_rng(7).uniform(-20, 20, (m, 1))).astype(np.float32)
        b *= (10.0 ** np.random.default_rng(8).uniform(-20, 20, (1, n))).astype(np.float32)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        norms = np.linalg.norm(a64, axis=1)[:, None] * np.linalg.norm(b64, axis=0)[None, :]
        assert (np.abs(product(a, b) - a64 @ b64) <= 2.0**-22 * norms).all()
        assert within_row_range_ok(product)
        return
    ac, bc = both_parts(a, b, algo)
    assert ac.shape == (m, k * len(f32.TERMS[algo])) and bc.shape == (k * len(f32.TERMS[algo]), n)
    if algo.startswith("tf32"):  # the kernels read TF32: the parts are exactly TF32
        assert not (_bits(ac) & 0x1FFF).any() and not (_bits(bc) & 0x1FFF).any()
    got = jnp.dot(ac.astype(jnp.float32), bc.astype(jnp.float32), precision="highest")
    assert rel_err(got, a, b) <= bound


def within_row_range_ok(product, m=64, n=48, k=700, seed=9):
    """Range inside the rows: k's features scaled by 2^-13 .. 2^13 in a and undone in b (x @ w
    of unnormalised features and their weights), so that every term is O(1) while the rows of
    a and columns of b span 2^26 and more. Each element within 2^-19 of sum_k |a_ik| |b_kj|
    against float64 (float32's own HIGHEST: ~2^-22 here; with the remainders unshifted, below
    float16's normal range for the small features, f16x3 gave ~2^-3)."""
    rng = np.random.default_rng(seed)
    s = 2.0 ** rng.uniform(-13, 13, k)
    a = (rng.standard_normal((m, k)) * s).astype(np.float32)
    b = (rng.standard_normal((k, n)) / s[:, None]).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    err = np.abs(np.asarray(product(a, b), np.float64) - a64 @ b64) / (np.abs(a64) @ np.abs(b64))
    return err.max() <= 2.0**-19


def test_cpu_numbers_are_lax():
    """On the CPU every float32 product is lax's own (bit for bit at DEFAULT, whatever the
    layout) and the primitive is in the jaxpr."""
    a, b = rand(7, (33, 70)), rand(8, (70, 21))
    for x, y, dn in ((a, b, (((1,), (0,)), ((), ()))), (a.T, b, (((0,), (0,)), ((), ()))),
                     (a, b.T, (((1,), (1,)), ((), ())))):
        np.testing.assert_array_equal(tg.dot_general(x, y, dn), lax.dot_general(x, y, dn))
    np.testing.assert_array_equal(tg.matmul(a, b, precision="highest"),
                                  jnp.matmul(a, b, precision="highest"))
    assert prims(jax.make_jaxpr(tg.matmul)(a, b), "tcgemm")


def test_epilogue_and_batch_on_float32():
    a, b = rand(9, (3, 17, 40)), rand(10, (40, 23))
    c, bias = rand(11, (3, 17, 23)), rand(12, (23,))
    got = tg.gemm(a, b, c, alpha=0.5, beta=2.0, bias=bias, activation="relu",
                  precision="highest")
    want = np.maximum(0.5 * np.einsum("bmk,kn->bmn", a.astype(np.float64), b) + 2.0 * c + bias, 0)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert tg.matmul(a, b, out_dtype=jnp.bfloat16).dtype == jnp.bfloat16


@pytest.mark.parametrize("precision", ["highest", PRESET.BF16_BF16_F32_X3, None])
def test_grad_keeps_precision(precision):
    a, b = jnp.asarray(rand(13, (8, 16))), jnp.asarray(rand(14, (16, 4)))
    jx = jax.make_jaxpr(jax.grad(lambda x, y: tg.matmul(x, y, precision=precision).sum(),
                                 argnums=(0, 1)))(a, b)
    eqs = prims(jx, "tcgemm")
    want = problem.canonical_precision(precision)
    assert len(eqs) == 3 and all(e.params["precision"] == want for e in eqs)
    ga, gb = jax.grad(lambda x, y: tg.matmul(x, y, precision=precision).sum(), (0, 1))(a, b)
    np.testing.assert_allclose(ga, np.broadcast_to(np.asarray(b).sum(1), (8, 16)), rtol=1e-5)
    np.testing.assert_allclose(gb, np.broadcast_to(np.asarray(a).sum(0)[:, None], (16, 4)),
                               rtol=1e-5)


def test_vmap_is_one_product():
    a, b = jnp.asarray(rand(15, (5, 9, 12))), jnp.asarray(rand(16, (5, 12, 7)))
    f = jax.vmap(lambda x, y: tg.matmul(x, y, precision="highest"))
    assert len(prims(jax.make_jaxpr(f)(a, b), "tcgemm")) == 1
    np.testing.assert_allclose(f(a, b), np.einsum("bmk,bkn->bmn", np.asarray(a, np.float64), b),
                               rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# The CUDA lowering, as for an H100 (compute capability 9.0).

@pytest.fixture
def h100(monkeypatch):
    monkeypatch.setattr(configs, "device_arch", lambda: (9, 0))


def _calls(f, *args):
    return custom_calls(cuda_text(f, *args))


@needs_module
def test_lowering_one_pass_is_xla_unless_forced(h100):
    """One TF32 pass (precision None / DEFAULT) is XLA's product (problem.F32_ON_KERNELS);
    with a config forced it is our call: K-major operands as they are, others transposed and
    K padded to a multiple of 4 first."""
    a, b = jnp.ones((64, 256), jnp.float32), jnp.ones((96, 256), jnp.float32)
    text = cuda_text(lambda x, y: tg.gemm(x, y, transpose_b=True), a, b)
    assert "custom_call @tcgemm" not in text and "dot_general" in text
    good = next(c.name for c in configs.CONFIGS if c.f32)
    calls = _calls(lambda x, y: tcgemm(x[None], y[None], transpose_b=True, config=good), a, b)
    assert len(calls) == 1 and calls[0]["config"] == good and calls[0]["transpose_a"] == "false"
    assert "tensor<1x64x256xf32>" in calls[0]["line"] and "tensor<1x96x256xf32>" in calls[0]["line"]
    a, b = jnp.ones((1, 64, 258), jnp.float32), jnp.ones((1, 258, 96), jnp.float32)
    calls = _calls(lambda x, y: tcgemm(x, y, config=good), a, b)
    assert len(calls) == 1 and "x260xf32>" in calls[0]["line"] and calls[0]["transpose_b"] == "true"


@needs_module
@pytest.mark.parametrize("precision,k_prime,elem", [
    ("highest", 576 + 258 + 6, "f16"),          # f16x3: float16 parts, K-major, promoted
    (PRESET.TF32_TF32_F32_X3, 3 * 258 + 2, "f32"),  # 3xTF32: three TF32 parts, K-major
    (PRESET.BF16_BF16_F32_X6, 6 * 258, "bf16"),  # bfloat16 parts on the bfloat16 kernels
    (PRESET.BF16_BF16_F32, 258, "bf16"),
])
def test_lowering_parts(h100, split_threshold, precision, k_prime, elem):
    """One product of the parts, K-major (transpose_b), written by one tcgemm_split call per
    operand (a read (M, K), b read (K, N) as they are: no XLA transpose), whose attributes are
    f32.layout's blocks and zero ranges for that operand; operands below
    lowering.SPLIT_MIN_ELEMENTS split by XLA ops instead (no tcgemm_split call; the bfloat16
    algorithms' parts then keep b's layout)."""
    a, b = jnp.ones((64, 258), jnp.float32), jnp.ones((258, 96), jnp.float32)
    f = lambda x, y: tg.matmul(x, y, precision=precision)  # noqa: E731
    text = cuda_text(f, a, b)  # 64 x 258 and 258 x 96: below the kernel's threshold
    assert "tcgemm_split" not in text
    (call,) = custom_calls(text)
    assert f"x{k_prime}x{elem}>" in call["line"]
    assert call["transpose_b"] == ("false" if elem == "bf16" else "true")
    split_threshold(64 * 258)  # a and b on the kernel
    calls = _calls(f, a, b)
    assert len(calls) == 1
    line = calls[0]["line"]
    assert f"x{k_prime}x{elem}>" in line, line
    promoted = elem == "f16"
    assert calls[0]["promote"] == str(promoted).lower()
    assert calls[0]["piece_scale_k"] == (f"{f32.f16x3_lo_k(258)} : i64" if promoted else "0 : i64")
    assert calls[0]["has_row_scale"] == calls[0]["has_col_scale"] == str(promoted).lower()
    assert calls[0]["transpose_b"] == "true" and calls[0]["transpose_a"] == "false"
    if elem != "bf16":
        assert configs.BY_NAME[calls[0]["config"]].f32
    if promoted:  # (B, M) and (1, N) scales after the operands
        assert "tensor<1x64xf32>" in line and "tensor<1x96xf32>" in line, line
    text = cuda_text(f, a, b)
    assert "stablehlo.transpose" not in text
    splits = custom_calls(text, "tcgemm_split")
    assert len(splits) == 2
    algo = problem.f32_algorithm(problem.canonical_precision(precision))
    for call, role, shape in [(splits[0], "a", "1x64x258xf32"), (splits[1], "b", "1x258x96xf32")]:
        blocks, zeros, kk = f32.layout(algo, role, 258)
        want = {"k_major": "true" if role == "a" else "false",
                "offsets": ", ".join(str(o) for o, _, _ in blocks),
                "parts": ", ".join(str(p + 4 * m) for _, p, m in blocks),
                "zeros": ", ".join(str(e) for z in zeros for e in z) or f"{kk}, {kk}"}
        for key, value in want.items():  # (a splat array prints as dense<v> : tensor<Nx..>)
            got = re.search(rf"{key} = (?:dense<\[?([^\]>]*)\]?> : tensor<(\d+)|(\w+))",
                            call["line"])
            assert got, (key, call["line"])
            seen = got.group(3) or ", ".join(
                got.group(1).split(", ") * (int(got.group(2)) if "," not in got.group(1) else 1))
            assert seen == value, (key, value, call["line"])
        assert f"(tensor<{shape}>)" in call["line"] and f"x{kk}x{elem}>" in call["line"]


@needs_module
def test_lowering_lax_algorithms_and_other_gpus(h100, monkeypatch):
    a, b = jnp.ones((64, 256), jnp.float32), jnp.ones((256, 96), jnp.float32)
    text = cuda_text(lambda x, y: tg.matmul(x, y, precision=PRESET.F32_F32_F32), a, b)
    assert "custom_call @tcgemm" not in text and "dot_general" in text
    monkeypatch.setattr(configs, "device_arch", lambda: (8, 0))  # an A100: XLA's own TF32
    text = cuda_text(lambda x, y: tg.matmul(x, y), a, b)
    assert "custom_call @tcgemm" not in text and "dot_general" in text


@needs_module
def test_forced_config_must_have_tf32_kernels(h100):
    a, b = jnp.ones((1, 64, 256), jnp.float32), jnp.ones((1, 96, 256), jnp.float32)
    bad = next(c.name for c in configs.CONFIGS if not c.f32)
    good = next(c.name for c in configs.CONFIGS if c.f32)
    calls = _calls(lambda x, y: tcgemm(x, y, transpose_b=True, config=good), a, b)
    assert calls[0]["config"] == good
    with pytest.raises(ValueError, match="no float32"):
        cuda_text(lambda x, y: tcgemm(x, y, transpose_b=True, config=bad), a, b)


@needs_module
def test_plan_f32():
    assert configs.plan_f32(4096, 4096, 4096, arch=(9, 0))[0] in {c.name for c in configs.CONFIGS
                                                                  if c.f32}
    assert configs.plan_f32(4096, 4096, 4097, arch=(9, 0)) is None  # rows TMA cannot address
    assert configs.plan_f32(4096, 4096, 4096, arch=(8, 0)) is None
    assert {c.name for c in configs.CONFIGS if c.f32} == {
        c.name for c in configs.CONFIGS
        if c.kind == "sm90" and not c.pingpong and not c.fp8_only and c.bm == 64 * c.consumers}


@needs_module
def test_plan_f32_long_k_slices():
    """A float32 product's K slices cover at most F32_SLICE_K of K' (the rounding of a slice's
    running float32 sum grows with its length), and a long-K product of few tiles fills the SMs
    with slices; an 8192^3 3xTF32 product keeps one."""
    cfg = {c.name: c for c in configs.CONFIGS}
    for m, n, k in [(256, 256, 3 * 65536), (128, 4096, 3 * 32768), (2, 3, 3 * 20000)]:
        name, split = configs.plan_f32(m, n, k, arch=(9, 0))
        eff = configs.effective_split(cfg[name], k, split, 4)
        assert -(-k // eff) <= configs.F32_SLICE_K, (m, n, k, name, split, eff)
    name, split = configs.plan_f32(256, 256, 3 * 65536, arch=(9, 0))
    assert cfg[name].tiles(256, 256) * split >= 66  # half the 132 SMs or more
    assert configs.plan_f32(8192, 8192, 3 * 8192, arch=(9, 0))[1] == 1
    assert all(s == 1 or k // s >= configs.F32_MIN_SLICE_K
               for k in (4, 4096, 24576, 196608) for s in configs.f32_splits(k))


@pytest.mark.parametrize("algo", sorted(f32.TERMS))
def test_layout_tiles_k_prime(algo):
    """f32.layout (the one rule of the XLA specification and of the tcgemm_split kernel, whose
    handler rejects any other): per operand one block of K per term, blocks and zero ranges
    tiling [0, K') exactly, K' = concat_k; a part met by the other operand's remainder is the
    masked big part; f16x3's big term starts at f16x3_lo_k."""
    for k in (0, 1, 3, 64, 77, 258, 1029, 4096):
        for role in ("a", "b"):
            blocks, zeros, kk = f32.layout(algo, role, k)
            assert kk == f32.concat_k(k, algo) and len(blocks) == len(f32.TERMS[algo])
            spans = sorted([(o, o + k) for o, _, _ in blocks] + list(zeros))
            at = 0
            for begin, end in spans:
                assert begin == at and end >= begin, (algo, role, k, spans)
                at = end
            assert at == kk
            for (offset, part, masked), (i, j) in zip(blocks, f32.TERMS[algo]):
                mine, other = (i, j) if role == "a" else (j, i)
                assert part == mine and masked == (mine == 0 and other > 0)
            if algo == "f16x3":
                assert blocks[2][0] == f32.f16x3_lo_k(k)


@pytest.mark.parametrize("algo,bound", [("tf32", 2e-3), ("tf32x3", 2e-6), ("bf16", 1e-2),
                                        ("bf16x3", 4e-5), ("bf16x6", 2e-6), ("f16x3", 2e-6)])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["NN", "NT", "TN", "TT"])
def test_f32_parts_layouts(algo, bound, ta, tb):
    """lowering.f32_parts with its XLA ops (operands below SPLIT_MIN_ELEMENTS), batched a and a
    shared b in every layout: the layout flags it returns (K-major both, or the operands' own
    with keep_layout, as the bfloat16 algorithms ask) and parts whose product, as the kernels
    sum it (f16x3: the remainders' terms times 2^-F16_LO_SHIFT, the powers of two undone), is
    the float32 product within the algorithm's bound."""
    bt, m, n, k = 2, 24, 20, 100
    a = np.stack([rand(100 + i, (k, m) if ta else (m, k)) for i in range(bt)])
    b = rand(99, (n, k) if tb else (k, n))[None]
    keep = algo.startswith("bf16")
    fn = functools.partial(lowering.f32_parts, algo=algo, transpose_a=ta, transpose_b=tb,
                           keep_layout=keep, min_elements=1 << 62)
    pa, pb, ta2, tb2, scales = jax.jit(fn)(a, b)
    assert (ta2, tb2) == ((ta, tb) if keep else (False, True))
    pa, pb = np.asarray(pa, np.float64), np.asarray(pb, np.float64)
    pa = np.swapaxes(pa, 1, 2) if ta2 else pa  # (B, M, K')
    pb = np.swapaxes(pb, 1, 2) if tb2 else pb  # (1, K', N)
    if algo == "f16x3":
        lk = f32.f16x3_lo_k(k)
        got = pa[..., :lk] @ pb[:, :lk] * 2.0 ** -f32.F16_LO_SHIFT + pa[..., lk:] @ pb[:, lk:]
        got *= (np.asarray(scales[0], np.float64)[:, :, None] *
                np.asarray(scales[1], np.float64)[:, None, :])
    else:
        got = pa @ pb
    a64 = np.swapaxes(a, 1, 2) if ta else a
    b64 = np.swapaxes(b, 1, 2) if tb else b
    want = a64.astype(np.float64) @ b64.astype(np.float64)
    assert np.linalg.norm(got - want) <= bound * np.linalg.norm(want)
