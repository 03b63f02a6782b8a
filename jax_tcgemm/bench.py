"""tcgemm vs jnp, same run, same harness: ``python -m jax_tcgemm.bench``.

Per case and side: one jitted call of R independent products (R distinct A, shared B, ~4 TFLOP
per call, 1 <= R <= 64; timing.py), 2 warm-up calls, then --reps timed calls, the sides
interleaved; median. GEMM rows: rel_err against a float32 'highest' reference of the first
product, and tcgemm vs jnp.dot over the whole of it. Epilogue rows (suite `epilogue`) time
three sides: ours (tg.gemm), the stock jnp composite of the same math, and the plain jnp.dot
alone (`dot_tflops`); rel_err against a float64 reference (numpy, on rows and columns of the
first product). benchmarks/NOTES.md has the method.
"""
from __future__ import annotations

import argparse
import datetime
import fnmatch
import gc
import json
import math
import os
import re
import subprocess
import sys

import numpy as np

from . import timing
from .timing import (AXPBY, MAX_R, MEM_FRAC_R, SUITES, TARGET_FLOP, Case,  # noqa: F401
                     cases, choose_reps, harness_operands, parse_shape, time_fn, time_fns)

_harness = timing.harness  # (tools/ use it under this name)
MEM_FRAC_SKIP = 0.40      # a single product's A+B+C above this share: the row is skipped
ERR_ROWS = 1024           # rel_err on the first and last ERR_ROWS/2 rows of the first product
EPI_ERR_ROWS = 256        # likewise for the epilogue rows' float64 reference (and columns)
ERR_TOL = {"float16": 1e-3, "bfloat16": 5e-3, "float32": 2e-3}  # or 2x jnp's, if larger
DTYPE_CHOICES = {"float16": ("float16",), "bfloat16": ("bfloat16",), "both": ("float16", "bfloat16")}
SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


def slug(device_kind: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-") or "unknown"


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def config_id(case: Case) -> str:
    """The config tcgemm runs `case` (its forward product) with (configs.plan_for_device, as
    the lowering asks it: the cost model's choice, or the tuned one; epilogue rows planned as
    fused), with ' split_k=S' when K is split; 'n/a' where unavailable."""
    try:
        import jax.numpy as jnp
        from jax_tcgemm import configs  # the lowering's own plan (the autotuner's when on)
        fused = getattr(case, "op", "matmul") != "matmul"  # an epilogue row
        name, split = configs.plan_for_device(case.m, case.n, case.k, case.batch,
                                              jnp.dtype(case.dtype), case.layout, fused)
        return name + (f" split_k={split}" if split > 1 else "")
    except Exception:
        return "n/a"


def tolerance(case: Case, jnp_err: float) -> float:
    """The rel_err bound of `case`: by output dtype (float32 from f16/bf16: 1e-5, scaled with
    K beyond 2048), or twice jnp's own error where that is larger."""
    if case.op != "matmul" and case.out_dtype == "float32":
        tol = 1e-5 * max(1.0, case.k / 2048)
    else:
        tol = ERR_TOL[case.out_dtype]
    return max(tol, 2 * jnp_err) if math.isfinite(jnp_err) else tol


# ---------------------------------------------------------------------------------------------
# What each side computes.

def _edge_rows(m: int, n_rows: int) -> np.ndarray:
    """The first and last n_rows/2 indices of range(m) (edge tiles included)."""
    h = n_rows // 2
    return np.unique(np.r_[0:min(h, m), max(0, m - h):m])


def _rel_err(out, a, b) -> float:
    """rel_err of out = a @ b against float32 'highest', on the first and last ERR_ROWS/2 rows
    of every batch element, all columns."""
    import jax.numpy as jnp
    rows = _edge_rows(a.shape[-2], ERR_ROWS)
    ref = jnp.matmul(a[..., rows, :].astype(jnp.float32), b.astype(jnp.float32), precision="highest")
    return timing.rel_fro(out[..., rows, :], ref)


def np_act(name, x, grad=False):
    """Activation `name` (or its derivative) in float64 numpy."""
    if name in (None, "none"):
        return np.ones_like(x) if grad else x
    if name == "relu":
        return (x > 0).astype(x.dtype) if grad else np.maximum(x, 0)
    if name == "silu":
        s = 1 / (1 + np.exp(-x))
        return s * (1 + x * (1 - s)) if grad else x * s
    if name == "gelu_tanh":
        c = math.sqrt(2 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x ** 3))
        if not grad:
            return 0.5 * x * (1 + t)
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
    if name == "gelu":
        erf = np.vectorize(math.erf)(x / math.sqrt(2))
        return 0.5 * (1 + erf) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi) if grad else 0.5 * x * (1 + erf)
    raise ValueError(f"unknown activation {name!r}")


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _rel64(out, ref) -> float:
    out = _f64(out)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.linalg.norm((out - ref).ravel()) / np.linalg.norm(ref.ravel()))


