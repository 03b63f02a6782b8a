"""The driver of the benchmark suites with their own rows, sides and records (bench_ragged.py,
bench_lowp.py, bench_f32.py): the --cases filter, the record's setup and rows (bench.run_setup,
run_meta, write_json, the progress line), and the two-sided rows of lowp and f32 (tcgemm and
jnp per row: setup, timing, format)."""
from __future__ import annotations

import fnmatch
import gc
import sys

import numpy as np

from . import timing
from .bench import _Progress, _sig, geomean, run_meta, run_setup, write_json


def filter_cases(cs: list, spec: str | None) -> list:
    """The cases whose names match one of the comma-separated globs of --cases (all if none)."""
    pats = [p.strip() for p in (spec or "").split(",") if p.strip()]
    return [c for c in cs if any(fnmatch.fnmatchcase(c.name, p) for p in pats)] if pats else cs


def run_suite(args, argv, cs: list, suffix: str, harness: str, header: str, run_one, fmt,
              summary) -> int:
    """The driver of a suite with its own rows and record (ragged, lowp, f32): the record's setup
    (benchmarks/results/<gpu><suffix>.json by default), the header, the rows (run_rows;
    run_one(case, mem_limit) -> row), the summary line (summary(rows)), the failed rows. Returns
    the exit status."""
    import jax
    backend = jax.default_backend()
    dev, mem_limit, json_path = run_setup(args, backend, suffix)
    meta = run_meta(dev, backend, argv, harness=harness)
    print(f"device: {dev.device_kind}  jax {jax.__version__}  commit {meta['commit'][:12]}"
          f"{' (dirty)' if meta['dirty'] else ''}  reps {args.reps}")
    print(header, flush=True)
    rows = run_rows(cs, lambda c: run_one(c, mem_limit), fmt, json_path, meta)
    print("\n" + summary(rows))
    if json_path:
        print(f"wrote {json_path}")
    failed = [r["name"] for r in rows if r.get("err_ok") is False or (
        "error" in r and not r["error"].startswith("skipped"))]
    if failed:
        print(f"FAILED (error or wrong result): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def two_sided_header(width: int, unit: str) -> str:
    """The header of a two-sided suite's rows (lowp, f32: tcgemm and jnp per row)."""
    return (f"{'name':<{width}} {'M':>6} {'N':>6} {'K':>6} {'tcgemm':>8} {'jnp':>8} {'ratio':>6} "
            f"{'rel_err':>9}  {'jnp_err':>9}  ({unit})")


def two_sided_row(row: dict, width: int, tail: str = "") -> str:
    """One row of a two-sided suite: rates, ratio, both errors (! where ours is out of
    bounds), then `tail`."""
    head = f"{row['name']:<{width}} {row['m']:>6} {row['n']:>6} {row['k']:>6} "
    if "error" in row:
        return head + "ERROR " + row["error"]
    return head + (f"{row['tcgemm_tflops']:>8.1f} {row['jnp_tflops']:>8.1f} {row['ratio']:>6.2f} "
                   f"{row['rel_err']:>9.2e}{' ' if row['err_ok'] else '!'} "
                   f"{row['jnp_rel_err']:>9.2e} {tail}")


def first_two_sides(case, ops: dict, operands, mem_limit, barrier: bool, err_rows: int):
    """The setup of a two-sided row: R (timing.choose_reps for case.flops and case.nbytes()),
    the operands (operands(case, R) -> (R distinct a, shared tuple)), each side jitted
    (timing.harness), each side's first product on the host, and the rows of a its error is
    measured on (the first and last err_rows). Returns (r, a, shared, fns, firsts, rows)."""
    per, shared = case.nbytes()
    r = timing.choose_reps(case.flops, per, shared, mem_limit)
    a, sh = operands(case, r)
    fns = {side: timing.harness(op, barrier) for side, op in ops.items()}
    firsts = {side: np.asarray(f(a, *sh)[0]) for side, f in fns.items()}
    rows = np.unique(np.r_[0:min(err_rows, case.m), max(0, case.m - err_rows):case.m])
    return r, a, sh, fns, firsts, rows


def time_two_sides(fns: dict, args: tuple, reps: int, r: int, flops: int, errs: dict,
                   tol: float) -> dict:
    """Times the sides {name: jitted fn} interleaved (timing.time_sides) and returns the
    row fields: rates (r products of `flops` each per call), ratio, errors, err_ok (ours within
    tol), per-side milliseconds."""
    med, extra = timing.time_sides(fns, args, reps)
    tf = {side: r * flops / med[side] / 1e12 for side in med}
    return dict(r=r, reps=reps, tcgemm_tflops=_sig(tf["tcgemm"], 4),
                jnp_tflops=_sig(tf["jnp"], 4), ratio=round(tf["tcgemm"] / tf["jnp"], 4),
                rel_err=_sig(errs["tcgemm"]), jnp_rel_err=_sig(errs["jnp"]),
                err_ok=bool(errs["tcgemm"] <= tol),
                **{f"{side}_ms": _sig(med[side] * 1e3, 4) for side in med},
                **extra)


def run_two_sided(args, argv, cs: list, suite: str, harness: str, header: str, run_case,
                  fmt) -> int:
    """`bench --suite <suite>` of a two-sided suite with its own rows (lowp, f32): nothing
    without a GPU (unless --force), the --cases filter, then run_suite with the geometric mean
    of the ratios. run_case(case, reps, mem_limit, barrier) -> row."""
    import jax
    backend = jax.default_backend()
    if backend != "gpu" and not args.force:
        print(f"No GPU found (JAX backend is {backend!r}): no {suite} benchmark is run.")
        return 0
    cs = filter_cases(cs, args.cases)
    if not cs:
        print("error: no case matches --cases", file=sys.stderr)
        return 2
    return run_suite(
        args, argv, cs, f"-{suite}", harness, header,
        lambda c, mem: run_case(c, args.reps, mem, not args.no_barrier), fmt,
        lambda rows: f"geomean tcgemm / jnp {geomean([r.get('ratio') for r in rows]):.3f}")


def run_rows(cs: list, run_one, fmt, json_path, meta) -> list:
    """run_one(case) -> row for each case of a suite with its own rows (ragged, lowp, f32): an
    exception becomes the row's `error` and the run goes on; each row is printed (fmt) and the
    JSON rewritten after it (a run cut short keeps what it measured). Returns the rows."""
    rows, prog = [], _Progress(len(cs))
    for case in cs:
        prog.start(case.name)
        try:
            row = run_one(case)
        except Exception as e:  # noqa: BLE001 (recorded, the run goes on)
            row = {f: getattr(case, f) for f in ("suite", "name", "m", "n", "k", "groups", "dtype")
                   if hasattr(case, f)}
            row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
        finally:
            gc.collect()
        rows.append(row)
        prog.emit(fmt(row))
        if json_path:
            write_json(json_path, rows, meta)
    if prog.bar is not None:
        prog.bar.close()
    return rows
