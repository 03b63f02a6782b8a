"""Energy per product of the bench's two sides, in sustained back-to-back calls
(``python tools/harness_energy.py ROW ... [--seconds 1.5] [--rounds 2]``, ROW a lowp or f32
row name, e.g. lowp_fp8_8192).

For each row: the bench's two sides (harness_gap.row_sides: R products per call, every
product's operands through their own optimization_barrier), then `--rounds` rounds in which
each side in turn runs calls back to back for `--seconds` (each call dispatched while the one
before it is on the GPU, as the bench's stream timing runs them), after one untimed call.
NVML's energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ) is read at the start and the
end of each phase, nvidia-smi samples the SM clock and power meanwhile (harness_gap.smi_start).
Prints per side and phase: calls, ms per call, TFLOP/s, J per product, the counter's mean W, the
samples' medians. Under a power cap
the rate is the cap over the energy per product; this shows which side spends less.
Not a unit test; a measuring tool for benchmarks/NOTES.md (v88)."""
from __future__ import annotations

import argparse
import ctypes
import time

import jax

from harness_gap import row_sides, smi_start, smi_stop  # tools/ (this script's directory)


class Nvml:
    """NVML's energy counter, through ctypes (no Python binding on the device)."""

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.h = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")

    def energy_mj(self) -> int:
        e = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(e)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
        return e.value


def phase(nv: Nvml, fn, args, seconds: float) -> dict:
    jax.block_until_ready(fn(*args))
    smi = smi_start(units=False)
    e0, t0 = nv.energy_mj(), time.perf_counter()
    prev, calls = fn(*args), 1
    while time.perf_counter() - t0 < seconds:
        cur = fn(*args)
        jax.block_until_ready(prev)
        prev, calls = cur, calls + 1
    jax.block_until_ready(prev)
    t1, e1 = time.perf_counter(), nv.energy_mj()
    return dict(calls=calls, s=t1 - t0, j=(e1 - e0) / 1e3, smi=smi_stop(smi))


def run(nv: Nvml, name: str, seconds: float, rounds: int) -> None:
    got = row_sides(name)
    if got is None:
        return
    case, r, args, fns = got
    for rnd in range(rounds):
        for side, fn in fns.items():
            p = phase(nv, fn, args, seconds)
            products = p["calls"] * r
            print(f"{name} R={r} round {rnd} {side:6s}: {p['calls']} calls, "
                  f"{p['s'] / p['calls'] * 1e3:.3f} ms/call, "
                  f"{products * case.flops / p['s'] / 1e12:.1f} TFLOP/s, "
                  f"{p['j'] / products:.4f} J/product, {p['j'] / p['s']:.0f} W (counter); {p['smi']}",
                  flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=2)
    ns = ap.parse_args()
    nv = Nvml()
    for row in ns.rows:
        run(nv, row, ns.seconds, ns.rounds)
