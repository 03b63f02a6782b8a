"""tcgemm vs jnp.dot, same run, same harness: ``python -m jax_tcgemm.bench``.

Per case and side: one jitted call of R independent products (R distinct A, shared B, ~4 TFLOP
per call, 1 <= R <= 64), 2 warm-up calls, then --reps timed calls, the sides interleaved; median.
rel_err against a float32 'highest' reference of the first product, and tcgemm vs jnp.dot over
the whole of it. benchmarks/NOTES.md has the method. jax_tcgemm is imported lazily, so the pure helpers import without the package.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import functools
import gc
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

TARGET_FLOP = 4e12        # work per timed call
MAX_R = 64                # products per call
MEM_FRAC_R = 0.25         # R copies of A and C (plus B) must fit in this share of device memory
MEM_FRAC_SKIP = 0.40      # a single product's A+B+C above this share: the row is skipped
ERR_ROWS = 1024           # rel_err on the first and last ERR_ROWS/2 rows of the first product
ERR_TOL = {"float16": 1e-3, "bfloat16": 5e-3, "float32": 2e-3}  # or 2x jnp.dot's, if larger
SUITES = ("square", "llm", "odd", "batched", "f32")
DTYPE_CHOICES = {"float16": ("float16",), "bfloat16": ("bfloat16",), "both": ("float16", "bfloat16")}
LLM_M = (16, 128, 4096, 8192)
LLM_NK = {  # y = x @ W, x (M, K), W (K, N): Llama-2 projections
    "l7b_gateup": (11008, 4096), "l7b_down": (4096, 11008),
    "l70b_gateup": (28672, 8192), "l70b_down": (8192, 28672), "l7b_qkvo": (4096, 4096)}
SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


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

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def nbytes(self) -> tuple[int, int, int]:
        """Bytes of one product's A, B and C (output dtype = input dtype)."""
        isz = {"float16": 2, "bfloat16": 2, "float32": 4}[self.dtype]
        b = self.batch
        return b * self.m * self.k * isz, b * self.k * self.n * isz, b * self.m * self.n * isz


def _shapes(suite: str):
    """(name, m, n, k, batch, vmap) of DESIGN §8's suites."""
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
    """The cases of `suite` ('all' = every suite) for each dtype; the f32 suite is float32 only."""
    out = []
    for s in (SUITES if suite == "all" else (suite,)):
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


