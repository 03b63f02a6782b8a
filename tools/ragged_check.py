"""Quick GPU check of the grouped (ragged) kernels through their raw FFI target, with a float64
reference, and (--time) one timing per bench shape against lax.ragged_dot and the dense batched
product (``python tools/ragged_check.py [--quick] [--time]``). Cases: both modes (rows: forward
/ dgrad with transpose_b; contraction: wgrad), empty and skewed groups, sizes that are no tile
multiple, a sum below M, oversized and negative sizes (the kernels' clamping), bias +
activation, float32 out; each on the planner's row and forced onto every sm80 row with grouped
kernels (both kernel families on an H100). --quick: one input type and no large shapes (for
``compute-sanitizer python3 tools/ragged_check.py --quick``: every family and mode still runs).
Prints one line per case and exits non-zero on any failure. Not a unit test
(tests/test_ragged_gpu.py has those).
"""
from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_tcgemm import _ffi, configs, problem

ACT = {None: lambda x: x, "relu": lambda x: np.maximum(x, 0),
       "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))}


def call(a, b, sizes, *, mode, transpose_b=False, out_dtype=None, bias=None, act=None,
         config=None):
    _ffi.require()  # the targets are registered by importing _ffi
    m, k = a.shape
    g = sizes.shape[0]
    if mode == 0:
        n = b.shape[1] if transpose_b else b.shape[2]
        out = jax.ShapeDtypeStruct((m, n), out_dtype or a.dtype)
        cfg = config or configs.plan_ragged(m, n, k, g, a.dtype, 0, transpose_b)
    else:
        n = b.shape[1]
        out = jax.ShapeDtypeStruct((g, k, n), out_dtype or jnp.float32)
        cfg = config or configs.plan_ragged(m, n, k, g, a.dtype, 1)
    args = [a, b, sizes] + ([bias] if bias is not None else [])
    return jax.ffi.ffi_call("tcgemm_ragged", out)(
        *args, mode=np.int32(mode), transpose_b=bool(transpose_b), config=cfg,
        activation=np.int32(problem.activation_index(act or "none")), has_bias=bias is not None)


def bounds(sizes, extent):
    """Group boundaries with the kernel's clamping: negative sizes count as 0, cut at extent."""
    out, start = [], 0
    for s in np.asarray(sizes):
        size = max(0, min(int(s), extent - start))
        out.append((start, start + size))
        start += size
    return out


def ref(a, b, sizes, mode, transpose_b, bias, act):
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if mode == 0:
        w = np.swapaxes(b64, 1, 2) if transpose_b else b64
        out = np.zeros((a.shape[0], w.shape[2]))
        for g, (s, e) in enumerate(bounds(sizes, a.shape[0])):
            y = a64[s:e] @ w[g]
            if bias is not None:
                y = y + np.asarray(bias, np.float64)[g]
            out[s:e] = ACT[act](y)
        return out
    out = np.zeros((sizes.shape[0], a.shape[1], b.shape[1]))
    for g, (s, e) in enumerate(bounds(sizes, a.shape[0])):
        out[g] = a64[s:e].T @ b64[s:e]
    return out


def check(name, m, k, n, sizes, mode, dtype=jnp.bfloat16, transpose_b=False, out_dtype=None,
          bias=False, act=None, seed=0, config=None):
    key = jax.random.key(seed)
    ka, kb, kc = jax.random.split(key, 3)
    g = len(sizes)
    a = jax.random.normal(ka, (m, k), jnp.float32).astype(dtype)
    if mode == 0:
        shape = (g, n, k) if transpose_b else (g, k, n)
        b = (jax.random.normal(kb, shape, jnp.float32) / np.sqrt(k)).astype(dtype)
    else:
        b = jax.random.normal(kb, (m, n), jnp.float32).astype(dtype)
    bv = jax.random.normal(kc, (g, n), jnp.float32) * 0.5 if bias else None
    sz = jnp.asarray(np.asarray(sizes, np.int32))
    out = call(a, b, sz, mode=mode, transpose_b=transpose_b, out_dtype=out_dtype, bias=bv, act=act,
               config=config)
    out = np.asarray(out.astype(jnp.float32), np.float64)
    r = ref(a, b, sz, mode, transpose_b, bv, act)
    err = np.linalg.norm(out - r) / max(np.linalg.norm(r), 1e-30)
    od = np.dtype(out_dtype or (dtype if mode == 0 else jnp.float32))
    tol = {np.dtype(jnp.float16): 2e-3, np.dtype(jnp.bfloat16): 8e-3}.get(od, 1e-5)
    zero_ok = True
    if mode == 0:  # rows past the groups must be exact zeros
        total = bounds(sz, m)[-1][1] if g else 0
        zero_ok = bool(np.all(out[total:] == 0))
    ok = np.isfinite(err) and err <= tol and zero_ok
    cfg = str(config or configs.plan_ragged(m, n, k, g, dtype, mode, transpose_b))
    print(f"{'ok ' if ok else 'FAIL'} {name:34s} {cfg:26s} rel_err {err:.2e} (tol {tol:.0e})"
          f"{'' if zero_ok else ' rows past the groups not zero'}", flush=True)
    return ok


def timing(name, m, k, n, g, sizes=None, reps=10):
    dt = jnp.bfloat16
    ka, kb = jax.random.split(jax.random.key(1))
    a = jax.random.normal(ka, (m, k), jnp.float32).astype(dt)
    b = (jax.random.normal(kb, (g, k, n), jnp.float32) / np.sqrt(k)).astype(dt)
    sz = jnp.asarray(np.full(g, m // g, np.int32) if sizes is None else np.asarray(sizes, np.int32))
    ours = jax.jit(lambda a, b, s: call(a, b, s, mode=0))
    lax_f = jax.jit(lambda a, b, s: jax.lax.ragged_dot(a, b, s))
    dense = jax.jit(lambda a, b: jnp.einsum("gmk,gkn->gmn", a, b))
    ad = a.reshape(g, m // g, k)
    flops = 2 * m * k * n

    def t(f, *args):
        jax.block_until_ready(f(*args))
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))
    to = t(ours, a, b, sz)
    td = t(dense, ad, b)
    try:
        tl = t(lax_f, a, b, sz)
        lx = f"{flops / tl / 1e12:7.1f}"
    except Exception as e:  # noqa: BLE001  (out of memory: recorded)
        lx = f"failed ({type(e).__name__})"
    print(f"time {name:18s} ours {flops / to / 1e12:7.1f}  dense {flops / td / 1e12:7.1f}  "
          f"lax {lx} TFLOP/s  (ours/dense {td / to:.3f})", flush=True)


def main() -> int:
    quick = "--quick" in sys.argv
    dtypes = (jnp.bfloat16,) if quick else (jnp.bfloat16, jnp.float16)
    # None: the planner's row (sm90 on compute capability 9.0, else sm80); then every sm80
    # row with grouped kernels, forced (they run on any GPU from sm_80 on)
    families = [None] + [c.name for c in configs.CONFIGS if c.kind == "sm80" and c.ragged]
    ok = True
    for cfg in families:
        kw = dict(config=cfg)
        for mode, tb in ((0, False), (0, True), (1, False)):
            tag = f"mode{mode}{'T' if tb else ''}"
            for dt in dtypes:
                d = np.dtype(dt).name
                ok &= check(f"{tag} {d} equal", 512, 256, 384, [128] * 4, mode, dt, tb, **kw)
                ok &= check(f"{tag} {d} ragged", 1000, 200, 72, [0, 37, 300, 1, 0, 400, 200, 62],
                            mode, dt, tb, **kw)
                ok &= check(f"{tag} {d} sum<M", 777, 136, 264, [100, 0, 250, 3], mode, dt, tb, **kw)
            ok &= check(f"{tag} over M", 300, 64, 128, [200, 200, 200], mode, transpose_b=tb, **kw)
            ok &= check(f"{tag} negative", 300, 64, 128, [100, -5, 150], mode, transpose_b=tb,
                        **kw)
            ok &= check(f"{tag} G=1", 333, 128, 256, [333], mode, transpose_b=tb, **kw)
            if not quick:
                ok &= check(f"{tag} G=64", 4096, 128, 136, list(np.random.default_rng(0).multinomial(
                    4096, np.ones(64) / 64)), mode, transpose_b=tb, **kw)
            ok &= check(f"{tag} f32 out", 640, 192, 256, [64, 320, 0, 256], mode, transpose_b=tb,
                        out_dtype=jnp.float32, **kw)
        for act in (None, "relu", "gelu_tanh"):
            ok &= check(f"bias {act}", 900, 256, 520, [300, 0, 250, 350], 0, bias=True, act=act,
                        **kw)
    print("ALL OK" if ok else "FAILURES", flush=True)
    if "--time" in sys.argv and not quick:
        timing("ragged_g8", 8192, 4096, 14336, 8)
        timing("ragged_g64", 16384, 2048, 1408, 64)
        timing("ragged_g8_small", 512, 4096, 14336, 8)
        z = np.array([1 / (i + 1) ** 1.2 for i in range(8)])
        z = np.floor(z / z.sum() * 8192).astype(int)
        z[5] = 0
        z[0] += 8192 - z.sum()
        timing("ragged_skewed", 8192, 4096, 14336, 8, z)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
