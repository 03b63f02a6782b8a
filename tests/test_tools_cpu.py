"""CPU tests of the measuring tools under tools/ (not a package; each loaded from its file):
harness_trace and pack_ab end to end on tiny products, sass_yield on synthetic CUDA ELF images
and on the built module (its POST_BUILD promotion bits, the fp8 pieces' uniform descriptors),
ncu_stalls on a synthetic source-page CSV."""
import csv
import importlib.util
import io

import jax
import pytest

ON_GPU = jax.default_backend() == "gpu"


def _tool(name: str):
    """tools/<name>.py loaded as a module (tools/ is not a package)."""
    import pathlib
    spec = importlib.util.spec_from_file_location(
        name, pathlib.Path(__file__).parents[1] / "tools" / f"{name}.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_harness_trace_tool_runs(monkeypatch, capsys):
    """tools/harness_trace.py (wall time vs GPU span per product) on a tiny product: one line per
    side with a positive wall time; without a GPU the timeline says it has no GPU events."""
    import sys
    tool = _tool("harness_trace")
    monkeypatch.setattr(tool, "R", 4)
    monkeypatch.setattr(sys, "argv", ["harness_trace.py", "2x16x24x32"])
    tool.main()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "2x16x24x32" in ln]
    assert [ln.split()[0] for ln in lines] == ["jnp", "tcgemm"]
    for ln in lines:
        wall = float(ln.split("wall ")[1].split()[0])
        assert wall > 0
        assert "GPU events" in ln or (ON_GPU and "GPU span" in ln)  # no CUPTI: no GPU events


def test_pack_ab_tool_runs(monkeypatch, capsys):
    """tools/pack_ab.py (pitch packing on / off / jnp.dot in one harness run) on a tiny product:
    one line with three positive timings; a product this small never packs."""
    from jax_tcgemm import configs
    if not configs.CONFIGS:
        pytest.skip("the tool plans with the config table, read from the built extension "
                    "jax_tcgemm._tcgemm (not built here)")
    tool = _tool("pack_ab")
    monkeypatch.setattr(tool, "R", 2)
    limit = tool.configs.PITCH_PACK_MIN_FLOP
    assert tool.main(["16x24x520", "--reps", "1"]) == 0
    assert tool.configs.PITCH_PACK_MIN_FLOP == limit  # restored
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("16x24x520")]
    assert "packs=False" in line and "R=2" in line
    for side in ("pack", "nopack", "jnp"):
        assert float(line.split(f" {side} ")[1].split()[0]) > 0, line


