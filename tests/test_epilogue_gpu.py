"""GPU tests of the fused epilogue, D = act(alpha * op(A) @ op(B) + beta * C + bias), on every
launch path (DESIGN §7; issue: every kernel family and path supports every epilogue).

References are float64 numpy of the already-rounded inputs (conftest.epilogue64); errors are
relative Frobenius norms within conftest.bound of the output dtype. Kernel results (all but
the gradients and the in-place / empty checks) come from `check_products`: all products of a
group in one jit, run twice, each run into fresh NaN-filled buffers donated for its outputs
(conftest.poisoned_twice), so an element never written stays NaN and a racy one differs
between the runs; the runs must agree bitwise.

- test_every_config: every config of the table (plan override) x split_k 1, 2, 4, 16 (2 and 4:
  the cluster reduction on sm80 rows, the workspace on sm90 rows; 16: the workspace) x eight
  epilogues (three without C: bias of every dtype, traced alpha, aux)
  x four layouts x float16 / bfloat16 in, on 150x260x200 (batch 2, B shared) and 33x72x1000
  (batch 2, A shared), and the three without C on 130x261x136 (odd N); the output dtype
  cycles over the splits, so every (config, epilogue, layout, input dtype, shape) meets
  float16, bfloat16 and float32 output.
- test_planned_paths: tg.gemm's planner on packed / unaligned shapes (4095x4097x1031,
  513x1000x3000); test_decode_tiles: 16x4096x4096, planned and forced onto the 16-row tiles
  with every split; test_edge_sizes: M, N, K = 0 and 1 (K = 0: D = act(beta * C + bias)).
- test_dact_kernel: tcgemm_dact_p directly; test_grad_through_epilogue: grad of tg.gemm with
  C, bias and every activation; test_overwrite_c_in_place: a donated c updated in place.
"""
from __future__ import annotations

import dataclasses
import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm as tg
from jax_tcgemm import configs
from jax_tcgemm.primitive import tcgemm, tcgemm_dact_p
from jax_tcgemm.problem import ACTIVATIONS

from conftest import (act64, act_grad64, bound, epilogue64, f64, poisoned_twice, rel_err,
                      seed_of)

pytestmark = pytest.mark.gpu

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
OUT_DTYPES = (F16, BF16, F32)
LAYOUTS = list(itertools.product((False, True), repeat=2))  # (transpose_a, transpose_b)
LNAME = configs.layout_name
CONFIG_NAMES = [c.name for c in configs.CONFIGS16]
SPLITS = (1, 2, 4, 16)


def rng_of(*parts):
    return np.random.default_rng(seed_of(*parts))


def stored(x, transposed):
    """A logical (..., R, C) host operand in its stored layout ((..., C, R) if transposed)."""
    return np.ascontiguousarray(np.swapaxes(x, -1, -2)) if transposed else x


# ---------------------------------------------------------------------------------------------
# Running and checking groups of products.

@dataclasses.dataclass
class Product:
    """One call: fn(*ops) -> list of outputs, compared with `wants` (float64, one per
    output) within bound(out_dtype, k) (times `slack`)."""
    what: str
    fn: object
    ops: tuple
    wants: list
    out_dtype: np.dtype
    k: int
    slack: float = 1.0


def _device(ops, cache):
    """ops on the device; each host array transferred once per group (by identity)."""
    def put(x):
        if x is None or not isinstance(x, np.ndarray):
            return x
        if id(x) not in cache:
            cache[id(x)] = (x, jax.device_put(x))
        return cache[id(x)][1]
    return tuple(put(x) for x in ops)


def _run(products):
    """Outputs of every product (host arrays, per product a list), per product whether both
    runs agreed bitwise, and the count written in place."""
    cache = {}
    ops = [_device(p.ops, cache) for p in products]
    fn = lambda ops: [o for p, xs in zip(products, ops) for o in p.fn(*xs)]  # noqa: E731
    flat, same, in_place = poisoned_twice(fn, ops)
    outs, agree, i = [], [], 0
    for p in products:
        n = len(p.wants)
        outs.append(flat[i:i + n])
        agree.append(all(same[i:i + n]))
        i += n
    return outs, agree, in_place


