"""Seeded fuzz of tcgemm_p: shapes, dtypes, output dtypes, layouts, batch (shared batch-1
operands: stride 0), and every kernel config (forced with `tcgemm(..., config=name)`, some with
split_k) or the default selection; and (the epilogue fuzz) the same with a random fused
epilogue: C of any form (full, batch-shared, per-row, per-column, scalar) and dtype, a shared
or per-item bias, every activation, alpha / beta static or traced (the scale operand), and the
pre-activation as a second output (aux).

Each case is reproducible from (TCGEMM_FUZZ_SEED, index). Dimensions mix primes, tile-1/tile/
tile+1 around every config's BM/BN/BK (and 2x, 3x), and log-uniform sizes up to 5000; one or
two axes are big, never all three (caps on M*N*K, operand and output sizes keep the whole run
to a few minutes). Config x layout x dtype x out dtype cycle through all combinations, so every
one is hit many times.

GPU mode (`-m gpu`, TCGEMM_FUZZ_CASES plain cases here and TCGEMM_FUZZ_EPI_CASES epilogue cases
in test_fuzz_epilogue.py, default 2000 each): cases run in groups, one jit per group. Each
output is NaN-poisoned first: a NaN-filled buffer of the output's shape is donated to the jitted
call and XLA writes the output into it (checked by its address and by the absence of copies in
the executable), so an element the kernel never writes stays NaN. Each output is compared with
the float64 reference of the rounded inputs: relative Frobenius error within conftest.bound (for
epilogues, relative to the larger of the result and the product, plus the epilogue's float32
evaluation), and every element within output rounding + a float32-accumulation allowance scaled
by |a_i|*|b_j| (+ the evaluation allowance, through the activation's slope). All failures are
listed at the end (case index, seed, shape, layout, dtypes, config, epilogue);
`TCGEMM_FUZZ_ONLY=i,j,...` reruns just those indices (of both fuzzes).

CPU mode (runs in CI, through the lax fallback): TCGEMM_FUZZ_CPU_CASES small cases of each
(default 50).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_tcgemm import configs
from jax_tcgemm.primitive import tcgemm

from conftest import ACT_LIPSCHITZ, act64, bound, poisoned_call, seed_of

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
LAYOUTS = list(itertools.product((False, True), repeat=2))  # (transpose_a, transpose_b)
SEED = int(os.environ.get("TCGEMM_FUZZ_SEED", "0"))
ONLY = [int(i) for i in os.environ.get("TCGEMM_FUZZ_ONLY", "").split(",") if i.strip()]
# Unit roundoff of the output rounding (and f16's subnormal spacing / 2 as an absolute term).
UNIT = {F16: 2.0 ** -11, BF16: 2.0 ** -8, F32: 2.0 ** -24}
TINY = {F16: 2.0 ** -25, BF16: 0.0, F32: 0.0}
PRIMES = (2, 3, 5, 7, 11, 13, 17, 31, 37, 61, 67, 97, 127, 131, 193, 251, 257, 383, 509, 521,
          769, 1021, 1031, 1531, 2039, 2053, 3067, 4093, 4099, 4999)


def _special_dims() -> list[int]:
    """Primes, and t-1, t, t+1 for t = 1x, 2x, 3x every tile size (and the mma granules)."""
    tiles = {v for c in configs.CONFIGS for v in (c.bm, c.bn, c.bk)} | {8, 16}
    out = set(PRIMES)
    for t, mult in itertools.product(tiles, (1, 2, 3)):
        out |= {mult * t - 1, mult * t, mult * t + 1}
    return sorted(out)


SPECIAL = _special_dims()


@dataclasses.dataclass(frozen=True)
class Mode:
    """Size limits of one fuzz mode (elements / multiply-adds, batch included)."""
    work: int        # batch * M * N * K
    out: int         # batch * M * N
    operand: int     # Ba * M * K and Bb * K * N
    big: int         # largest value of a big axis
    small: int       # largest value of the other axes
    huge_batch: bool  # batch around the 65535 grid-z limit, with tiny matrices


GPU_MODE = Mode(work=2 ** 26, out=2 ** 22, operand=2 ** 22, big=5000, small=300, huge_batch=True)
CPU_MODE = Mode(work=2 ** 17, out=2 ** 13, operand=2 ** 13, big=700, small=96, huge_batch=False)


@dataclasses.dataclass(frozen=True)
class Case:
    index: int
    m: int
    n: int
    k: int
    ba: int  # batch of a (1: shared by the whole batch, stride 0)
    bb: int
    dtype: np.dtype
    out_dtype: np.dtype
    ta: bool
    tb: bool
    config: str | None  # None: the default selection (configs.plan)
    split_k: int | None
    # the epilogue (defaults: none, a plain product)
    c_shape: tuple | None = None  # (1 or B, 1 or M, 1 or N)
    c_dtype: np.dtype | None = None
    bias_rows: int = 0  # 0: no bias; 1: shared (1, N); B: per item (B, N)
    bias_dtype: np.dtype = F32  # float32, float16 or bfloat16 (the kernels read each)
    activation: str = "none"
    alpha: float = 1.0  # float32 values
    beta: float = 0.0
    traced: bool = False  # alpha, beta as the float32 scale operand
    aux: bool = False  # also the pre-activation

    @property
    def batch(self):
        return max(self.ba, self.bb)

    @property
    def epilogue(self):
        return (self.c_shape is not None or self.bias_rows or self.activation != "none"
                or self.alpha != 1.0 or self.traced or self.aux)

    @property
    def seed(self):
        return seed_of("fuzz", SEED, self.index) if not self.epilogue else seed_of(
            "fuzz-epi-ops", SEED, self.index)

    @property
    def a_shape(self):  # stored
        return (self.ba, self.k, self.m) if self.ta else (self.ba, self.m, self.k)

    @property
    def b_shape(self):
        return (self.bb, self.n, self.k) if self.tb else (self.bb, self.k, self.n)

    @property
    def out_shape(self):
        return (self.batch, self.m, self.n)

    @property
    def outputs(self):
        return 2 if self.aux else 1

    def size(self):
        c = math.prod(self.c_shape) if self.c_shape else 0
        return (self.ba * self.m * self.k + self.bb * self.k * self.n + c + self.bias_rows * self.n
                + self.outputs * self.batch * self.m * self.n)

    def call(self, a, b, c=None, bias=None, scale=None):
        """The case's outputs: [d] or [d, pre]."""
        kw = {} if self.traced else dict(alpha=self.alpha, beta=self.beta)
        # float32 operands at HIGHEST (f16x3): float32 accuracy, within the same bounds
        prec = "highest" if self.dtype == F32 else None
        out = tcgemm(a, b, c, bias, scale, transpose_a=self.ta, transpose_b=self.tb,
                     out_dtype=self.out_dtype, activation=self.activation, aux=self.aux,
                     config=self.config, split_k=self.split_k, precision=prec, **kw)
        return list(out) if self.aux else [out]

    def __str__(self):
        split = "" if self.split_k is None else f" split_k={self.split_k}"
        epi = ""
        if self.epilogue:
            c = "" if self.c_shape is None else f" c{self.c_shape} {self.c_dtype.name}"
            bias = (f" bias({self.bias_rows}, N) {np.dtype(self.bias_dtype).name}"
                    if self.bias_rows else "")
            ab = "traced " if self.traced else ""
            epi = (f" [{ab}alpha={self.alpha!r} beta={self.beta!r}{c}{bias} "
                   f"{self.activation}{' aux' if self.aux else ''}]")
        return (f"case {self.index} (seed {self.seed}): batch {self.ba}/{self.bb} M={self.m} "
                f"N={self.n} K={self.k} {configs.layout_name(self.ta, self.tb)} "
                f"{self.dtype.name}->{self.out_dtype.name} {self.config or 'default'}{split}{epi}")