def epilogue_ops(case: Case) -> dict:
    """{side: op(x, *shared)} of an epilogue case: tcgemm (tg.gemm), jnp (the stock composite)
    and dot (jnp.dot alone; for fwd_bwd the same three GEMMs with a given cotangent)."""
    import functools

    import jax
    import jax.numpy as jnp
    import jax_tcgemm as tg

    act = case.activation
    jact = {None: lambda y: y, "relu": jax.nn.relu, "silu": jax.nn.silu,
            "gelu": functools.partial(jax.nn.gelu, approximate=False),
            "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True)}[act]
    f32 = jnp.float32
    if case.op == "axpby":
        al, be = AXPBY
        return {"tcgemm": lambda a, b, c: tg.gemm(a, b, c, alpha=al, beta=be, out_dtype=f32),
                "jnp": lambda a, b, c: al * jnp.dot(a, b, preferred_element_type=f32) + be * c,
                "dot": lambda a, b, c: jnp.dot(a, b, preferred_element_type=f32)}
    if case.op == "bias_act":
        return {"tcgemm": lambda x, w, bias: tg.gemm(x, w, bias=bias, activation=act),
                "jnp": lambda x, w, bias: jact(jnp.dot(x, w) + bias),
                "dot": lambda x, w, bias: jnp.dot(x, w)}
    if case.op != "fwd_bwd":
        raise ValueError(f"not an epilogue op: {case.op!r}")

    def vg(layer):
        return jax.value_and_grad(lambda x, w, bias: jnp.sum(layer(x, w, bias), dtype=f32),
                                  argnums=(0, 1, 2))
    ours = vg(lambda x, w, bias: tg.gemm(x, w, bias=bias, activation=act))
    comp = vg(lambda x, w, bias: jact(jnp.dot(x, w) + bias))
    return {"tcgemm": lambda x, w, bias, ct: ours(x, w, bias),
            "jnp": lambda x, w, bias, ct: comp(x, w, bias),
            "dot": lambda x, w, bias, ct: (jnp.dot(x, w), jnp.dot(ct, w.T), jnp.dot(x.T, ct))}


def epilogue_operands(case: Case, r: int, seed: int = 0):
    """(R distinct x ~ N(0, 1), shared operands): W ~ N(0, 1/K), then axpby: C (float32
    N(0, 1)); bias_act: bias (N(0, 1/4), in the input dtype); fwd_bwd: bias and the dot side's
    cotangent (N(0, 1))."""
    import jax
    m, n, k, dt = case.m, case.n, case.k, np.dtype(case.dtype)
    a_list, w = harness_operands(r, (m, k), (k, n), dt, k, seed)
    k1, k2 = jax.random.split(jax.random.key(seed + 1))
    if case.op == "axpby":
        return a_list, (w, timing.random_array(k1, (m, n), np.float32))
    bias = timing.random_array(k1, (n,), dt, 0.5)
    if case.op == "fwd_bwd":
        return a_list, (w, bias, timing.random_array(k2, (m, n), dt))
    return a_list, (w, bias)


def epilogue_error(case: Case, out, x, shared) -> tuple[float, dict]:
    """(rel_err, parts) of the first product's result against float64 numpy: forward ops on
    the first and last EPI_ERR_ROWS/2 rows; fwd_bwd: dx on those rows, dW and dbias on as
    many edge columns (their sums over all M rows included). rel_err is the largest part."""
    rows = _edge_rows(case.m, EPI_ERR_ROWS)
    w = _f64(shared[0])
    if case.op == "axpby":
        al, be = AXPBY
        ref = al * (_f64(x[rows]) @ w) + be * _f64(shared[1][rows])
        return _rel64(out[rows], ref), {}
    bias = _f64(shared[1])
    if case.op == "bias_act":
        return _rel64(out[rows], np_act(case.activation, _f64(x[rows]) @ w + bias)), {}
    _, (dx, dw, db) = out
    g_rows = np_act(case.activation, _f64(x[rows]) @ w + bias, grad=True)
    cols = _edge_rows(case.n, EPI_ERR_ROWS)
    x64 = _f64(x)
    g_cols = np_act(case.activation, x64 @ w[:, cols] + bias[cols], grad=True)
    parts = {"dx": _rel64(dx[rows], g_rows @ w.T), "dw": _rel64(dw[:, cols], x64.T @ g_cols),
             "dbias": _rel64(db[cols], g_cols.sum(0))}
    return max(parts.values()), {p: _sig(e) for p, e in parts.items()}


_sig = timing.sig  # (bench_suites, bench_ragged and tools use it under this name)


def _row_base(case: Case) -> dict:
    return {"suite": case.suite, "name": case.name, "m": case.m, "n": case.n, "k": case.k,
            "batch": case.batch, "dtype": case.dtype, "layout": case.layout, "config": config_id(case)}


def _problem(case: Case, r: int):
    """({side: op(a, *shared)}, R distinct A's, shared operands) of `case`."""
    import jax
    import jax.numpy as jnp
    import jax_tcgemm as tg
    if case.op != "matmul":
        return (epilogue_ops(case), *epilogue_operands(case, r))
    lead = (case.batch,) if case.vmap else ()
    a_list, b = harness_operands(r, lead + (case.m, case.k), lead + (case.k, case.n),
                                 jnp.dtype(case.dtype), case.k)
    ops = {"tcgemm": jax.vmap(tg.matmul) if case.vmap else tg.matmul,
           "jnp": jax.vmap(jnp.matmul) if case.vmap else jnp.dot}
    return ops, a_list, (b,)


def run_case(case: Case, reps: int = 9, mem_limit: int | None = None, barrier: bool = True) -> dict:
    """Time tcgemm and jnp (and, for epilogue rows, jnp.dot alone) on `case`; the row for the
    table and the JSON record."""
    import jax

    row = _row_base(case)
    a_bytes, b_bytes, c_bytes = case.nbytes()
    if mem_limit and a_bytes + b_bytes + c_bytes > MEM_FRAC_SKIP * mem_limit:
        row["error"] = (f"skipped: working set {(a_bytes + b_bytes + c_bytes) / 2**30:.1f} GiB > "
                        f"{MEM_FRAC_SKIP:.0%} of device memory ({mem_limit / 2**30:.1f} GiB)")
        return row
    r = choose_reps(case.flops, a_bytes + c_bytes, b_bytes, mem_limit)
    ops, a_list, shared = _problem(case, r)
    jaxpr = str(jax.make_jaxpr(ops["tcgemm"])(a_list[0], *shared))
    row["tg_path"] = ("fallback" if "tcgemm" not in jaxpr else
                      "mixed" if "dot_general" in jaxpr else "tcgemm")
    fns = {side: _harness(op, barrier) for side, op in ops.items()}
    first = {side: fns[side](a_list, *shared)[0] for side in ("tcgemm", "jnp")}  # product 0
    if case.op == "matmul":
        errs = {side: (_rel_err(out, a_list[0], shared[0]), {}) for side, out in first.items()}
    else:
        errs = {side: epilogue_error(case, out, a_list[0], shared) for side, out in first.items()}
    vs_jnp = max(timing.rel_fro(x, y) for x, y in  # whole outputs: every tile written
                 zip(jax.tree.leaves(first["tcgemm"]), jax.tree.leaves(first["jnp"])))
    del first
    med, extra = timing.time_sides(fns, (a_list, *shared), reps)
    tf = {side: r * case.flops / med[side] / 1e12 for side in med}
    err, jnp_err = errs["tcgemm"][0], errs["jnp"][0]
    tol = tolerance(case, jnp_err)
    row.update(r=r, reps=reps, tcgemm_tflops=_sig(tf["tcgemm"], 4), jnp_tflops=_sig(tf["jnp"], 4),
               ratio=round(tf["tcgemm"] / tf["jnp"], 4), rel_err=_sig(err),
               jnp_rel_err=_sig(jnp_err), vs_jnp=_sig(vs_jnp),
               err_ok=bool(err <= tol and vs_jnp <= 2 * tol),
               tcgemm_ms=_sig(med["tcgemm"] * 1e3, 4), jnp_ms=_sig(med["jnp"] * 1e3, 4),
               **extra)
    if "dot" in tf:
        row.update(dot_tflops=_sig(tf["dot"], 4), dot_ms=_sig(med["dot"] * 1e3, 4),
                   vs_dot=round(tf["tcgemm"] / tf["dot"], 4),
                   jnp_vs_dot=round(tf["jnp"] / tf["dot"], 4))
    if errs["tcgemm"][1]:
        row["rel_err_parts"] = errs["tcgemm"][1]
    return row


def _safe_run(case: Case, reps: int, mem_limit, barrier: bool) -> dict:
    try:
        return run_case(case, reps, mem_limit, barrier)
    except Exception as e:  # e.g. out of memory: record it and go on
        return {**_row_base(case), "error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
    finally:
        gc.collect()


HEADER = (f"{'name':<26} {'M':>6} {'N':>6} {'K':>6} {'batch':>5} {'dtype':<5} "
          f"{'tcgemm':>8} {'jnp':>8} {'ratio':>6} {'rel_err':>9} {'jnp_err':>9}  config"
          "  [jnp.dot alone]")


def format_row(row: dict) -> str:
    head = (f"{row['name']:<26} {row['m']:>6} {row['n']:>6} {row['k']:>6} {row['batch']:>5} "
            f"{SHORT.get(row['dtype'], row['dtype']):<5} ")
    if "error" in row:
        return head + ("SKIP " if row["error"].startswith("skipped") else "ERROR ") + row["error"]
    e = [("nan" if row[f] is None else f"{row[f]:.2e}") for f in ("rel_err", "jnp_rel_err")]
    return head + (f"{row['tcgemm_tflops']:>8.1f} {row['jnp_tflops']:>8.1f} {row['ratio']:>6.3f} "
                   f"{e[0]:>9}{' ' if row['err_ok'] else '!'}{e[1]:>9}  {row['config']}"
                   + (f"  [dot {row['dot_tflops']:.1f}]" if "dot_tflops" in row else ""))


def git_info() -> tuple[str, bool | None]:
    """(commit, dirty): the JAX_TCGEMM_COMMIT environment variable and None where it is set
    (the device copy of the tree has no .git, or a stale one); else from git in the package's
    directory or the cwd; else ("unknown", None)."""
    if os.environ.get("JAX_TCGEMM_COMMIT"):
        return os.environ["JAX_TCGEMM_COMMIT"], None
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
    return "unknown", None


def run_setup(args, backend: str, suffix: str = ""):
    """(device, its memory limit in bytes or None, the record's path) of a timed run, with the
    autotuner switched on when asked: the record defaults on GPU to
    benchmarks/results/<gpu><suffix>.json (None elsewhere, unless --json)."""
    import jax
    if args.autotune:
        from jax_tcgemm import autotune
        autotune.enable()
    dev = jax.devices()[0]
    mem_limit = (getattr(dev, "memory_stats", lambda: None)() or {}).get("bytes_limit")
    json_path = args.json or (os.path.join("benchmarks", "results",
                                           slug(dev.device_kind) + suffix + ".json")
                              if backend == "gpu" else None)
    return dev, mem_limit, json_path


def run_meta(dev, backend: str, argv, **fields) -> dict:
    """The record's header: commit, device, versions, date, argv, and `fields` (harness, ...)."""
    import jax
    import jaxlib
    commit, dirty = git_info()
    return {"commit": commit, "dirty": dirty, "device": dev.device_kind, "backend": backend,
            "jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": list(sys.argv[1:] if argv is None else argv), **fields}


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
    """No GPU: show the CPU fallback computing the right thing on a small batched product and
    a fused epilogue (bias + gelu_tanh, against float64)."""
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
    bias = jax.random.normal(jax.random.key(1), (17,), jnp.float32)
    epi = jax.jit(lambda a, b, bias: tg.gemm(a, b, bias=bias, activation="gelu_tanh"))(a, b, bias)
    epi_err = _rel64(epi, np_act("gelu_tanh", _f64(a) @ _f64(b) + _f64(bias)))
    print(f"tg.gemm(a, b, bias=bias, activation='gelu_tanh') -> {epi.shape} {epi.dtype}; "
          f"rel_err vs float64 = {epi_err:.3g}")
    ok = ok and epi.shape == out.shape and epi.dtype == out.dtype and epi_err < ERR_TOL["float16"]
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jax_tcgemm.bench",
                                description="Time jax_tcgemm (tcgemm) against jnp on the GPU.")
    p.add_argument("--suite", choices=tuple(dict.fromkeys(SUITES + ("ragged", "lowp", "f32", "all"))),
                   default="all")
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
    if args.suite == "ragged":  # its own rows, sides and record: bench_ragged.py
        from . import bench_ragged
        return bench_ragged.run(args, argv)
    if args.suite == "lowp":  # fp8 / int8 (tg.scaled_matmul): bench_lowp.py
        from . import bench_lowp
        return bench_lowp.run(args, argv)
    if args.suite == "f32":  # float32 by precision (TF32, f16x3, presets): bench_f32.py
        from . import bench_f32
        return bench_f32.run(args, argv)
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
    dev, mem_limit, json_path = run_setup(args, backend)
    meta = run_meta(dev, backend, argv, autotune=args.autotune, harness=(f"per side one jit of R independent products (R distinct A, shared B; "
                        "epilogue rows: shared W and C or bias, sides tcgemm, jnp composite and "
                        "jnp.dot alone; "
                        f"R*FLOP ~ {TARGET_FLOP / 1e12:g} TFLOP, 1<=R<={MAX_R}, R*(A+C) "
                        f"<= {MEM_FRAC_R:.0%} device memory), outputs returned as a tuple"
                        f"{'' if args.no_barrier else ', optimization_barrier per product'}; "
                        + timing.method(args.reps)))
    print(f"device: {dev.device_kind}  jax {jax.__version__}  commit {meta['commit'][:12]}"
          f"{' (dirty)' if meta['dirty'] else ''}  memory limit "
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
        print(f"geomean ratio tcgemm/jnp  {suite:<8} {geomean(ratios):6.3f}  ({len(ratios)} rows)")
    if json_path:
        print(f"wrote {json_path}")
    if args.plot and plot(rows, args.plot,
                          f"{dev.device_kind}: tcgemm vs jnp.dot (commit {meta['commit'][:12]})"):
        print(f"wrote {args.plot}")
    failed = [f"{r['name']} {r['dtype']}" for r in rows if r.get("err_ok") is False or (
        "error" in r and not r["error"].startswith("skipped"))]
    if failed:
        print(f"FAILED (error or wrong result): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