def check_products(products):
    """Runs the products in one jit (each alone where the group fails, to name the failing
    one) and asserts every output: shape and dtype, no NaN, both runs bitwise equal, error
    within bounds. Returns the number of outputs checked."""
    try:
        outs, agree, in_place = _run(products)
        results = list(zip(outs, agree))
    except Exception:  # noqa: BLE001 (attributed product by product below)
        if len(products) == 1:
            raise
        results, in_place = [], 0
        for p in products:
            try:
                outs, agree, n = _run([p])
                results.append((outs[0], agree[0]))
                in_place += n
            except Exception as e:  # noqa: BLE001
                results.append((f"{type(e).__name__}: {str(e).splitlines()[0][:300]}", False))
    n_out = sum(len(p.wants) for p in products)
    if in_place < n_out:
        warnings.warn(f"{n_out - in_place} of {n_out} outputs were not "
                      "written into their NaN-poisoned buffers; unwritten elements there are "
                      "caught only by the comparison with the reference")
    fails = []
    for p, (outs, agree) in zip(products, results):
        if isinstance(outs, str):
            fails.append(f"{p.what}: {outs}")
            continue
        if not agree:
            fails.append(f"{p.what}: two identical calls differ")
        for i, (out, want) in enumerate(zip(outs, p.wants)):
            name = f"{p.what} [output {i}]"
            if out.shape != want.shape or out.dtype != p.out_dtype:
                fails.append(f"{name}: {out.shape} {out.dtype}, expected {want.shape} "
                             f"{p.out_dtype}")
            elif np.isnan(out.astype(np.float32)).any():
                fails.append(f"{name}: NaN (an unwritten element)")
            elif not rel_err(out, want) <= p.slack * bound(p.out_dtype, p.k):
                fails.append(f"{name}: rel err {rel_err(out, want):.3g} > "
                             f"{p.slack * bound(p.out_dtype, p.k):.3g}")
    assert not fails, f"{len(fails)} of {len(products)} products failed:\n" + "\n".join(
        fails[:60])
    return n_out


# ---------------------------------------------------------------------------------------------
# The epilogues of the grid.

@dataclasses.dataclass(frozen=True)
class Epi:
    name: str
    c: str | None  # "full" (B, M, N), "shared" (1, M, N), "row" (1, M, 1), "col" (B, 1, N)
    c_dtype: str | None  # "f32", "out" (the output's), "in" (the operands')
    bias: str | None  # "shared" (1, N), "batched" (B, N)
    activation: str
    alpha: float
    beta: float
    aux: bool = False  # also the pre-activation
    traced: bool = False  # alpha, beta as the float32 scale operand
    bias_dtype: str = "f32"  # "f32", "out" (the output's), "in" (the operands')

    def operands(self, bt, m, n, dt, od, tag):
        """Host c, bias, scale (None where absent) for a (bt, m, n) result."""
        rng = rng_of("epi", tag, self.name, bt, m, n, dt.name, od.name)
        dtype_of = {"f32": F32, "out": od, "in": dt}  # c_dtype / bias_dtype names
        c = bias = scale = None
        if self.c:
            shape = {"full": (bt, m, n), "shared": (1, m, n), "row": (1, m, 1),
                     "col": (bt, 1, n)}[self.c]
            c = rng.standard_normal(shape, np.float32).astype(dtype_of[self.c_dtype])
        if self.bias:
            bias = rng.standard_normal((bt if self.bias == "batched" else 1, n), np.float32)
            bias = bias.astype(dtype_of[self.bias_dtype])
        if self.traced:
            scale = np.array([self.alpha, self.beta], np.float32)
        return c, bias, scale

    def call(self, **kw):
        """fn(a, b, c, bias, scale) -> [d] or [d, pre] through tcgemm_p with kw."""
        if not self.traced:
            kw.update(alpha=self.alpha, beta=self.beta)

        def fn(a, b, c, bias, scale):
            out = tcgemm(a, b, c, bias, scale, activation=self.activation, aux=self.aux, **kw)
            return list(out) if self.aux else [out]
        return fn

    def wants(self, ab, c, bias):
        d, pre = epilogue64(ab, c, bias, alpha=self.alpha, beta=self.beta,
                            activation=self.activation)
        return [d, pre] if self.aux else [d]


