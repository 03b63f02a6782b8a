"""Rewrite the scheduling bits of the promotion runs in compiled sm_90a SASS, in place.

A promoted fp8 piece is added into the float32 sums by a run of 64 FADD (per-tensor scales) or
FFMA (block scales: acc = part * s + acc, one scale register per row). On the rows that wait
for each piece before adding it, ptxas lets every other instruction of such a run yield, and a
yielding FFMA drops the operand-reuse cache, so every other FFMA reads its scale from the
register file again (benchmarks/NOTES.md v77). This tool
sets both bits along the runs by a policy, in any file that holds the kernels' CUDA ELF images
uncompressed: a cubin, a host object, or the built module (CMake builds the byte kernels with
-no-compress for this). It reads the images itself (ELF sections .text.<kernel>, 16-byte
instructions); no CUDA tool is needed.

Encoding (sm_90, the register forms): low word bits 0-11 the opcode (0x223 FFMA Rd, Ra, Rb,
Rc; 0x221 FADD Rd, Ra, Rb), Rd bits 16-23, Ra 24-31, Rb 32-39; FFMA's Rc in the high word's
bits 0-7. Control bits of the high word (Volta and later): stall 41-44, yield 45 (set: no
yield), write / read barrier 46-48 / 49-51, wait mask 52-57, reuse flags 58-61 (a, b, c, d).

  python tools/sass_yield.py FILE --policy {keep,reuse,yield,everyN} [--kernels REGEX]
                             [--ops FFMA,FADD] [--require] [--dry-run]
  python tools/sass_yield.py FILE --build [--dry-run]   the build's rewrite (BUILD, --require)
"""
from __future__ import annotations

import argparse
import itertools
import re
import struct
import sys

YIELD = 1 << 45          # set: the warp does not yield after this instruction
REUSE_B = 1 << 59        # keep operand b in the reuse cache for the next instruction
MIN_RUN = 16             # shorter runs of FADD / FFMA are left as they are
EM_CUDA = 190
FFMA, FADD = 0x223, 0x221
QGMMA, R2UR = 0x9F3, 0x2CA  # fp8 wgmma; a vector register moved into a uniform one
PIECE_GAP = 16              # QGMMA at most this many instructions apart: one piece's issues
NAMES = {FFMA: "FFMA", FADD: "FADD"}
# What the build applies to the module (CMake's POST_BUILD step, option TCGEMM_SASS_YIELD;
# benchmarks/NOTES.md v77-v78): the fp8 kernels' block-scale FFMA runs, every fourth yielding;
# the per-tensor FADD runs keep ptxas's bits.
FP8_SM90 = r"gemm_sm90_kernel.*fp8"  # the sm90 fp8 kernels' mangled names
BUILD = {"policy": "every4", "kernels": FP8_SM90, "ops": ("FFMA",)}


