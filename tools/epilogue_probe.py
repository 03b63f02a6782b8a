"""Where an epilogue row's time goes (``python tools/epilogue_probe.py [--reps N]``): the bench
rows' shapes timed with parts of the epilogue left out (plain, alpha only, C, bias, bias +
activation, aux), against jnp.dot and the jnp composite, in one harness (timing.py: R distinct
A's, per-product optimization_barrier, medians, interleaved). Differences between the variants
place the cost inside the kernel without hardware counters. The decode row is also timed under
every plan (config x split) the planner could pick, to check its choice.

Prints one line per variant (ms per product, TFLOP/s, against jnp.dot) and writes the numbers
as JSON to --out when given. Not a unit test; a measuring tool for benchmarks/NOTES.md.
"""
from __future__ import annotations

import argparse
import json
import math
import re

import jax
import jax.numpy as jnp

import jax_tcgemm as tg
from jax_tcgemm import configs, timing
from jax_tcgemm.primitive import tcgemm


def _tc(a, b, c=None, bias=None, **kw):
    """tcgemm (the primitive: rank-3 operands, float32 bias (1, N)) on 2-D a, b, c, bias."""
    return tcgemm(a[None], b[None], None if c is None else c[None],
                  None if bias is None else bias.astype("float32").reshape(1, -1), **kw)[0]


# sm90 rows timed under a plan override (a ping-pong row, where the table has one, against the
# planner's choice)
_SM90 = tuple(c.name for c in configs.CONFIGS if c.name in (
    "sm90_128x256x64_s4_g2", "sm90_128x128x64_s6_g2", "sm90_128x128x64_s6_p2"))


# Epilogues timed on every row of _SM90 (aux: the forward that grad runs, which also writes the
# pre-activation)
_GELU = {"bias": 1, "activation": "gelu_tanh"}
_FORCED = (("plain", {}), ("bias_gelu_tanh", _GELU), ("bias_gelu_tanh_aux", {**_GELU, "aux": True}))


def _variants_bias_act(f32):
    gelu_t = lambda y: jax.nn.gelu(y, approximate=True)  # noqa: E731
    return {
        "jnp_dot": lambda x, w, b: jnp.dot(x, w),
        "jnp_bias_gelu_tanh": lambda x, w, b: gelu_t(jnp.dot(x, w) + b),
        "tg_plain": lambda x, w, b: tg.gemm(x, w),
        "tg_alpha": lambda x, w, b: tg.gemm(x, w, alpha=2.0),
        "tg_f32out": lambda x, w, b: tg.gemm(x, w, out_dtype=f32),
        "tg_bias": lambda x, w, b: tg.gemm(x, w, bias=b),
        "tg_bias_relu": lambda x, w, b: tg.gemm(x, w, bias=b, activation="relu"),
        "tg_bias_gelu_tanh": lambda x, w, b: tg.gemm(x, w, bias=b, activation="gelu_tanh"),
        "tg_bias_gelu_tanh_aux": lambda x, w, b: tcgemm(
            x[None], w[None], None, b.astype(f32).reshape(1, -1), activation="gelu_tanh",
            aux=True)[0][0],
        **{f"{cfg}/{v}": (lambda x, w, b, cfg=cfg, kw=kw: _tc(x, w, config=cfg, **{
            k: (b if k == "bias" else a) for k, a in kw.items()}))
           for cfg in _SM90 for v, kw in _FORCED},
    }


def _variants_axpby(f32):
    return {
        "jnp_dot_f32": lambda a, b, c: jnp.dot(a, b, preferred_element_type=f32),
        "jnp_axpby": lambda a, b, c: 1.1 * jnp.dot(a, b, preferred_element_type=f32) + 1.2 * c,
        "tg_f32out": lambda a, b, c: tg.gemm(a, b, out_dtype=f32),
        "tg_alpha": lambda a, b, c: tg.gemm(a, b, alpha=1.1, out_dtype=f32),
        "tg_axpby": lambda a, b, c: tg.gemm(a, b, c, alpha=1.1, beta=1.2, out_dtype=f32),
        **{f"{cfg}/axpby": (lambda a, b, c, cfg=cfg: _tc(
            a, b, c, alpha=1.1, beta=1.2, out_dtype=f32, config=cfg)) for cfg in _SM90},
    }


def run(name, m, n, k, dtype, variants, shared_extra, reps, results, only=None):
    if only:
        variants = {v: f for v, f in variants.items() if re.search(only, v)}
    if not variants:
        return
    flops = 2 * m * n * k
    r = max(1, min(64, round(4e12 / flops)))
    a_list, w = timing.harness_operands(r, (m, k), (k, n), dtype, k)
    shared = (w, *shared_extra)
    fns = {v: timing.harness(op) for v, op in variants.items()}
    t = timing.medians(timing.time_fns(fns, (a_list, *shared), reps))
    base = next(iter(t.values()))
    for v, sec in t.items():
        ms = sec / r * 1e3
        print(f"{name:14s} {v:26s} {ms:9.4f} ms  {flops / (sec / r) / 1e12:7.1f} TFLOP/s  "
              f"x{base / sec:5.3f} of {next(iter(t))}", flush=True)
        results.append({"case": name, "variant": v, "m": m, "n": n, "k": k, "dtype": str(dtype),
                        "r": r, "ms": ms, "tflops": flops / (sec / r) / 1e12})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="regex: time only the variants it matches")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode plans")
    args = ap.parse_args()
    f32, bf16, f16 = jnp.float32, jnp.bfloat16, jnp.float16
    key = jax.random.key(7)
    results: list = []

    bias = timing.random_array(key, (16384,), bf16, 0.5)
    run("bias_act", 8192, 16384, 4096, bf16, _variants_bias_act(f32), (bias,), args.reps, results,
        args.only)

    c = timing.random_array(key, (4096, 4096), f32)
    run("seed001", 4096, 4096, 4096, f16, _variants_axpby(f32), (c,), args.reps, results,
        args.only)
    if args.no_decode:
        return _write(args.out, results)

    m, n, k = 16, 14336, 4096
    bias = timing.random_array(key, (n,), bf16, 0.5)
    dec = {"jnp_bias_gelu_tanh": lambda x, w, b: jax.nn.gelu(jnp.dot(x, w) + b, approximate=True),
           "tg_planned": lambda x, w, b: tg.gemm(x, w, bias=b, activation="gelu_tanh")}
    for cfg in configs.CONFIGS16:
        if cfg.bm > 64 and cfg.name not in _SM90:
            continue
        kt = math.ceil(k / cfg.bk)
        for split in ((1, 2) if cfg.kind == "sm90" else (1, 2, 4, 8)):
            if split <= kt:
                dec[f"{cfg.name}/{split}"] = (
                    lambda x, w, b, cfg=cfg, split=split: _tc(
                        x, w, bias=b, activation="gelu_tanh", config=cfg.name, split_k=split))
    print("decode plan:", configs.plan_for_device(m, n, k, 1, bf16, "NN", True), flush=True)
    run("decode", m, n, k, bf16, dec, (bias,), args.reps, results, args.only)
    return _write(args.out, results)


def _write(path, results) -> int:
    if path:
        with open(path, "w") as f:
            json.dump({"device": jax.devices()[0].device_kind, "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