EPILOGUES = (
    Epi("c_f32+bias+gelu_tanh", "full", "f32", "shared", "gelu_tanh", 0.75, -1.5),
    Epi("c_row_out+relu", "row", "out", None, "relu", -1.25, 0.5),
    Epi("c_col_in+bias_batched+silu", "col", "in", "batched", "silu", 1.0, 2.0),
    Epi("aux+c_out+bias+gelu", "full", "out", "shared", "gelu", 0.5, 1.0, aux=True),
    Epi("traced_scale+c_shared_f32", "shared", "f32", None, "none", -0.625, 1.75, traced=True),
    # no C (a layer's forward): bias of every dtype, traced alpha, aux
    Epi("aux+bias_out+gelu_tanh", None, None, "shared", "gelu_tanh", 0.75, 0.0, aux=True,
        bias_dtype="out"),
    Epi("bias_batched_in+gelu_tanh", None, None, "batched", "gelu_tanh", -1.25, 0.0,
        bias_dtype="in"),
    Epi("traced_scale+bias+relu", None, None, "shared", "relu", 1.5, 0.0, traced=True),
)
NO_C = tuple(e for e in EPILOGUES if not e.c)

# (tag, Ba, Bb, M, N, K): batch 2 with a shared B, then with a shared A; the third (odd N: D
# and aux stored element by element, the bias read past no row end) with the epilogues
# without C only
GRID_SHAPES = (("s1", 2, 1, 150, 260, 200), ("s2", 1, 2, 33, 72, 1000),
               ("s3", 2, 1, 130, 261, 136))

_host_cache: dict = {}


def logical(tag, ba, bb, m, n, k, dt):
    """Logical host a (Ba, M, K), b (Bb, K, N) and their float64 product (cached)."""
    key = (tag, ba, bb, m, n, k, dt)
    if key not in _host_cache:
        rng = rng_of("logical", *key[:-1], dt.name)
        a = rng.standard_normal((ba, m, k), np.float32).astype(dt)
        b = rng.standard_normal((bb, k, n), np.float32).astype(dt)
        _host_cache[key] = a, b, np.matmul(f64(a), f64(b))
    return _host_cache[key]


def grid_products(config, split, si):
    """Every epilogue x layout x input dtype x shape for (config, split); the output dtype
    cycles with the split index si."""
    out = []
    for (gi, (tag, ba, bb, m, n, k)), dt in itertools.product(enumerate(GRID_SHAPES),
                                                               (F16, BF16)):
        a, b, ab = logical(tag, ba, bb, m, n, k, dt)
        stores = {(x, t): stored(v, t) for x, v in (("a", a), ("b", b)) for t in (False, True)}
        for (li, (ta, tb)), (ei, epi) in itertools.product(
                enumerate(LAYOUTS), enumerate(NO_C if tag == "s3" else EPILOGUES)):
            od = OUT_DTYPES[(ei + li + gi + si) % 3]
            c, bias, scale = epi.operands(max(ba, bb), m, n, dt, od, tag)
            fn = epi.call(transpose_a=ta, transpose_b=tb, out_dtype=od, config=config,
                          split_k=split)
            out.append(Product(
                f"{config} split_k={split} {tag} {LNAME(ta, tb)} {dt.name}->{od.name} "
                f"{epi.name}", fn, (stores["a", ta], stores["b", tb], c, bias, scale),
                epi.wants(ab, c, bias), od, k))
    return out


