"""The `ragged` benchmark suite: tg.ragged_dot against lax.ragged_dot and against the dense
batched product of equal FLOPs, bfloat16, in one run and one harness:

    python -m jax_tcgemm.bench --suite ragged [--json PATH] [--reps 9] [--cases GLOB]
    python -m jax_tcgemm.bench_ragged ...                    (the same)

Three sides per row, timed interleaved (timing.time_fns) after warm-up, each one jit of R
independent products over R distinct lhs (shared weights and group sizes, every product's
operands through their own optimization_barrier: timing.harness): `tcgemm` (tg.ragged_dot;
ragged_gemm with the fused silu in the MLP row), `jnp` (lax.ragged_dot, the stock way) and
`dense` (jnp.matmul of (G, M/G, K) x (G, K, N): the FLOPs of equal groups, what a grouped GEMM
can hope for). Where lax fails (e.g. out of memory at 64 groups) the row records its error
(`jnp_error`) and the other sides are still timed. rel_err: ours against a float32 reference
on the first and last rows of every group (the MLP row: every output and gradient against the
dense MLP in float32); err_ok bounds it by bf16's 5e-3 (MLP: 1e-2), or twice lax's / dense's
own error where larger. Rows go to benchmarks/results/<gpu>-ragged.json by default (not the
GEMM record, which a ragged-only run would overwrite).
"""
from __future__ import annotations

import dataclasses
import gc
import math
import sys

import numpy as np

from . import bench, bench_suites, timing

# name, G, M, K, N, sizes ("equal" or "zipf": Zipf-like with one empty group), op ("dot" or
# "fwd_bwd": value_and_grad of silu(x @ W1[g]) @ W2[g] wrt x, W1, W2)
ROWS = (
    ("ragged_g8", 8, 8192, 4096, 14336, "equal", "dot"),
    ("ragged_g64", 64, 16384, 2048, 1408, "equal", "dot"),
    ("ragged_g8_small", 8, 512, 4096, 14336, "equal", "dot"),
    ("ragged_skewed", 8, 8192, 4096, 14336, "zipf", "dot"),
    ("ragged_fwd_bwd", 8, 8192, 4096, 14336, "equal", "fwd_bwd"),
)
ERR_ROWS = 32  # rows checked at each end of every group
SIDES = ("tcgemm", "jnp", "dense")