def choose_reps(flops: int, per_product_bytes: int = 0, shared_bytes: int = 0,
                mem_limit: int | None = None) -> int:
    """R: products per timed call. R*flops ~ TARGET_FLOP, 1 <= R <= MAX_R, and R*per_product
    + shared within MEM_FRAC_R of mem_limit (when known)."""
    r = min(MAX_R, max(1, round(TARGET_FLOP / flops)))
    if mem_limit and per_product_bytes:
        fit = int((MEM_FRAC_R * mem_limit - shared_bytes) // per_product_bytes)
        r = max(1, min(r, fit))
    return r


def slug(device_kind: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-") or "unknown"


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def time_fns(fns: dict, args, reps: int, warmup: int = 2) -> dict:
    """Seconds per call of each fn in `fns`, the sides interleaved rep by rep."""
    import jax
    for _ in range(warmup):
        for f in fns.values():
            jax.block_until_ready(f(*args))
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[name].append(time.perf_counter() - t0)
    return times


def time_fn(fn, args, reps: int, warmup: int = 2) -> float:
    """Median seconds of `reps` calls fn(*args) after `warmup` calls."""
    return statistics.median(time_fns({"f": fn}, args, reps, warmup)["f"])


def config_id(case: Case) -> str:
    """The config tcgemm runs `case` with (autotune.plan: the cost model's choice, or the
    tuned one), with ' split_k=S' when K is split; 'n/a' where unavailable."""
    try:
        import jax.numpy as jnp
        from jax_tcgemm import autotune
        name, split = autotune.plan(case.m, case.n, case.k, case.batch, jnp.dtype(case.dtype),
                                    case.layout)
        return name + (f" split_k={split}" if split > 1 else "")
    except Exception:
        return "n/a"


@functools.cache
def _rand_fn():
    import jax
    import jax.numpy as jnp

    def rand(key, shape, dtype, scale):
        return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)
    return jax.jit(rand, static_argnums=(1, 2, 3))


def harness_operands(r: int, a_shape, b_shape, dtype, k: int, seed: int = 0):
    """The harness's inputs: R distinct A matrices of a_shape ~ N(0, 1) and one shared B of
    b_shape ~ N(0, 1)/sqrt(K), in `dtype`, from jax.random key `seed`."""
    import jax
    keys = jax.random.split(jax.random.key(seed), r + 1)
    rand = _rand_fn()
    a_list = tuple(rand(keys[i], tuple(a_shape), dtype, 1.0) for i in range(r))
    return a_list, rand(keys[r], tuple(b_shape), dtype, 1.0 / math.sqrt(max(k, 1)))


def _harness(op, barrier: bool):
    """jit(f(a_list, b) -> tuple(op(a, b) for a in a_list)). With `barrier`, each product's
    operands pass through their own optimization_barrier, so XLA cannot merge the R dots
    (DotMerger) or otherwise share work between them; the barrier moves no data."""
    import jax

    def f(a_list, b):
        outs = []
        for a in a_list:
            if barrier:
                a, bb = jax.lax.optimization_barrier((a, b))
            else:
                bb = b
            outs.append(op(a, bb))
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


def _rel_err(out, a, b) -> float:
    """rel_err of out = a @ b against float32 'highest', on the first and last ERR_ROWS/2 rows
    (edge tiles included) of every batch element, all columns."""
    import jax.numpy as jnp
    import numpy as np
    m, h = a.shape[-2], ERR_ROWS // 2
    rows = np.unique(np.r_[0:min(h, m), max(0, m - h):m])
    ref = jnp.matmul(a[..., rows, :].astype(jnp.float32), b.astype(jnp.float32), precision="highest")
    return float(_rel_fro()(out[..., rows, :], ref))


def _sig(x, n=3):
    """x to n significant digits; NaN/inf -> None (JSON has no NaN)."""
    return float(f"{x:.{n}g}") if math.isfinite(x) else None


def _row_base(case: Case) -> dict:
    return {"suite": case.suite, "name": case.name, "m": case.m, "n": case.n, "k": case.k,
            "batch": case.batch, "dtype": case.dtype, "layout": case.layout, "config": config_id(case)}


def run_case(case: Case, reps: int = 9, mem_limit: int | None = None, barrier: bool = True) -> dict:
    """Time tcgemm and jnp.dot on `case`; the row for the table and the JSON record."""
    import jax
    import jax.numpy as jnp
    import jax_tcgemm as tg

    row = _row_base(case)
    a_bytes, b_bytes, c_bytes = case.nbytes()
    if mem_limit and a_bytes + b_bytes + c_bytes > MEM_FRAC_SKIP * mem_limit:
        row["error"] = (f"skipped: working set {(a_bytes + b_bytes + c_bytes) / 2**30:.1f} GiB > "
                        f"{MEM_FRAC_SKIP:.0%} of device memory ({mem_limit / 2**30:.1f} GiB)")
        return row
    r = choose_reps(case.flops, a_bytes + c_bytes, b_bytes, mem_limit)
    lead = (case.batch,) if case.vmap else ()
    a_list, b = harness_operands(r, lead + (case.m, case.k), lead + (case.k, case.n),
                                 jnp.dtype(case.dtype), case.k)
    op_tg = jax.vmap(tg.matmul) if case.vmap else tg.matmul
    op_jnp = jax.vmap(jnp.matmul) if case.vmap else jnp.dot
    row["tg_path"] = "tcgemm" if "tcgemm" in str(jax.make_jaxpr(op_tg)(a_list[0], b)) else "fallback"
    fns = {"tcgemm": _harness(op_tg, barrier), "jnp": _harness(op_jnp, barrier)}
    first = {side: f(a_list, b)[0] for side, f in fns.items()}  # compile; keep product 0 only
    errs = {side: _rel_err(out, a_list[0], b) for side, out in first.items()}
    vs_jnp = float(_rel_fro()(first["tcgemm"], first["jnp"]))  # whole product: every tile written
    del first
    times = time_fns(fns, (a_list, b), reps)
    med = {side: statistics.median(t) for side, t in times.items()}
    tf = {side: r * case.flops / med[side] / 1e12 for side in med}
    tol = max(ERR_TOL[case.dtype], 2 * errs["jnp"]) if math.isfinite(errs["jnp"]) else ERR_TOL[case.dtype]
    row.update(r=r, reps=reps, tcgemm_tflops=_sig(tf["tcgemm"], 4), jnp_tflops=_sig(tf["jnp"], 4),
               ratio=round(tf["tcgemm"] / tf["jnp"], 4), rel_err=_sig(errs["tcgemm"]),
               jnp_rel_err=_sig(errs["jnp"]), vs_jnp=_sig(vs_jnp),
               err_ok=bool(errs["tcgemm"] <= tol and vs_jnp <= 2 * tol),
               tcgemm_ms=_sig(med["tcgemm"] * 1e3, 4), jnp_ms=_sig(med["jnp"] * 1e3, 4))
    return row


def _safe_run(case: Case, reps: int, mem_limit, barrier: bool) -> dict:
    try:
        return run_case(case, reps, mem_limit, barrier)
    except Exception as e:  # e.g. out of memory: record it and go on
        return {**_row_base(case), "error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
    finally:
        gc.collect()


HEADER = (f"{'name':<26} {'M':>6} {'N':>6} {'K':>6} {'batch':>5} {'dtype':<5} "
          f"{'tcgemm':>8} {'jnp.dot':>8} {'ratio':>6} {'rel_err':>9} {'jnp_err':>9}  config")


def format_row(row: dict) -> str:
    head = (f"{row['name']:<26} {row['m']:>6} {row['n']:>6} {row['k']:>6} {row['batch']:>5} "
            f"{SHORT.get(row['dtype'], row['dtype']):<5} ")
    if "error" in row:
        return head + ("SKIP " if row["error"].startswith("skipped") else "ERROR ") + row["error"]
    e = [("nan" if row[f] is None else f"{row[f]:.2e}") for f in ("rel_err", "jnp_rel_err")]
    return head + (f"{row['tcgemm_tflops']:>8.1f} {row['jnp_tflops']:>8.1f} {row['ratio']:>6.3f} "
                   f"{e[0]:>9}{' ' if row['err_ok'] else '!'}{e[1]:>9}  {row['config']}")


def git_info() -> tuple[str, bool | None]:
    """(commit, dirty) from git in the package's directory or the cwd; else the
    JAX_TCGEMM_COMMIT environment variable (the device copy of the tree has no .git), None."""
    for d in (os.path.dirname(os.path.abspath(__file__)), os.getcwd()):
        try:
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=d, capture_output=True,
                                  text=True, timeout=10)
            if head.returncode != 0:
                continue
            st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/",
                                 ":(top,exclude)benchmarks/results"], cwd=d, capture_output=True,
                                text=True, timeout=10)
            return head.stdout.strip(), bool(st.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            continue
    return os.environ.get("JAX_TCGEMM_COMMIT", "unknown"), None


def write_json(path: str, rows: list, meta: dict) -> None:
    """Write {**meta, 'rows': rows} to path atomically, creating parent directories."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def plot(rows: list, path: str, title: str = "") -> bool:
    """Grouped bar chart (PNG) of tcgemm vs jnp.dot TFLOP/s per row; False if skipped."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return False
    x = list(range(len(ok)))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.32 * len(ok) + 2), 5.5))
    ax.bar([i - 0.2 for i in x], [r["tcgemm_tflops"] for r in ok], 0.4, label="tcgemm")
    ax.bar([i + 0.2 for i in x], [r["jnp_tflops"] for r in ok], 0.4, label="jnp.dot")
    ax.set_xticks(x, [f"{r['name']} {SHORT.get(r['dtype'], r['dtype'])}" for r in ok],
                  rotation=90, fontsize=7)
    ax.set(ylabel="TFLOP/s", title=title)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