@pytest.mark.parametrize("config", CONFIG_NAMES)
def test_every_config(config):
    """152 products (192 outputs with aux) per split, in one jit."""
    for si, split in enumerate(SPLITS):
        check_products(grid_products(config, split, si))


# ---------------------------------------------------------------------------------------------
# The planner's paths through tg.gemm: packed / unaligned shapes and the decode shape.

def gemm_products(tag, m, n, k, dt, forced=()):
    """tg.gemm (the planner) with: full float32 C + bias + gelu_tanh; per-row C of the output
    dtype + relu; per-column float32 C + bias + silu with traced alpha and beta (float32
    output); both operands stored transposed; and tcgemm_p with aux (gelu). `forced`: (config,
    split) pairs, each with one of the epilogues."""
    rng = rng_of("gemm", tag, m, n, k, dt.name)
    a = rng.standard_normal((m, k), np.float32).astype(dt)
    b = rng.standard_normal((k, n), np.float32).astype(dt)
    ab = f64(a) @ f64(b)
    c_full = rng.standard_normal((m, n), np.float32)
    c_row = rng.standard_normal((m, 1), np.float32).astype(dt)
    c_col = rng.standard_normal((n,), np.float32)
    bias = rng.standard_normal((n,), np.float32)
    scale = (np.float32(-0.75), np.float32(1.25))
    ps = [
        Product(f"{tag} gemm c_f32+bias+gelu_tanh", lambda x, y, c, z: [tg.gemm(
            x, y, c, alpha=0.75, beta=-1.5, bias=z, activation="gelu_tanh")],
            (a, b, c_full, bias), [act64("gelu_tanh", 0.75 * ab - 1.5 * f64(c_full) + bias)],
            dt, k),
        Product(f"{tag} gemm c_row+relu", lambda x, y, c: [tg.gemm(
            x, y, c, alpha=-1.25, beta=0.5, activation="relu")],
            (a, b, c_row), [act64("relu", -1.25 * ab + 0.5 * f64(c_row))], dt, k),
        Product(f"{tag} gemm c_col+bias+silu traced f32", lambda x, y, c, z, al, be: [tg.gemm(
            x, y, c, alpha=al, beta=be, bias=z, activation="silu", out_dtype=F32)],
            (a, b, c_col, bias) + scale,
            [act64("silu", -0.75 * ab + 1.25 * f64(c_col) + bias)], F32, k),
        Product(f"{tag} gemm TT c_f32+bias+gelu_tanh f32", lambda x, y, c, z: [tg.gemm(
            x, y, c, alpha=0.75, beta=-1.5, bias=z, activation="gelu_tanh", transpose_a=True,
            transpose_b=True, out_dtype=F32)], (stored(a, True), stored(b, True), c_full, bias),
            [act64("gelu_tanh", 0.75 * ab - 1.5 * f64(c_full) + bias)], F32, k),
        Product(f"{tag} tcgemm aux gelu", lambda x, y, c, z: list(tcgemm(
            x[None], y[None], c[None], z[None], beta=1.0, activation="gelu", aux=True)),
            (a, b, c_full, bias), list(epilogue64(ab[None], c_full, bias, beta=1.0,
                                                  activation="gelu")), dt, k),
    ]
    for i, (cfg, split) in enumerate(forced):
        epi = EPILOGUES[i % len(EPILOGUES)]
        od = OUT_DTYPES[i % 3]
        c, bi, sc = epi.operands(1, m, n, dt, od, tag)
        ps.append(Product(f"{tag} {cfg} split_k={split} {epi.name} ->{od.name}", epi.call(
            out_dtype=od, config=cfg, split_k=split), (a[None], b[None], c, bi, sc),
            epi.wants(ab[None], c, bi), od, k))
    return ps


