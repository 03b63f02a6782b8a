"""Energy per product of the bench's two sides, in sustained back-to-back calls
(``python tools/harness_energy.py ROW ... [--seconds 1.5] [--rounds 2]``, ROW a lowp or f32
row name, e.g. lowp_fp8_8192).

For each row: the bench's two sides (harness_gap.row_sides: R products per call, every
product's operands through their own optimization_barrier), then `--rounds` rounds in which
each side in turn runs calls back to back for `--seconds` (each call dispatched while the one
before it is on the GPU, as the bench's stream timing runs them), after one untimed call.
NVML's energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ) is read at the start and the
end of each phase, the SM clock and power sampled every 20 ms in between. Prints per side and
phase: calls, ms per call, TFLOP/s, J per product, mean W, median SM MHz. Under a power cap
the rate is the cap over the energy per product; this shows which side spends less.
Not a unit test; a measuring tool for benchmarks/NOTES.md (v88)."""
from __future__ import annotations

import argparse
import ctypes
import statistics
import threading
import time

import jax

from harness_gap import row_sides  # tools/ (this script's directory)


class Nvml:
    """The few NVML calls this needs, through ctypes (no Python binding on the device)."""

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

    def sm_mhz(self) -> int:
        c = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(c))  # NVML_CLOCK_SM
        return c.value

    def watts(self) -> float:
        p = ctypes.c_uint()
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(p))  # mW
        return p.value / 1e3


def phase(nv: Nvml, fn, args, seconds: float) -> dict:
    jax.block_until_ready(fn(*args))
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((nv.sm_mhz(), nv.watts()))
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    e0, t0 = nv.energy_mj(), time.perf_counter()
    th.start()
    prev, calls = fn(*args), 1
    while time.perf_counter() - t0 < seconds:
        cur = fn(*args)
        jax.block_until_ready(prev)
        prev, calls = cur, calls + 1
    jax.block_until_ready(prev)
    t1, e1 = time.perf_counter(), nv.energy_mj()
    stop.set()
    th.join()
    return dict(calls=calls, s=t1 - t0, j=(e1 - e0) / 1e3,
                mhz=statistics.median(s[0] for s in samples) if samples else 0.0,
                w=statistics.mean(s[1] for s in samples) if samples else 0.0)


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
                  f"{p['j'] / products:.4f} J/product, {p['j'] / p['s']:.0f} W (counter), "
                  f"{p['w']:.0f} W / SM {p['mhz']:.0f} MHz (sampled)", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=2)
    ns = ap.parse_args()
    nv = Nvml()
    for row in ns.rows:
        run(nv, row, ns.seconds, ns.rounds)
