"""Where a two-sided bench row's harness time goes (``python tools/harness_gap.py ROW ...``,
ROW an f32 or lowp row name, e.g. f32_bf16x3_8192 lowp_fp8_8192).

For each row and side (tcgemm, jnp), in the bench harness (bench_suites.first_two_sides: R
products per call, optimization_barrier each):
  * the harness's median wall time per product (timing.time_fns, two rounds);
  * the GPU timeline of one call under jax.profiler, right after (hot) and after a pause
    (cool): busy time and span per product, and the kernels that take the most;
  * wall time per call blocking on every call against 9 calls in a stream (timing.time_fns
    without and with stream: what blocking exposes of each call's dispatch), and the timeline
    of 3 consecutive blocking calls (their span, the idle gaps between them);
  * nvidia-smi's SM clock, power and throttle reasons, sampled every 100 ms during 3 s of the
    tcgemm side back to back (0x4: the software power cap).
Not a unit test; a measuring tool for benchmarks/NOTES.md (v55-v56 ran its two halves)."""
from __future__ import annotations

import statistics
import subprocess
import sys
import time

import jax

from harness_trace import device_kernels, trace_events  # tools/ (this script's directory)
from jax_tcgemm import bench_f32, bench_lowp, bench_suites, timing


def _device_kernels(f, args, calls: int = 1) -> list:
    """(start us, duration us, name) of the GPU kernels of `calls` blocking calls f(*args)."""
    return sorted({(e["ts"], e["dur"], e["name"])
                   for e in device_kernels(*trace_events(f, args, calls))})


def timeline(f, args, r: int, top: int = 4) -> str:
    ks = _device_kernels(f, args)
    if not ks:
        return "no GPU kernels in the trace"
    busy = sum(k[1] for k in ks)
    span = ks[-1][0] + ks[-1][1] - ks[0][0]
    per: dict = {}
    for _, dur, name in ks:
        per.setdefault(name[:80], []).append(dur)
    s = f"{len(ks)} kernels, busy {busy / r / 1e3:.3f} ms/product, span {span / r / 1e3:.3f}"
    for name, d in sorted(per.items(), key=lambda kv: -sum(kv[1]))[:top]:
        s += f"\n      {sum(d) / r:9.1f} us/product x{len(d)} med {statistics.median(d):.1f}  {name}"
    return s


def calls_timeline(f, args, n: int = 3) -> str:
    ks = _device_kernels(f, args, n)
    if len(ks) < 2:
        return "no GPU kernels in the trace"
    gaps = sorted(ks[i + 1][0] - ks[i][0] - ks[i][1] for i in range(len(ks) - 1))
    span = ks[-1][0] + ks[-1][1] - ks[0][0]
    return (f"{len(ks)} kernels, span {span / 1e3:.3f} ms, busy "
            f"{sum(k[1] for k in ks) / 1e3:.3f}, largest gaps (us) "
            f"{[round(g, 1) for g in gaps[-(n - 1):]]}")


def smi_start(units: bool = True):
    """nvidia-smi sampling SM clock, power and throttle reasons every 100 ms (csv lines on its
    stdout; `units` False: bare numbers), or the OSError's text if it cannot start."""
    try:
        return subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,"
                                 "clocks_throttle_reasons.active",
                                 "--format=csv,noheader" + ("" if units else ",nounits"),
                                 "-lms", "100"], stdout=subprocess.PIPE, text=True)
    except OSError as e:
        return f"no nvidia-smi ({e})"


def smi_stop(smi) -> str:
    """Stops smi_start(units=False) and summarises its samples (median SM clock and power, the
    throttle reasons seen)."""
    if isinstance(smi, str):  # smi_start's reason it could not start
        return smi
    smi.terminate()
    rows = [ln.split(",") for ln in smi.stdout.read().strip().split("\n") if ln.count(",") == 2]
    if not rows:
        return "no samples"
    clk = statistics.median(float(r[0]) for r in rows)
    pw = statistics.median(float(r[1]) for r in rows)
    return (f"{len(rows)} samples, SM {clk:.0f} MHz, {pw:.0f} W (median), throttle "
            f"{sorted({r[2].strip() for r in rows})}")


def smi_during(fn, args, seconds: float = 3.0) -> str:
    smi = smi_start()
    if isinstance(smi, str):
        return smi
    t0 = time.time()
    while time.time() - t0 < seconds:
        jax.block_until_ready(fn(*args))
    smi.terminate()
    lines = smi.stdout.read().strip().split("\n")
    return f"{len(lines)} samples: " + "; ".join(sorted(set(lines))[:12])


def row_sides(name: str):
    """(case, R, args, {side: jitted fn}) of the lowp or f32 bench row `name`, set up as the
    bench sets it up (bench_suites.first_two_sides); None, said, if there is no such row."""
    mod = bench_lowp if name.startswith("lowp") else bench_f32
    case = next((c for c in mod.cases() if c.name == name), None)
    if case is None:
        print(f"{name}: no such row in the f32 / lowp suites", flush=True)
        return None
    r, a, sh, fns, _, _ = bench_suites.first_two_sides(case, mod.ops(case), mod.operands, None,
                                                        True, 8)
    return case, r, (a, *sh), fns


def run(name: str) -> None:
    got = row_sides(name)
    if got is None:
        return
    _, r, args, fns = got
    for rnd in range(2):
        med = timing.medians(timing.time_fns(fns, args, 7))
        print(f"{name} R={r} harness round {rnd}: "
              + ", ".join(f"{s} {m / r * 1e3:.3f} ms/product" for s, m in med.items()), flush=True)
    for side, f in fns.items():
        print(f"  hot {side}: {timeline(f, args, r)}", flush=True)
    time.sleep(3)
    for side, f in fns.items():
        time.sleep(2)
        print(f"  cool {side}: {timeline(f, args, r)}", flush=True)
    for side, f in fns.items():
        ws = timing.time_fns({side: f}, args, 9, 0, stream=False)[side]
        pipe = statistics.median(timing.time_fns({side: f}, args, 9, 0)[side])
        print(f"  {side}: blocking call median {statistics.median(ws) * 1e3:.3f} ms (min "
              f"{min(ws) * 1e3:.3f}), in a stream {pipe * 1e3:.3f} ms per call; "
              f"3 blocking calls: {calls_timeline(f, args)}", flush=True)
    print(f"  nvidia-smi during 3 s of tcgemm: {smi_during(fns['tcgemm'], args)}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for row in sys.argv[1:]:
        run(row)