@pytest.mark.parametrize("tag,m,n,k,dt", [
    ("packed", 4095, 4097, 1031, BF16),  # rows of K = 1031 and N = 4097: packed
    ("pitch", 513, 1000, 3000, F16),     # rows of 3000 and 1000: packed for the pitch
], ids=["4095x4097x1031", "513x1000x3000"])
def test_planned_paths(tag, m, n, k, dt):
    assert configs.should_pack(m, n, k) and configs.should_pack(m, n, k, 1, True, True)
    check_products(gemm_products(tag, m, n, k, dt))


@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
def test_decode_tiles(dt):
    """16 x 4096 x 4096: planned, and forced onto every 16-row tile with every split (cluster
    splits 2 and 4, the workspace for 16) and onto an sm90 row with split 2."""
    skinny = [c.name for c in configs.CONFIGS16 if c.bm < 64]
    assert skinny, "no 16-row tile in the config table"
    forced = [(c, s) for c in skinny for s in SPLITS]
    forced += [(c.name, 2) for c in configs.CONFIGS16 if c.kind == "sm90"][:1]
    check_products(gemm_products("decode", 16, 4096, 4096, dt, forced))


# ---------------------------------------------------------------------------------------------
# Edge sizes.

EDGE_SHAPES = (("k0", 2, 1, 37, 45, 0), ("k0_big", 1, 1, 300, 520, 0), ("one", 1, 1, 1, 1, 1),
               ("row", 1, 1, 1, 300, 1), ("col", 2, 2, 300, 1, 513))
EMPTY_SHAPES = (("m0", 2, 1, 0, 45, 33), ("n0", 1, 2, 37, 0, 33), ("all0", 1, 1, 0, 0, 0),
                ("m0k0", 2, 2, 0, 45, 0))


@pytest.mark.parametrize("config", CONFIG_NAMES + [None], ids=lambda c: c or "planned")
def test_edge_sizes(config):
    """K = 0 (D = act(beta * C + bias): the product is zero), M, N, K = 1, with a full float32
    C + bias + gelu_tanh and with aux + C + bias + gelu, in splits 1 and 2; and empty results
    (M or N = 0) have their shapes."""
    ps = []
    for (si, split), (gi, (tag, ba, bb, m, n, k)), (ei, epi) in itertools.product(
            enumerate((1, 2) if config else (None,)), enumerate(EDGE_SHAPES),
            enumerate((EPILOGUES[0], EPILOGUES[3]))):
        dt, od = (F16, BF16)[gi % 2], OUT_DTYPES[(si + gi + ei) % 3]
        ta, tb = LAYOUTS[(si + gi + ei) % 4]
        a, b, ab = logical(tag, ba, bb, m, n, k, dt)
        c, bias, scale = epi.operands(max(ba, bb), m, n, dt, od, tag)
        ps.append(Product(f"{config} split_k={split} {tag} {LNAME(ta, tb)} {epi.name} "
                          f"->{od.name}", epi.call(transpose_a=ta, transpose_b=tb, out_dtype=od,
                                                   config=config, split_k=split),
                          (stored(a, ta), stored(b, tb), c, bias, scale),
                          epi.wants(ab, c, bias), od, max(k, 1)))
    check_products(ps)
    calls, ops, shapes = [], [], []
    for (tag, ba, bb, m, n, k), epi, (ta, tb) in itertools.product(EMPTY_SHAPES, EPILOGUES,
                                                                    LAYOUTS[::3]):
        a = np.zeros((ba, k, m) if ta else (ba, m, k), BF16)
        b = np.zeros((bb, n, k) if tb else (bb, k, n), BF16)
        calls.append(epi.call(transpose_a=ta, transpose_b=tb, out_dtype=F32, config=config,
                              split_k=1 if config else None))
        ops.append((a, b) + epi.operands(max(ba, bb), m, n, BF16, F32, tag))
        shapes.append([((max(ba, bb), m, n), F32)] * (2 if epi.aux else 1))
    outs = jax.jit(lambda ops: [f(*xs) for f, xs in zip(calls, ops)])(ops)  # one jit
    assert [[(o.shape, o.dtype) for o in out] for out in outs] == shapes


