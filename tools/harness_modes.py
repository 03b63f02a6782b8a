"""The two ways timing.time_fns can time a call, side by side on bench rows
(``python tools/harness_modes.py ROW ...``, ROW a lowp or f32 row name, e.g. lowp_fp8_8192).

For each row: the bench's two sides (harness_gap.row_sides: R products per call,
optimization_barrier each), then `--rounds` rounds of (blocking, stream) medians of `--reps`
interleaved calls per side (timing.time_fns with stream=False / True), each phase with
nvidia-smi sampled every 100 ms (median SM clock and power, the throttle reasons seen).
Prints ms per call, TFLOP/s and the ratio of each phase. Not a unit test; a measuring tool
for benchmarks/NOTES.md (v74)."""
from __future__ import annotations

import argparse

from harness_gap import row_sides, smi_start, smi_stop  # tools/ (this script's directory)
from jax_tcgemm import timing


def run(name: str, reps: int, rounds: int) -> None:
    got = row_sides(name)
    if got is None:
        return
    case, r, args, fns = got
    for rnd in range(rounds):
        for stream in (False, True):
            smi = smi_start(units=False)
            med = timing.medians(timing.time_fns(fns, args, reps, stream=stream))
            tf = {s: r * case.flops / m / 1e12 for s, m in med.items()}
            print(f"{name} R={r} round {rnd} {'stream  ' if stream else 'blocking'}: "
                  + ", ".join(f"{s} {m * 1e3:.3f} ms/call {tf[s]:.1f}" for s, m in med.items())
                  + f", ratio {tf['tcgemm'] / tf['jnp']:.4f}; {smi_stop(smi)}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args()
    for row in ns.rows:
        run(row, ns.reps, ns.rounds)
