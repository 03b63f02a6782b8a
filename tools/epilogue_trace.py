"""Per-kernel GPU time of the epilogue suite's rows, each side of the bench harness profiled
(``python tools/epilogue_trace.py epilogue_fwd_bwd_bias_gelu[,NAME...] [tcgemm,jnp,dot]``).

For each named row of the epilogue suite (jax_tcgemm.timing.EPILOGUE) and each side (tcgemm:
tg.gemm and its AD; jnp: the stock composite; dot: jnp.dot alone), runs the bench harness
(R = 2 products per jitted call), prints the median wall time per product over 5 calls, then
profiles one call (jax.profiler, CUPTI) and prints its GPU span and busy time per product and
every kernel by name: count and median duration. This is how benchmarks/NOTES.md v39 split the
fwd_bwd row into its forward, the non-GEMM passes and the backward GEMMs. Not a unit test.
"""
import glob
import statistics
import sys
import tempfile

import jax
from jax.profiler import ProfileData

from jax_tcgemm import bench, timing

R = 2


def kernels(f, args):
    """[(start ns, duration ns, name)] of the GPU kernels of one profiled call f(*args)."""
    d = tempfile.mkdtemp(prefix="epilogue_trace_")
    with jax.profiler.trace(d):
        jax.block_until_ready(f(*args))
    pd = ProfileData.from_file(glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0])
    return sorted((e.start_ns, e.duration_ns, e.name) for plane in pd.planes
                  if plane.name.startswith("/device:GPU") for line in plane.lines
                  for e in line.events if "memcpy" not in e.name.lower())


def main():
    names = sys.argv[1].split(",")
    sides = sys.argv[2].split(",") if len(sys.argv) > 2 else ["tcgemm", "jnp", "dot"]
    for case in timing.cases("epilogue"):
        if case.name not in names:
            continue
        ops, a_list, shared = bench._problem(case, R)
        for side in sides:
            f = timing.harness(ops[side])
            args = (a_list, *shared)
            wall = timing.time_fn(f, args, reps=5, warmup=3) / R * 1e3
            ev = kernels(f, args)
            if not ev:
                print(f"== {case.name} {side}: no GPU kernels in the trace (no GPU, or no CUPTI)")
                continue
            span = (ev[-1][0] + ev[-1][1] - ev[0][0]) / 1e6 / R
            busy = sum(e[1] for e in ev) / 1e6 / R
            print(f"== {case.name} {side}: wall {wall:.3f} ms/product, GPU span {span:.3f}, "
                  f"busy {busy:.3f}", flush=True)
            by_name: dict = {}
            for e in ev:
                by_name.setdefault(e[2][:90], []).append(e[1] / 1e6)
            for name, ds in by_name.items():
                print(f"   {len(ds):3d} x {statistics.median(ds):7.3f} ms  {name}")


if __name__ == "__main__":
    main()
