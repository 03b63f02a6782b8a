"""Decode-sized 8-bit products on the narrow rows against the plan without them (NARROW_MAX_M
= 0) and jnp, one harness (R products per call sharing b, barrier per product): us per product
of each side, the narrow row forced at each of SPLITS K slices, WRONG where a side's result
differs from jnp's (int8: bitwise; fp8: relative Frobenius error 1e-2). benchmarks/NOTES.md v69.

    KINDS=int8,fp8 MS=1,16,32 SHAPES=4096x4096,14336x4096 SPLITS=1,2,4 python tools/narrow_probe.py NN NT
"""
import json, os, sys
import jax, jax.numpy as jnp, numpy as np
from jax import lax
import jax_tcgemm as tg
from jax_tcgemm import plan8, scaled, timing


def ours(plan, tb, kind):
    """The product; `plan` (or None: the planner's) is what compiled() forces at lowering."""
    def f(a, b):
        if kind == "int8":
            return tg.scaled_matmul(a, b, None, None, out_dtype=jnp.int32, transpose_b=tb)
        return tg.scaled_matmul(a, b, jnp.float32(0.03), jnp.float32(0.05),
                                out_dtype=jnp.bfloat16, transpose_b=tb)
    f.plan = plan
    return f


def compiled(op, args):
    """timing.harness(op), compiled (lowered) with op.plan forced, if any: the plan is chosen at
    lowering (scaled._lowering), so the patch must hold while the first call compiles."""
    fn = timing.harness(op)
    saved = scaled.kernel_config
    if getattr(op, "plan", None) is not None:
        scaled.kernel_config = lambda *_: op.plan
    try:
        jax.block_until_ready(fn(*args))
    finally:
        scaled.kernel_config = saved
    return fn


def old_plan(m, n, k, kind, tb):
    saved = plan8.NARROW_MAX_M
    plan8.NARROW_MAX_M = 0
    try:
        return plan8.plan_byte(m, n, k, kind, transpose_b=tb)
    finally:
        plan8.NARROW_MAX_M = saved


R = int(os.environ.get("R", "64"))


def main():
    for kind in os.environ.get("KINDS", "int8,fp8").split(","):
        for lay in sys.argv[1:]:
            for m in [int(x) for x in os.environ.get("MS", "1,16,32").split(",")]:
                for n, k in [tuple(int(v) for v in x.split("x")) for x in
                             os.environ.get("SHAPES", "4096x4096,14336x4096,4096x14336").split(",")]:
                    tb = lay == "NT"
                    keys = jax.random.split(jax.random.key(1), R + 1)
                    if kind == "int8":
                        q = lambda key, s: jax.random.randint(key, s, -127, 128, jnp.int32).astype(jnp.int8)
                    else:
                        q = lambda key, s: jax.random.normal(key, s, jnp.float32).astype(jnp.float8_e4m3fn)
                    a = tuple(q(keys[i], (m, k)) for i in range(R))
                    b = q(keys[R], (n, k) if tb else (k, n))
                    dn = (((1,), (1 if tb else 0,)), ((), ()))
                    if kind == "int8":
                        ref = lambda a, b: lax.dot_general(a, b, dn, preferred_element_type=jnp.int32)
                    else:
                        ref = lambda a, b: (lax.dot_general(a, b, dn, preferred_element_type=jnp.float32)
                                            * jnp.float32(0.03 * 0.05)).astype(jnp.bfloat16)
                    po = old_plan(m, n, k, kind, tb)
                    pn = plan8.plan_byte(m, n, k, kind, transpose_b=tb)
                    sides = {"jnp": ref, f"old {po[0][:14]} s{po[1]}": ours(po, tb, kind),
                             f"plan {pn[0][:14]} s{pn[1]}": ours(None, tb, kind)}
                    row = "narrow_16x64x64_w1x4" if m <= 16 else "narrow_32x64x64_w2x2"
                    for sp in [int(x) for x in os.environ.get("SPLITS", "1,2,4,8,16").split(",")]:
                        if (row, sp) != pn:
                            sides[f"{row[7:12]} s{sp}"] = ours((row, sp), tb, kind)
                    fns = {nm: compiled(op, (a, b)) for nm, op in sides.items()}
                    want = np.asarray(fns["jnp"](a, b)[0]).astype(np.float64)
                    ok = {}
                    for nm, f in fns.items():
                        got = np.asarray(f(a, b)[0]).astype(np.float64)
                        ok[nm] = (np.array_equal(got, want) if kind == "int8" else
                                  float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 1e-2)
                    med = timing.medians(timing.time_fns(fns, (a, b), 7))
                    line = {"shape": f"{kind} {m}x{n}x{k} {lay}"}
                    for nm, t in med.items():
                        line[nm] = round(t / R * 1e6, 2) if ok[nm] else "WRONG"
                    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
