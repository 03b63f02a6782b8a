"""A/B of pitch packing in the benchmark harness: per product, tcgemm with the default packing
rule, tcgemm with pitch packing off (configs.PITCH_PACK_MIN_FLOP raised past any product), and
jnp.dot, all in one run with the sides interleaved (jax_tcgemm.bench's harness and time_fns).

    python tools/pack_ab.py MxNxK [MxNxK ...] [--dtype float16|bfloat16] [--reps N]

Each rule's program is lowered and compiled ahead of time under that rule (the packing choice
is made while lowering), so both stay fixed while they are timed. Prints one line per shape:
microseconds per product, TFLOP/s, and each tcgemm side's ratio to jnp.dot; `packs` says whether
the default rule's custom call packs at all. benchmarks/NOTES.md v18 has the H100 numbers.
"""
from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp

import jax_tcgemm as tg
from jax_tcgemm import bench, configs

R = None  # products per call; None: bench.choose_reps (tests set a small number)


def compiled_under(limit: int, a, b):
    """The harness over tg.matmul, lowered and compiled with PITCH_PACK_MIN_FLOP = limit."""
    saved = configs.PITCH_PACK_MIN_FLOP
    configs.PITCH_PACK_MIN_FLOP = limit
    try:
        jax.clear_caches()  # lower again under this rule
        lowered = bench._harness(tg.matmul, True).lower(a, b)
        return lowered.compile(), "pack = true" in lowered.as_text()
    finally:
        configs.PITCH_PACK_MIN_FLOP = saved


def run(spec: str, dtype, reps: int) -> str:
    m, n, k = (int(x) for x in spec.lower().split("x"))
    r = R or bench.choose_reps(2 * m * n * k)
    a, b = bench.harness_operands(r, (m, k), (k, n), dtype, k)
    fns = {}
    fns["pack"], packs = compiled_under(configs.PITCH_PACK_MIN_FLOP, a, b)
    fns["nopack"], _ = compiled_under(2**62, a, b)
    fns["jnp"] = bench._harness(jnp.matmul, True)
    times = bench.time_fns(fns, (a, b), reps)
    us = {name: statistics.median(t) / r * 1e6 for name, t in times.items()}
    flop = 2 * m * n * k
    plan = configs.plan(m, n, k, arch=configs.device_arch())
    return (f"{spec} {jnp.dtype(dtype).name} R={r} plan={plan[0]} split={plan[1]} packs={packs}: "
            + "  ".join(f"{name} {t:.1f} us ({flop / t / 1e6:.0f} TFLOP/s)" for name, t in us.items())
            + f"  pack/jnp {us['jnp'] / us['pack']:.3f}x  nopack/jnp {us['jnp'] / us['nopack']:.3f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shapes", nargs="+", metavar="MxNxK")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args(argv)
    for spec in args.shapes:
        print(run(spec, jnp.dtype(args.dtype), args.reps), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
