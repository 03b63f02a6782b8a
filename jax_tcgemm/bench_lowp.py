"""The `lowp` benchmark suite: tg.scaled_matmul (fp8, int8) against the jnp / lax way of
computing the same thing, in one run and one harness (issue 26):

    python -m jax_tcgemm.bench --suite lowp [--json PATH] [--reps 9] [--cases GLOB]

Two sides per row, timed interleaved (timing.time_fns) after warm-up, each one jit of R
independent products over R distinct a (shared b and scales, every product's operands through
their own optimization_barrier: timing.harness):
- lowp_fp8_*: e4m3 x e4m3 -> bfloat16 with per-tensor scales; jnp: jnp.dot of the fp8 arrays
  (float32 accumulation) times sa * sb, rounded to bfloat16 (XLA fuses the scale and the
  rounding into the GEMM's epilogue). b is (K, N) ("NN", as jnp.dot takes it: transposed
  first on both sides) or (N, K) ("NT", _nt rows: the K-major weight layout both cuBLASLt and
  wgmma read).
- lowp_fp8_block_*: DeepSeek-V3 block scales; jnp: the dequantise-then-dot composite.
- lowp_int8_*: int8 x int8 -> int32; jnp: jnp.dot(preferred_element_type=int32).
- lowp_w8a8_*: int8 -> bfloat16 with per-row scales of a and per-column scales of b; jnp: the
  int32 product times the scales, rounded.
rel_err: each side against float64 of the quantised values on the first and last 256 rows;
err_ok bounds ours by the output dtype's bound (bf16 5e-3; int32: exact), or twice jnp's own
error where larger. Rows go to benchmarks/results/<gpu>-lowp.json by default.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import bench_suites, timing

# name, M, N, K, kind ("fp8", "fp8_block", "int8", "w8a8"), layout of b: "NN" (K, N), what
# jnp.dot takes (both sides transpose it for the K-major tensor cores: ours by its copy kernel
# inside the call, XLA by a transpose in front of cuBLASLt), or "NT" (N, K), the K-major weight
# layout (no copy on either side)
ROWS = (
    ("lowp_fp8_8192", 8192, 8192, 8192, "fp8", "NN"),
    ("lowp_fp8_8192_nt", 8192, 8192, 8192, "fp8", "NT"),
    ("lowp_fp8_llm_nt", 4096, 7168, 16384, "fp8", "NT"),
    ("lowp_fp8_block_8192", 8192, 8192, 8192, "fp8_block", "NT"),
    ("lowp_fp8_block_llm", 4096, 7168, 16384, "fp8_block", "NT"),
    ("lowp_fp8_block_llm_m128", 128, 7168, 16384, "fp8_block", "NT"),
    ("lowp_int8_8192", 8192, 8192, 8192, "int8", "NN"),
    ("lowp_int8_8192_nt", 8192, 8192, 8192, "int8", "NT"),
    ("lowp_int8_m16", 16, 4096, 4096, "int8", "NN"),
    ("lowp_w8a8_8192", 8192, 8192, 8192, "w8a8", "NT"),
)
ERR_ROWS = 256


@dataclasses.dataclass(frozen=True)
class LowpCase:
    name: str
    m: int
    n: int
    k: int
    kind: str
    layout: str = "NT"
    suite: str = "lowp"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def out_dtype(self) -> str:
        return "int32" if self.kind == "int8" else "bfloat16"

    def nbytes(self) -> tuple[int, int]:
        """(per product: a and the output, shared: b) in bytes."""
        return self.m * self.k + self.m * self.n * (4 if self.kind == "int8" else 2), \
            self.n * self.k


def cases() -> list[LowpCase]:
    return [LowpCase(*r) for r in ROWS]


def operands(case: LowpCase, r: int):
    """R distinct a (M, K), the shared b ((N, K) for NT, else (K, N)) and scales, on device:
    fp8 N(0, 1) values, int8 uniform in [-127, 127]; scales positive."""
    import jax
    import jax.numpy as jnp
    keys = jax.random.split(jax.random.key(0), r + 3)
    bshape = (case.n, case.k) if case.layout == "NT" else (case.k, case.n)
    if case.kind in ("int8", "w8a8"):
        def q(key, shape):
            return jax.random.randint(key, shape, -127, 128, jnp.int32).astype(jnp.int8)
    else:
        def q(key, shape):
            return jax.random.normal(key, shape, jnp.float32).astype(jnp.float8_e4m3fn)
    a = tuple(q(keys[i], (case.m, case.k)) for i in range(r))
    b = q(keys[r], bshape)
    kb, nb = -(-case.k // 128), -(-case.n // 128)
    if case.kind == "fp8":
        sa, sb = jnp.float32(0.03), jnp.float32(0.05)
    elif case.kind == "w8a8":
        sa = jax.random.uniform(keys[r + 1], (case.m,), jnp.float32, 1e-3, 2e-3)
        sb = jax.random.uniform(keys[r + 2], (case.n,), jnp.float32, 1e-3, 2e-3)
    elif case.kind == "fp8_block":
        sa = jax.random.uniform(keys[r + 1], (case.m, kb), jnp.float32, 0.01, 0.05)
        sb = jax.random.uniform(keys[r + 2], (nb, kb), jnp.float32, 0.01, 0.05)  # b's layout
    else:
        sa = sb = None
    return a, (b, sa, sb)


def ops(case: LowpCase) -> dict:
    """{side: op(a, b, sa, sb)}."""
    import jax.numpy as jnp
    from jax import lax
    import jax_tcgemm as tg
    tb = case.layout == "NT"
    dn = (((1,), (1 if tb else 0,)), ((), ()))

    def ours(a, b, sa, sb):
        return tg.scaled_matmul(a, b, sa, sb, out_dtype=case.out_dtype, transpose_b=tb)

    if case.kind == "int8":
        def ref(a, b, sa, sb):
            return lax.dot_general(a, b, dn, preferred_element_type=jnp.int32)
    elif case.kind == "fp8":
        def ref(a, b, sa, sb):
            acc = lax.dot_general(a, b, dn, preferred_element_type=jnp.float32)
            return (acc * (sa * sb)).astype(jnp.bfloat16)
    elif case.kind == "w8a8":
        def ref(a, b, sa, sb):
            acc = lax.dot_general(a, b, dn, preferred_element_type=jnp.int32)
            return (acc.astype(jnp.float32) * (sa[:, None] * sb)).astype(jnp.bfloat16)
    else:
        def ref(a, b, sa, sb):  # dequantise, then one bfloat16 GEMM (what a user writes)
            k = a.shape[1]
            da = (a.astype(jnp.float32) * jnp.repeat(sa, 128, axis=1)[:, :k]).astype(jnp.bfloat16)
            sbx = jnp.repeat(jnp.repeat(sb, 128, axis=0), 128, axis=1)
            sbx = sbx[:b.shape[0], :b.shape[1]] if tb else sbx.T[:b.shape[0], :b.shape[1]]
            db = (b.astype(jnp.float32) * sbx).astype(jnp.bfloat16)
            return lax.dot_general(da, db, dn, preferred_element_type=jnp.float32).astype(
                jnp.bfloat16)
    return {"tcgemm": ours, "jnp": ref}


def reference64(case: LowpCase, a, b, sa, sb, rows) -> np.ndarray:
    """float64 result on `rows` of a: the quantised values, the scales on the exact products
    (block: per 128-slice of K)."""
    a = np.asarray(a[rows].astype(np.float32) if case.kind != "int8" else a[rows], np.float64)
    b = np.asarray(b.astype(np.float32) if case.kind != "int8" else b, np.float64)
    b = b.T if case.layout == "NT" else b  # (K, N)
    if case.kind in ("int8",):
        return a @ b
    if case.kind == "fp8":
        return a @ b * float(sa) * float(sb)
    if case.kind == "w8a8":
        return a @ b * np.asarray(sa, np.float64)[rows][:, None] * np.asarray(sb, np.float64)
    sa, sb = np.asarray(sa, np.float64)[rows], np.asarray(sb, np.float64).T  # (Kb, Nb)
    out = np.zeros((a.shape[0], b.shape[1]))
    for kb in range(sa.shape[1]):
        sl = slice(128 * kb, 128 * (kb + 1))
        col = np.repeat(sb[kb], 128)[:b.shape[1]]
        out += (a[:, sl] @ b[sl]) * sa[:, kb:kb + 1] * col
    return out


def config_of(case: LowpCase) -> str:
    """The row tg.scaled_matmul runs the case on (scaled.kernel_config), or "lax"."""
    try:
        from jax_tcgemm import scaled
        kind = "int8" if case.kind in ("int8", "w8a8") else "fp8"
        form = "block" if case.kind == "fp8_block" else "outer"
        plan = scaled.kernel_config(kind, case.m, case.n, case.k, form, 1, case.layout == "NT")
        return "lax" if plan is None else plan[0] + (f" split {plan[1]}" if plan[1] > 1 else "")
    except Exception:  # noqa: BLE001
        return "n/a"


def run_case(case: LowpCase, reps: int = 9, mem_limit: int | None = None,
             barrier: bool = True) -> dict:
    row = {"suite": case.suite, "name": case.name, "m": case.m, "n": case.n, "k": case.k,
           "batch": 1, "dtype": "int8" if case.kind in ("int8", "w8a8") else "float8_e4m3fn",
           "out_dtype": case.out_dtype, "layout": case.layout, "kind": case.kind,
           "config": config_of(case)}
    r, a, sh, fns, firsts, rows = bench_suites.first_two_sides(
        case, ops(case), operands, mem_limit, barrier, ERR_ROWS)
    host = [np.asarray(x) if x is not None else None for x in (a[0], *sh)]
    want = reference64(case, host[0], host[1], host[2], host[3], rows)
    errs = {}
    for side, out in firsts.items():
        o = out[rows].astype(np.float64)
        errs[side] = float(np.linalg.norm(o - want) / max(np.linalg.norm(want), 1e-300))
    del firsts
    tol = 0.0 if case.kind == "int8" else max(5e-3, 2 * errs["jnp"])
    row.update(bench_suites.time_two_sides(fns, (a, *sh), reps, r, case.flops, errs, tol))
    return row


def format_row(row: dict) -> str:
    return bench_suites.two_sided_row(row, 24, f"cfg {row.get('config')}")


HEADER = bench_suites.two_sided_header(24, "TFLOP/s or TOP/s")


def run(args, argv=None) -> int:
    """`bench --suite lowp` with bench's parsed arguments (reps, json, cases, force,
    no_barrier)."""
    harness = ("per side one jit of R independent products (R distinct a, shared b and scales"
               f"{'' if args.no_barrier else ', optimization_barrier per product'}), sides "
               "tcgemm (tg.scaled_matmul) and jnp (the lax way: fp8 dot + scale, int8 dot, "
               "dequantise-then-dot); " + timing.method(args.reps))
    return bench_suites.run_two_sided(args, argv, cases(), "lowp", harness, HEADER, run_case,
                               format_row)
