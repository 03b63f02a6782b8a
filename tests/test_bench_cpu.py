"""CPU tests of jax_tcgemm.bench and jax_tcgemm.timing: case tables (DESIGN §8, the epilogue
suite of issue 22), the R rule, the CLI, the no-GPU path, the import structure and, with
--force, the timing harness end to end on tiny shapes (GEMM and epilogue rows)."""
import importlib.util
import itertools
import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_tcgemm import bench, timing

ON_GPU = jax.default_backend() == "gpu"
ROW_FIELDS = {"name", "m", "n", "k", "batch", "dtype", "layout", "config",
              "tcgemm_tflops", "jnp_tflops", "ratio", "rel_err"}
# beside the stream's figures (timing.time_sides): the blocking calls and the stream's dispatch
TIMING_FIELDS = {"tcgemm_ms", "jnp_ms", "tcgemm_ms_blocking", "jnp_ms_blocking", "ratio_blocking",
                 "tcgemm_dispatch_ms", "jnp_dispatch_ms"}


def shapes(cs):
    return [(c.m, c.n, c.k, c.batch) for c in cs]


def test_llm_suite_is_llama2_projections():
    one = bench.cases("llm", ("float16",))
    assert len(one) == 4 * 5
    want = {(m, n, k, 1) for m in (16, 128, 4096, 8192) for n, k in
            [(11008, 4096), (4096, 11008), (28672, 8192), (8192, 28672), (4096, 4096)]}
    assert set(shapes(one)) == want and len(set(c.name for c in one)) == 20
    assert all(c.dtype == "float16" and c.layout == "NN" and not c.vmap for c in one)
    both = bench.cases("llm", ("float16", "bfloat16"))
    assert len(both) == 40
    assert sorted(shapes(c for c in both if c.dtype == "bfloat16")) == sorted(shapes(one))


def test_other_suites_match_design():
    sq = bench.cases("square", ("float16",))
    assert shapes(sq) == [(s, s, s, 1) for s in (1024, 2048, 4096, 8192, 16384)]
    assert set(shapes(bench.cases("odd", ("bfloat16",)))) == {(4095, 4097, 4093, 1), (1000, 1000, 1000, 1)}
    bt = bench.cases("batched", ("float16",))
    assert set(shapes(bt)) == {(256, 256, 256, 64), (1024, 1024, 128, 32)}
    assert all(c.vmap for c in bt)
    f32 = bench.cases("f32", ("float16", "bfloat16"))
    assert [(c.m, c.n, c.k, c.dtype) for c in f32] == [(4096, 4096, 4096, "float32")]
    every = bench.cases("all", ("float16", "bfloat16"))
    assert len(every) == 2 * (5 + 20 + 2 + 2) + 1 + 5
    assert len({(c.name, c.dtype) for c in every}) == len(every)
    with pytest.raises(ValueError, match="unknown suite"):
        bench.cases("nope")


EPILOGUE_ROWS = [  # issue 22's table: name, (m, n, k), dtype, op, activation
    ("epilogue_seed001", (4096, 4096, 4096), "float16", "axpby", None),
    ("epilogue_bias_gelu_tanh", (8192, 16384, 4096), "bfloat16", "bias_act", "gelu_tanh"),
    ("epilogue_bias_relu", (8192, 16384, 4096), "bfloat16", "bias_act", "relu"),
    ("epilogue_fwd_bwd_bias_gelu", (8192, 16384, 4096), "bfloat16", "fwd_bwd", "gelu_tanh"),
    ("epilogue_decode_bias_gelu", (16, 14336, 4096), "bfloat16", "bias_act", "gelu_tanh"),
]