class _Progress:
    """On a tty: tqdm on stderr if importable, else a '\\r' counter. Otherwise (logs, captured
    output): one '[i/n] case' line per case on stderr, nothing that fills a log with redraws."""

    def __init__(self, total: int):
        self.total, self.i, self.bar = total, 0, None
        self.tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
        if self.tty:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, file=sys.stderr, leave=False)
            except ImportError:
                pass

    def start(self, label: str):
        self.i += 1
        if self.bar is not None:
            return self.bar.set_description(label)
        pre, end = ("\r", "\033[K") if self.tty else ("", "\n")
        print(f"{pre}[{self.i}/{self.total}] {label}", end=end, file=sys.stderr, flush=True)

    def emit(self, line: str):
        """A finished row to stdout, without garbling the progress line."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
            return self.bar.update(1)
        if self.tty:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
        print(line, flush=True)


def cpu_demo() -> int:
    """No GPU: show the CPU fallback computing the right thing on a small batched product."""
    import jax
    import jax.numpy as jnp
    import jax_tcgemm as tg

    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (2, 33, 65), jnp.float32).astype(jnp.float16)
    b = (jax.random.normal(kb, (65, 17), jnp.float32) / math.sqrt(65)).astype(jnp.float16)
    out = jax.jit(tg.matmul)(a, b)
    ref = jnp.matmul(a, b)
    ref32 = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32), precision="highest")
    max_err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
    rel = float(jnp.linalg.norm((out.astype(jnp.float32) - ref32).ravel()) / jnp.linalg.norm(ref32.ravel()))
    print(f"tg.matmul {a.shape} {a.dtype} @ {b.shape} {b.dtype} -> {out.shape} {out.dtype}"
          f" (jnp.matmul: {ref.shape} {ref.dtype}) on {jax.default_backend()}")
    print(f"max |tg - jnp.matmul| = {max_err:.3g}; rel_err vs float32 = {rel:.3g}")
    ok = out.shape == ref.shape and out.dtype == ref.dtype and math.isfinite(rel) and rel < ERR_TOL["float16"]
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jax_tcgemm.bench",
                                description="Time jax_tcgemm (tcgemm) against jnp.dot on the GPU.")
    p.add_argument("--suite", choices=SUITES + ("all",), default="all")
    p.add_argument("--dtype", choices=tuple(DTYPE_CHOICES), default="both")
    p.add_argument("--json", metavar="PATH", help="default on GPU: benchmarks/results/<gpu>.json")
    p.add_argument("--plot", metavar="PATH", help="PNG bar chart of TFLOP/s per case")
    p.add_argument("--reps", type=int, default=9, help="timed calls per side (>= 7; default 9)")
    p.add_argument("--quick", action="store_true", help="square 4096 and 8192 only")
    p.add_argument("--cases", metavar="NAME,NAME", help="keep cases whose name matches (globs ok)")
    p.add_argument("--shape", action="append", default=[], metavar="MxNxK|BxMxNxK",
                   help="add a custom case (repeatable); replaces the suites")
    p.add_argument("--no-barrier", action="store_true",
                   help="no optimization_barrier per product (lets XLA merge the jnp.dot side)")
    p.add_argument("--autotune", action="store_true",
                   help="tcgemm uses autotuned configs (jax_tcgemm.autotune) instead of the model")
    p.add_argument("--force", action="store_true",
                   help="time even without a GPU (meaningless numbers; to test the harness)")
    return p


def select_cases(args) -> list[Case]:
    dtypes = DTYPE_CHOICES[args.dtype]
    if args.shape:
        cs = [c for s in args.shape for c in parse_shape(s, dtypes)]
    elif args.quick:
        cs = [c for c in cases("square", dtypes) if c.m in (4096, 8192)]
    else:
        cs = cases(args.suite, dtypes)
    if args.cases:
        pats = [p.strip() for p in args.cases.split(",") if p.strip()]
        cs = [c for c in cs if any(fnmatch.fnmatchcase(c.name, p) for p in pats)]
    return cs


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.reps < 7:
        parser.error(f"--reps must be >= 7 (the median of at least 7 calls), got {args.reps}")
    try:
        cs = select_cases(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import jax

    backend = jax.default_backend()
    if backend != "gpu" and not args.force:
        print(f"No GPU found (JAX backend is {backend!r}): timings here would be meaningless, so "
              f"no benchmark is run and no JSON{' (' + args.json + ')' if args.json else ''} "
              "or plot is written. Running the CPU fallback demo instead.")
        return cpu_demo()
    if not cs:
        print("error: no case matches --cases", file=sys.stderr)
        return 2
    if args.autotune:
        from jax_tcgemm import autotune
        autotune.enable()
    dev = jax.devices()[0]
    mem_limit = (getattr(dev, "memory_stats", lambda: None)() or {}).get("bytes_limit")
    json_path = args.json or (os.path.join("benchmarks", "results", slug(dev.device_kind) + ".json")
                              if backend == "gpu" else None)
    import jaxlib
    commit, dirty = git_info()
    meta = {"commit": commit, "dirty": dirty, "device": dev.device_kind, "backend": backend,
            "jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "harness": (f"per side one jit of R independent products (R distinct A, shared B; "
                        f"R*2MNK*batch ~ {TARGET_FLOP / 1e12:g} TFLOP, 1<=R<={MAX_R}, R*(A+C) "
                        f"<= {MEM_FRAC_R:.0%} device memory), outputs returned as a tuple"
                        f"{'' if args.no_barrier else ', optimization_barrier per product'}; "
                        f"2 warm-up calls, {args.reps} timed calls per side interleaved, "
                        "perf_counter around call+block_until_ready, median"),
            "argv": list(sys.argv[1:] if argv is None else argv), "autotune": args.autotune}
    print(f"device: {dev.device_kind}  jax {jax.__version__}  commit {commit[:12]}"
          f"{' (dirty)' if dirty else ''}  memory limit "
          f"{'unknown' if not mem_limit else f'{mem_limit / 2**30:.1f} GiB'}  reps {args.reps}")
    print(HEADER, flush=True)
    rows, prog = [], _Progress(len(cs))
    for case in cs:
        prog.start(f"{case.name} {SHORT[case.dtype]}")
        row = _safe_run(case, args.reps, mem_limit, not args.no_barrier)
        rows.append(row)
        prog.emit(format_row(row))
        if json_path:  # after every row, so a cut-off run still leaves its results
            write_json(json_path, rows, meta)
    if prog.bar is not None:
        prog.bar.close()
    print()
    for suite in dict.fromkeys(r["suite"] for r in rows):
        ratios = [r["ratio"] for r in rows if r["suite"] == suite and "ratio" in r]
        print(f"geomean ratio tcgemm/jnp.dot  {suite:<8} {geomean(ratios):6.3f}  ({len(ratios)} rows)")
    if json_path:
        print(f"wrote {json_path}")
    if args.plot and plot(rows, args.plot, f"{dev.device_kind}: tcgemm vs jnp.dot (commit {commit[:12]})"):
        print(f"wrote {args.plot}")
    failed = [f"{r['name']} {r['dtype']}" for r in rows if r.get("err_ok") is False or (
        "error" in r and not r["error"].startswith("skipped"))]
    if failed:
        print(f"FAILED (error or wrong result): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
