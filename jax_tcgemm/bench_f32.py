"""The `f32` benchmark suite: float32 products through tg.matmul / tg.dot_general against the
same call of jnp / lax at the same precision, in one run and one harness (issue 25):

    python -m jax_tcgemm.bench --suite f32 [--json PATH] [--reps 9] [--cases GLOB]

Two sides per row, timed interleaved (timing.time_fns) after warm-up, each one jit of R
independent products over R distinct a (shared b, every product's operands through their own
optimization_barrier: timing.harness). TFLOP/s count 2 M N K per product whatever the
algorithm's passes.
- f32_default_*: precision None (one TF32 pass on both sides: XLA's GPU default; ours is
  XLA's too, problem.F32_ON_KERNELS), and f32_tf32_forced_8192_nt: one TF32 pass on our
  kernel (config forced: tcgemm(config=configs.plan_f32(...))) against XLA's;
- f32_highest_*: precision HIGHEST (ours f16x3; jnp: XLA's float32 product on the CUDA cores);
- f32_tf32x3_* / f32_bf16x3_*: the lax.DotAlgorithmPreset on both sides.
b is (K, N) as jnp.dot takes it ("NN"), or (N, K) ("NT": the K-major layout the TF32 tensor
cores read, no copy on either side).
rel_err: each side's max-norm error against float64 of the float32 operands on the first and
last 256 rows, relative to the reference's max; err_ok bounds ours by the row's bound
(HIGHEST and 3xTF32: 2e-6 as issue 25 asks of HIGHEST, or jnp's own error if larger; one TF32
pass: 2e-3, the TF32 kernels read float32 operands truncated to TF32 (2^-10 relative at
most), where XLA's rounds them first; BF16 passes: twice jnp's). Rows go to
benchmarks/results/<gpu>-f32.json by default.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import bench_suites, timing

# name, M, N, K, precision (a lax precision name or a DotAlgorithmPreset name), layout of b
ROWS = (
    ("f32_default_8192", 8192, 8192, 8192, "default", "NN"),
    ("f32_default_8192_nt", 8192, 8192, 8192, "default", "NT"),
    ("f32_tf32_forced_8192_nt", 8192, 8192, 8192, "TF32_TF32_F32", "NT"),
    ("f32_highest_8192", 8192, 8192, 8192, "highest", "NN"),
    ("f32_highest_4096", 4096, 4096, 4096, "highest", "NN"),
    ("f32_highest_llm", 4096, 11008, 4096, "highest", "NN"),
    ("f32_tf32x3_8192", 8192, 8192, 8192, "TF32_TF32_F32_X3", "NN"),
    ("f32_bf16x3_8192", 8192, 8192, 8192, "BF16_BF16_F32_X3", "NN"),
)
ERR_ROWS = 256
ACCURATE = ("highest", "TF32_TF32_F32_X3")  # float32-accuracy rows: bound 2e-6
ONE_TF32_PASS = ("default", "high", "TF32_TF32_F32")


@dataclasses.dataclass(frozen=True)
class F32Case:
    name: str
    m: int
    n: int
    k: int
    precision: str
    layout: str = "NN"
    suite: str = "f32"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def nbytes(self) -> tuple[int, int]:
        """(per product: a and the output, shared: b) in bytes."""
        return 4 * (self.m * self.k + self.m * self.n), 4 * self.n * self.k

    def lax_precision(self):
        from jax import lax
        try:
            return lax.DotAlgorithmPreset[self.precision]
        except KeyError:
            return None if self.precision == "default" else self.precision


def cases() -> list[F32Case]:
    return [F32Case(*r) for r in ROWS]


def operands(case: F32Case, r: int):
    """R distinct a (M, K) and the shared b ((N, K) for NT, else (K, N)): N(0, 1) float32."""
    import jax
    import jax.numpy as jnp
    keys = jax.random.split(jax.random.key(1), r + 1)
    bshape = (case.n, case.k) if case.layout == "NT" else (case.k, case.n)
    a = tuple(jax.random.normal(keys[i], (case.m, case.k), jnp.float32) for i in range(r))
    return a, (jax.random.normal(keys[r], bshape, jnp.float32),)


def ops(case: F32Case) -> dict:
    """{side: op(a, b)}: the same lax.dot_general call, ours through tg.dot_general."""
    from jax import lax
    import jax_tcgemm as tg
    dn = (((1,), (1 if case.layout == "NT" else 0,)), ((), ()))
    prec = case.lax_precision()
    if "forced" in case.name:  # our TF32 kernel, K-major operands as they are
        from jax_tcgemm import configs
        from jax_tcgemm.primitive import tcgemm
        config, split = configs.plan_f32(case.m, case.n, case.k)

        def ours(a, b):
            return tcgemm(a[None], b[None], transpose_b=True, config=config, split_k=split,
                          precision=prec)[0]
    else:
        def ours(a, b):
            return tg.dot_general(a, b, dn, precision=prec)
    return {"tcgemm": ours, "jnp": lambda a, b: lax.dot_general(a, b, dn, precision=prec)}


def algorithm_of(case: F32Case) -> str:
    """The algorithm (problem.f32_algorithm) and the row its product runs on."""
    try:
        from jax_tcgemm import configs, f32, problem
        algo = problem.f32_algorithm(problem.canonical_precision(case.lax_precision()))
        if algo is None or (algo not in problem.F32_ON_KERNELS and "forced" not in case.name):
            return f"{algo or 'lax'} (XLA)"
        k = f32.concat_k(case.k, algo)
        if algo.startswith("bf16"):
            plan = configs.plan_for_device(case.m, case.n, k, layout="NT")  # K-major parts
        else:
            plan = configs.plan_f32(case.m, case.n, k)
        return f"{algo} on {plan[0]} split {plan[1]}" if plan else f"{algo} (lax)"
    except Exception:  # noqa: BLE001
        return "n/a"


def bound(case: F32Case, jnp_err: float) -> float:
    if case.precision in ACCURATE:
        return max(2e-6, jnp_err)
    return max(2e-3, 2 * jnp_err) if case.precision in ONE_TF32_PASS else 2 * jnp_err


def run_case(case: F32Case, reps: int = 9, mem_limit: int | None = None,
             barrier: bool = True) -> dict:
    row = {"suite": case.suite, "name": case.name, "m": case.m, "n": case.n, "k": case.k,
           "batch": 1, "dtype": "float32", "out_dtype": "float32", "layout": case.layout,
           "precision": case.precision, "config": algorithm_of(case)}
    r, a, sh, fns, firsts, rows = bench_suites.first_two_sides(
        case, ops(case), operands, mem_limit, barrier, ERR_ROWS)
    a0, b = np.asarray(a[0], np.float64)[rows], np.asarray(sh[0], np.float64)
    want = a0 @ (b.T if case.layout == "NT" else b)
    scale = max(float(np.abs(want).max()), 1e-300)
    errs = {side: float(np.abs(out[rows].astype(np.float64) - want).max() / scale)
            for side, out in firsts.items()}
    del firsts
    row.update(bench_suites.time_two_sides(fns, (a, *sh), reps, r, case.flops, errs,
                                    bound(case, errs["jnp"])))
    return row


def format_row(row: dict) -> str:
    return bench_suites.two_sided_row(row, 22, row.get("config", ""))


HEADER = bench_suites.two_sided_header(22, "TFLOP/s")


def run(args, argv=None) -> int:
    """`bench --suite f32` with bench's parsed arguments (reps, json, cases, force,
    no_barrier)."""
    harness = ("per side one jit of R independent products (R distinct a, shared b"
               f"{'' if args.no_barrier else ', optimization_barrier per product'}), sides "
               "tcgemm (tg.dot_general) and jnp (lax.dot_general, same precision); "
               + timing.method(args.reps))
    return bench_suites.run_two_sided(args, argv, cases(), "f32", harness, HEADER, run_case, format_row)