def test_epilogue_suite_rows():
    for dtypes in (("float16",), ("float16", "bfloat16")):  # fixed dtypes, whatever --dtype says
        epi = bench.cases("epilogue", dtypes)
        assert [(c.name, (c.m, c.n, c.k), c.dtype, c.op, c.activation) for c in epi] == EPILOGUE_ROWS
    assert all(c.batch == 1 and c.layout == "NN" and not c.vmap for c in epi)
    by = {c.name: c for c in epi}
    seed = by["epilogue_seed001"]
    assert seed.out_dtype == "float32" and bench.AXPBY == (1.1, 1.2)
    assert seed.flops == 2 * 4096 ** 3
    assert by["epilogue_fwd_bwd_bias_gelu"].flops == 3 * 2 * 8192 * 16384 * 4096  # 3 GEMMs
    assert by["epilogue_bias_relu"].flops == 2 * 8192 * 16384 * 4096
    assert by["epilogue_bias_relu"].out_dtype == "bfloat16"
    assert seed.nbytes() == (4096 ** 2 * 2, 4096 ** 2 * 2, 2 * 4096 ** 2 * 4)  # C in, D out
    # R: ~4 TFLOP a call (the fwd_bwd row is one call of 3.3 TFLOP; decode is capped at 64)
    assert [bench.choose_reps(c.flops) for c in epi] == [29, 4, 4, 1, 64]
    # the default run (no --suite) includes them, beside the GEMM suites
    default = bench.select_cases(bench._parser().parse_args([]))
    assert [c.name for c in default if c.suite == "epilogue"] == [r[0] for r in EPILOGUE_ROWS]
    assert {c.suite for c in default} == set(bench.SUITES) and "epilogue" in bench.SUITES
    sel = bench.select_cases(bench._parser().parse_args(["--suite", "epilogue", "--cases",
                                                         "*bias_relu,*seed001"]))
    assert [c.name for c in sel] == ["epilogue_seed001", "epilogue_bias_relu"]


