"""The measuring harness shared by the benchmark (bench.py) and the autotuner (autotune.py),
and the benchmark's case tables (DESIGN §8). Never imported by the core.

One timed call of a side is one jit of R independent products over R distinct A's (shared
operands B, C, bias, ... once), each product's operands through their own
`optimization_barrier`, so XLA cannot merge the products or share work between them; R is
chosen so that a call does ~TARGET_FLOP of work. Sides are timed interleaved, rep by rep,
after warm-up calls; the figure is the median.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time

TARGET_FLOP = 4e12        # work per timed call
MAX_R = 64                # products per call
MEM_FRAC_R = 0.25         # R copies of A and C (plus B) must fit in this share of device memory
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}

# ---------------------------------------------------------------------------------------------
# Case tables.

SUITES = ("square", "llm", "odd", "batched", "f32", "epilogue")
LLM_M = (16, 128, 4096, 8192)
LLM_NK = {  # y = x @ W, x (M, K), W (K, N): Llama-2 projections
    "l7b_gateup": (11008, 4096), "l7b_down": (4096, 11008),
    "l70b_gateup": (28672, 8192), "l70b_down": (8192, 28672), "l7b_qkvo": (4096, 4096)}
# The epilogue suite: (name, m, n, k, dtype, op, activation). op "axpby": D = 1.1 A@B + 1.2 C
# (float32 C and D); "bias_act": act(x@W + bias); "fwd_bwd": value_and_grad of
# sum(act(x@W + bias)) w.r.t. x, W and bias (three GEMMs).
EPILOGUE = (
    ("epilogue_seed001", 4096, 4096, 4096, "float16", "axpby", None),
    ("epilogue_bias_gelu_tanh", 8192, 16384, 4096, "bfloat16", "bias_act", "gelu_tanh"),
    ("epilogue_bias_relu", 8192, 16384, 4096, "bfloat16", "bias_act", "relu"),
    ("epilogue_fwd_bwd_bias_gelu", 8192, 16384, 4096, "bfloat16", "fwd_bwd", "gelu_tanh"),
    ("epilogue_decode_bias_gelu", 16, 14336, 4096, "bfloat16", "bias_act", "gelu_tanh"),
)
OPS = ("matmul", "axpby", "bias_act", "fwd_bwd")
AXPBY = (1.1, 1.2)  # alpha, beta of the axpby op (the CUDA-samples tensor-core GEMM)


@dataclasses.dataclass(frozen=True)
class Case:
    suite: str
    name: str
    m: int
    n: int
    k: int
    batch: int
    dtype: str
    vmap: bool = False        # batched cases: jax.vmap of the 2-D op over a leading batch axis
    layout: str = "NN"
    op: str = "matmul"        # one of OPS
    activation: str | None = None

    @property
    def gemms(self) -> int:
        return 3 if self.op == "fwd_bwd" else 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch * self.gemms

    @property
    def out_dtype(self) -> str:
        return "float32" if self.op == "axpby" else self.dtype

    def nbytes(self) -> tuple[int, int, int]:
        """Bytes of one product's A, B and output C (and the M x N or K x N arrays an
        epilogue op adds: axpby's C input, fwd_bwd's pre-activation, cotangent, dx and dW)."""
        isz, b = ITEMSIZE[self.dtype], self.batch
        a, w = b * self.m * self.k * isz, b * self.k * self.n * isz
        c = b * self.m * self.n * ITEMSIZE[self.out_dtype]
        if self.op == "axpby":
            c *= 2
        elif self.op == "fwd_bwd":
            c = 3 * c + w + a
        return a, w, c


def _shapes(suite: str):
    """(name, m, n, k, batch, vmap) of the plain GEMM suites."""
    if suite == "square":
        return [(f"square_{s}", s, s, s, 1, False) for s in (1024, 2048, 4096, 8192, 16384)]
    if suite == "llm":
        return [(f"llm_{tag}_m{m}", m, n, k, 1, False)
                for tag, (n, k) in LLM_NK.items() for m in LLM_M]
    if suite == "odd":
        return [("odd_4095x4097x4093", 4095, 4097, 4093, 1, False), ("odd_1000", 1000, 1000, 1000, 1, False)]
    if suite == "batched":
        return [("batched_64x256x256x256", 256, 256, 256, 64, True),
                ("batched_32x1024x1024x128", 1024, 1024, 128, 32, True)]
    if suite == "f32":
        return [("f32_4096", 4096, 4096, 4096, 1, False)]
    raise ValueError(f"unknown suite {suite!r}; expected one of {SUITES + ('all',)}")


def cases(suite: str, dtypes=("float16", "bfloat16")) -> list[Case]:
    """The cases of `suite` ('all' = every suite) for each dtype; the f32 suite is float32
    only, and each epilogue row has its own fixed dtype."""
    out = []
    for s in (SUITES if suite == "all" else (suite,)):
        if s == "epilogue":
            out += [Case(s, name, m, n, k, 1, dt, op=op, activation=act)
                    for name, m, n, k, dt, op, act in EPILOGUE]
            continue
        for name, m, n, k, batch, vmap in _shapes(s):
            for dt in (("float32",) if s == "f32" else tuple(dtypes)):
                out.append(Case(s, name, m, n, k, batch, dt, vmap))
    return out


def parse_shape(spec: str, dtypes) -> list[Case]:
    """'MxNxK' (plain) or 'BxMxNxK' (vmapped batch) -> custom cases, one per dtype."""
    dims = [int(x) for x in spec.lower().split("x")]
    if len(dims) not in (3, 4) or min(dims) < 1:
        raise ValueError(f"--shape {spec!r}: expected MxNxK or BxMxNxK with positive sizes")
    b, (m, n, k) = (dims[0], dims[1:]) if len(dims) == 4 else (1, dims)
    return [Case("custom", f"custom_{spec}", m, n, k, b, dt, len(dims) == 4) for dt in dtypes]


# ---------------------------------------------------------------------------------------------
# The harness.

def choose_reps(flops: int, per_product_bytes: int = 0, shared_bytes: int = 0,
                mem_limit: int | None = None) -> int:
    """R: products per timed call. R*flops ~ TARGET_FLOP, 1 <= R <= MAX_R, and R*per_product
    + shared within MEM_FRAC_R of mem_limit (when known)."""
    r = min(MAX_R, max(1, round(TARGET_FLOP / flops)))
    if mem_limit and per_product_bytes:
        fit = int((MEM_FRAC_R * mem_limit - shared_bytes) // per_product_bytes)
        r = max(1, min(r, fit))
    return r


def time_fns(fns: dict, args, reps: int, warmup: int = 2, stream: bool = True,
             dispatch: dict | None = None) -> dict:
    """Seconds per call of each fn in `fns` ({name: [seconds] * reps}), the sides interleaved
    rep by rep after `warmup` calls of each.

    stream (the default): the calls run back to back, each dispatched while the one before it
    is still on the GPU, as a program that dispatches asynchronously runs them, and a call's
    time is the interval from the previous call's completion to its own. The GPU never waits
    for the host, so the host's dispatch (PjRt's execute path, ~0.4 ms per call on an H200,
    benchmarks/NOTES.md v56) is not charged to the call unless it takes longer than the call
    itself: then the interval is the dispatch's, which `dispatch` ({name: [seconds]}, filled
    when given) shows. Without stream, each call is timed alone around call +
    block_until_ready, from an idle GPU: the figures of the records up to v73 (NOTES), which
    charge both sides the dispatch (a constant that keeps the order of close candidates, as
    the autotuner wants, but pulls ratios toward 1)."""
    import jax
    for _ in range(warmup):
        for f in fns.values():
            jax.block_until_ready(f(*args))
    times = {name: [] for name in fns}
    order = [name for _ in range(reps) for name in fns]
    if not stream:
        for name in order:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](*args))
            times[name].append(time.perf_counter() - t0)
        return times

    def queue(i):  # dispatch call i of `order`, timing the host's part
        t0 = time.perf_counter()
        out = fns[order[i]](*args)
        if dispatch is not None:
            dispatch.setdefault(order[i], []).append(time.perf_counter() - t0)
        return out
    # An untimed lead call (of the last side, as in the rotation) occupies the GPU while the
    # first timed call is queued behind it; then at every step the next call is queued before
    # the running one is waited for: two calls' outputs are alive at most.
    running = fns[order[-1]](*args)
    queued = queue(0)
    jax.block_until_ready(running)
    t_prev = time.perf_counter()
    for i, name in enumerate(order):
        running = queued
        queued = queue(i + 1) if i + 1 < len(order) else None
        jax.block_until_ready(running)
        t = time.perf_counter()
        times[name].append(t - t_prev)
        t_prev = t
    return times


def medians(times: dict) -> dict:
    """{name: median seconds} of time_fns' result."""
    return {name: statistics.median(t) for name, t in times.items()}