def _dim(r: random.Random, hi: int, top: int, big: bool, aligned: bool) -> int:
    """One dimension <= min(hi, top): a special value, or log-uniform (from 256 if big)."""
    top = max(1, min(hi, top))
    if r.random() < 0.45:
        cands = [v for v in SPECIAL if v <= top and (not big or v >= 64 or top < 64)]
        v = r.choice(cands or [top])
    else:
        lo = 256 if big and top > 512 else 1
        v = int(round(math.exp(r.uniform(math.log(lo), math.log(top + 0.5)))))
    if aligned and top >= 8:  # contiguous extents multiples of 8: the cp.async (aligned) path
        v = max(8, v - v % 8)
    return max(1, min(v, top))


def _shape(r: random.Random, mode: Mode):
    """(m, n, k, ba, bb) within the mode's caps: big axes drawn first, each axis bounded by the
    caps given the axes drawn so far."""
    u = r.random()
    if u < 0.55:
        bt = 1
    elif u < 0.985 or not mode.huge_batch:
        bt = r.randint(2, 6)
    else:
        bt = r.choice([65535, 65537, 70001])  # around the grid-z limit of the launch
    ba, bb = (1, 1) if bt == 1 else r.choice([(bt, bt), (bt, bt), (1, bt), (bt, 1)])
    big = r.sample("mnk", r.choices([0, 1, 2], [25, 45, 30])[0])
    order = big + r.sample([x for x in "mnk" if x not in big], 3 - len(big))
    aligned = r.random() < 0.4
    d = {"m": 1, "n": 1, "k": 1}
    for x in order:
        d[x] = 1
        lims = [mode.work // (bt * d["m"] * d["n"] * d["k"])]
        if x != "k":
            lims.append(mode.out // (bt * d["m"] * d["n"]))
        if x != "n":
            lims.append(mode.operand // (ba * d["m"] * d["k"]))
        if x != "m":
            lims.append(mode.operand // (bb * d["k"] * d["n"]))
        d[x] = _dim(r, min(lims), mode.big if x in big else mode.small, x in big, aligned)
    return d["m"], d["n"], d["k"], ba, bb


def combos(shuffle_seed) -> list:
    """Every (config or None = planned, layout, dtype, out dtype), shuffled once: float16 and
    bfloat16 operands on every config, float32 ones (HIGHEST, f16x3: Case.call) on the configs
    with float32 kernels."""
    out = list(itertools.product([c.name for c in configs.CONFIGS16] + [None], LAYOUTS,
                                 (F16, BF16), (F16, BF16, F32)))
    out += itertools.product([c.name for c in configs.CONFIGS if c.f32] + [None], LAYOUTS,
                             (F32,), (F16, BF16, F32))
    random.Random(shuffle_seed).shuffle(out)
    return out


def draw_split(r: random.Random, config, m: int, n: int, ba: int, bb: int, mode: Mode):
    """A split_k for a case with a config override (30% of them), within the workspace size."""
    split = None
    if config is not None and r.random() < 0.3:
        split = r.choice([2, 3, 4, 5, 8, 16, configs.MAX_SPLIT_K])
        while split > 2 and split * max(ba, bb) * m * n > mode.out * 4:  # workspace size
            split //= 2
    return split


def generate(count: int, mode: Mode, seed: int = SEED) -> list[Case]:
    """Cases 0..count-1; config x layout x dtype x out dtype cycle through every combination
    (shuffled once per seed); shapes are drawn per case from (seed, index)."""
    combo = combos(seed)
    cases = []
    for i in range(count):
        r = random.Random(seed_of("fuzz-shape", seed, i))
        config, (ta, tb), dt, od = combo[i % len(combo)]
        m, n, k, ba, bb = _shape(r, mode)
        split = draw_split(r, config, m, n, ba, bb, mode)
        cases.append(Case(i, m, n, k, ba, bb, dt, od, ta, tb, config, split))
    return cases


def operands(case: Case):
    """Fresh standard-normal host operands: a, b in their stored layout, then c, bias and the
    scale operand (None where the case has none)."""
    rng = np.random.default_rng(case.seed)
    a = rng.standard_normal(case.a_shape, np.float32).astype(case.dtype)
    b = rng.standard_normal(case.b_shape, np.float32).astype(case.dtype)
    c = bias = scale = None
    if case.c_shape is not None:
        c = rng.standard_normal(case.c_shape, np.float32).astype(case.c_dtype)
    if case.bias_rows:
        bias = rng.standard_normal((case.bias_rows, case.n), np.float32).astype(case.bias_dtype)
    if case.traced:
        scale = np.array([case.alpha, case.beta], np.float32)
    return a, b, c, bias, scale


def compare_tol(out, ref, allow, out_dtype, k, frob_ref=None, frob_allow=None) -> str | None:
    """None if `out` matches the float64 reference `ref`; else what is wrong: a non-finite
    element, a Frobenius error above conftest.bound(out_dtype, k) * ||frob_ref|| (default:
    ref) + ||frob_allow||, or an element off by more than output rounding + `allow` (an
    absolute allowance broadcast to ref's shape). Overwrites ref."""
    out = np.asarray(out)
    diff = out.astype(np.float64)
    diff -= ref
    if not np.isfinite(diff).all():
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(diff))[0])
        return (f"{(~np.isfinite(diff)).sum()} non-finite elements (NaN: unwritten?), first at "
                f"{idx}: {out[idx]!r}")
    den = np.vdot(ref, ref) if frob_ref is None else np.vdot(frob_ref, frob_ref)
    num = math.sqrt(np.vdot(diff, diff))
    lim = bound(out_dtype, k) * math.sqrt(den)
    if frob_allow is not None:
        lim += math.sqrt(np.vdot(frob_allow, frob_allow))
    if not num <= lim:
        return (f"relative error {num / max(math.sqrt(den), 1e-300):.3g} > "
                f"{bound(out_dtype, k):.3g}")
    u = UNIT[np.dtype(out_dtype)]
    tol = np.abs(ref, out=ref)
    tol *= u
    tol += allow * (1 + u)
    tol += TINY[np.dtype(out_dtype)]
    bad = np.abs(diff, out=diff) > tol
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{bad.sum()} elements off (first at {idx}: {out[idx]!r}, off by {diff[idx]:.3g} "
                f"> tolerance {tol[idx]:.3g})")
    return None


def compare(out, ref, a_norms, b_norms, out_dtype, k) -> str | None:
    """compare_tol of a plain product: relative Frobenius error within bound(out_dtype, k),
    every element within output rounding + bound(float32, k) * |a_i| * |b_j| (float32
    accumulation; a_norms * b_norms broadcast to ref's shape). Overwrites ref."""
    return compare_tol(out, ref, a_norms * b_norms * bound(F32, k), out_dtype, k)


def check(case: Case, ops, outs) -> str | None:
    """None if `outs` ([d] or [d, pre]) are case's results for the host operands `ops`
    (operands(case)); else what is wrong."""
    outs = [np.asarray(o) for o in outs]
    if len(outs) != case.outputs or any(
            o.shape != case.out_shape or o.dtype != case.out_dtype for o in outs):
        return (f"results {[(o.shape, o.dtype.name) for o in outs]}, expected {case.outputs} x "
                f"{case.out_shape} {case.out_dtype}")
    a, b, c, bias, _ = ops
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    a64 = np.swapaxes(a64, 1, 2) if case.ta else a64  # logical (Ba, M, K)
    b64 = np.swapaxes(b64, 1, 2) if case.tb else b64  # logical (Bb, K, N)
    ab = np.matmul(a64, b64)
    acc = np.linalg.norm(a64, axis=2)[:, :, None] * np.linalg.norm(b64, axis=1)[:, None, :]
    acc *= bound(F32, case.k)
    if not case.epilogue:
        return compare_tol(outs[0], ab, acc, case.out_dtype, case.k)
    # pre = alpha * ab + beta * c + bias; evaluated in float32: a few units in the last place
    # of each term (and of the activation's value)
    pre = ab * case.alpha
    ev = np.abs(pre)
    acc *= abs(case.alpha)
    if c is not None:
        bc = c.astype(np.float64) * case.beta
        pre = pre + bc
        ev = ev + np.abs(bc)
    if bias is not None:
        pre = pre + bias.astype(np.float64)[:, None, :]
        ev = ev + np.abs(bias.astype(np.float64))[:, None, :]
    ev *= 4 * UNIT[F32]
    slope = 1.0 if case.activation in ("none", "relu") else ACT_LIPSCHITZ
    # bfloat16 results of gelu_tanh take tanh.approx.f32 (ffi/ptx/math.cuh; relative error
    # 2^-11 of tanh): 0.5 |pre| 2^-11 absolute in d, doubled
    approx = (np.abs(pre) * 2.0 ** -11 if case.activation == "gelu_tanh"
              and case.out_dtype == BF16 else 0.0)
    problems = []
    for name, out, ref, s, extra in (
            ("d", outs[0], act64(case.activation, pre), slope, approx),
            ("pre", outs[-1], pre, 1.0, 0.0))[:case.outputs]:
        # Frobenius error relative to the larger of the result and the product (an epilogue
        # that cancels or squashes the product keeps the product's absolute error)
        frob_ref = ref if np.vdot(ref, ref) >= s * s * np.vdot(ab, ab) * case.alpha ** 2 else (
            ab * (s * case.alpha))
        allow = (acc + ev) * s + extra
        p = compare_tol(out, np.array(ref), allow, case.out_dtype, case.k, frob_ref,
                        ev * s + extra)
        if p:
            problems.append(f"{name}: {p}")
    return "; ".join(problems) or None


# ---------------------------------------------------------------------------------------------
# Running groups of cases: one jit per group; on the GPU into donated NaN-filled buffers.

def _run_group(cases, host, poison: bool):
    """Outputs of a group of cases (one jitted call; per case a list) and their poisoned flags
    (per case: all of its outputs written in place)."""
    dev = [tuple(None if x is None else jax.device_put(x) for x in ops) for ops in host]
    fn = lambda ops: [o for c, xs in zip(cases, ops) for o in c.call(*xs)]  # noqa: E731
    if not poison:
        flat, flags = jax.jit(fn)(dev), [False] * sum(c.outputs for c in cases)
    else:
        poisons = [jax.device_put(np.full(c.out_shape, np.nan, c.out_dtype))
                   for c in cases for _ in range(c.outputs)]
        flat, flags = poisoned_call(fn, poisons, dev)
    outs, ok, i = [], [], 0
    for c in cases:
        outs.append(list(flat[i:i + c.outputs]))
        ok.append(all(flags[i:i + c.outputs]))
        i += c.outputs
    return outs, ok


def _groups(cases, max_cases=48, max_elems=2 ** 26):
    group, elems = [], 0
    for c in cases:
        if group and (len(group) == max_cases or elems + c.size() > max_elems):
            yield group
            group, elems = [], 0
        group.append(c)
        elems += c.size()
    if group:
        yield group


def _attempt(cases, host, poison):
    """[(output or error text, poisoned flag)] of a group; when the group fails as a whole,
    each case is run alone to attribute the error."""
    try:
        return list(zip(*_run_group(cases, host, poison)))
    except Exception:  # noqa: BLE001
        if len(cases) == 1:
            raise
    results = []
    for c, h in zip(cases, host):
        try:
            results += _attempt([c], [h], poison)
        except Exception as e:  # noqa: BLE001 (reported with the case)
            results.append((f"{type(e).__name__}: {str(e).splitlines()[0][:300]}", False))
    return results


def run_fuzz(cases, poison: bool):
    """Runs and checks every case (host work on a thread pool: numpy releases the GIL);
    returns (failures, number of outputs written into a poisoned buffer)."""
    failures, poisoned = [], 0

    def verdict(job):
        c, ops, (outs, _) = job
        return outs if isinstance(outs, str) else check(c, ops, outs)

    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        for group in _groups(cases):
            host = list(pool.map(operands, group))
            results = _attempt(group, host, poison)
            poisoned += sum(bool(f) for _, f in results)
            for c, problem in zip(group, pool.map(verdict, zip(group, host, results))):
                if problem:
                    failures.append(f"{c}: {problem}")
    return failures, poisoned


def _report(capsys, cases, failures, poisoned, t0, what="fuzz"):
    with capsys.disabled():
        print(f"\n{what}: {len(cases)} cases run, {len(failures)} failures "
              f"({poisoned} cases' outputs NaN-poisoned, {time.perf_counter() - t0:.0f} s, "
              f"TCGEMM_FUZZ_SEED={SEED})")
    assert not failures, f"{len(failures)} of {len(cases)} {what} cases failed:\n" + "\n".join(
        failures[:100])


def _select(cases):
    return [c for c in cases if c.index in ONLY] if ONLY else cases


def _run_gpu(capsys, cases, what):
    t0 = time.perf_counter()
    failures, poisoned = run_fuzz(cases, poison=True)
    if poisoned < len(cases):
        warnings.warn(f"only {poisoned} of {len(cases)} {what} cases were written into "
                      "NaN-poisoned buffers; unwritten elements in the others are caught only "
                      "by the comparison with the reference")
    _report(capsys, cases, failures, poisoned, t0, what)


def _run_cpu(capsys, cases, what):
    t0 = time.perf_counter()
    with jax.default_device(jax.devices("cpu")[0]):
        failures, poisoned = run_fuzz(cases, poison=False)
    _report(capsys, cases, failures, poisoned, t0, what)


@pytest.mark.gpu
def test_fuzz_gpu(capsys):
    cases = _select(generate(int(os.environ.get("TCGEMM_FUZZ_CASES", "2000")), GPU_MODE))
    _run_gpu(capsys, cases, "fuzz")


def test_fuzz_cpu(capsys):
    cases = _select(generate(int(os.environ.get("TCGEMM_FUZZ_CPU_CASES", "50")), CPU_MODE))
    _run_cpu(capsys, cases, "fuzz")


needs_table = pytest.mark.skipif(not configs.CONFIGS, reason="the config table comes from the "
                                 "CUDA extension (jax_tcgemm._tcgemm), which is not built here")


@needs_table
def test_generator_covers_the_space():
    """The 2000-case GPU run hits every config x layout x dtype x out dtype (float32 operands:
    the configs with TF32 kernels), both loader paths,
    shared operands, tile-edge and big sizes, and stays within its caps."""
    cases = generate(2000, GPU_MODE)
    assert {(c.config, c.ta, c.tb, c.dtype, c.out_dtype) for c in cases} == set(
        itertools.product([c.name for c in configs.CONFIGS16] + [None], (False, True),
                          (False, True), (F16, BF16), (F16, BF16, F32))) | set(
        itertools.product([c.name for c in configs.CONFIGS if c.f32] + [None], (False, True),
                          (False, True), (F32,), (F16, BF16, F32)))
    for c in cases:
        assert 1 <= min(c.m, c.n, c.k) and max(c.m, c.n, c.k) <= GPU_MODE.big, c
        assert c.batch * c.m * c.n * c.k <= GPU_MODE.work and c.batch * c.m * c.n <= GPU_MODE.out
        assert sorted((c.m, c.n, c.k))[0] <= GPU_MODE.small, c  # never all three big
        assert not c.epilogue
    aligned = [c for c in cases if c.m % 8 == 0 and c.n % 8 == 0 and c.k % 8 == 0]
    assert 0.2 < len(aligned) / len(cases) < 0.8
    assert any(c.ba == 1 < c.bb for c in cases) and any(c.bb == 1 < c.ba for c in cases)
    assert any(c.batch > 65535 for c in cases)
    assert max(max(c.m, c.n, c.k) for c in cases) > 4000
    edges = {v for c in configs.CONFIGS for t in (c.bm, c.bn, c.bk) for v in (t - 1, t + 1)}
    assert edges <= {d for c in cases for d in (c.m, c.n, c.k)}
    assert any(c.split_k for c in cases)
    assert [str(c) for c in generate(50, GPU_MODE)] == [str(c) for c in cases[:50]]  # reproducible


def test_check_catches_defects():
    """`check` passes the exact product and flags an unwritten (NaN) element, one element that
    misses one K term, and two swapped rows, for float32 and float16 outputs."""
    c = Case(0, 70, 50, 300, 1, 1, F16, F32, False, True, None, None)
    ops = operands(c)
    a, b = ops[:2]
    a64, b64 = a.astype(np.float64)[0], np.swapaxes(b.astype(np.float64), 1, 2)[0]
    exact = (a64 @ b64)[None]
    big = int(np.argmax(np.abs(a64[3] * b64[:, 4])))  # the largest term of element (3, 4)

    def nan(x):
        x[0, 69, 49] = np.nan

    def missing_term(x):
        x[0, 3, 4] -= a64[3, big] * b64[big, 4]

    def swapped_rows(x):
        x[0, [5, 6]] = x[0, [6, 5]]

    for od in (F32, F16):
        case = dataclasses.replace(c, out_dtype=od)
        assert check(case, ops, [exact.astype(od)]) is None
        for defect in (nan, missing_term, swapped_rows):
            bad = exact.copy()
            defect(bad)
            assert check(case, ops, [bad.astype(od)]), f"{defect.__name__} not caught ({od})"
