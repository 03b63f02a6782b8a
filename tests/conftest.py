"""Shared pytest configuration and numerics helpers for the jax_tcgemm tests.

* Registers the `gpu` marker. Tests marked `gpu` are skipped, with a reason, when
  `jax.default_backend() != "gpu"` or when the CUDA extension is not built. With
  TCGEMM_REQUIRE_GPU=1 in the environment (the GPU check script sets it) the same conditions
  FAIL those tests instead, so a GPU run can never pass by silently skipping everything.
* Helpers (import them with `from conftest import ...`): `rand` (fresh random normal inputs),
  `ref64` (float64 numpy reference of the already-rounded inputs), `epilogue_ref64` /
  `epilogue64` (the same with the fused epilogue), `act64` / `act_grad64` (the activations
  and their derivatives in float64), `rel_err` (relative Frobenius error), `BOUNDS` / `bound`
  (per-output-dtype error bounds, DESIGN §7). All run on the CPU. `poisoned` /
  `poisoned_twice`: outputs written into donated NaN-filled buffers (any backend).
* Pins the CPU test modules (`*_cpu`, test_sharding) to the CPU device on any machine.
"""
from __future__ import annotations

import hashlib
import os
import re
import warnings

# Several CPU devices for the sharding tests (tests/test_sharding.py). XLA reads this flag once,
# when jax starts its backends, so it is set here, before anything imports jax, and appended to
# flags the user set. It changes only the host (CPU) platform, never the GPUs.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=4").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

REQUIRE_GPU = os.environ.get("TCGEMM_REQUIRE_GPU", "") not in ("", "0")
NO_GPU_REASON = f"no GPU: jax.default_backend() is {jax.default_backend()}"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU and the built extension (skipped elsewhere; "
                   "TCGEMM_REQUIRE_GPU=1 turns the skip into a failure)")


def _gpu_problem() -> str | None:
    """Why `gpu` tests cannot run here (None if they can)."""
    if jax.default_backend() != "gpu":
        return NO_GPU_REASON
    from jax_tcgemm import _ffi
    if not _ffi.available():
        return f"CUDA extension jax_tcgemm._tcgemm not built/loadable ({_ffi._LOAD_ERROR})"
    return None


def pytest_collection_modifyitems(config, items):
    problem = _gpu_problem()
    if problem is None or REQUIRE_GPU:
        return  # run them (or fail them in pytest_runtest_setup)
    skip = pytest.mark.skip(reason=problem)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


# Modules of CPU tests (named *_cpu, and test_sharding's CPU meshes) test the CPU contract:
# lax's numbers on the host platform. On a GPU machine the default device is a GPU, where the
# same calls run our kernels (TF32 / f16x3 float32, fp8 wgmma), and XLA itself differs (it
# folds the stock Flax fp8 op's float32 -> fp8 -> float32 converts away on a GPU). So their
# tests run on the host's CPU device wherever they run; the GPU numbers are the gpu tests'.
CPU_MODULES = ("test_sharding",)


@pytest.fixture(autouse=True, scope="module")
def _cpu_contract(request):
    name = request.module.__name__.rsplit(".", 1)[-1]
    if name.endswith("_cpu") or name in CPU_MODULES:
        with jax.default_device(jax.devices("cpu")[0]):
            yield
    else:
        yield


def pytest_runtest_setup(item):
    # Runs before any fixture of the item (module-scoped ones included).
    if REQUIRE_GPU and item.get_closest_marker("gpu") is not None:
        problem = _gpu_problem()
        if problem is not None:
            pytest.fail(f"TCGEMM_REQUIRE_GPU=1 but {problem}", pytrace=False)


# ---------------------------------------------------------------------------------------------
# Numerics helpers.

# Relative Frobenius error bounds by OUTPUT dtype against the float64 product of the rounded
# inputs (DESIGN §7). Output rounding alone is ~1.4e-4 (f16) and ~1.1e-3 (bf16) relative.
BOUNDS = {
    np.dtype(jnp.float16): 1e-3,
    np.dtype(jnp.bfloat16): 5e-3,
    np.dtype(np.float32): 1e-5,
}


def bound(out_dtype, k: int = 1) -> float:
    """BOUNDS[out_dtype], for float32 output scaled with K beyond 2048.

    Tensor-core float32 accumulation is reported to round toward zero (Fasi et al., 2021,
    "Numerical behavior of NVIDIA tensor cores"), so its error can grow roughly linearly in
    the K/16 accumulation steps rather than with sqrt(K): an estimated ~7e-6 at K=4096 and
    ~1e-4 at K=65536 (not yet measured on our kernel). 1e-5*K/2048 keeps ~3x margin over
    that estimate, while a real defect (even one missing K element) costs about 1/sqrt(K)
    relative, which stays far above it (4e-3 at K=65536)."""
    dt = np.dtype(out_dtype)
    b = BOUNDS[dt]
    if dt == np.float32:
        b *= max(1.0, k / 2048)
    return b


