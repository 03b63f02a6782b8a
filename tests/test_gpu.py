"""GPU tests of the CUDA kernels (DESIGN §7). Every test is marked `gpu`: skipped off-GPU with a
reason, failed instead when TCGEMM_REQUIRE_GPU=1 (see conftest.py).

References are float64 numpy products of the already-rounded float16/bfloat16 inputs; errors
are relative Frobenius norms within conftest.BOUNDS (float32 output: scaled with K, see
conftest.bound). Inputs are fresh standard-normal draws seeded from the case parameters; one
draw serves all layouts / output dtypes / configs of a shape (each layout stores it
differently, so a layout-flag bug still changes the result).

Unwritten outputs: every kernel result checked here comes from `run`, which compiles the
product once and runs it twice, each time into a fresh NaN-filled buffer donated for its output
(conftest.poisoned_twice: XLA writes the result into that very buffer, and `run` requires it),
then requires both runs to agree bitwise and to match the float64 reference on every element.
An element the kernel never writes therefore shows up as NaN, and a racy or non-deterministic
write as a difference between the two runs.

Speed: kernels are called through one jitted wrapper with static flags (one small XLA compile
per shape/layout/dtype), operands are created and transposed on the host, and the large-shape
cases use a reduced dtype x layout product.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg
from jax_tcgemm import configs
from jax_tcgemm.primitive import tcgemm

from conftest import (assert_close, bound, f64, nan_filled, poisoned, poisoned_twice, rel_err,
                      seed_of)

pytestmark = pytest.mark.gpu

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
IN_DTYPES = (F16, BF16)
OUT_DTYPES = (F16, BF16, F32)
LAYOUTS = list(itertools.product((False, True), repeat=2))  # (transpose_a, transpose_b)
LNAME = configs.layout_name
CONFIG_NAMES = [c.name for c in configs.CONFIGS16]
SM90_NAMES = [c.name for c in configs.CONFIGS16 if c.kind == "sm90"]

_tc = jax.jit(tcgemm, static_argnames=("transpose_a", "transpose_b", "out_dtype", "config",
                                        "split_k"))


def make(tag, m, n, k, dtype, ba=1, bb=1):
    """Host operands a (ba, M, K), b (bb, K, N) in `dtype` and their float64 product."""
    rng = np.random.default_rng(seed_of(tag, m, n, k, np.dtype(dtype).name, ba, bb))
    a = rng.standard_normal((ba, m, k), np.float32).astype(dtype)
    b = rng.standard_normal((bb, k, n), np.float32).astype(dtype)
    return a, b, np.matmul(a.astype(np.float64), b.astype(np.float64))


def put(x, transposed):
    """A logical (B, R, C) host operand on the GPU in its stored layout ((B, C, R) if T)."""
    return jax.device_put(np.ascontiguousarray(np.swapaxes(x, -1, -2)) if transposed else x)


def run(fn, *args, out_shape, out_dtype):
    """fn(*args) compiled once and run twice, each run into a fresh NaN-filled buffer donated
    for its output (conftest.poisoned_twice); the result must be written in place, contain no
    NaN, and agree bitwise between the runs. Returns the second result."""
    outs, same, in_place = poisoned_twice(lambda *xs: [fn(*xs)], *args)
    host = outs[0]
    assert host.shape == tuple(out_shape) and host.dtype == out_dtype
    assert in_place == (1 if host.size else 0), "the output was not written into its poison"
    assert not np.isnan(host.astype(np.float32)).any(), "NaN in the output: unwritten elements"
    assert same[0], "two identical calls differ"
    return host


def check_all(a, b, ref, layouts, out_dtypes, configs_=(None,), what=""):
    """Runs tcgemm on (a, b) stored in each layout, for each out dtype and config (a name, None
    for the planner's choice, or a (name, split_k) pair); collects every failure before
    asserting."""
    k = a.shape[2]
    bt, m, n = ref.shape
    fails, stored = [], {}
    for (ta, tb), od, cfg in itertools.product(layouts, out_dtypes, configs_):
        for key, x, t in (("a", a, ta), ("b", b, tb)):
            if (key, t) not in stored:
                stored[key, t] = put(x, t)
        sa, sb = stored["a", ta], stored["b", tb]
        name, split = cfg if isinstance(cfg, tuple) else (cfg, None)
        fn = lambda x, y: _tc(x, y, transpose_a=ta, transpose_b=tb, out_dtype=od, config=name,  # noqa: E731,B023
                              split_k=split)  # noqa: B023
        case = f"{what} {LNAME(ta, tb)} {a.dtype}->{od} {name or 'auto'} split_k={split}"
        try:
            out = run(fn, sa, sb, out_shape=(bt, m, n), out_dtype=od)
        except AssertionError as e:
            fails.append(f"{case}: {str(e).splitlines()[0]}")
            continue
        err = rel_err(out, ref)
        if not err <= bound(od, k):
            fails.append(f"{case}: rel err {err:.3g} > {bound(od, k):.3g}")
    assert not fails, "\n".join(fails)


# ---------------------------------------------------------------------------------------------
# Every dtype x output dtype x layout on small / medium shapes; a reduced product on large ones.

FULL_SHAPES = [(1, 1, 1), (17, 33, 65), (127, 129, 255), (1000, 1000, 1000), (300, 200, 1),
               (2048, 2048, 2048), (1, 515, 129), (515, 1, 129), (8, 8, 8), (33, 9, 4104)]


@pytest.mark.parametrize("m,n,k", FULL_SHAPES, ids=["x".join(map(str, s)) for s in FULL_SHAPES])
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_all_layouts_and_dtypes(m, n, k, dtype):
    a, b, ref = make("full", m, n, k, dtype)
    check_all(a, b, ref, LAYOUTS, OUT_DTYPES, what=f"{m}x{n}x{k}")


LARGE_SHAPES = [(4095, 4097, 4093), (16, 4096, 4096), (4096, 16, 4096), (64, 64, 65536)]


@pytest.mark.parametrize("m,n,k", LARGE_SHAPES, ids=["x".join(map(str, s)) for s in LARGE_SHAPES])
@pytest.mark.parametrize("dtype,out_dtype", [(F16, F32), (BF16, BF16)], ids=str)
def test_large_shapes(m, n, k, dtype, out_dtype):
    a, b, ref = make("large", m, n, k, dtype)
    check_all(a, b, ref, [(False, False), (True, True)], [out_dtype], what=f"{m}x{n}x{k}")


@pytest.mark.parametrize("config", CONFIG_NAMES)
@pytest.mark.parametrize("m,n,k", [(333, 517, 259), (512, 512, 256)], ids=["odd", "aligned"])
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_every_config(config, m, n, k, dtype):
    a, b, ref = make("cfg", m, n, k, dtype)
    check_all(a, b, ref, LAYOUTS, (dtype, F32), configs_=(config,), what=f"{m}x{n}x{k}")


@pytest.mark.parametrize("m,n,k,ba,bb", [(16, 4096, 4096, 1, 1), (33, 517, 2001, 1, 1),
                                         (130, 260, 1000, 3, 1), (64, 72, 4104, 2, 2)], ids=str)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_split_k(m, n, k, ba, bb, dtype):
    """Split-K (K slices summed in float32 by the reduction kernel) for every config, slice
    counts that do and do not divide the k tiles, more slices than k tiles, and batches."""
    a, b, ref = make("splitk", m, n, k, dtype, ba, bb)
    plans = [(c, s) for c in CONFIG_NAMES for s in (2, 5, 16)] + [(CONFIG_NAMES[-1], 64)]
    check_all(a, b, ref, LAYOUTS if m < 100 else [(False, False), (True, True)],
              (dtype, F32), configs_=plans, what=f"{ba}x{m}x{n}x{k}")


@pytest.mark.parametrize("split", [2, 3, 5])
def test_cluster_split_past_grid_z(split):
    """Cluster split-K over more batch items than grid z holds (65535): the blocks of z = 0, 1
    walk a second item, so the 16-row tile's two-slice push reduction reuses its receive slot
    (behind a second cluster barrier phase) and every sm80 config with BK >= 64 (the sliced-K
    rows included) runs its cluster reduction twice."""
    m, n, k, bt = 3, 72, 520, 65537  # 9 k tiles of 64 (5 of 128): 2, 3 and 5 slices
    a, b, ref = make("zloop", m, n, k, BF16, bt, 1)
    names = [c.name for c in configs.CONFIGS if c.kind == "sm80" and c.bk >= 64]
    check_all(a, b, ref, [(False, False), (True, True)], (F32,),
              configs_=[(c, split) for c in names], what=f"{bt}x{m}x{n}x{k}")


def test_planner_splits_skinny_products():
    """The cost model splits K when M is small and K long (for this GPU's compute capability,
    as tcgemm plans), and the result is right."""
    name, split = configs.plan(16, 4096, 11008, 1, F16, "NN", configs.device_arch())
    assert split > 1, (name, split)
    a, b, ref = make("plan", 16, 4096, 11008, F16)
    check_all(a, b, ref, [(False, False)], (F16, F32), configs_=((name, split), None))


@pytest.mark.parametrize("config", SM90_NAMES)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_sm90_configs(config, dtype):
    """Each Hopper (TMA + wgmma) config forced, in every layout, to the input dtype and float32.
    On compute capability 9.0 it runs as itself where both operands' rows are 16-byte multiples
    (as stored or packed) and as its sm80 fallback elsewhere; on other GPUs always as the
    fallback. Either way the result must match the float64 reference. Shapes are not tile
    multiples; each layout of (300, 520, 200) and (129, 257, 1000) has rows of M, N or K that
    are or are not 8-element multiples, so both paths run."""
    c = configs.BY_NAME[config]
    assert c.kind == "sm90" and configs.sm80_fallback(c).bk == c.bk
    for m, n, k in [(300, 520, 200), (129, 257, 1000)]:
        a, b, ref = make("sm90", m, n, k, dtype)
        check_all(a, b, ref, LAYOUTS, (dtype, F32), configs_=(config,), what=f"{m}x{n}x{k}")
    for ba, bb in [(3, 1), (1, 3)]:  # a batch of 3, one operand shared (stride 0)
        a, b, ref = make("sm90_batch", 136, 264, 320, dtype, ba, bb)
        check_all(a, b, ref, LAYOUTS, (dtype, F32), configs_=(config,),
                  what=f"batch {ba}/{bb} 136x264x320")
    # explicit split_k = 2: float32 workspace + reduction kernel (never a cluster for sm90);
    # K = 3000 (47 k tiles) runs every stage's mbarriers through several phases, in 1, 3 and 12
    # slices, over a batch of 2 with a shared B
    a, b, ref = make("sm90_split", 200, 392, 1536, dtype)
    check_all(a, b, ref, LAYOUTS, (dtype, F32), configs_=((config, 2),), what="200x392x1536")
    a, b, ref = make("sm90_longk", 40, 264, 3000, dtype, 2, 1)
    check_all(a, b, ref, LAYOUTS, (F32,), configs_=(config, (config, 3), (config, 12)),
              what="2x40x264x3000")
    # K = 1001: rows of K are not 16-byte multiples. 300 x 520 is large enough to be packed
    # (then TMA-addressable); 129 x 67 is not (the sm80 fallback runs on the operands as stored)
    for m, n in [(300, 520), (129, 67)]:
        a, b, ref = make("sm90_odd", m, n, 1001, dtype)
        assert configs.should_pack(m, n, 1001) is (m == 300)
        check_all(a, b, ref, LAYOUTS, (dtype, F32), configs_=(config, (config, 2)),
                  what=f"{m}x{n}x1001")


@pytest.mark.parametrize("ba,bb", [(5, 5), (1, 5), (5, 1)], ids=["5x5", "1x5", "5x1"])
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_batched_primitive(ba, bb, dtype):
    a, b, ref = make("batch", 67, 45, 93, dtype, ba, bb)  # a batch-1 operand is shared
    check_all(a, b, ref, LAYOUTS, (dtype, F32), what=f"batch {ba}/{bb}")
    a, b, ref = make("batch_cfg", 150, 260, 70, dtype, ba, bb)
    check_all(a, b, ref, [(False, False), (True, True)], (F32,), configs_=CONFIG_NAMES,
              what=f"batch {ba}/{bb}")


@pytest.mark.parametrize("a_shape,b_shape", [
    ((4, 1, 37, 29), (3, 29, 41)), ((2, 3, 37, 29), (29, 41)), ((37, 29), (5, 29, 41)),
    ((5, 37, 29), (5, 29, 41)), ((29,), (3, 29, 41)), ((2, 37, 29), (29,))], ids=str)
def test_matmul_broadcasting(a_shape, b_shape):
    rng = np.random.default_rng(seed_of("bcast", a_shape, b_shape))
    a = rng.standard_normal(a_shape, np.float32).astype(BF16)
    b = rng.standard_normal(b_shape, np.float32).astype(BF16)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    for od in (BF16, F32):
        f = jax.jit(lambda x, y: tg.matmul(x, y, out_dtype=od))  # noqa: B023
        out = run(f, a, b, out_shape=ref.shape, out_dtype=od)
        assert_close(out, ref, od, 29, f"matmul {a_shape} @ {b_shape} -> {od}")


# ---------------------------------------------------------------------------------------------
# Poisoning, zero sizes.

def test_poison_reaches_the_kernel_output():
    """The donated NaN buffer is the kernel's output buffer (same address, no copy in the
    executable), so an element the kernel leaves unwritten keeps its NaN, which `run` reports."""
    a, b, ref = make("poison", 257, 129, 96, F16)
    sa, sb = put(a, False), put(b, False)
    fn = lambda x, y: [_tc(x, y, out_dtype=F32)]  # noqa: E731
    poisons = nan_filled(jax.eval_shape(fn, sa, sb))
    call = poisoned(fn, poisons, sa, sb)
    for _ in range(3):
        fresh = nan_filled(jax.eval_shape(fn, sa, sb))
        ptr = fresh[0].unsafe_buffer_pointer()
        (out,), (in_place,) = call(fresh, sa, sb)
        assert in_place and out.unsafe_buffer_pointer() == ptr
        assert_close(np.asarray(out), ref, F32, 96, "poisoned")


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=[LNAME(*t) for t in LAYOUTS])
@pytest.mark.parametrize("m,n,batch", [(37, 45, 1), (300, 260, 3)], ids=str)
def test_k0_gives_zeros(ta, tb, m, n, batch):
    a = jnp.zeros((batch, 0, m) if ta else (batch, m, 0), F16)
    b = jnp.zeros((1, n, 0) if tb else (1, 0, n), F16)
    for od in OUT_DTYPES:
        fn = lambda x, y: _tc(x, y, transpose_a=ta, transpose_b=tb, out_dtype=od)  # noqa: B023
        out = run(fn, a, b, out_shape=(batch, m, n), out_dtype=od)
        np.testing.assert_array_equal(out.astype(np.float32), 0.0)


@pytest.mark.parametrize("m,n,k", [(0, 45, 33), (37, 0, 33), (0, 0, 0), (0, 45, 0)], ids=str)
def test_empty_outputs(m, n, k):
    for (ta, tb), cfg in itertools.product(LAYOUTS, CONFIG_NAMES):
        a = jnp.ones((2, k, m) if ta else (2, m, k), BF16)
        b = jnp.ones((2, n, k) if tb else (2, k, n), BF16)
        out = _tc(a, b, transpose_a=ta, transpose_b=tb, out_dtype=F32, config=cfg)
        out.block_until_ready()
        assert out.shape == (2, m, n) and out.dtype == F32


# ---------------------------------------------------------------------------------------------
# The custom call is really what runs, and the transformations on the GPU.

def test_gpu_runs_the_custom_call():
    a, b = jnp.ones((64, 32), F16), jnp.ones((32, 16), F16)
    lowered = jax.jit(tg.matmul).lower(a, b)
    assert "stablehlo.custom_call @tcgemm" in lowered.as_text()
    assert "tcgemm" in lowered.compile().as_text()
    g = jax.value_and_grad(lambda x, y: tg.matmul(x, y, out_dtype=F32).sum(), argnums=(0, 1))
    assert jax.jit(g).lower(a, b).as_text().count("stablehlo.custom_call @tcgemm") == 3


@pytest.mark.parametrize("in_axes,shapes", [
    ((0, None), ((6, 70, 50), (50, 40))), ((None, 0), ((70, 50), (6, 50, 40))),
    ((0, 0), ((6, 70, 50), (6, 50, 40))), ((1, 2), ((70, 6, 50), (50, 40, 6))),
    ((0, None), ((4, 2, 70, 50), (2, 50, 40))), ((0, 0), ((4, 2, 70, 50), (4, 1, 50, 40)))],
    ids=str)
def test_vmap(in_axes, shapes):
    rng = np.random.default_rng(seed_of("vmap", in_axes, shapes))
    x = rng.standard_normal(shapes[0], np.float32).astype(F16)
    y = rng.standard_normal(shapes[1], np.float32).astype(F16)
    out = jax.jit(jax.vmap(lambda a, b: tg.matmul(a, b, out_dtype=F32), in_axes=in_axes))(x, y)
    # mapped axes to the front; an unmapped operand broadcasts in np.matmul
    xm = f64(x) if in_axes[0] is None else np.moveaxis(f64(x), in_axes[0], 0)
    ym = f64(y) if in_axes[1] is None else np.moveaxis(f64(y), in_axes[1], 0)
    assert_close(out, np.matmul(xm, ym), F32, 50, f"vmap {in_axes}")


def test_vmap_of_vmap():
    rng = np.random.default_rng(seed_of("vmap2"))
    x = rng.standard_normal((3, 4, 70, 50), np.float32).astype(BF16)
    y = rng.standard_normal((3, 50, 40), np.float32).astype(BF16)
    f = jax.jit(jax.vmap(jax.vmap(lambda a, b: tg.matmul(a, b, out_dtype=F32), (0, None))))
    assert_close(f(x, y), np.matmul(f64(x), f64(y)[:, None]), F32, 50)


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=[LNAME(*t) for t in LAYOUTS])
@pytest.mark.parametrize("dtype,out_dtype", [(F16, F32), (BF16, BF16)], ids=str)
def test_grad_vs_jnp(ta, tb, dtype, out_dtype):
    m, n, k = 130, 70, 190
    a, b, _ = make("grad", m, n, k, dtype, 3, 1)  # b shared by the batch: its grad sums
    ct = np.random.default_rng(seed_of("ct", ta, tb)).standard_normal((3, m, n), np.float32)
    ct = ct.astype(out_dtype)
    sa, sb = put(a, ta), put(b, tb)
    f_ours = lambda x, y: tcgemm(x, y, transpose_a=ta, transpose_b=tb, out_dtype=out_dtype)
    f_jnp = lambda x, y: jnp.matmul(jnp.swapaxes(x, 1, 2) if ta else x,
                                    jnp.swapaxes(y, 1, 2) if tb else y,
                                    preferred_element_type=out_dtype)
    vjp = lambda f: jax.jit(lambda x, y, c: jax.vjp(f, x, y)[1](c))  # noqa: E731
    ours, theirs = vjp(f_ours)(sa, sb, ct), vjp(f_jnp)(sa, sb, ct)
    c64 = ct.astype(np.float64)
    da = c64 @ np.swapaxes(b.astype(np.float64), 1, 2)
    db = (np.swapaxes(a.astype(np.float64), 1, 2) @ c64).sum(0, keepdims=True)
    refs = (np.swapaxes(da, 1, 2) if ta else da, np.swapaxes(db, 1, 2) if tb else db)
    for name, got, jn, ref, kk in zip("ab", ours, theirs, refs, (n, 3 * m)):
        assert got.dtype == jn.dtype == dtype and got.shape == jn.shape == ref.shape
        assert_close(got, ref, dtype, kk, f"d{name}")
        # jnp's own error can exceed the bound (for the shared b it sums per-batch grads
        # rounded to bf16); agreement is only required up to that.
        tol = 2 * max(bound(dtype), rel_err(jn, ref))
        assert rel_err(got, f64(jn)) <= tol, f"d{name} vs jnp.matmul's"


def test_scan_and_fori_loop_of_50_calls():
    """50 kernel calls inside one jitted loop (XLA may capture them in a command buffer)
    equal the same 50 calls made one by one."""
    rng = np.random.default_rng(seed_of("scan"))
    A = jax.device_put(rng.standard_normal((50, 96, 80), np.float32).astype(F16))
    B = jax.device_put(rng.standard_normal((1, 80, 72), np.float32).astype(F16))
    W = jax.device_put((rng.standard_normal((1, 80, 80), np.float32) / 9).astype(F16))
    step = jax.jit(lambda a, b: tcgemm(a[None], b, out_dtype=F32)[0])
    step16 = jax.jit(lambda x, w: tcgemm(x[None], w)[0])

    @jax.jit
    def scanned(A, B):  # 50 independent products
        return lax.scan(lambda c, a: (c, tcgemm(a[None], B, out_dtype=F32)[0]), 0, A)[1]

    @jax.jit
    def chained(x, W):  # 50 dependent products: x <- x @ W
        return lax.fori_loop(0, 50, lambda i, x: tcgemm(x[None], W)[0], x)

    singles = np.stack([np.asarray(step(A[i], B)) for i in range(50)])
    np.testing.assert_array_equal(np.asarray(scanned(A, B)), singles)
    assert_close(singles, np.matmul(f64(A), f64(B)), F32, 80, "per-call")
    x = A[0]
    for _ in range(50):
        x = step16(x, W)
    assert np.isfinite(f64(x)).all() and np.abs(f64(x)).max() > 1e-3
    np.testing.assert_array_equal(f64(chained(A[0], W)), f64(x))


DG_CASES = [((2, 5, 70, 40), (2, 5, 30, 40), (((3,), (3,)), ((0, 1), (0, 1)))),  # attention QK^T
            ((70, 3, 40), (40, 3, 30), (((2,), (0,)), ((1,), (1,)))),            # batch in middle
            ((6, 40, 7), (7, 30, 6), (((2, 0), (0, 2)), ((), ()))),              # 2 contracting
            ((4, 33, 65), (65, 17), (((2,), (0,)), ((), ())))]                    # Dense


def dot_general64(x, y, dims):
    """lax.dot_general's semantics in float64 numpy."""
    (lc, rc), (lb, rb) = (list(map(list, d)) for d in dims)
    lf = [d for d in range(x.ndim) if d not in lc + lb]
    rf = [d for d in range(y.ndim) if d not in rc + rb]
    x, y = np.transpose(f64(x), lb + lf + lc), np.transpose(f64(y), rb + rc + rf)
    nb, size = len(lb), lambda s: int(np.prod(s))  # noqa: E731
    bs, fs, gs = x.shape[:nb], x.shape[nb:nb + len(lf)], y.shape[y.ndim - len(rf):]
    out = np.matmul(x.reshape(size(bs), size(fs), -1), y.reshape(size(bs), -1, size(gs)))
    return out.reshape(bs + fs + gs)