# ---------------------------------------------------------------------------------------------
# The backward pass of the epilogue: tcgemm_dact_p.

DACT_FLAGS = [(True, True, False), (True, True, True), (True, False, False),
              (False, True, False), (False, True, True)]  # (has_g, has_dbias, bias_batched)


def dact_products(tag, rng, shape, act, gdt, flags, ct_dtype, pre_dtype):
    """The checked outputs of one tcgemm_dact call on fresh N(0, 1) ct and N(0, 9) pre: g
    (has_g) and dbias (has_dbias; float32 sums of g, rounded to g's dtype at least where g is
    written), against float64 numpy."""
    has_g, has_dbias, batched = flags
    ct = rng.standard_normal(shape, np.float32).astype(ct_dtype)
    pre = (rng.standard_normal(shape, np.float32) * 3).astype(pre_dtype)
    g = f64(ct) * act_grad64(act, pre)
    # without an activation pre is not read: a scalar stands in for it, as in the AD rules
    pre_op = pre if act != "none" else np.zeros((), F16)
    fn = (lambda a, q: tcgemm_dact_p.bind(a, q, activation=act, has_g=has_g,
                                          has_dbias=has_dbias, g_dtype=gdt, bias_batched=batched))
    what = (f"{tag}: {shape} {act} ct {ct.dtype} pre {pre.dtype} g {gdt.name} "
            f"has_g={has_g} has_dbias={has_dbias} bias_batched={batched}")
    ps = []
    if has_g:
        ps.append(Product(what + " g", lambda a, q: fn(a, q)[:1], (ct, pre_op), [g], gdt, 1))
    if has_dbias:
        want = g.sum(1) if batched else g.sum((0, 1))[None]
        ps.append(Product(what + " dbias", lambda a, q: fn(a, q)[-1:], (ct, pre_op), [want],
                          F32, 1, slack=bound(gdt) / bound(F32)))
    return ps


def test_dact_kernel():
    """g = ct * act'(pre) (rounded once to g's dtype) and dbias = the column sums of g, for
    every activation, g dtype, (has_g, has_dbias) and bias_batched, ct and pre of every
    dtype, against float64 numpy; rows and columns no multiple of the kernel's 8 x 32. Mixed
    dtypes (the scalar kernel), and ct, pre and g of one dtype on rows of 16-byte multiples
    (the vector kernel: 128-byte lines, and narrow rows of fewer chunks than a block's)."""
    shapes = ((3, 130, 300), (2, 1029, 97))
    vec_shapes = ((3, 131, 264), (2, 517, 40))
    combos = [(shape, act, gdt, fl, (i % 3, (i + 1) % 3)) for i, (shape, act, gdt, fl) in
              enumerate(itertools.product(shapes, ACTIVATIONS, OUT_DTYPES, DACT_FLAGS))
              if shape == shapes[0] or gdt == BF16]  # the long columns: bfloat16 g only
    same = list(OUT_DTYPES).index
    combos += [(shape, act, gdt, fl, (same(gdt), same(gdt))) for shape, act, gdt, fl in
               itertools.product(vec_shapes, ACTIVATIONS, OUT_DTYPES, DACT_FLAGS)]
    ps = []
    for shape, act, gdt, fl, (ci, pi) in combos:
        ps += dact_products("dact", rng_of("dact", shape, act, gdt.name, *fl, ci, pi), shape,
                            act, gdt, fl, OUT_DTYPES[ci], OUT_DTYPES[pi])
    check_products(ps)


