"""Where the bench harness's time goes at small products: per-product wall time and GPU span.

    python tools/harness_trace.py 1x16x4096x4096 64x256x256x256 [--config NAME --split S] [--host N]

For each BxMxNxK (B > 1: both operands batched, as the bench's vmap cases), runs the bench
harness (jax_tcgemm.bench: R = 64 products per jitted call, float16) for jnp.matmul and for
tcgemm (the planned config, or --config/--split), prints the median wall time per product over
9 calls, then profiles one call (jax.profiler) and prints from its GPU timeline: kernels,
span per product (first kernel start to last kernel end, / R), the median kernel duration and
the median / smallest gap between consecutive kernels (negative: a kernel started before its
predecessor ended). Wall time minus GPU span is what the call spends before the GPU starts;
--host N lists the host-side events of that call that take the most time.
"""
import argparse
import glob
import gzip
import json
import shutil
import statistics
import tempfile

import jax
import jax.numpy as jnp

from jax_tcgemm import bench
from jax_tcgemm.primitive import tcgemm

R = 64


def host_summary(ev, procs, first_kernel_ts, top: int) -> str:
    """The `top` host-side trace events of the profiled call by total time (name, count,
    total us), and how long after the first host event the first kernel started."""
    host = [e for e in ev if e.get("ph") == "X" and e.get("dur")
            and procs.get(e["pid"], "").startswith("/host")]
    if not host:
        return "  no host events"
    tot: dict = {}
    for e in host:
        c, t = tot.get(e["name"], (0, 0.0))
        tot[e["name"]] = (c + 1, t + e["dur"])
    start = min(e["ts"] for e in host)
    lines = [f"  first kernel {first_kernel_ts - start:.1f} us after the first host event"]
    for name, (c, t) in sorted(tot.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"  {t:10.1f} us {c:5d}x  {name[:110]}")
    return "\n".join(lines)


def trace_events(f, args, calls: int = 1):
    """The profiler's trace events of `calls` blocking calls f(*args), and its process names
    {pid: name}; ([], {}) when no trace was written."""
    d = tempfile.mkdtemp(prefix="harness_trace_")
    try:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(calls):
                jax.block_until_ready(f(*args))
        paths = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)
        if not paths:
            return [], {}
        ev = json.load(gzip.open(paths[0]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    procs = {e["pid"]: e["args"]["name"] for e in ev
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    return ev, procs


def device_kernels(ev, procs) -> list:
    """The GPU kernels of trace_events' events, by start time."""
    return sorted((e for e in ev if e.get("ph") == "X"
                   and procs.get(e["pid"], "").startswith("/device")), key=lambda e: e["ts"])


def gpu_timeline(f, args, top: int = 0) -> str:
    ev, procs = trace_events(f, args)
    if not ev:
        return "no profiler trace written"
    kern = device_kernels(ev, procs)
    if len(kern) < 2:
        return f"{len(kern)} GPU events (is CUPTI available?)"
    ends = [e["ts"] + e["dur"] for e in kern]
    gaps = sorted(kern[i + 1]["ts"] - ends[i] for i in range(len(kern) - 1))
    return (f"{len(kern)} kernels, GPU span {(max(ends) - kern[0]['ts']) / R:.2f} us/product, "
            f"kernel median {statistics.median(e['dur'] for e in kern):.2f} us, "
            f"gaps median {gaps[len(gaps) // 2]:.2f} min {gaps[0]:.2f} us"
            + ("\n" + host_summary(ev, procs, kern[0]["ts"], top) if top else ""))


def run(label, dims, op, top=0):
    b, m, n, k = dims
    a_list, w = bench.harness_operands(R, (b, m, k), (b, k, n), jnp.float16, k)
    f = bench._harness(op, True)
    wall = bench.time_fn(f, (a_list, w), reps=9, warmup=3)
    print(f"{label:>6} {b}x{m}x{n}x{k}: wall {wall * 1e6 / R:.2f} us/product"
          f" | {gpu_timeline(f, (a_list, w), top)}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shapes", nargs="+", help="BxMxNxK")
    ap.add_argument("--config", default=None, help="tcgemm config (default: planned)")
    ap.add_argument("--split", type=int, default=None, help="split_k with --config")
    ap.add_argument("--host", type=int, default=0, metavar="N",
                    help="also print the N host-side trace events that take the most time")
    args = ap.parse_args()
    for spec in args.shapes:
        dims = tuple(int(x) for x in spec.lower().split("x"))
        if len(dims) != 4:
            ap.error(f"shape {spec!r} is not BxMxNxK")
        run("jnp", dims, jnp.matmul, args.host)
        run("tcgemm", dims, lambda a, w: tcgemm(a, w, config=args.config, split_k=args.split),
            args.host)


if __name__ == "__main__":
    main()