@dataclasses.dataclass(frozen=True)
class RaggedCase:
    name: str
    groups: int
    m: int
    k: int
    n: int
    sizes: str = "equal"
    op: str = "dot"
    dtype: str = "bfloat16"
    suite: str = "ragged"

    @property
    def flops(self) -> int:  # fwd_bwd: two forward products, four backward ones
        return 2 * self.m * self.k * self.n * (6 if self.op == "fwd_bwd" else 1)

    def group_sizes(self) -> np.ndarray:
        """int32 (G,): M/G each, or Zipf-like (1/r^1.2) with the middle group empty; sum M."""
        g, m = self.groups, self.m
        if self.sizes == "equal":
            return np.full(g, m // g, np.int32)
        w = 1.0 / np.arange(1, g) ** 1.2
        s = np.floor(m * w / w.sum()).astype(np.int32)
        s[0] += m - s.sum()
        return np.insert(s, g // 2, 0).astype(np.int32)

    def nbytes(self) -> tuple[int, int]:
        """(per product: x and the outputs, shared: the weights) in bytes."""
        x, w, out = self.m * self.k * 2, self.groups * self.k * self.n * 2, self.m * self.n * 2
        if self.op == "fwd_bwd":  # W2, h and pre (f32 under grad), dh, dx, dW1, dW2
            return 2 * x + 4 * out + 4 * out + 2 * w, 2 * w
        return x + out, w


def cases(shapes=()) -> list[RaggedCase]:
    """The suite's rows, or custom ones ('MxNxK': 8 equal groups) from --shape."""
    if shapes:
        out = []
        for spec in shapes:
            d = [int(x) for x in spec.lower().split("x")]
            if len(d) != 3 or min(d) < 1 or d[0] % 8:
                raise ValueError(f"--shape {spec!r}: the ragged suite takes MxNxK, M a multiple "
                                 "of 8 (8 equal groups)")
            out.append(RaggedCase(f"ragged_custom_{spec}", 8, d[0], d[2], d[1]))
        return out
    return [RaggedCase(name, g, m, k, n, sizes, op) for name, g, m, k, n, sizes, op in ROWS]


# ---------------------------------------------------------------------------------------------
# What each side computes.

def ops(case: RaggedCase) -> dict:
    """{side: op(x, *shared)}: shared is (w, sizes) or, for fwd_bwd, (w1, w2, sizes)."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    import jax_tcgemm as tg

    g = case.groups

    def dense(x, w, _):  # (G, M/G, K) x (G, K, N): equal groups, as one batched product
        return jnp.matmul(x.reshape(g, -1, x.shape[-1]), w).reshape(x.shape[0], -1)
    if case.op == "dot":
        return {"tcgemm": tg.ragged_dot, "jnp": lax.ragged_dot, "dense": dense}

    def mlp(first, second):
        def loss(x, w1, w2, gs):
            return jnp.sum(second(first(x, w1, gs), w2, gs), dtype=jnp.float32)
        return jax.value_and_grad(loss, argnums=(0, 1, 2))
    silu = jax.nn.silu
    return {"tcgemm": mlp(lambda x, w, gs: tg.ragged_gemm(x, w, gs, activation="silu"),
                          tg.ragged_dot),
            "jnp": mlp(lambda x, w, gs: silu(lax.ragged_dot(x, w, gs)), lax.ragged_dot),
            "dense": mlp(lambda x, w, gs: silu(dense(x, w, gs)), dense)}


def operands(case: RaggedCase, r: int):
    """R distinct x (M, K) and the shared weights (N(0, 1/K) or 1/N) and sizes, on device."""
    import jax
    import jax.numpy as jnp
    keys = jax.random.split(jax.random.key(0), r + 2)
    x = tuple(timing.random_array(keys[i], (case.m, case.k), case.dtype) for i in range(r))
    w = timing.random_array(keys[r], (case.groups, case.k, case.n), case.dtype,
                            1.0 / math.sqrt(case.k))
    gs = jnp.asarray(case.group_sizes())
    if case.op == "dot":
        return x, (w, gs)
    w2 = timing.random_array(keys[r + 1], (case.groups, case.n, case.k), case.dtype,
                             1.0 / math.sqrt(case.n))
    return x, (w, w2, gs)


def _dot_errors(case, outs, x, w, gs) -> dict:
    """rel_err of each side's output against float32 on the first and last ERR_ROWS rows of
    every group (all groups: a wrong group, or its start, shows)."""
    import jax.numpy as jnp
    ends = np.cumsum(gs)
    pieces = [(g, np.unique(np.r_[s:min(s + ERR_ROWS, e), max(s, e - ERR_ROWS):e]))
              for g, (s, e) in enumerate(zip(np.r_[0, ends[:-1]], ends)) if e > s]
    rows = np.concatenate([r for _, r in pieces])
    ref = jnp.concatenate([jnp.matmul(x[r].astype(jnp.float32), w[g].astype(jnp.float32),
                                      precision="highest") for g, r in pieces])
    return {side: timing.rel_fro(out[rows], ref) for side, out in outs.items()}


def _mlp_errors(case, outs, x, shared) -> dict:
    """max over the value and the three gradients of each side's rel_err against the dense MLP
    in float32 (equal groups: the same math)."""
    import jax
    import jax.numpy as jnp
    with jax.default_matmul_precision("highest"):  # (not TF32)
        f32 = jax.jit(ops(case)["dense"])(*(v.astype(jnp.float32) for v in (x, *shared[:2])),
                                          shared[2])
    ref = jax.tree.leaves(f32)
    return {side: max(timing.rel_fro(a, b) for a, b in zip(jax.tree.leaves(out), ref))
            for side, out in outs.items()}


def config_of(case: RaggedCase) -> str:
    """The forward product's config (configs.plan_ragged), 'lax' where no grouped kernel runs
    (configs.ragged_kind: a GPU below sm_80, or none), 'n/a' where the planner is unavailable."""
    try:
        import jax.numpy as jnp
        from jax_tcgemm import configs
        return configs.plan_ragged(case.m, case.n, case.k, case.groups, jnp.dtype(case.dtype),
                                   0, False) or "lax"
    except Exception:  # noqa: BLE001 (not built: the row still runs)
        return "n/a"


def _short(e: Exception) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"


def run_case(case: RaggedCase, reps: int = 9, mem_limit: int | None = None,
             barrier: bool = True) -> dict:
    """Times the three sides of `case` (lax's failure recorded in the row); the JSON row."""
    gs = case.group_sizes()
    row = {"suite": case.suite, "name": case.name, "m": case.m, "n": case.n, "k": case.k,
           "batch": 1, "groups": case.groups, "dtype": case.dtype, "layout": "NN",
           "op": case.op, "config": config_of(case),
           "group_sizes": (gs.tolist() if case.groups <= 16 else
                           {"min": int(gs.min()), "max": int(gs.max()),
                            "empty": int((gs == 0).sum())})}
    per, shared_bytes = case.nbytes()
    if mem_limit and per + shared_bytes > bench.MEM_FRAC_SKIP * mem_limit:
        row["error"] = f"skipped: working set {(per + shared_bytes) / 2**30:.1f} GiB"
        return row
    r = timing.choose_reps(case.flops, per, shared_bytes, mem_limit)
    x, shared = operands(case, r)
    fns, firsts = {}, {}
    for side, op in ops(case).items():  # compile and run once; a failing side is recorded
        try:
            fns[side] = timing.harness(op, barrier)
            firsts[side] = fns[side](x, *shared)[0]
        except Exception as e:  # noqa: BLE001 (e.g. RESOURCE_EXHAUSTED)
            fns.pop(side, None)
            row[f"{side}_error"] = _short(e)
            gc.collect()
    if "tcgemm" not in fns:
        row["error"] = row.pop("tcgemm_error")
        return row
    if case.op == "dot":  # (the dense side multiplies other rows for unequal groups)
        firsts.pop("dense", None)
        errs = _dot_errors(case, firsts, x[0], shared[0], gs)
    else:
        errs = _mlp_errors(case, firsts, x[0], shared)
    del firsts
    med, extra = timing.time_sides(fns, (x, *shared), reps)
    tf = {side: r * case.flops / med[side] / 1e12 for side in med}
    sig = bench._sig
    tol = max([1e-2 if case.op == "fwd_bwd" else bench.ERR_TOL[case.dtype]]
              + [2 * e for side, e in errs.items() if side != "tcgemm" and math.isfinite(e)])
    row.update(r=r, reps=reps, tcgemm_tflops=sig(tf["tcgemm"], 4),
               jnp_tflops=sig(tf["jnp"], 4) if "jnp" in tf else None,
               dense_tflops=sig(tf["dense"], 4) if "dense" in tf else None,
               ratio=round(tf["tcgemm"] / tf["jnp"], 4) if "jnp" in tf else None,
               vs_dense=round(tf["tcgemm"] / tf["dense"], 4) if "dense" in tf else None,
               rel_err=sig(errs["tcgemm"]), jnp_rel_err=sig(errs["jnp"]) if "jnp" in errs
               else None, err_ok=bool(errs["tcgemm"] <= tol),
               **{f"{side}_ms": sig(med[side] * 1e3, 4) for side in med},
               **extra)
    return row


def format_row(row: dict) -> str:
    head = f"{row['name']:<18} {row['groups']:>3} {row['m']:>6} {row['k']:>6} {row['n']:>6} "
    if "error" in row:
        return head + ("SKIP " if row["error"].startswith("skipped") else "ERROR ") + row["error"]
    num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    return head + (f"{row['tcgemm_tflops']:>8.1f} {num(row['jnp_tflops'], '>8.1f')} "
                   f"{num(row['dense_tflops'], '>8.1f')} {num(row['ratio'], '>6.2f')} "
                   f"{num(row['vs_dense'], '>6.3f')} {num(row['rel_err'], '>9.2e')}"
                   f"{' ' if row['err_ok'] else '!'} cfg {row['config']}"
                   + (f"  [lax: {row['jnp_error'][:120]}]" if "jnp_error" in row else ""))


HEADER = (f"{'name':<18} {'G':>3} {'M':>6} {'K':>6} {'N':>6} {'tcgemm':>8} {'lax':>8} "
          f"{'dense':>8} {'x lax':>6} {'/dense':>6} {'rel_err':>9}  (TFLOP/s)")


def run(args, argv=None) -> int:
    """`bench --suite ragged` with bench's parsed arguments (reps, json, cases, shape, force,
    no_barrier, autotune; dtype: the rows are bfloat16)."""
    import jax
    backend = jax.default_backend()
    if backend != "gpu" and not args.force:
        print(f"No GPU found (JAX backend is {backend!r}): no ragged benchmark is run.")
        return 0
    try:
        cs = cases(args.shape)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cs = bench_suites.filter_cases(cs, args.cases)
    if not cs:
        print("error: no case matches --cases", file=sys.stderr)
        return 2
    harness = ("per side one jit of R independent products (R distinct lhs, shared weights "
               "and group sizes"
               f"{'' if args.no_barrier else ', optimization_barrier per product'}), sides "
               "tcgemm (tg.ragged_dot / ragged_gemm), jnp (lax.ragged_dot) and dense (batched "
               "(G, M/G, K) x (G, K, N), equal FLOPs); " + timing.method(args.reps))

    def summary(rows):
        ratio, dense = (bench.geomean([r.get(f) for r in rows]) for f in ("ratio", "vs_dense"))
        return f"geomean tcgemm / lax.ragged_dot {ratio:.3f}, tcgemm / dense {dense:.3f}"
    return bench_suites.run_suite(args, argv, cs, "-ragged", harness, HEADER,
                           lambda c, mem: run_case(c, args.reps, mem, not args.no_barrier),
                           format_row, summary)


def main(argv=None) -> int:
    return bench.main(["--suite", "ragged"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