def test_dact_fuzz():
    """TCGEMM_FUZZ_DACT_CASES (default 300) random tcgemm_dact calls against float64: batch,
    rows (1 to ~3000) and columns (multiples of 8 and 4, and any) drawn at random, mostly ct,
    pre and g of one dtype (the vector kernel, all its block shapes and row splits), the rest
    mixed (the scalar kernel); every activation and (has_g, has_dbias, bias_batched)."""
    import os
    import random
    r = random.Random(seed_of("dact_fuzz"))
    ps = []
    for case in range(int(os.environ.get("TCGEMM_FUZZ_DACT_CASES", "300"))):
        shape = (r.choice([1, 1, 2, 3, 4]), int(np.exp(r.uniform(0, np.log(3000)))),
                 r.choice([8 * r.randint(1, 256), 4 * r.randint(1, 160), r.randint(1, 700)]))
        act, fl = r.choice(ACTIVATIONS), r.choice(DACT_FLAGS)
        gi = r.randrange(3)
        ci, pi = (gi, gi) if r.random() < 0.7 else (r.randrange(3), r.randrange(3))
        ps += dact_products(f"dact fuzz {case}", rng_of("dact_fuzz", case), shape, act,
                            OUT_DTYPES[gi], fl, OUT_DTYPES[ci], OUT_DTYPES[pi])
    print(f"dact fuzz: {len(ps)} outputs")
    for i in range(0, len(ps), 100):
        check_products(ps[i:i + 100])


# ---------------------------------------------------------------------------------------------
# grad through the epilogue.

@pytest.mark.parametrize("act", [None] + list(ACTIVATIONS[1:]), ids=str)
def test_grad_through_epilogue(act):
    """grad of sum(ct * gemm(x, w, c, alpha, beta, bias, act)) with respect to x, w, c and bias
    (x batched, w shared: its gradient sums over the batch) against the float64 chain rule,
    for float16 / bfloat16 inputs, float16 / bfloat16 / float32 outputs, two layouts; the
    gradients keep the inputs' dtypes. Bounds: twice the dtype's (g is rounded to the output
    dtype, the pre-activation to it too, then the product is rounded)."""
    bt, m, n, k, al, be = 2, 130, 520, 264, 0.75, -0.5
    cases, args = [], []
    for dt, od in ((F16, F16), (BF16, BF16), (BF16, F32), (F16, F32)):
        rng = rng_of("grad", act, dt.name, od.name)
        x = rng.standard_normal((bt, m, k), np.float32).astype(dt)
        w = rng.standard_normal((k, n), np.float32).astype(dt)
        c = rng.standard_normal((bt, m, n), np.float32).astype(od)
        bias = rng.standard_normal((n,), np.float32)
        ct = rng.standard_normal((bt, m, n), np.float32)
        _, pre = epilogue64(np.matmul(f64(x), f64(w)), c, bias, alpha=al, beta=be)
        g = f64(ct) * act_grad64(act, pre)
        want = {"x": al * g @ f64(w).T, "w": al * np.einsum("bmk,bmn->kn", f64(x), g),
                "c": be * g, "bias": g.sum((0, 1))}
        for ta, tb in ((False, False), (True, True)):
            cases.append((dt, od, ta, tb, want))
            args.append((stored(x, ta), stored(w, tb), c, bias, ct))

    def grads(args):  # every case's gradients in one jit
        out = []
        for (_, od, ta, tb, _), (xs, ws, cs, bs, ct) in zip(cases, args):
            def loss(xs, ws, cs, bs, ta=ta, tb=tb, od=od, ct=ct):
                d = tg.gemm(xs, ws, cs, alpha=al, beta=be, bias=bs, activation=act,
                            transpose_a=ta, transpose_b=tb, out_dtype=od)
                return jnp.sum(d.astype(jnp.float32) * ct)
            out.append(jax.grad(loss, argnums=(0, 1, 2, 3))(xs, ws, cs, bs))
        return out

    fails = []
    for (dt, od, ta, tb, want), got in zip(cases, jax.jit(grads)(args)):
        for (name, ref), gv, dtype in zip(want.items(), got, (dt, dt, od, F32)):
            ref = stored(ref, {"x": ta, "w": tb}.get(name, False))
            what = f"d{name} act={act} {dt.name}->{od.name} {LNAME(ta, tb)}"
            if gv.dtype != dtype or gv.shape != ref.shape:
                fails.append(f"{what}: {gv.shape} {gv.dtype}, expected {ref.shape} {dtype}")
                continue
            lim = 2 * bound(od if name in ("c", "bias") else dtype, k)
            if not rel_err(gv, ref) <= lim:
                fails.append(f"{what}: rel err {rel_err(gv, ref):.3g} > {lim:.3g}")
    assert not fails, "\n".join(fails)


