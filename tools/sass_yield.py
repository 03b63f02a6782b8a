"""Rewrite the scheduling bits of the promotion runs in compiled sm_90a SASS, in place.

A promoted fp8 piece is added into the float32 sums by a run of 64 FADD (per-tensor scales) or
FFMA (block scales: acc = part * s + acc, one scale register per row). ptxas alternates the
yield hint along such a run, and a yielding FFMA drops the operand-reuse cache, so every other
FFMA reads its scale from the register file again. This tool sets both bits along the runs by a
policy and writes the instructions back where they lie in the file (an uncompressed fatbin: the
byte kernels are built with -no-compress), so the same 16-byte words are found and replaced.

Control bits of an instruction's high 64-bit word (Volta and later): stall 41-44, yield 45 (1:
no yield), write / read barrier 46-48 / 49-51, wait mask 52-57, reuse flags 58-61 (a, b, c, d).

  python tools/sass_yield.py FILE --policy {keep,reuse,yield,everyN} [--kernels REGEX] [--dry-run]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

YIELD = 1 << 45          # set: the warp does not yield after this instruction
REUSE_B = 1 << 59        # keep operand b in the reuse cache for the next instruction
MIN_RUN = 16             # shorter runs of FADD / FFMA are left as they are

_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")
_HI = re.compile(r"^\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")


def cuobjdump() -> str:
    for cand in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                 "/usr/local/cuda/bin/cuobjdump"):
        if cand and os.path.isfile(cand):
            return cand
    try:
        import nvidia  # PyPI's nvidia-cuda-cuobjdump
        for d in nvidia.__path__:
            c = os.path.join(d, "cu13", "bin", "cuobjdump")
            if os.path.isfile(c):
                return c
    except ImportError:
        pass
    sys.exit("sass_yield: no cuobjdump (set CUOBJDUMP)")


def functions(path: str):
    """(name, [(mnemonic, operands, lo, hi)]) of every sm_90a function in the file."""
    out = subprocess.run([cuobjdump(), "-sass", "-arch", "sm_90a", path], check=True,
                         capture_output=True, text=True).stdout
    yield from parse_sass(out)


def parse_sass(text: str):
    """functions() of cuobjdump -sass's text."""
    name, insns, pending = None, [], None
    for line in text.splitlines():
        if "Function :" in line:
            if name:
                yield name, insns
            name, insns, pending = line.split("Function :")[1].strip(), [], None
            continue
        m = _INSN.match(line)
        if m:
            text = m.group(2)
            text = re.sub(r"^@!?U?P\w+\s+", "", text)
            op, _, rest = text.partition(" ")
            pending = (op, rest, int(m.group(3), 16))
            continue
        m = _HI.match(line)
        if m and pending:
            insns.append(pending + (int(m.group(1), 16),))
            pending = None
    if name:
        yield name, insns


def runs(insns):
    """Maximal runs of at least MIN_RUN FADD or FFMA (one mnemonic) that accumulate."""
    i = 0
    while i < len(insns):
        op = insns[i][0]
        j = i
        while j < len(insns) and insns[j][0] == op:
            j += 1
        if op in ("FADD", "FFMA") and j - i >= MIN_RUN and all(
                regs(ins[1])[0] == regs(ins[1])[-1] for ins in insns[i:j]):
            yield op, i, j  # sums: each writes the register it adds into
        i = max(j, i + 1)


def regs(operands: str):
    return [t.strip().split(".")[0] for t in operands.split(",")]


def rewrite(op, run, policy):
    """New high words for one run."""
    his = [hi for (_, _, _, hi) in run]
    if policy == "keep":
        return his
    new = []
    for k, (_, ops, _, hi) in enumerate(run):
        if policy == "yield":      # every instruction yields; no reuse across a yield
            hi = (hi & ~YIELD) & ~REUSE_B
        elif policy == "reuse" or policy.startswith("every"):
            # reuse: no yields inside the run; everyN: every N-th instruction yields. The scale
            # stays in the reuse cache from one instruction to the next where neither yields.
            every = int(policy[5:]) if policy.startswith("every") else 0
            yields = every and k % every == every - 1
            hi = hi & ~YIELD if yields else hi | YIELD
            if op == "FFMA":
                nxt = run[k + 1][1] if k + 1 < len(run) else None
                same = nxt is not None and regs(nxt)[2] == regs(ops)[2] and not yields
                hi = hi | REUSE_B if same else hi & ~REUSE_B
            if k == len(run) - 1:
                hi &= ~YIELD       # the run's last instruction yields
        new.append(hi)
    return new


def word(lo, hi) -> bytes:
    return lo.to_bytes(8, "little") + hi.to_bytes(8, "little")


def patch(data: bytearray, funcs, policy: str, kernels: str = r"fp8"):
    """Rewrite the runs of `funcs` (functions()) in `data`: (runs seen, runs rewritten)."""
    patched = runs_seen = 0
    for name, insns in funcs:
        if not re.search(kernels, name):
            continue
        for op, i, j in runs(insns):
            run = insns[i:j]
            old = b"".join(word(lo, hi) for (_, _, lo, hi) in run)
            new = b"".join(word(lo, hi) for (_, _, lo, _), hi in
                           zip(run, rewrite(op, run, policy)))
            runs_seen += 1
            at = data.find(old)
            if at < 0:
                if data.find(new) >= 0:
                    continue  # an identical run elsewhere was rewritten already
                raise ValueError(f"sass_yield: run {op} x{j - i} of {name} not found verbatim "
                                 "(a compressed fatbin? build with -no-compress)")
            while at >= 0:
                data[at:at + len(old)] = new
                patched += old != new
                at = data.find(old, at + len(old))
    return runs_seen, patched


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--policy", required=True, help="keep, reuse, yield or everyN")
    ap.add_argument("--kernels", default=r"fp8", help="regex on the mangled names")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    data = bytearray(open(args.file, "rb").read())
    if not re.fullmatch(r"keep|reuse|yield|every[1-9][0-9]*", args.policy):
        ap.error(f"unknown policy {args.policy!r}")
    try:
        runs_seen, patched = patch(data, functions(args.file), args.policy, args.kernels)
    except ValueError as e:
        sys.exit(str(e))
    print(f"sass_yield: {runs_seen} runs, {patched} rewritten ({args.policy})")
    if not args.dry_run:
        open(args.file, "wb").write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