def method(reps: int) -> str:
    """The record's words for how time_sides times a row (the `harness` field's tail)."""
    return (f"2 warm-up calls, then {reps} timed calls per side interleaved, back to back (each "
            "queued while the previous one runs; a call's time is from the previous call's "
            "completion to its own), median; *_dispatch_ms: the host's part of queuing those "
            "calls, median; *_ms_blocking: as many calls before them, each timed alone around "
            "call + block_until_ready, median")


def time_sides(fns: dict, args, reps: int) -> tuple[dict, dict]:
    """A bench row's timings: (stream medians, extra row fields), seconds per call of each side
    and side_fields' fields. The stream figures are the row's; the blocking ones (each call
    alone from an idle GPU) are kept beside them so that the row compares with records before
    v74 (benchmarks/NOTES.md), and the host's dispatch time of the stream's calls shows where a
    stream figure is the host's (dispatch as long as the interval). The blocking calls run
    first, right after the warm-up as they did in those records, and the stream after them, on
    the GPU they have warmed."""
    blocking = medians(time_fns(fns, args, reps, stream=False))
    dispatch: dict = {}
    stream = medians(time_fns(fns, args, reps, 0, dispatch=dispatch))
    return stream, side_fields(blocking, medians(dispatch))


def sig(x, n=3):
    """x to n significant digits; NaN/inf -> None (JSON has no NaN)."""
    return float(f"{x:.{n}g}") if math.isfinite(x) else None