@pytest.mark.parametrize("name", ("relu", "gelu", "gelu_tanh", "silu", None))
def test_np_act_matches_jax(name):
    """The bench's float64 activations (and derivatives) are jax.nn's."""
    x = np.linspace(-4, 4, 101)
    fn = {None: lambda v: v, "relu": jax.nn.relu, "silu": jax.nn.silu,
          "gelu": lambda v: jax.nn.gelu(v, approximate=False),
          "gelu_tanh": lambda v: jax.nn.gelu(v, approximate=True)}[name]
    with jax.default_device(jax.devices("cpu")[0]):
        xs = jnp.asarray(x[x != 0], jnp.float32)  # relu' is undefined at 0
        want, dwant = np.asarray(fn(xs)), np.asarray(jax.vmap(jax.grad(fn))(xs))
    np.testing.assert_allclose(bench.np_act(name, x[x != 0]), want, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(bench.np_act(name, x[x != 0], grad=True), dwant, rtol=2e-6, atol=2e-6)


def tiny_epilogue(monkeypatch, max_r=3):
    """The epilogue suite at tiny shapes (edges of 16-row tiles, K not a tile multiple)."""
    monkeypatch.setattr(timing, "EPILOGUE", (
        ("epilogue_seed001", 40, 48, 72, "float16", "axpby", None),
        ("epilogue_bias_gelu_tanh", 72, 40, 56, "bfloat16", "bias_act", "gelu_tanh"),
        ("epilogue_bias_relu", 72, 40, 56, "bfloat16", "bias_act", "relu"),
        ("epilogue_fwd_bwd_bias_gelu", 72, 40, 56, "bfloat16", "fwd_bwd", "gelu_tanh"),
        ("epilogue_decode_bias_gelu", 16, 96, 64, "bfloat16", "bias_act", "gelu_tanh")))
    monkeypatch.setattr(timing, "MAX_R", max_r)
    return bench.cases("epilogue")


def test_epilogue_sides_compute_the_same_math(monkeypatch):
    """Per epilogue case: ours is all tcgemm (no dot_general, also in the gradient), the jnp
    composite and the dot side are stock jnp; ours and jnp agree; epilogue_error measures
    ours against float64 within the output dtype's bound, and flags a wrong result."""
    for case in tiny_epilogue(monkeypatch):
        ops = bench.epilogue_ops(case)
        a_list, shared = bench.epilogue_operands(case, 2)
        assert len(a_list) == 2 and not np.array_equal(a_list[0], a_list[1])
        text = {side: str(jax.make_jaxpr(op)(a_list[0], *shared)) for side, op in ops.items()}
        assert "tcgemm" in text["tcgemm"] and "dot_general" not in text["tcgemm"], case.name
        assert "tcgemm" not in text["jnp"] + text["dot"] and "dot_general" in text["dot"]
        if case.op == "fwd_bwd":
            assert text["tcgemm"].count("tcgemm[") == 3 and "tcgemm_dact" in text["tcgemm"]
        outs = {side: jax.jit(ops[side])(a_list[0], *shared) for side in ("tcgemm", "jnp")}
        err, parts = bench.epilogue_error(case, outs["tcgemm"], a_list[0], shared)
        jerr, _ = bench.epilogue_error(case, outs["jnp"], a_list[0], shared)
        assert 0 < err <= bench.tolerance(case, jerr), (case.name, err, jerr)
        assert (set(parts) == {"dx", "dw", "dbias"}) == (case.op == "fwd_bwd")
        wrong = jax.tree.map(lambda y: y * 1.01, outs["tcgemm"])  # 1% off: far beyond any bound
        assert bench.epilogue_error(case, wrong, a_list[0], shared)[0] > 5e-3, case.name



def test_tolerance_by_output_dtype():
    seed, gelu = bench.cases("epilogue")[:2]
    assert bench.tolerance(seed, 1e-7) == pytest.approx(2e-5)  # float32 out, K = 4096
    assert bench.tolerance(gelu, 1e-3) == 5e-3 and bench.tolerance(gelu, 4e-3) == 8e-3
    sq = bench.cases("square", ("float16",))[0]
    assert bench.tolerance(sq, float("nan")) == 1e-3


def test_epilogue_suite_end_to_end(tmp_path, monkeypatch, capsys):
    """--suite epilogue --force on tiny shapes: the five rows in order, each with the GEMM rows'
    fields plus dot_tflops, timed against the jnp composite and jnp.dot in one run."""
    tiny_epilogue(monkeypatch)
    out = tmp_path / "epi.json"
    rc = bench.main(["--force", "--suite", "epilogue", "--reps", "7", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == [r[0] for r in EPILOGUE_ROWS]
    for r in rows:
        assert ROW_FIELDS | TIMING_FIELDS | {"dot_tflops", "vs_dot", "jnp_vs_dot",
                                             "dot_ms_blocking", "dot_dispatch_ms"} <= set(r), r
        assert "error" not in r, r
        assert r["tcgemm_tflops"] > 0 and r["jnp_tflops"] > 0 and r["dot_tflops"] > 0
        assert r["err_ok"] and r["tg_path"] == "tcgemm" and r["reps"] == 7 and r["r"] == 3, r
        assert 0 < r["rel_err"] < (2e-5 if r["name"] == "epilogue_seed001" else 5e-3), r
    assert set(rows[3]["rel_err_parts"]) == {"dx", "dw", "dbias"}
    assert "[dot " in text and "geomean ratio tcgemm/jnp  epilogue" in text


def test_case_flops_and_bytes():
    c = bench.Case("batched", "x", 1024, 1024, 128, 32, "bfloat16", True)
    assert c.flops == 2 * 1024 * 1024 * 128 * 32
    assert c.nbytes() == (32 * 1024 * 128 * 2, 32 * 128 * 1024 * 2, 32 * 1024 * 1024 * 2)


@pytest.mark.parametrize("case", bench.cases("all"), ids=lambda c: f"{c.name}-{c.dtype}")
def test_choose_reps_rule(case):
    r = bench.choose_reps(case.flops)
    assert 1 <= r <= 64
    if 1 < r < 64:  # otherwise clamped: then the bound it hit must be why
        assert abs(r * case.flops - 4e12) <= case.flops / 2
    elif r == 64:
        assert 64 * case.flops <= 4e12 * 1.01
    else:
        assert case.flops >= 4e12 / 1.5


def test_choose_reps_values_and_memory_cap():
    f = lambda s: 2 * s ** 3  # noqa: E731
    assert bench.choose_reps(f(1024)) == 64
    assert bench.choose_reps(f(4096)) == 29          # 29 * 137 GFLOP = 3.99 TFLOP
    assert bench.choose_reps(f(8192)) == 4
    assert bench.choose_reps(f(16384)) == 1
    assert bench.choose_reps(10) == 64 and bench.choose_reps(10 ** 15) == 1
    gib = 2 ** 30
    # 25% of 8 GiB = 2 GiB: 0.5 GiB shared + 0.25 GiB per product -> 6 fit
    assert bench.choose_reps(f(1024), gib // 4, gib // 2, 8 * gib) == 6
    assert bench.choose_reps(f(1024), 4 * gib, 0, 8 * gib) == 1    # never below 1
    assert bench.choose_reps(f(1024), gib, 0, None) == 64          # unknown memory: no cap


def test_slug_and_geomean():
    assert bench.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert bench.slug("NVIDIA H200") == "nvidia-h200"
    assert math.isclose(bench.geomean([0.5, 2.0, 4.0]), 2 ** (1 / 3) * 2 ** (1 / 3), rel_tol=1e-12)
    assert math.isnan(bench.geomean([]))


def test_cli_selection():
    p = bench._parser()
    quick = bench.select_cases(p.parse_args(["--quick"]))
    assert sorted((c.m, c.dtype) for c in quick) == [(4096, "bfloat16"), (4096, "float16"),
                                                      (8192, "bfloat16"), (8192, "float16")]
    sel = bench.select_cases(p.parse_args(["--suite", "llm", "--dtype", "bfloat16",
                                           "--cases", "llm_l70b_*_m16,llm_l7b_qkvo_m128"]))
    assert {c.name for c in sel} == {"llm_l70b_gateup_m16", "llm_l70b_down_m16", "llm_l7b_qkvo_m128"}
    assert {c.dtype for c in sel} == {"bfloat16"}
    custom = bench.select_cases(p.parse_args(["--shape", "3x40x24x16", "--dtype", "float16"]))
    assert [(c.batch, c.m, c.n, c.k, c.vmap) for c in custom] == [(3, 40, 24, 16, True)]
    with pytest.raises(SystemExit) as e:
        bench.main(["--reps", "5"])   # the median of >= 7 calls
    assert e.value.code == 2
    with pytest.raises(ValueError):
        bench.parse_shape("12x34", ("float16",))


def test_time_fn_counts_warmup_and_reps():
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    t = timing.time_fn(fn, (jnp.ones(4),), reps=7, warmup=2)
    assert t > 0 and len(calls) == 2 + 1 + 7          # warm-up, the stream's lead call, reps
    times = timing.time_fns({"a": fn, "b": fn}, (jnp.ones(4),), reps=7, stream=False)
    assert [len(v) for v in times.values()] == [7, 7] and len(calls) == 10 + 18
    assert timing.medians({"a": [3.0, 1.0, 2.0]}) == {"a": 2.0}
    # bench keeps the names tools/ use, and they are timing's
    assert bench.time_fn is timing.time_fn and bench._harness is timing.harness
    assert bench.harness_operands is timing.harness_operands


def test_stream_timing_order_and_intervals():
    """time_fns' stream mode: warm-up calls, then an untimed lead call of the last side, then
    the sides interleaved rep by rep, each call dispatched before the previous one is waited
    for; every interval positive, and they add up to the stream's wall time."""
    import time
    seq = []

    def side(name):
        def f(x):
            seq.append(name)
            return x + 1
        return f
    t0 = time.perf_counter()
    times = timing.time_fns({"a": side("a"), "b": side("b")}, (jnp.ones(4),), reps=3, warmup=1)
    wall = time.perf_counter() - t0
    assert seq == ["a", "b", "b"] + ["a", "b"] * 3
    assert [len(v) for v in times.values()] == [3, 3]
    assert all(x > 0 for v in times.values() for x in v)
    assert sum(map(sum, times.values())) <= wall
    seq.clear()
    disp: dict = {}
    timing.time_fns({"a": side("a"), "b": side("b")}, (jnp.ones(4),), reps=3, warmup=0,
                    dispatch=disp)
    assert [len(v) for v in disp.values()] == [3, 3] and len(seq) == 1 + 6
    stream, extra = timing.time_sides({"tcgemm": side("a"), "jnp": side("b")}, (jnp.ones(4),),
                                      reps=7)
    assert set(stream) == {"tcgemm", "jnp"} and min(stream.values()) > 0
    assert set(extra) == {"tcgemm_ms_blocking", "jnp_ms_blocking", "ratio_blocking",
                          "tcgemm_dispatch_ms", "jnp_dispatch_ms"}
    fields = timing.side_fields({"tcgemm": 2e-3, "jnp": 3e-3}, {"tcgemm": 1.23456e-4})
    assert fields == {"tcgemm_ms_blocking": 2.0, "jnp_ms_blocking": 3.0, "ratio_blocking": 1.5,
                      "tcgemm_dispatch_ms": 0.1235}
    assert "back to back" in timing.method(9) and "9 timed calls" in timing.method(9)


def test_harness_one_barrier_per_product():
    """timing.harness: R products over R distinct A's and shared operands, each product's
    operands through their own optimization_barrier (none without barrier)."""
    a_list, b = timing.harness_operands(3, (8, 16), (16, 4), jnp.float16, 16)
    c = jnp.ones((8, 4), jnp.float32)
    op = lambda a, b, c: jnp.dot(a, b, preferred_element_type=jnp.float32) + c  # noqa: E731
    for barrier, count in ((True, 3), (False, 0)):
        f = timing.harness(op, barrier)
        assert str(jax.make_jaxpr(f)(a_list, b, c)).count("optimization_barrier") == count
        outs = f(a_list, b, c)
        assert len(outs) == 3
        for a, o in zip(a_list, outs):
            np.testing.assert_allclose(o, op(a, b, c), rtol=1e-6)
    assert not np.array_equal(a_list[0], a_list[1]) and float(jnp.std(b.astype(jnp.float32))) > 0


def test_import_structure():
    """`import jax_tcgemm` loads no bench, timing or autotune module (nor flax); autotune and
    timing never import the bench CLI."""
    code = ("import sys, jax_tcgemm; print(sorted(m for m in sys.modules if m.startswith("
            "('jax_tcgemm.bench', 'jax_tcgemm.timing', 'jax_tcgemm.autotune', 'flax'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    code = ("import sys, jax_tcgemm.autotune, jax_tcgemm.timing; "
            "print('jax_tcgemm.bench' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.skipif(ON_GPU, reason="the no-GPU path only runs without a GPU")
def test_main_without_gpu_runs_demo_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "res" / "x.json"
    png = tmp_path / "x.png"
    assert bench.main(["--json", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "No GPU found" in text and "meaningless" in text
    assert "(2, 33, 65)" in text and "(2, 33, 17)" in text and text.rstrip().endswith("OK")
    assert "activation='gelu_tanh'" in text and "rel_err vs float64" in text
    assert not out.exists() and not png.exists()


def test_force_runs_the_harness_end_to_end(tmp_path, capsys):
    out = tmp_path / "res" / "bench.json"
    png = tmp_path / "plot.png"
    rc = bench.main(["--force", "--shape", "64x48x40", "--shape", "3x40x24x16", "--dtype", "both",
                     "--reps", "7", "--json", str(out), "--plot", str(png)])
    text = capsys.readouterr().out
    assert rc == 0, text
    rec = json.loads(out.read_text())
    assert {"commit", "dirty", "device", "jax_version", "jaxlib_version", "date", "harness"} <= set(rec)
    assert rec["jax_version"] == jax.__version__
    rows = rec["rows"]
    assert [(r["name"], r["dtype"]) for r in rows] == [
        (n, d) for n, d in itertools.product(["custom_64x48x40", "custom_3x40x24x16"],
                                             ["float16", "bfloat16"])]
    for r in rows:
        assert ROW_FIELDS | TIMING_FIELDS <= set(r) and "error" not in r, r
        assert r["layout"] == "NN" and r["r"] == 64 and r["reps"] == 7
        assert r["tcgemm_tflops"] > 0 and r["jnp_tflops"] > 0 and r["ratio"] > 0
        assert 0 < r["rel_err"] < {"float16": 1e-3, "bfloat16": 5e-3}[r["dtype"]]
        assert r["err_ok"] and r["tg_path"] == "tcgemm"   # the primitive, not a bypass
    assert "geomean ratio" in text and "custom_3x40x24x16" in text
    assert png.exists() == (importlib.util.find_spec("matplotlib") is not None)


def test_failing_row_is_recorded_and_run_continues(tmp_path, monkeypatch, capsys):
    real = bench.run_case

    def flaky(case, *a, **kw):
        if case.m == 64:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory\nwhile allocating")
        return real(case, *a, **kw)

    monkeypatch.setattr(bench, "run_case", flaky)
    out = tmp_path / "b.json"
    rc = bench.main(["--force", "--shape", "64x48x40", "--shape", "32x16x24", "--dtype", "float16",
                     "--json", str(out)])
    assert rc == 1
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["error"] == "RuntimeError: RESOURCE_EXHAUSTED: out of memory while allocating"
    assert "error" not in rows[1] and rows[1]["ratio"] > 0
    assert "ERROR RuntimeError" in capsys.readouterr().out


def test_oversized_case_is_skipped_not_run():
    c = bench.Case("square", "square_16384", 16384, 16384, 16384, 1, "float16")
    row = bench.run_case(c, reps=7, mem_limit=2 * 2 ** 30)   # 1.5 GiB > 40% of 2 GiB
    assert row["error"].startswith("skipped") and "tcgemm_tflops" not in row
    assert bench.format_row(row).split()[-1] != "" and "SKIP" in bench.format_row(row)


@pytest.mark.parametrize("kind,layout", [("fp8", "NN"), ("fp8", "NT"), ("fp8_block", "NT"),
                                         ("int8", "NN"), ("w8a8", "NT")])
def test_lowp_sides_and_reference(kind, layout):
    """The lowp suite's two sides compute the same product as its float64 reference
    (bench_lowp.reference64) on a small case (CPU: ours is the lax path); the suite's rows."""
    from jax_tcgemm import bench_lowp
    names = [c.name for c in bench_lowp.cases()]
    assert {"lowp_fp8_8192", "lowp_fp8_block_8192", "lowp_int8_8192", "lowp_w8a8_8192",
            "lowp_int8_m16", "lowp_fp8_block_llm"} <= set(names)
    case = bench_lowp.LowpCase("t", 64, 200, 384, kind, layout)
    with jax.default_device(jax.devices("cpu")[0]):
        a, sh = bench_lowp.operands(case, 1)
        host = [np.asarray(x) if x is not None else None for x in (a[0], *sh)]
        rows = np.arange(64)
        want = bench_lowp.reference64(case, host[0], host[1], host[2], host[3], rows)
        for side, op in bench_lowp.ops(case).items():
            out = np.asarray(jax.jit(op)(a[0], *sh)).astype(np.float64)
            err = np.linalg.norm(out - want) / np.linalg.norm(want)
            assert err <= (0 if kind == "int8" else 1e-2), (side, err)


def test_lowp_and_ragged_suites_end_to_end(tmp_path, monkeypatch, capsys):
    """--suite lowp, f32 and ragged --force on tiny rows (bench_suites.run_suite, the driver they
    share): every row timed on both sides, its record written, the summary line printed."""
    from jax_tcgemm import bench_f32, bench_lowp, bench_ragged
    monkeypatch.setattr(bench_f32, "cases", lambda: [
        bench_f32.F32Case("f32_t_highest", 40, 56, 300, "highest", "NN"),
        bench_f32.F32Case("f32_t_bf16x6", 33, 20, 70, "BF16_BF16_F32_X6", "NT")])
    monkeypatch.setattr(bench_lowp, "cases", lambda: [
        bench_lowp.LowpCase("lowp_t_int8", 32, 48, 256, "int8", "NN"),
        bench_lowp.LowpCase("lowp_t_block", 32, 130, 260, "fp8_block", "NT")])
    monkeypatch.setattr(bench_ragged, "ROWS", (("ragged_t", 2, 64, 32, 48, "equal", "dot"),))
    monkeypatch.setattr(timing, "TARGET_FLOP", 1e6)
    for suite, names, line in (("lowp", ["lowp_t_int8", "lowp_t_block"], "geomean tcgemm / jnp"),
                               ("f32", ["f32_t_highest", "f32_t_bf16x6"], "geomean tcgemm / jnp"),
                               ("ragged", ["ragged_t"], "geomean tcgemm / lax.ragged_dot")):
        out = tmp_path / f"{suite}.json"
        rc = bench.main(["--force", "--suite", suite, "--reps", "7", "--json", str(out)])
        text = capsys.readouterr().out
        assert rc == 0, text
        rows = json.loads(out.read_text())["rows"]
        assert [r["name"] for r in rows] == names
        assert all(r["tcgemm_tflops"] > 0 and r["err_ok"] for r in rows), rows
        assert all(TIMING_FIELDS <= set(r) for r in rows), rows
        assert "back to back" in json.loads(out.read_text())["harness"]
        assert line in text
