"""Where the warps of one sm90 fp8 launch wait, instruction by instruction (benchmarks/NOTES.md
v78). Two halves:

  launch: one e4m3 x e4m3 -> bf16 product (M = N = K = 8192 unless --size; b (N, K)) with block
          or per-tensor scales, forced onto one row (scaled.kernel_config), for ncu to profile:
      ncu --kernel-name regex:gemm_sm90_kernel --launch-count 1 --clock-control base \\
          --section WarpStateStats --section SourceCounters -o blk \\
          python -P tools/ncu_stalls.py launch block sm90_192x128x64_s4_g3_f8
      ncu --import blk.ncu-rep --page source --csv --print-source sass > blk.csv
  report: that CSV summarised: samples per opcode with their main stall reasons, then the hot
          loop (the instructions executed at least --hot times the most-executed one's count),
          one line each with its samples, the stall columns' share and the samples no stall
          column names ('other': on Hopper, a wgmma waiting for its warpgroup), runs of FFMA /
          FADD folded into one line:
      python tools/ncu_stalls.py report blk.csv [tensor.csv ...]
"""
from __future__ import annotations

import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
RUNS = ("FFMA", "FADD")


def launch(mode: str, row: str, size: int) -> None:
    import jax
    import jax.numpy as jnp
    import jax_tcgemm as tg
    from jax_tcgemm import scaled
    scaled.kernel_config = lambda *_, **__: (row, 1)
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (size, size), jnp.float32).astype(jnp.float8_e4m3fn)
    b = (jax.random.normal(kb, (size, size), jnp.float32) / 4).astype(jnp.float8_e4m3fn)
    blocks = -(-size // 128)  # 128-blocks of K (and of N): a (M, Kb), b (Nb, Kb) for (N, K) b
    if mode == "block":
        sa = jax.random.uniform(ka, (size, blocks), jnp.float32, 0.5, 2)
        sb = jax.random.uniform(kb, (blocks, blocks), jnp.float32, 0.5, 2)
    else:
        sa, sb = jnp.float32(1.5), jnp.float32(0.75)
    f = jax.jit(lambda *x: tg.scaled_matmul(*x, out_dtype=jnp.bfloat16, transpose_b=True))
    out = f(a, b, sa, sb).block_until_ready()
    print(f"{mode} on {row}: {out.shape} {out.dtype}")


def read(path: str):
    """(header, rows) of ncu's source-page CSV (a 'Kernel Name' line may come first)."""
    with open(path, newline="", errors="replace") as f:
        rows = list(csv.reader(f))
    at = next(i for i, r in enumerate(rows) if "Source" in r and SAMPLES in r)
    return rows[at], rows[at + 1:]


def opcode(source: str) -> str:
    words = source.split()
    if not words:
        return "?"
    return (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]


def summarise(header, rows, hot: float = 0.5, out=sys.stdout) -> dict:
    """Print the report of one launch; return {'samples', 'by_opcode', 'loop'} for callers."""
    ix = {c: i for i, c in enumerate(header)}
    stalls = [c for c in header if c.startswith("stall_") and "(Not Issued)" not in c]

    def num(r, c):
        try:
            return float(r[ix[c]].replace(",", ""))
        except (KeyError, IndexError, ValueError):
            return 0.0

    src = ix["Source"]
    total = sum(num(r, SAMPLES) for r in rows)
    by_op = collections.defaultdict(collections.Counter)
    for r in rows:
        c = by_op[opcode(r[src])]
        c["samples"] += num(r, SAMPLES)
        c["executed"] += num(r, EXECUTED)
        for s in stalls:
            c[s[6:]] += num(r, s)
    print(f"{int(total)} samples, {sum(num(r, EXECUTED) for r in rows) / 1e6:.1f} M instructions",
          file=out)
    for op, c in sorted(by_op.items(), key=lambda kv: -kv[1]["samples"])[:16]:
        why = sorted(((v, k) for k, v in c.items() if k not in ("samples", "executed")),
                     reverse=True)[:4]
        print(f"  {op:10s} {int(c['samples']):7d} samples {c['executed'] / 1e6:8.1f} M  " +
              ", ".join(f"{k}={int(v)}" for v, k in why if v), file=out)
    peak = max((num(r, EXECUTED) for r in rows), default=0.0)
    loop = [r for r in rows if peak and num(r, EXECUTED) >= hot * peak]
    print(f"hot loop: {len(loop)} instructions executed >= {hot:g} x {peak / 1e6:.2f} M", file=out)
    folded = []
    for r in loop:
        op, s = opcode(r[src]), num(r, SAMPLES)
        if folded and op in RUNS and folded[-1][0] == op and folded[-1][3]:
            folded[-1][1] += 1
            folded[-1][2] += s
            continue
        named = sum(num(r, c) for c in stalls)
        why = sorted(((num(r, c), c[6:]) for c in stalls), reverse=True)[:3]
        text = ", ".join(f"{k}={int(v)}" for v, k in why if v)
        if s - named > 0.5:
            text += f", other={int(s - named)}"
        folded.append([op, 1, s, op in RUNS, r[src].strip(), text])
    for op, n, s, is_run, source, text in folded:
        label = f"[{n} x {op}]" if is_run and n > 1 else source[:58]
        print(f"  {int(s):6d}  {label:58s} {'' if is_run and n > 1 else text}", file=out)
    return {"samples": total, "by_opcode": dict(by_op), "loop": folded}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    la = sub.add_parser("launch")
    la.add_argument("mode", choices=("block", "tensor"))
    la.add_argument("row", help="a config name, e.g. sm90_192x128x64_s4_g3_f8")
    la.add_argument("--size", type=int, default=8192)
    rp = sub.add_parser("report")
    rp.add_argument("csv", nargs="+")
    rp.add_argument("--hot", type=float, default=0.5)
    args = ap.parse_args(argv)
    if args.cmd == "launch":
        launch(args.mode, args.row, args.size)
        return 0
    for path in args.csv:
        print(f"== {path}")
        summarise(*read(path), hot=args.hot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