def seed_of(*parts) -> int:
    """A stable 32-bit seed derived from the case parameters (fresh inputs per case)."""
    h = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(h[:4], "little")


def rand(key_or_seed, shape, dtype=jnp.float16, scale=1.0):
    """Fresh standard-normal values (never zeros, never constant) rounded to `dtype`, as a jax
    array on the default device.

    `key_or_seed` is an int seed, a tuple of case parameters hashed into a seed, or a jax PRNG
    key. Seeds draw on the host with numpy (no per-shape compile of a jax RNG kernel)."""
    if isinstance(key_or_seed, tuple):
        key_or_seed = seed_of(*key_or_seed)
    if isinstance(key_or_seed, (int, np.integer)):
        x = np.random.default_rng(int(key_or_seed)).standard_normal(shape, np.float32)
        return jnp.asarray((x * scale).astype(dtype))
    return (jax.random.normal(key_or_seed, shape, jnp.float32) * scale).astype(dtype)


def f64(x) -> np.ndarray:
    """Host float64 copy, complex128 for complex values (converted on the host: no per-shape
    device compile)."""
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def ref64(a, b, *, transpose_a=False, transpose_b=False) -> np.ndarray:
    """float64 numpy reference of tcgemm_p semantics on rank-3 (batch-1 broadcast) operands,
    or of a plain matmul on other ranks when both flags are False."""
    a, b = f64(a), f64(b)
    for x in (a, b):
        assert x.size <= 1 or np.ptp(x) > 0, "constant test input"
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def scaled_ref64(a, b, sa, sb, *, transpose_b=False, block=False) -> np.ndarray:
    """float64 sum_k a b * scales of tg.scaled_matmul's quantised operands: a (..., M, K), b
    (..., K, N) or with transpose_b (..., N, K), batch dims broadcast. Per-tensor / row / column
    scales (sa () / (1,) / (..., M), sb () / (1,) / (..., N)) multiply the product; `block`:
    sa (..., M, Kb), sb (..., Kb, Nb) or with transpose_b (..., Nb, Kb), each 128-slice of K's
    partial product times its blocks' scales. No scales: sa and sb None."""
    A, B = f64(a), f64(b)
    B = np.swapaxes(B, -1, -2) if transpose_b else B  # (..., K, N)
    if sa is None:
        return np.matmul(A, B)
    SA, SB = f64(sa), f64(sb)
    if not block:
        return np.matmul(A, B) * (SA[..., None] if SA.ndim else SA) * \
            (SB[..., None, :] if SB.ndim else SB)
    SB = np.swapaxes(SB, -1, -2) if transpose_b else SB  # (..., Kb, Nb)
    k, n = B.shape[-2:]
    out = 0.0
    for kb in range(-(-k // 128)):
        sl = slice(128 * kb, 128 * (kb + 1))
        col = np.repeat(SB[..., kb, :], 128, axis=-1)[..., None, :n]
        out = out + np.matmul(A[..., sl], B[..., sl, :]) * SA[..., kb:kb + 1] * col
    return out


def rel_err(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64 (inf if out has any non-finite value)."""
    out = f64(out)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if not np.all(np.isfinite(out)):
        return float("inf")
    den = np.linalg.norm(ref.ravel())
    num = np.linalg.norm((out - ref).ravel())
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return float(num / den)


def assert_close(out, ref, out_dtype, k=1, what=""):
    err = rel_err(out, ref)
    lim = bound(out_dtype, k)
    assert err <= lim, f"{what}: relative error {err:.3g} > bound {lim:.3g} ({np.dtype(out_dtype)})"
    return err


# ---------------------------------------------------------------------------------------------
# The fused epilogue in float64: D = act(alpha * op(a) @ op(b) + beta * c + bias).

def _erf(x):
    from scipy.special import erf  # a jax dependency
    return erf(x)


def act64(name, x) -> np.ndarray:
    """The epilogue's activation (problem.ACTIVATIONS; None is "none") in float64."""
    x = np.asarray(x, np.float64)
    if name in (None, "none"):
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    raise ValueError(f"unknown activation {name!r}")


def act_grad64(name, x) -> np.ndarray:
    """d act / dx in float64 (relu: 0 at 0, as jax.nn.relu's derivative)."""
    x = np.asarray(x, np.float64)
    if name in (None, "none"):
        return np.ones_like(x)
    if name == "relu":
        return (x > 0).astype(np.float64)
    if name == "gelu":
        return 0.5 * (1.0 + _erf(x / np.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
    if name == "gelu_tanh":
        c = np.sqrt(2.0 / np.pi)
        t = np.tanh(c * (x + 0.044715 * x ** 3))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)
    if name == "silu":
        s = 1.0 / (1.0 + np.exp(-x))
        return s * (1.0 + x * (1.0 - s))
    raise ValueError(f"unknown activation {name!r}")


# Largest |act'| over the reals (gelu: 1.129, gelu_tanh: 1.129, silu: 1.100): how much an
# error in the pre-activation can grow through the activation.
ACT_LIPSCHITZ = 1.13


def epilogue64(ab, c=None, bias=None, *, alpha=1.0, beta=0.0, activation=None):
    """(d, pre) in float64 from the float64 product ab: pre = alpha * ab + beta * c + bias,
    d = act(pre). A 2-D bias is (B or 1, N) of a rank-3 product (tcgemm_p's form), a 1-D one
    (N,); c broadcasts to the result."""
    pre = float(alpha) * np.asarray(ab, np.float64)
    if c is not None:
        pre = pre + float(beta) * f64(c)
    if bias is not None:
        bias = f64(bias)
        pre = pre + (bias[:, None, :] if bias.ndim == 2 else bias)
    return act64(activation, pre), pre


def epilogue_ref64(a, b, c=None, bias=None, *, alpha=1.0, beta=0.0, activation=None,
                   transpose_a=False, transpose_b=False):
    """(d, pre) in float64 of the already-rounded operands (ref64, then epilogue64)."""
    ab = ref64(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    return epilogue64(ab, c, bias, alpha=alpha, beta=beta, activation=activation)


# ---------------------------------------------------------------------------------------------
# Outputs written into NaN-poisoned buffers.

_COPY = re.compile(r"\scopy(-start)?\(")


def poisoned(fn, poisons, *args):
    """Compiles fn(*args) -> list of arrays with `poisons` (device arrays, one per output, same
    shape and dtype, e.g. NaN-filled) donated, so that XLA writes each output into its poison
    buffer and an element the kernel never writes keeps the poison. Returns
    run(poisons, *args) -> (outputs, flags); flags[i]: output i really was written in place
    (same address, no copy in the executable). Each call needs fresh poisons (donated)."""
    jitted = jax.jit(lambda ps, *xs: fn(*xs), donate_argnums=0, keep_unused=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        compiled = jitted.lower(poisons, *args).compile()
    in_place = not _COPY.search(compiled.as_text() or "")

    def run(poisons, *args):
        ptrs = [p.unsafe_buffer_pointer() if p.size else None for p in poisons]
        outs = compiled(poisons, *args)
        return outs, [in_place and p is not None and o.unsafe_buffer_pointer() == p
                      for o, p in zip(outs, ptrs)]
    return run


def poisoned_call(fn, poisons, *args):
    """poisoned(...) compiled and run once."""
    return poisoned(fn, poisons, *args)(poisons, *args)


def nan_filled(avals):
    """Fresh device buffers of the given shapes / dtypes, filled with NaN on the host (no
    device compile per shape)."""
    return [jax.device_put(np.full(a.shape, np.nan, a.dtype)) for a in avals]


def poisoned_twice(fn, *args):
    """fn(*args) -> list of arrays, compiled once and run twice, each run into fresh NaN-filled
    buffers donated for its outputs (`poisoned`): an element never written stays NaN, a racy or
    non-deterministic one differs between the runs. Returns (the second run's outputs as host
    arrays, per output whether both runs agree bitwise, how many outputs of the second run were
    written in place)."""
    avals = jax.eval_shape(fn, *args)
    run = poisoned(fn, nan_filled(avals), *args)
    first = [np.asarray(x) for x in run(nan_filled(avals), *args)[0]]
    outs, flags = run(nan_filled(avals), *args)
    outs = [np.asarray(x) for x in outs]
    same = [np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(first, outs)]
    return outs, same, sum(bool(f) for f in flags)


@pytest.fixture
def split_threshold(monkeypatch):
    """set(n): float32 operands of n elements or more split by the tcgemm_split kernel in the
    lowerings that follow (lowering.SPLIT_MIN_ELEMENTS; jax's lowering caches cleared on each
    change and at the end, so that no test sees another's lowering)."""
    from jax_tcgemm import lowering

    def set_(n):
        monkeypatch.setattr(lowering, "SPLIT_MIN_ELEMENTS", n)
        jax.clear_caches()
    yield set_
    jax.clear_caches()  # (before monkeypatch restores the threshold)
