"""Quick GPU check of the fused epilogue on every launch path, with a float64 reference, and
one timing of each path against the jnp composite (``python tools/epilogue_check.py``).

Paths: every config of the table (plan override), split-K through a cluster (2, 4 slices) and
through the workspace (16 slices), a packed unaligned shape, the 16-row decode tiles, every
activation, every C form (full / per-row / per-column, float32 and out-dtype), traced alpha
and beta, aux output, and the dact kernel under grad. Prints one line per case and a summary;
exits non-zero on any failure. Not a unit test (tests/ has those); a fast first look.
"""
from __future__ import annotations

import itertools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_tcgemm as tg
from jax_tcgemm import configs
from jax_tcgemm.primitive import tcgemm

ACTS = {
    None: lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
}


def ref(a, b, c, bias, alpha, beta, act, ta, tb):
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    if ta:
        a64 = np.swapaxes(a64, -1, -2)
    if tb:
        b64 = np.swapaxes(b64, -1, -2)
    x = alpha * np.matmul(a64, b64)
    if c is not None:
        x = x + beta * c.astype(np.float64)
    if bias is not None:
        x = x + bias.astype(np.float64)
    return ACTS[act](x), x


def main() -> int:
    rng = np.random.default_rng(0)
    fails = 0
    n_cases = 0

    def check(tag, out, want, dtype):
        nonlocal fails, n_cases
        n_cases += 1
        out = np.asarray(out, np.float64)
        err = np.linalg.norm(out - want) / max(np.linalg.norm(want), 1e-30)
        tol = {np.dtype(jnp.float16): 2e-3, np.dtype(jnp.bfloat16): 1e-2}.get(np.dtype(dtype), 1e-5)
        ok = np.isfinite(out).all() and err <= tol
        fails += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {tag}: rel err {err:.2e} (tol {tol:.0e})", flush=True)

    names = [c.name for c in configs.CONFIGS16]
    for cfg, (m, n, k), (ta, tb) in itertools.product(
            names, [(150, 260, 200), (33, 72, 1000)], [(False, False), (True, True)]):
        dt = jnp.float16 if ta else jnp.bfloat16
        a = rng.standard_normal((2, m, k) if not ta else (2, k, m)).astype(dt)
        b = rng.standard_normal((1, k, n) if not tb else (1, n, k)).astype(dt)
        c = rng.standard_normal((2, m, n)).astype(np.float32)
        bias = rng.standard_normal((1, n)).astype(np.float32)
        for split in (1, 2, 16):
            for act, od in [((None, np.float32), ("gelu_tanh", dt))[split % 2]]:
                out = jax.jit(lambda a, b, c, bias: tcgemm(
                    a, b, c, bias, transpose_a=ta, transpose_b=tb, out_dtype=od, alpha=0.7,
                    beta=-1.3, activation=act, config=cfg, split_k=split))(a, b, c, bias)
                want, _ = ref(a, b, c, bias, 0.7, -1.3, act, ta, tb)
                check(f"{cfg} split {split} {m}x{n}x{k} {np.dtype(dt).name} "
                      f"ta={ta} tb={tb} act={act} out={np.dtype(od).name}", out, want, od)

    # planner paths: packed unaligned, decode, C forms, activations, traced scale, aux
    for (m, n, k), act, cform, cdt in itertools.product(
            [(16, 4096, 4096), (4095, 4097, 1031), (512, 1000, 3000)], list(ACTS),
            ["full", "row", "col", None], ["f32", "out"]):
        dt = jnp.bfloat16
        a = rng.standard_normal((m, k)).astype(dt)
        b = rng.standard_normal((k, n)).astype(dt)
        cshape = {"full": (m, n), "row": (m, 1), "col": (n,), None: None}[cform]
        c = None if cshape is None else rng.standard_normal(cshape).astype(
            np.float32 if cdt == "f32" else dt)
        bias = rng.standard_normal((n,)).astype(np.float32)
        out = jax.jit(lambda a, b, c, bias, al, be: tg.gemm(
            a, b, c, alpha=al, beta=be, bias=bias, activation=act))(
                a, b, c, bias, jnp.float32(0.5), jnp.float32(2.0))
        want, _ = ref(a, b, c, bias, 0.5, 2.0, act, False, False)
        check(f"gemm {m}x{n}x{k} act={act} c={cform}/{cdt}", out, want, dt)

    # grad through the fused epilogue (aux + dact)
    m, n, k = 300, 520, 264
    x = rng.standard_normal((m, k)).astype(jnp.bfloat16)
    w = rng.standard_normal((k, n)).astype(jnp.bfloat16)
    bias = rng.standard_normal((n,)).astype(np.float32)
    for act in ACTS:
        f = lambda x, w, b: tg.gemm(x, w, bias=b, activation=act, out_dtype=jnp.float32).sum()
        g = lambda x, w, b: jax.nn.gelu(x.astype(jnp.float32) @ w.astype(jnp.float32) + b,
                                        approximate=act == "gelu_tanh") if act in ("gelu", "gelu_tanh") else None
        gs = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(x, w, bias)
        ref_f = {None: lambda v: v, "relu": jax.nn.relu, "silu": jax.nn.silu,
                 "gelu": lambda v: jax.nn.gelu(v, approximate=False),
                 "gelu_tanh": lambda v: jax.nn.gelu(v, approximate=True)}[act]
        fr = lambda x, w, b: ref_f(x.astype(jnp.float32) @ w.astype(jnp.float32) + b).sum()
        with jax.default_matmul_precision("highest"):
            gr = jax.jit(jax.grad(fr, argnums=(0, 1, 2)))(x, w, bias)
        for name, u, v in zip("xwb", gs, gr):
            check(f"grad d{name} act={act}", np.asarray(u, np.float32),
                  np.asarray(v, np.float64), jnp.bfloat16)
        del g

    # timings: fused vs the jnp composite, 4096^3 f16 seed001 and bias+gelu_tanh
    def timeit(fn, *args, reps=20):
        fn(*args).block_until_ready()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(*args).block_until_ready()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    for tag, (m, n, k), dt, kw in [
            ("seed001", (4096, 4096, 4096), jnp.float16, dict(alpha=1.1, beta=1.2, c=True)),
            ("bias_gelu_tanh", (8192, 16384, 4096), jnp.bfloat16, dict(act="gelu_tanh")),
            ("decode_bias_gelu", (16, 14336, 4096), jnp.bfloat16, dict(act="gelu_tanh"))]:
        a = jnp.asarray(rng.standard_normal((m, k)), dt)
        b = jnp.asarray(rng.standard_normal((k, n)), dt)
        if kw.get("c"):
            c = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
            ours = jax.jit(lambda a, b, c: tg.gemm(a, b, c, alpha=1.1, beta=1.2,
                                                   out_dtype=jnp.float32))
            theirs = jax.jit(lambda a, b, c: 1.1 * jnp.dot(a, b, preferred_element_type=jnp.float32)
                             + 1.2 * c)
            args = (a, b, c)
        else:
            bias = jnp.asarray(rng.standard_normal((n,)), jnp.float32)
            ours = jax.jit(lambda a, b, bias: tg.gemm(a, b, bias=bias, activation="gelu_tanh"))
            theirs = jax.jit(lambda a, b, bias: jax.nn.gelu(jnp.dot(a, b) + bias.astype(dt),
                                                            approximate=True))
            args = (a, b, bias)
        plain = jax.jit(lambda a, b: jnp.dot(a, b))
        t_o, t_j, t_d = timeit(ours, *args), timeit(theirs, *args), timeit(plain, a, b)
        fl = 2 * m * n * k
        print(f"time {tag}: ours {fl / t_o / 1e12:.0f} TFLOP/s, jnp composite "
              f"{fl / t_j / 1e12:.0f}, jnp dot alone {fl / t_d / 1e12:.0f}; ratio {t_j / t_o:.3f}",
              flush=True)

    print(f"{n_cases - fails} passed, {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
