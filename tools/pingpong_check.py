"""GPU check of the ping-pong sm90 row (sm90_128x128x64_s6_p2) on shapes where each block runs
many items with more k tiles than stages (the case its turn-taking exists for), every layout,
plain and with an epilogue, against the cooperative 128x256 row and float64; then one timing
of each against the jnp composite (``python tools/pingpong_check.py``). Exits non-zero on any
failure. The row is not in the table until this passes on a GPU: add
TCGEMM_SM90_PINGPONG_CONFIG(128, 128, 64, 6) to ffi/host/gemm_config.inc and rebuild first."""
from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_tcgemm.primitive import tcgemm

PP, COOP = "sm90_128x128x64_s6_p2", "sm90_128x256x64_s4_g2"


def main() -> int:
    ok = True
    key = jax.random.key(3)
    for (m, n, k) in ((1024, 1536, 2048), (1000, 1032, 1096), (4096, 4096, 1024)):
        for ta in (False, True):
            for tb in (False, True):
                ka, kb, kc = jax.random.split(jax.random.fold_in(key, m + 7 * ta + 3 * tb), 3)
                a = jax.random.normal(ka, (1, k, m) if ta else (1, m, k), jnp.float32).astype(jnp.bfloat16)
                b = (jax.random.normal(kb, (1, n, k) if tb else (1, k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
                bias = jax.random.normal(kc, (1, n), jnp.float32)
                a64 = np.asarray(a[0], np.float64)
                b64 = np.asarray(b[0], np.float64)
                ref = (a64.T if ta else a64) @ (b64.T if tb else b64)
                for epi in (False, True):
                    kw = dict(bias=bias, activation="gelu_tanh") if epi else {}
                    want = ref + np.asarray(bias[0], np.float64) if epi else ref
                    if epi:
                        want = 0.5 * want * (1 + np.tanh(np.sqrt(2 / np.pi) * (want + 0.044715 * want**3)))
                    out = jax.jit(lambda a, b: tcgemm(a, b, transpose_a=ta, transpose_b=tb,
                                                      out_dtype=jnp.float32, config=PP, **kw))(a, b)
                    err = float(np.linalg.norm(np.asarray(out[0]) - want) / np.linalg.norm(want))
                    good = err < 1e-4
                    ok &= good
                    print(f"{'ok ' if good else 'FAIL'} {m}x{n}x{k} ta={ta:d} tb={tb:d} epi={epi:d} "
                          f"rel_err {err:.2e}", flush=True)
    # timing: x 8192 x 4096 @ W 4096 x 16384 + bias, gelu_tanh, bf16; R = 4 products per call
    m, n, k, r = 8192, 16384, 4096, 4
    xs = [jax.random.normal(jax.random.fold_in(key, i), (1, m, k), jnp.bfloat16) for i in range(r)]
    w = (jax.random.normal(key, (1, k, n), jnp.float32) / 64).astype(jnp.bfloat16)
    bias = jax.random.normal(key, (1, n), jnp.float32)

    def many(f):
        def g(xs, w, bias):
            return [f(*jax.lax.optimization_barrier((x, w, bias))) for x in xs]
        return jax.jit(g)
    sides = {
        "jnp": many(lambda x, w, b: jax.nn.gelu(jnp.dot(x[0], w[0]) + b[0].astype(jnp.bfloat16),
                                                approximate=True)),
        "coop": many(lambda x, w, b: tcgemm(x, w, None, b, activation="gelu_tanh", config=COOP)),
        "pingpong": many(lambda x, w, b: tcgemm(x, w, None, b, activation="gelu_tanh", config=PP)),
        "coop_plain": many(lambda x, w, b: tcgemm(x, w, config=COOP)),
        "pingpong_plain": many(lambda x, w, b: tcgemm(x, w, config=PP)),
    }
    ts = {s: [] for s in sides}
    for f in sides.values():
        jax.block_until_ready(f(xs, w, bias))
    for _ in range(7):
        for s, f in sides.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(xs, w, bias))
            ts[s].append(time.perf_counter() - t0)
    for s, t in ts.items():
        med = float(np.median(t)) / r
        print(f"time {s:15s} {med * 1e3:8.3f} ms  {2 * m * n * k / med / 1e12:7.1f} TFLOP/s", flush=True)
    print("ALL OK" if ok else "FAILURES", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