def side_fields(blocking: dict, dispatch: dict) -> dict:
    """The row fields beside the stream's figures: <side>_ms_blocking and ratio_blocking
    (tcgemm's rate over jnp's) from the blocking medians, <side>_dispatch_ms from the stream's
    dispatch medians (seconds in, milliseconds to 4 significant digits out)."""
    out = {f"{side}_ms_blocking": sig(t * 1e3, 4) for side, t in blocking.items()}
    if "tcgemm" in blocking and "jnp" in blocking:
        out["ratio_blocking"] = round(blocking["jnp"] / blocking["tcgemm"], 4)
    out.update({f"{side}_dispatch_ms": sig(t * 1e3, 4) for side, t in dispatch.items()})
    return out


def time_fn(fn, args, reps: int, warmup: int = 2) -> float:
    """Median seconds of `reps` calls fn(*args) after `warmup` calls."""
    return medians(time_fns({"f": fn}, args, reps, warmup))["f"]


@functools.cache
def _rand_fn():
    import jax
    import jax.numpy as jnp

    def rand(key, shape, dtype, scale):
        return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)
    return jax.jit(rand, static_argnums=(1, 2))


def random_array(key, shape, dtype, scale: float = 1.0):
    """N(0, scale^2) values of `shape` in `dtype` from jax.random key `key` (on the device)."""
    import numpy as np
    return _rand_fn()(key, tuple(shape), np.dtype(dtype), np.float32(scale))


def harness_operands(r: int, a_shape, b_shape, dtype, k: int, seed: int = 0):
    """The harness's inputs: R distinct A matrices of a_shape ~ N(0, 1) and one shared B of
    b_shape ~ N(0, 1)/sqrt(K), in `dtype`, from jax.random key `seed`."""
    import jax
    keys = jax.random.split(jax.random.key(seed), r + 1)
    a_list = tuple(random_array(keys[i], a_shape, dtype) for i in range(r))
    return a_list, random_array(keys[r], b_shape, dtype, 1.0 / math.sqrt(max(k, 1)))


def harness(op, barrier: bool = True):
    """jit(f(a_list, *shared) -> tuple(op(a, *shared) for a in a_list)). With `barrier`, each
    product's operands pass through their own optimization_barrier, so XLA cannot merge the R
    products (DotMerger) or otherwise share work between them; the barrier moves no data."""
    import jax

    def f(a_list, *shared):
        outs = []
        for a in a_list:
            args = jax.lax.optimization_barrier((a, *shared)) if barrier else (a, *shared)
            outs.append(op(*args))
        return tuple(outs)
    return jax.jit(f)


@functools.cache
def _rel_fro():
    import jax
    import jax.numpy as jnp

    def rel(x, ref):
        x, ref = x.astype(jnp.float32), ref.astype(jnp.float32)
        return jnp.sqrt(jnp.sum((x - ref) ** 2)) / jnp.sqrt(jnp.sum(ref ** 2))
    return jax.jit(rel)


def rel_fro(x, ref) -> float:
    """||x - ref||_F / ||ref||_F, in float32 on the device."""
    return float(_rel_fro()(x, ref))