def _cuda_elf(texts, machine=190):
    """A minimal ELF64 image with one .text.<name> section per (name, code) of texts."""
    import struct
    names = b"\0.shstrtab\0" + b"".join(b".text." + n.encode() + b"\0" for n, _ in texts)
    body, secs, at = b"", [], 64
    for code in [names] + [c for _, c in texts]:
        pad = -at % 16
        body += b"\0" * pad
        at += pad
        secs.append((at, len(code)))
        body += code
        at += len(code)
    shoff = at + (-at % 8)
    body += b"\0" * (shoff - at)
    name_at = [names.index(b".shstrtab")] + [names.index(b".text." + n.encode()) for n, _ in texts]
    shdrs = b"\0" * 64 + b"".join(struct.pack("<IIQQQQIIQQ", na, 1, 0, 0, off, size, 0, 0, 16, 0)
                                   for na, (off, size) in zip(name_at, secs))
    hdr = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9 + struct.pack(
        "<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(secs) + 1, 1)
    return hdr + body + shdrs


def _promotion_code(tool, n_ffma=20, n_fadd=17):
    """16-byte instructions: an FMUL, a promotion run of FFMA in ptxas's pattern (scale R142
    reused into every other one, which does not yield), a FADD run, then FFMA that do not
    accumulate (an epilogue's)."""
    import struct
    base = 0x000FE20000000000 | (1 << 41)  # stall 1

    def ffma(d, a, b, c, hi):
        return struct.pack("<QQ", (b << 32) | (a << 24) | (d << 16) | 0x7223, hi | c)

    code = struct.pack("<QQ", 0x00000012098E7C20, base)  # FMUL R142, R9, UR18
    for k in range(n_ffma):
        code += ffma(100 + k, 24 + k, 142, 100 + k,
                     base | (tool.YIELD | tool.REUSE_B if k % 2 == 0 else 0))
    for k in range(n_fadd):
        code += struct.pack("<QQ", ((k + 4) << 32) | ((k + 40) << 24) | ((k + 4) << 16) | 0x7221,
                            base | (tool.YIELD if k % 2 == 0 else 0))
    for k in range(16):
        code += ffma(60 + k, 24 + k, 3, 2, base)
    return code


def test_sass_yield_rewrites_promotion_runs_only(tmp_path):
    """tools/sass_yield.py on synthetic CUDA ELF images inside a larger file: it finds the
    accumulating FFMA and FADD runs of the kernels it is asked for (not the epilogue's FFMA,
    the FMUL, another kernel or a non-CUDA ELF), keeps them under `keep`, and under everyN
    yields at every N-th instruction of a run and keeps the scale in the reuse cache between
    the others, changing nothing else."""
    import struct
    tool = _tool("sass_yield")
    code = _promotion_code(tool)
    blob = (b"\x11" * 24 + _cuda_elf([("fp8_kernel", code), ("int8_kernel", code)]) +
            b"\x22" * 40 + _cuda_elf([("fp8_kernel", code)], machine=62))
    texts = list(tool.cuda_texts(blob))
    assert [n for n, _, _ in texts] == ["fp8_kernel", "int8_kernel"]
    name, off, size = texts[0]
    assert blob[off:off + size] == code
    assert [(op, len(r)) for op, r in tool.runs(blob, off, size)] == [(0x223, 20), (0x221, 17)]
    data = bytearray(blob)
    assert tool.patch(data, "keep") == (2, 0) and data == blob
    assert tool.patch(data, "every4", kernels="nomatch") == (0, 0) and data == blob
    seen, changed = tool.patch(data, "every4")
    assert seen == 2 and changed > 0 and len(data) == len(blob)
    assert [i for i in range(len(blob)) if data[i] != blob[i]] and \
        all(off <= i < off + size and (i - off) % 16 >= 8 for i in range(len(blob))
            if data[i] != blob[i])  # only the fp8 kernel's high words
    his = [struct.unpack_from("<Q", data, off + 16 * i + 8)[0] for i in range(size // 16)]
    old = [struct.unpack_from("<Q", code, 16 * i + 8)[0] for i in range(size // 16)]
    mask = tool.YIELD | tool.REUSE_B
    for k, hi in enumerate(his[1:21]):
        yields = k % 4 == 3 or k == 19
        assert bool(hi & tool.YIELD) != yields, k
        assert bool(hi & tool.REUSE_B) == (not yields and k < 19), k
    assert [bool(hi & tool.YIELD) for hi in his[21:38]] == [k % 4 != 3 and k != 16
                                                            for k in range(17)]
    assert [h & ~mask for h in his] == [h & ~mask for h in old]
    assert his[0] == old[0] and his[38:] == old[38:]
    only = bytearray(blob)  # the FFMA runs alone: the FADD run's words as they were
    assert tool.patch(only, "every4", ops=("FFMA",))[0] == 1
    assert only[off + 21 * 16:off + 38 * 16] == blob[off + 21 * 16:off + 38 * 16]
    assert only[off:off + 21 * 16] == data[off:off + 21 * 16]
    again = bytearray(data)  # idempotent
    assert tool.patch(again, "every4")[1] == 0 and again == data
    path = tmp_path / "m.bin"
    path.write_bytes(blob)
    assert tool.main([str(path), "--policy", "yield"]) == 0
    assert path.read_bytes() != blob
    with pytest.raises(SystemExit, match="no FFMA promotion run"):
        tool.main([str(path), "--policy", "keep", "--ops", "FFMA", "--kernels", "bf16",
                   "--require"])
    with pytest.raises(SystemExit, match="no FFMA promotion run"):  # --build requires runs
        tool.main([str(path), "--build", "--dry-run"])  # (no gemm_sm90_kernel here)
    with pytest.raises(ValueError, match="unknown policy"):
        tool.patch(bytearray(blob), "every")
    (tmp_path / "z.bin").write_bytes(b"\0" * 64)
    with pytest.raises(SystemExit, match="no uncompressed CUDA ELF"):
        tool.main([str(tmp_path / "z.bin"), "--policy", "keep"])


def _built_module():
    """(path, bytes) of the installed CUDA extension; the test skips where it is not built."""
    spec = importlib.util.find_spec("jax_tcgemm._tcgemm")
    if spec is None or not spec.origin:
        pytest.skip("CUDA extension jax_tcgemm._tcgemm not built")
    with open(spec.origin, "rb") as f:
        return spec.origin, bytearray(f.read())


def test_built_module_carries_the_every4_promotion_bits():
    """The build's POST_BUILD step (CMake option TCGEMM_SASS_YIELD, on by default) left the
    fp8 kernels' block-scale FFMA runs in the every4 form: the tool finds them and has nothing
    left to change there, while the per-tensor FADD runs keep ptxas's own bits (every4 would
    change them)."""
    origin, data = _built_module()
    tool = _tool("sass_yield")
    build = tool.BUILD
    assert build["policy"] == "every4" and build["ops"] == ("FFMA",)
    seen, changed = tool.patch(data, build["policy"], build["kernels"], build["ops"])
    assert seen > 0, f"no fp8 FFMA promotion run in {origin}"
    assert changed == 0, (f"{changed} FFMA of {seen} runs not in the every4 form: "
                          f"{origin} was built with TCGEMM_SASS_YIELD=OFF")
    fadd_seen, fadd_changed = tool.patch(data, build["policy"], build["kernels"], ("FADD",))
    assert fadd_seen > 0 and fadd_changed > 0


def test_built_module_issues_fp8_pieces_from_uniform_descriptors():
    """The fp8 sm90 kernels of the built module issue each piece's QGMMA with no R2UR between
    them: the consumer warpgroup's index is broadcast from lane 0, so A's wgmma descriptors are
    built in uniform registers (benchmarks/NOTES.md v82; d83cb26's module had an R2UR in 87 of
    its 102 such gaps)."""
    origin, data = _built_module()
    tool = _tool("sass_yield")
    gaps, with_r2ur = tool.issue_gaps(data)
    assert gaps > 0, f"no fp8 QGMMA pieces found in {origin}"
    assert with_r2ur == 0, f"{with_r2ur} of {gaps} QGMMA issue gaps move a descriptor by R2UR"


def test_ncu_stalls_report(tmp_path):
    """tools/ncu_stalls.py report on a synthetic ncu source-page CSV: samples per opcode, the
    hot loop with a run of FFMA folded into one line, and the samples no stall column names
    ('other') shown where they are."""
    tool = _tool("ncu_stalls")
    header = ["Address", "Source", tool.SAMPLES, tool.EXECUTED, "stall_wait", "stall_dispatch",
              "stall_wait (Not Issued)"]
    body = [["0x0", "LDC R1, c[0x0][0x28]", "5", "10", "5", "0", "5"],
            ["0x10", "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR20], RZ, !UPT", "90", "1000",
             "10", "0", "0"]]
    body += [[f"0x{32 + 16 * i:x}", f"FFMA R{4 + i}, R{24 + i}, R90, R{4 + i}", "3", "1000",
              "1", "2", "0"] for i in range(5)]
    body += [["0x80", "@!P0 BRA 0x10", "4", "1000", "0", "4", "0"]]
    path = tmp_path / "src.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(header)
        w.writerows(body)
    buf = io.StringIO()
    got = tool.summarise(*tool.read(str(path)), out=buf)
    assert got["samples"] == 5 + 90 + 15 + 4
    assert got["by_opcode"]["FFMA"]["samples"] == 15 and got["by_opcode"]["FFMA"]["dispatch"] == 10
    assert got["by_opcode"]["BRA"]["executed"] == 1000
    loop = [(op, n, s) for op, n, s, *_ in got["loop"]]
    assert loop == [("QGMMA", 1, 90), ("FFMA", 5, 15), ("BRA", 1, 4)]  # LDC: not hot
    text = buf.getvalue()
    assert "other=80" in text and "[5 x FFMA]" in text and "LDC" in text.split("hot loop")[0]
    assert tool.opcode("@!P0 BRA 0x10") == "BRA" and tool.opcode("") == "?"