@pytest.mark.parametrize("lhs,rhs,dims", DG_CASES, ids=str)
def test_dot_general(lhs, rhs, dims):
    rng = np.random.default_rng(seed_of("dg", lhs, rhs))
    x = rng.standard_normal(lhs, np.float32).astype(BF16)
    y = rng.standard_normal(rhs, np.float32).astype(BF16)
    ref = dot_general64(x, y, dims)
    k = int(np.prod([lhs[d] for d in dims[0][0]]))
    for pet in (None, F32):
        f = jax.jit(lambda a, b: tg.dot_general(a, b, dims, preferred_element_type=pet))  # noqa: B023
        out = f(x, y)
        want = jax.eval_shape(lambda a, b: lax.dot_general(a, b, dims, preferred_element_type=pet),  # noqa: B023
                              x, y)
        assert (out.shape, out.dtype) == (want.shape, want.dtype)
        assert_close(out, ref, out.dtype, k, f"dot_general {dims}")


@pytest.mark.parametrize("spec,ls,rs", [("bqd,bkd->bqk", (4, 130, 64), (4, 70, 64)),
                                        ("bqk,bkd->bqd", (4, 130, 70), (4, 70, 64)),
                                        ("abc,cd->abd", (3, 50, 96), (96, 33))], ids=str)
def test_einsum(spec, ls, rs):
    rng = np.random.default_rng(seed_of("einsum", spec))
    x = rng.standard_normal(ls, np.float32).astype(F16)
    y = rng.standard_normal(rs, np.float32).astype(F16)
    for pet in (None, F32):
        f = jax.jit(lambda a, b: jnp.einsum(spec, a, b, preferred_element_type=pet,  # noqa: B023
                                            _dot_general=tg.dot_general))
        out = f(x, y)
        assert out.dtype == (F16 if pet is None else F32)
        assert_close(out, np.einsum(spec, f64(x), f64(y)), out.dtype, 96, spec)