# ---------------------------------------------------------------------------------------------
# A donated c updated in place.

def test_overwrite_c_in_place():
    """tcgemm(..., overwrite_c=True) in a jit that donates c writes D into c's buffer (the
    same address; c is consumed) with the right values, on the planned path, an sm80 row, a
    cluster split, the workspace split, an sm90 row and its workspace split, for float32 and
    bfloat16 C / D; without donation c is left intact. tg.gemm's residual update likewise."""
    bt, m, n, k = 2, 300, 520, 264
    rng = rng_of("overwrite")
    a = rng.standard_normal((bt, m, k), np.float32).astype(F16)
    b = rng.standard_normal((1, k, n), np.float32).astype(F16)
    bias = rng.standard_normal((1, n), np.float32)
    c0 = rng.standard_normal((bt, m, n), np.float32)
    ab = np.matmul(f64(a), f64(b))
    sm80 = [c.name for c in configs.CONFIGS if c.kind == "sm80" and c.bm >= 64]
    sm90 = [c.name for c in configs.CONFIGS16 if c.kind == "sm90"]
    plans = [(None, None), (sm80[0], 1), (sm80[-1], 2), (sm80[0], 16), (sm90[0], 1),
             (sm90[-1], 2)]
    da, db, dbias = jax.device_put(a), jax.device_put(b), jax.device_put(bias)
    fails = []
    for (cfg, split), od in itertools.product(plans, (F32, BF16)):
        c = c0.astype(od)
        want = epilogue64(ab, c, bias, alpha=0.5, beta=1.0, activation="gelu_tanh")[0]

        def f(x, y, cc, z, cfg=cfg, split=split, od=od):
            return tcgemm(x, y, cc, z, alpha=0.5, beta=1.0, activation="gelu_tanh", out_dtype=od,
                          config=cfg, split_k=split, overwrite_c=True)
        dc = jax.device_put(c)
        ptr = dc.unsafe_buffer_pointer()
        out = jax.jit(f, donate_argnums=2)(da, db, dc, dbias)
        what = f"{cfg or 'planned'} split_k={split} {od.name}"
        if out.unsafe_buffer_pointer() != ptr or not dc.is_deleted():
            fails.append(f"{what}: D is not in c's buffer")
        if not rel_err(out, want) <= bound(od, k):
            fails.append(f"{what}: rel err {rel_err(out, want):.3g}")
        kept = jax.device_put(c)  # not donated: XLA copies c first
        out2 = jax.jit(f)(da, db, kept, dbias)
        if not np.array_equal(np.asarray(kept).view(np.uint8), c.view(np.uint8)):
            fails.append(f"{what}: an undonated c was overwritten")
        if not np.array_equal(np.asarray(out2).view(np.uint8), np.asarray(out).view(np.uint8)):
            fails.append(f"{what}: in place and copied results differ")
    # tg.gemm: the residual stream h <- h + x @ w, donated
    h0 = rng.standard_normal((m, n), np.float32)
    dh = jax.device_put(h0)
    ptr = dh.unsafe_buffer_pointer()
    step = jax.jit(lambda x, y, h: tg.gemm(x, y, h, beta=1.0, out_dtype=F32, overwrite_c=True),
                   donate_argnums=2)
    out = step(a[0], b[0], dh)
    if out.unsafe_buffer_pointer() != ptr:
        fails.append("tg.gemm residual: D is not in h's buffer")
    if not rel_err(out, ab[0] + h0) <= bound(F32, k):
        fails.append(f"tg.gemm residual: rel err {rel_err(out, ab[0] + h0):.3g}")
    assert not fails, "\n".join(fails)