def cuda_texts(data):
    """(kernel name, offset, size) of the .text sections of every CUDA ELF image in data."""
    at = data.find(b"\x7fELF")
    while at >= 0:
        hdr = bytes(data[at:at + 64])
        if len(hdr) == 64 and hdr[4] == 2 and hdr[5] == 1 and \
                struct.unpack_from("<H", hdr, 18)[0] == EM_CUDA:
            shoff, = struct.unpack_from("<Q", hdr, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", hdr, 0x3A)
            secs = []
            for i in range(shnum):
                base = at + shoff + i * shentsize
                if shentsize < 64 or base + 64 > len(data):
                    secs = []
                    break
                name, _, _, _, off, size = struct.unpack_from("<IIQQQQ", data, base)
                secs.append((name, off, size))
            if secs and shstrndx < len(secs):
                _, stro, strs = secs[shstrndx]
                strtab = bytes(data[at + stro:at + stro + strs])
                for name, off, size in secs:
                    end = strtab.find(b"\0", name)
                    sname = strtab[name:end if end >= 0 else None].decode("latin-1")
                    if sname.startswith(".text.") and at + off + size <= len(data) and \
                            size % 16 == 0:
                        yield sname[len(".text."):], at + off, size
        at = data.find(b"\x7fELF", at + 4)


def decode(data, off):
    """(opcode, registers: Rd first, then the sources) of the instruction at off."""
    lo, hi = struct.unpack_from("<QQ", data, off)
    op = lo & 0xFFF
    regs = ((lo >> 16) & 0xFF, (lo >> 24) & 0xFF, (lo >> 32) & 0xFF)
    if op == FFMA:
        regs += (hi & 0xFF,)
    return op, regs, hi


def runs(data, off, size):
    """[(opcode, [(offset, registers, hi), ...])]: maximal runs of at least MIN_RUN FADD or
    FFMA (one opcode) in a .text section that each add into their destination (Rd = the last
    source): the promotion's sums."""
    def kind(insn):
        _, op, regs, _ = insn
        return op if op in NAMES and regs[0] == regs[-1] else None

    insns = [(at, *decode(data, at)) for at in range(off, off + size, 16)]
    out = []
    for op, group in itertools.groupby(insns, key=kind):
        group = [(at, regs, hi) for at, _, regs, hi in group]
        if op is not None and len(group) >= MIN_RUN:
            out.append((op, group))
    return out


def issue_gaps(data, kernels=FP8_SM90):
    """(gaps, with_r2ur): the stretches between consecutive QGMMA of one piece (at most
    PIECE_GAP instructions apart) in the kernels matching `kernels`, and how many of them hold
    an R2UR, i.e. a wgmma descriptor built in vector registers and moved over before its issue
    (benchmarks/NOTES.md v82: the 8-bit kernels build A's in uniform registers)."""
    gaps = with_r2ur = 0
    for name, off, size in cuda_texts(data):
        if not re.search(kernels, name):
            continue
        ops = [decode(data, at)[0] for at in range(off, off + size, 16)]
        issues = [i for i, op in enumerate(ops) if op == QGMMA]
        for a, b in zip(issues, issues[1:]):
            if b - a <= PIECE_GAP:
                gaps += 1
                with_r2ur += R2UR in ops[a + 1:b]
    return gaps, with_r2ur


def rewrite(op, run, policy):
    """New high words for one run (run: runs()' entries)."""
    his = [hi for (_, _, hi) in run]
    if policy == "keep":
        return his
    every = int(policy[5:]) if policy.startswith("every") else 0
    new = []
    for k, (_, regs, hi) in enumerate(run):
        if policy == "yield":      # every instruction yields; no reuse across a yield
            hi = (hi & ~YIELD) & ~REUSE_B
        else:
            # reuse: no yields inside the run; everyN: every N-th instruction yields. The scale
            # stays in the reuse cache from one instruction to the next where neither yields.
            yields = every and k % every == every - 1
            hi = hi & ~YIELD if yields else hi | YIELD
            if op == FFMA:
                same = k + 1 < len(run) and run[k + 1][1][2] == regs[2] and not yields
                hi = hi | REUSE_B if same else hi & ~REUSE_B
            if k == len(run) - 1:
                hi &= ~YIELD       # the run's last instruction yields
        new.append(hi)
    return new


def patch(data: bytearray, policy: str, kernels: str = r"fp8", ops=("FFMA", "FADD")):
    """Rewrite the promotion runs (of the mnemonics in ops) of the kernels whose names match
    `kernels`, in data: (runs seen, instructions changed)."""
    if not re.fullmatch(r"keep|reuse|yield|every[1-9][0-9]*", policy):
        raise ValueError(f"sass_yield: unknown policy {policy!r}")
    seen = changed = 0
    for name, off, size in list(cuda_texts(data)):
        if not re.search(kernels, name):
            continue
        for op, run in runs(data, off, size):
            if NAMES[op] not in ops:
                continue
            seen += 1
            for (at, _, hi), new in zip(run, rewrite(op, run, policy)):
                if new != hi:
                    data[at + 8:at + 16] = struct.pack("<Q", new)
                    changed += 1
    return seen, changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--policy", help="keep, reuse, yield or everyN")
    ap.add_argument("--build", action="store_true",
                    help="the build's rewrite (BUILD: policy, kernels, ops), with --require")
    ap.add_argument("--kernels", default=r"fp8", help="regex on the mangled names")
    ap.add_argument("--ops", default="FFMA,FADD", help="the runs rewritten: FFMA, FADD or both")
    ap.add_argument("--require", action="store_true",
                    help="fail where no run is found (a build step: the kernels changed)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    if args.build:
        args.policy, args.kernels, args.ops, args.require = (
            BUILD["policy"], BUILD["kernels"], ",".join(BUILD["ops"]), True)
    elif args.policy is None:
        ap.error("one of --policy or --build is required")
    with open(args.file, "rb") as f:
        data = bytearray(f.read())
    if next(cuda_texts(data), None) is None:
        sys.exit(f"sass_yield: no uncompressed CUDA ELF image in {args.file} (build the "
                 "kernels with -no-compress)")
    try:
        seen, changed = patch(data, args.policy, args.kernels, args.ops.split(","))
    except ValueError as e:
        sys.exit(str(e))
    print(f"sass_yield: {seen} runs, {changed} instructions rewritten ({args.policy})")
    if args.require and not seen:
        sys.exit(f"sass_yield: no {args.ops} promotion run in the kernels matching "
                 f"{args.kernels!r} of {args.file}")
    if not args.dry_run:
        with open(args.file, "wb") as f:
            f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
