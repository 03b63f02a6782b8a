"""CPU tests of jax_tcgemm (DESIGN §7): everything that runs without a GPU.

Import and public names, shapes (jax.eval_shape), jaxprs of grad/vmap, the CPU lowering, and
numerics of the CPU fallback (the primitive lowers through lax.dot_general
off-GPU) against float64 references. Elsewhere: the config table, the planner and the CUDA
lowering in test_arch_cpu.py (they need the compiled extension's rules and skip, saying so,
without it), error messages in test_errors_cpu.py, tg.gemm's epilogue in test_epilogue_cpu.py,
the source tree in test_structure_cpu.py.
"""
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg
from jax_tcgemm import _ffi, configs, primitive, problem
from jax_tcgemm.primitive import tcgemm, tcgemm_p

from conftest import assert_close, bound, f64, ref64, rel_err, rand

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
IN_DTYPES = (F16, BF16)
OUT_DTYPES = (F16, BF16, F32)
LAYOUTS = list(itertools.product((False, True), repeat=2))  # (transpose_a, transpose_b)
LAYOUT_IDS = [problem.layout_name(*t) for t in LAYOUTS]
S = jax.ShapeDtypeStruct
# The config table comes from the compiled module (empty without it).
NO_MODULE = f"needs the compiled extension jax_tcgemm._tcgemm: {_ffi._LOAD_ERROR}"
needs_module = pytest.mark.skipif(not _ffi.available(), reason=NO_MODULE)
CFG0 = configs.CONFIGS[0].name if configs.CONFIGS else None
FP8_ONLY = next((c.name for c in configs.CONFIGS if c.fp8_only), None)  # no 16-bit kernels
SM90 = [c for c in configs.CONFIGS if c.kind == "sm90"]  # tests/test_arch_cpu.py: their rules
CFG64 = next((c.name for c in reversed(configs.CONFIGS) if c.kind == "sm80" and c.bk == 64),
             None)  # chosen by property, not by name


@pytest.fixture(autouse=True)
def _on_cpu():  # numerics here test the CPU fallback, even on a GPU host
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def eqns(jaxpr):  # all equations of a (closed) jaxpr, sub-jaxprs included
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    yield from eqns(sub)


def prims(jaxpr, name):
    return [e for e in eqns(jaxpr) if e.primitive.name == name]


def stored(x, transposed):  # a logical (B, R, C) operand in its stored layout ((B, C, R) if T)
    return jnp.swapaxes(x, -1, -2) if transposed else x


# ---------------------------------------------------------------------------------------------
# Import, public names, configs.

def test_import_and_public_names():
    assert isinstance(tg.__version__, str) and re.fullmatch(r"\d+\.\d+\.\d+.*", tg.__version__)
    assert set(tg.__all__) >= {"matmul", "dot_general", "gemm", "__version__"}
    assert callable(tg.matmul) and callable(tg.dot_general) and callable(tg.gemm)
    assert tcgemm_p.name == "tcgemm" and _ffi.TARGET == "tcgemm"
    assert tcgemm_p.multiple_results
    assert primitive.tcgemm_dact_p.name == _ffi.DACT_TARGET == "tcgemm_dact"
    assert isinstance(_ffi.available(), bool)


def test_dot_general_signature_matches_lax():
    import inspect
    ours = inspect.signature(tg.dot_general).parameters
    theirs = inspect.signature(lax.dot_general).parameters
    # ours is jax 0.12.1's; jax 0.11.2's lax.dot_general has no reduction_order
    assert list(ours) == list(theirs) + [n for n in ("reduction_order",) if n not in theirs]
    for name in theirs:
        assert ours[name].kind == theirs[name].kind, name
        assert ours[name].default == theirs[name].default, name
    assert ours["reduction_order"].kind == inspect.Parameter.KEYWORD_ONLY
    assert ours["reduction_order"].default is None


def test_layout_names():
    assert configs.LAYOUTS == ("NN", "NT", "TN", "TT")
    assert [configs.layout_name(*t) for t in LAYOUTS] == ["NN", "NT", "TN", "TT"]
    assert [problem.layout_name(*t) for t in LAYOUTS] == ["NN", "NT", "TN", "TT"]


def test_extension_missing_is_reported():
    if _ffi.available():
        assert _ffi.config_names()
        _ffi.require()  # no error
    else:
        assert _ffi.config_names() is None
        with pytest.raises(RuntimeError, match="rebuild"):
            _ffi.require()


# ---------------------------------------------------------------------------------------------
# Shapes: jax.eval_shape against jnp.matmul / lax.dot_general.

MATMUL_SHAPES = [
    ((5, 7), (7, 3)), ((1, 1), (1, 1)), ((17, 65), (65, 33)), ((2, 5, 7), (2, 7, 3)),
    ((2, 5, 7), (7, 3)), ((5, 7), (2, 7, 3)), ((4, 1, 5, 7), (3, 7, 3)), ((1, 5, 7), (6, 7, 3)),
    ((7,), (7, 3)), ((5, 7), (7,)), ((7,), (7,)), ((7,), (2, 3, 7, 4)), ((2, 3, 5, 7), (7,)),
    ((0, 7), (7, 3)), ((5, 7), (7, 0)), ((2, 0, 7), (7, 3)), ((3, 2, 1, 5, 7), (2, 7, 1)),
]


@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("out_dtype", (None,) + OUT_DTYPES, ids=str)
def test_eval_shape_matmul(a_shape, b_shape, dtype, out_dtype):
    want = jax.eval_shape(jnp.matmul, S(a_shape, dtype), S(b_shape, dtype))
    got = jax.eval_shape(lambda a, b: tg.matmul(a, b, out_dtype=out_dtype),
                         S(a_shape, dtype), S(b_shape, dtype))
    assert got.shape == want.shape
    assert got.dtype == (dtype if out_dtype is None else out_dtype)


DOT_GENERAL_CASES = [  # (lhs shape, rhs shape, dimension_numbers)
    ((5, 7), (7, 3), (((1,), (0,)), ((), ()))),            # NN
    ((7, 5), (7, 3), (((0,), (0,)), ((), ()))),            # TN
    ((5, 7), (3, 7), (((1,), (1,)), ((), ()))),            # NT
    ((7, 5), (3, 7), (((0,), (1,)), ((), ()))),            # TT
    ((2, 5, 7), (2, 7, 3), (((2,), (1,)), ((0,), (0,)))),  # batched
    ((5, 2, 7), (7, 2, 3), (((2,), (0,)), ((1,), (1,)))),  # batch dims in the middle
    ((5, 7, 2), (7, 3, 2), (((1,), (0,)), ((2,), (2,)))),  # batch dims last
    ((2, 7, 5), (2, 3, 7), (((1,), (2,)), ((0,), (0,)))),  # batched TT
    ((4, 3, 5, 6), (5, 6, 7), (((2, 3), (0, 1)), ((), ()))),  # two contracting dims
    ((4, 5, 6), (6, 5, 7), (((1, 2), (1, 0)), ((), ()))),  # contracting dims in another order
    ((6, 4, 5), (5, 7, 6), (((2, 0), (0, 2)), ((), ()))),  # ... and not adjacent
    ((2, 3, 7, 4), (5, 7, 6), (((2,), (1,)), ((), ()))),   # free dims on both sides of K
    ((2, 3, 5, 7), (3, 2, 7, 4), (((3,), (2,)), ((0, 1), (1, 0)))),  # two batch dims, swapped
    ((2, 3, 7), (7, 4), (((2,), (0,)), ((), ()))),         # Dense on a 3-D input
    ((5,), (3,), (((), ()), ((), ()))),                    # outer product (K = 1)
    ((5, 7), (5, 7), (((0, 1), (0, 1)), ((), ()))),        # full contraction (scalar)
    ((7,), (7, 3), (((0,), (0,)), ((), ()))),              # vector @ matrix
    ((3, 0, 7), (3, 7, 4), (((2,), (1,)), ((0,), (0,)))),  # M = 0
    ((3, 5, 0), (3, 0, 4), (((2,), (1,)), ((0,), (0,)))),  # K = 0
]
DG_IDS = [f"{a}x{b}_{d}".replace(" ", "") for a, b, d in DOT_GENERAL_CASES]


@pytest.mark.parametrize("lhs,rhs,dims", DOT_GENERAL_CASES, ids=DG_IDS)
@pytest.mark.parametrize("pet", (None, F32, BF16), ids=str)
def test_eval_shape_dot_general(lhs, rhs, dims, pet):
    for dt in IN_DTYPES:
        want = jax.eval_shape(lambda a, b: lax.dot_general(a, b, dims, preferred_element_type=pet),
                              S(lhs, dt), S(rhs, dt))
        got = jax.eval_shape(lambda a, b: tg.dot_general(a, b, dims, preferred_element_type=pet),
                             S(lhs, dt), S(rhs, dt))
        assert (got.shape, got.dtype) == (want.shape, want.dtype)


# ---------------------------------------------------------------------------------------------
# Operands of the jaxpr tests below and of the error tests (test_errors_cpu.py).

def h(*shape, dt=F16):
    return jnp.ones(shape, dt)


DG_NN = (((1,), (0,)), ((), ()))


# ---------------------------------------------------------------------------------------------
# Jaxprs: one tcgemm per product; grad = 3 tcgemms with flipped flags; vmap folds into batch.

@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_jaxpr_matmul_one_tcgemm(out_dtype):
    jx = jax.make_jaxpr(lambda a, b: tg.matmul(a, b, out_dtype=out_dtype))(h(5, 7), h(7, 3))
    (e,) = prims(jx, "tcgemm")
    assert e.params["out_dtype"] == out_dtype
    assert (e.params["transpose_a"], e.params["transpose_b"]) == (False, False)
    assert e.params["plan"] is None  # planned by the CUDA lowering, not at bind time
    assert (e.params["activation"], e.params["aux"], e.params["has_c"], e.params["has_bias"],
            e.params["has_scale"], e.params["alpha"]) == ("none", False, False, False, False, 1.0)
    assert len(e.outvars) == 1
    assert not prims(jx, "dot_general")


@needs_module
def test_jaxpr_plan_override_kept():
    """config / split_k given to the binder become the `plan` param (none given: None)."""
    x, y = S((1, 5, 7), F16), S((1, 7, 3), F16)
    (e,) = prims(jax.make_jaxpr(lambda a, b: tcgemm(a, b, config=CFG0, split_k=3))(x, y),
                 "tcgemm")
    assert e.params["plan"] == (CFG0, 3)
    (e,) = prims(jax.make_jaxpr(lambda a, b: tcgemm(a, b, config=CFG0))(x, y), "tcgemm")
    assert e.params["plan"] == (CFG0, 1)


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
def test_jaxpr_grad_three_tcgemms_flipped_flags(ta, tb):
    a = h(2, 7, 5) if ta else h(2, 5, 7)
    b = h(2, 3, 7) if tb else h(2, 7, 3)
    f = lambda a, b: tcgemm(a, b, transpose_a=ta, transpose_b=tb, out_dtype=F32).sum()
    jx = jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(a, b)
    gemms = prims(jx, "tcgemm")
    assert len(gemms) == 3
    assert not prims(jx, "transpose") and not prims(jx, "dot_general")
    flags = [(e.params["transpose_a"], e.params["transpose_b"]) for e in gemms]
    assert flags[0] == (ta, tb)  # forward
    # dA = dC . op(B)^T (or its transpose), dB = op(A)^T . dC (or its transpose)
    want_da = (False, not tb) if not ta else (tb, True)
    want_db = (not ta, False) if not tb else (True, ta)
    assert sorted(flags[1:]) == sorted([want_da, want_db])
    outs = {tuple(e.outvars[0].aval.shape) for e in gemms[1:]}
    assert outs == {a.shape, b.shape}


def test_jaxpr_grad_nn_matmul():
    f = lambda a, b: tg.matmul(a, b, out_dtype=F32).sum()
    jx = jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(h(5, 7), h(7, 3))
    gemms = prims(jx, "tcgemm")
    assert len(gemms) == 3 and not prims(jx, "transpose") and not prims(jx, "dot_general")
    by_shape = {tuple(e.outvars[0].aval.shape): e.params for e in gemms}
    assert (by_shape[(1, 5, 7)]["transpose_a"], by_shape[(1, 5, 7)]["transpose_b"]) == (False, True)
    assert (by_shape[(1, 7, 3)]["transpose_a"], by_shape[(1, 7, 3)]["transpose_b"]) == (True, False)


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0), (1, 2)], ids=str)
def test_jaxpr_vmap_one_tcgemm(in_axes):
    a = {None: h(5, 7), 0: h(4, 5, 7), 1: h(5, 4, 7)}[in_axes[0]]
    b = {None: h(7, 3), 0: h(4, 7, 3), 2: h(7, 3, 4)}[in_axes[1]]
    jx = jax.make_jaxpr(jax.vmap(tg.matmul, in_axes=in_axes))(a, b)
    assert len(prims(jx, "tcgemm")) == 1


def test_jaxpr_vmap_of_vmap_one_tcgemm():
    f = jax.vmap(jax.vmap(tg.matmul, in_axes=(0, None)), in_axes=(0, 0))
    jx = jax.make_jaxpr(f)(h(2, 3, 5, 7), h(2, 7, 4))
    (e,) = prims(jx, "tcgemm")
    assert e.outvars[0].aval.shape == (6, 5, 4)  # both vmapped axes folded into the batch


def test_jaxpr_vmap_of_grad():
    g = jax.grad(lambda a, b: tg.matmul(a, b, out_dtype=F32).sum(), argnums=(0, 1))
    jx = jax.make_jaxpr(jax.vmap(g))(h(4, 5, 7), h(4, 7, 3))
    assert len(prims(jx, "tcgemm")) == 3 and not prims(jx, "dot_general")


# ---------------------------------------------------------------------------------------------
# Lowering from the CPU host (the CUDA custom call: test_arch_cpu.py, test_epilogue_cpu.py).

def cuda_text(f, *args):
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


CALL_ATTRS = ("transpose_a", "transpose_b", "config", "split_k", "pack", "has_c", "has_bias",
              "has_scale", "tensor_scales", "has_row_scale", "has_col_scale", "aux", "promote",
              "piece_scale_k", "piece_scale", "tail_rows", "tail_split", "alpha", "beta",
              "activation")


def custom_calls(text, target="tcgemm"):
    """The `target` custom calls of a module's text: their attributes (as written, strings
    unquoted), result types and the line."""
    out = []
    for line in text.splitlines():
        if f"stablehlo.custom_call @{target}(" in line:
            call = {"line": line}
            for k in CALL_ATTRS:
                m = re.search(rf"(?<![\w.]){k} = ([^,}}]+)", line)
                if m:
                    call[k] = m.group(1).strip('"')
            results = line.rsplit("->", 1)[1].strip()
            call["results"] = re.findall(r"tensor<[^>]*>", results)
            out.append(call)
    return out


def test_cpu_lowering_is_fallback():
    text = jax.jit(tg.matmul).trace(h(5, 7), h(7, 3)).lower(lowering_platforms=("cpu",)).as_text()
    assert "custom_call @tcgemm" not in text and "dot_general" in text


# ---------------------------------------------------------------------------------------------
# CPU fallback numerics against float64 references of the rounded inputs.

SHAPES = [(1, 1, 1), (17, 33, 65), (64, 32, 48), (5, 129, 3)]  # (M, N, K)


@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_matmul_fallback_numerics(m, n, k, dtype):
    a, b = rand(("mm_a", m, k, dtype.name), (m, k), dtype), rand(("mm_b", k, n), (k, n), dtype)
    ref = ref64(a, b)
    for out_dtype in (None,) + OUT_DTYPES:
        out = tg.matmul(a, b, out_dtype=out_dtype)
        want = dtype if out_dtype is None else out_dtype
        assert out.dtype == want and out.shape == (m, n)
        assert_close(out, ref, want, k, f"matmul {m}x{n}x{k} {dtype}->{want}")
    assert_close(jax.jit(tg.matmul)(a, b), ref, dtype, k, "jit")


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("ba,bb", [(1, 1), (3, 3), (1, 3), (3, 1)], ids=str)
def test_primitive_fallback_layouts_batch(ta, tb, dtype, ba, bb):
    m, n, k = 17, 33, 65
    a = rand(("pa", ta, tb, ba, bb, dtype.name), (ba, m, k), dtype)
    b = rand(("pb", ta, tb, ba, bb, dtype.name), (bb, k, n), dtype)
    ref = ref64(a, b)  # broadcasts batch 1
    for out_dtype in OUT_DTYPES:
        out = tcgemm(stored(a, ta), stored(b, tb), transpose_a=ta, transpose_b=tb,
                     out_dtype=out_dtype)
        assert out.shape == (max(ba, bb), m, n) and out.dtype == out_dtype
        assert_close(out, ref, out_dtype, k, f"{configs.layout_name(ta, tb)} {dtype}->{out_dtype}")
        np.testing.assert_array_equal(f64(out), f64(primitive.reference(  # the documented rule
            stored(a, ta), stored(b, tb), transpose_a=ta, transpose_b=tb, out_dtype=out_dtype)[0]))


def test_matmul_fallback_broadcast_batch():
    a = rand(("bcast_a",), (4, 1, 9, 13), BF16)
    b = rand(("bcast_b",), (3, 13, 6), BF16)
    out = tg.matmul(a, b, out_dtype=F32)
    assert out.shape == (4, 3, 9, 6)
    assert_close(out, ref64(a, b), F32, 13)
    for a_s, b_s in [((13,), (3, 13, 6)), ((2, 9, 13), (13,)), ((13,), (13,))]:
        x, y = rand(("v", a_s), a_s, F16), rand(("w", b_s), b_s, F16)
        assert_close(tg.matmul(x, y, out_dtype=F32), np.matmul(f64(x), f64(y)), F32, 13)


@pytest.mark.parametrize("lhs,rhs,dims", DOT_GENERAL_CASES, ids=DG_IDS)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_dot_general_fallback_vs_lax(lhs, rhs, dims, dtype):
    x = rand(("dgl", lhs, dims, dtype.name), lhs, dtype)
    y = rand(("dgr", rhs, dims, dtype.name), rhs, dtype)
    k = int(np.prod([lhs[d] for d in dims[0][0]]))
    ref = lax.dot_general(x.astype(F32), y.astype(F32), dims, precision=lax.Precision.HIGHEST)
    for pet in (None, F32, BF16):
        out = tg.dot_general(x, y, dims, preferred_element_type=pet)
        want = lax.dot_general(x, y, dims, preferred_element_type=pet)
        assert (out.shape, out.dtype) == (want.shape, want.dtype)
        assert_close(out, f64(ref), want.dtype, k, f"dot_general {dims} pet={pet}")
        if out.size >= 16:  # (lax's own rounding of a cancelling scalar can be far off)
            assert rel_err(out, f64(want)) <= 2 * bound(want.dtype, k)


EINSUMS = [("bij,bjk->bik", (2, 5, 7), (2, 7, 3)), ("ij,kj->ik", (5, 7), (3, 7)),
           ("bhqd,bhkd->bhqk", (2, 3, 5, 8), (2, 3, 6, 8)), ("bhqk,bhkd->bhqd", (2, 3, 5, 6), (2, 3, 6, 8)),
           ("abc,cd->abd", (2, 3, 7), (7, 4)), ("ijk,kji->", (3, 4, 5), (5, 4, 3)),
           ("i,j->ij", (5,), (3,)), ("bij,jk->bki", (2, 5, 7), (7, 3))]


@pytest.mark.parametrize("spec,ls,rs", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum_with_tg_dot_general(spec, ls, rs):
    x, y = rand(("es", spec, 0), ls, BF16), rand(("es", spec, 1), rs, BF16)
    ref = np.einsum(spec, f64(x), f64(y))
    want = jnp.einsum(spec, x, y)
    for pet in (None, F32):
        out = jnp.einsum(spec, x, y, preferred_element_type=pet, _dot_general=tg.dot_general)
        assert out.shape == want.shape and out.dtype == (BF16 if pet is None else F32)
        assert_close(out, ref, out.dtype, 8, spec)
    jx = jax.make_jaxpr(lambda a, b: jnp.einsum(spec, a, b, _dot_general=tg.dot_general))(x, y)
    assert len(prims(jx, "tcgemm")) == 1 and not prims(jx, "dot_general")


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=str)
def test_fallback_dtypes_equal_lax(dtype):
    x = jnp.asarray(np.arange(5 * 7).reshape(5, 7) % 11 - 5, dtype)
    y = jnp.asarray(np.arange(7 * 3).reshape(7, 3) % 7 - 3, dtype)
    np.testing.assert_array_equal(tg.matmul(x, y), jnp.matmul(x, y))
    for dims in (DG_NN, (((1,), (1,)), ((), ()))):
        yy = y if dims == DG_NN else y.T
        out, want = tg.dot_general(x, yy, dims), lax.dot_general(x, yy, dims)
        assert out.dtype == want.dtype
        np.testing.assert_array_equal(out, want)
    # float32 runs on the (TF32) kernels, whose CPU lowering is lax's float32 product
    assert bool(prims(jax.make_jaxpr(tg.matmul)(x, y), "tcgemm")) == (dtype == np.float32)


def test_mixed_f16_bf16_falls_back_like_jnp():
    x, y = rand(3, (5, 7), F16), rand(4, (7, 3), BF16)
    out, want = tg.matmul(x, y), jnp.matmul(x, y)
    assert out.dtype == want.dtype
    np.testing.assert_array_equal(f64(out), f64(want))


# ---------------------------------------------------------------------------------------------
# Transformations on the fallback: grads vs jnp.matmul, vmap numerics.

@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype,out_dtype", [(F16, F32), (BF16, BF16), (BF16, F32), (F16, F16)],
                         ids=str)
def test_grad_matches_jnp(ta, tb, dtype, out_dtype):
    m, n, k = 9, 11, 13
    a = rand(("ga", ta, tb, dtype.name), (2, m, k), dtype)
    b = rand(("gb", ta, tb, dtype.name), (1, k, n), dtype)  # shared operand: grad sums batch
    ct = rand(("gc", ta, tb, dtype.name), (2, m, n), out_dtype)
    sa, sb = stored(a, ta), stored(b, tb)
    ours = jax.vjp(lambda x, y: tcgemm(x, y, transpose_a=ta, transpose_b=tb,
                                       out_dtype=out_dtype), sa, sb)[1](ct)
    jn = jax.vjp(lambda x, y: jnp.matmul(stored(x, ta), stored(y, tb),
                                         preferred_element_type=out_dtype), sa, sb)[1](ct)
    ct64 = f64(ct)
    da_ref = ct64 @ np.swapaxes(f64(b), -1, -2)
    db_ref = (np.swapaxes(f64(a), -1, -2) @ ct64).sum(0, keepdims=True)
    for got, theirs, ref in zip(ours, jn, (stored(da_ref, ta), stored(db_ref, tb))):
        assert got.dtype == theirs.dtype == dtype and got.shape == theirs.shape
        assert_close(got, ref, dtype, n, "grad vs float64")
        assert rel_err(got, f64(theirs)) <= 2 * max(bound(dtype), rel_err(theirs, ref))


@pytest.mark.parametrize("in_axes,shapes", [
    ((0, None), ((4, 5, 7), (7, 3))), ((None, 0), ((5, 7), (4, 7, 3))),
    ((0, 0), ((4, 5, 7), (4, 7, 3))), ((1, 2), ((5, 4, 7), (7, 3, 4))),
    ((0, None), ((4, 2, 5, 7), (2, 7, 3))), ((0, 0), ((4, 2, 5, 7), (4, 1, 7, 3)))], ids=str)
def test_vmap_numerics(in_axes, shapes):
    x, y = rand(("va", in_axes, shapes), shapes[0], F16), rand(("vb", in_axes, shapes), shapes[1], F16)
    out = jax.vmap(lambda a, b: tg.matmul(a, b, out_dtype=F32), in_axes=in_axes)(x, y)
    xm, ym = (f64(v) if ax is None else np.moveaxis(f64(v), ax, 0) for v, ax in zip((x, y), in_axes))
    assert_close(out, np.matmul(xm, ym), F32, 7)  # mapped axes first; unmapped ones broadcast


def test_vmap_of_vmap_and_jit_numerics():
    x, y = rand(5, (2, 3, 5, 7), BF16), rand(6, (2, 7, 4), BF16)
    f = jax.jit(jax.vmap(jax.vmap(lambda a, b: tg.matmul(a, b, out_dtype=F32), in_axes=(0, None))))
    out = f(x, y)
    assert out.shape == (2, 3, 5, 4)
    assert_close(out, np.matmul(f64(x), f64(y)[:, None]), F32, 7)


def test_jvp_and_vmap_of_grad_numerics():
    a, b = rand(7, (3, 5, 7), F16), rand(8, (3, 7, 4), F16)
    da, db = rand(9, a.shape, F16), rand(10, b.shape, F16)
    out, tan = jax.jvp(lambda x, y: tg.matmul(x, y, out_dtype=F32), (a, b), (da, db))
    assert_close(tan, f64(da) @ f64(b) + f64(a) @ f64(db), F32, 7)
    g = jax.vmap(jax.grad(lambda x, y: tg.matmul(x, y, out_dtype=F32).sum(), argnums=(0, 1)))
    ga, gb = g(a, b)
    assert_close(ga, np.ones((3, 5, 4)) @ np.swapaxes(f64(b), 1, 2), F16, 4)
    assert_close(gb, np.swapaxes(f64(a), 1, 2) @ np.ones((3, 5, 4)), F16, 5)


# ---------------------------------------------------------------------------------------------
# Zero sizes, and a known limitation (strict xfail: a fix turns it into an XPASS failure).

@pytest.mark.parametrize("a_shape,b_shape", [((5, 0), (0, 6)), ((2, 5, 0), (2, 0, 6)),
                                             ((4, 1, 5, 0), (3, 0, 6)), ((2, 0, 5), (2, 5, 6)),
                                             ((2, 3, 5), (2, 5, 0))], ids=str)
def test_matmul_zero_sizes(a_shape, b_shape):
    x, y = jnp.ones(a_shape, F16), jnp.ones(b_shape, F16)
    out, want = tg.matmul(x, y), jnp.matmul(x, y)
    assert jax.eval_shape(tg.matmul, x, y).shape == want.shape == out.shape
    np.testing.assert_array_equal(f64(out), 0.0)


def test_primitive_k0_gives_zeros():
    out = tcgemm(jnp.ones((2, 5, 0), F16), jnp.ones((1, 0, 6), F16), out_dtype=F32)
    assert out.shape == (2, 5, 6)
    np.testing.assert_array_equal(np.asarray(out), 0.0)


def test_matmul_zero_batch():
    out = tg.matmul(jnp.ones((3, 5), F16), jnp.ones((0, 5, 2), F16))
    assert out.shape == (0, 3, 2)


@pytest.mark.parametrize("scale,b_val", [(1e-9, 1e4), (1e5, 1e-3)], ids=str)
def test_grad_f32_cotangent_range(scale, b_val):
    """A float32 cotangent outside float16's range (1e-9, 1e5) still gives lax's finite,
    nonzero gradients of float16 operands: the backward products scale it by a power of two
    before the cast (epilogue.narrow_cotangent) and undo that in their epilogue."""
    a, b = jnp.ones((4, 8), F16), jnp.full((8, 3), b_val, F16)
    ours = jax.grad(lambda x: scale * tg.matmul(x, b, out_dtype=F32).sum())(a)
    want = jax.grad(lambda x: scale * jnp.matmul(x, b, preferred_element_type=F32).sum())(a)
    assert np.all(np.isfinite(f64(want))) and np.all(f64(want) != 0) and ours.dtype == F16
    np.testing.assert_allclose(f64(ours), f64(want), rtol=2e-3)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)], ids=str)
def test_grad_wide_cotangent_keeps_its_values(ta, tb):
    """Cotangent rows of 2^-36 .. 2^-16 (below float16's range, float32 and, with out_dtype
    bfloat16 of float16 operands, bfloat16) against b ~ 2^10, through tg.gemm with a traced
    alpha, a batch-shared b and both layouts: gradients in float16's range equal the float64
    ones of the cotangent as given, within float16 rounding (cast as it is, rows below 2^-24
    would give zeros)."""
    k1, k2, k3 = jax.random.split(jax.random.key(11), 3)
    a = jax.random.normal(k1, (2, 8, 16) if not ta else (2, 16, 8), F32).astype(F16)
    b = (1024 * jax.random.normal(k2, (16, 5) if not tb else (5, 16), F32)).astype(F16)
    exps = jax.random.randint(k3, (2, 8, 1), -36, -16)
    ct = jnp.ldexp(jax.random.uniform(k3, (2, 8, 5), F32, 1.0, 2.0), exps)
    for out_dtype, cot in ((F32, ct), (BF16, ct.astype(BF16))):
        alpha = jnp.float32(0.75)
        f = lambda x, y: tg.gemm(x, y, alpha=alpha, transpose_a=ta, transpose_b=tb,  # noqa: E731
                                 out_dtype=out_dtype)
        _, vjp = jax.vjp(f, a, b)
        ga, gb = vjp(cot)
        assert ga.dtype == gb.dtype == F16
        opa, opb = f64(a), f64(b)
        opa = np.swapaxes(opa, 1, 2) if ta else opa
        opb = opb.T if tb else opb
        c64 = 0.75 * f64(cot)
        want_a, mag_a = c64 @ opb.T, np.abs(c64) @ np.abs(opb).T
        want_b = np.einsum("bmk,bmn->kn", opa, c64)
        mag_b = np.einsum("bmk,bmn->kn", np.abs(opa), np.abs(c64))
        tr = lambda x, t, f: f(x) if t else x  # noqa: E731
        for got, want, mag in ((ga, tr(want_a, ta, lambda x: np.swapaxes(x, 1, 2)),
                                tr(mag_a, ta, lambda x: np.swapaxes(x, 1, 2))),
                               (gb, tr(want_b, tb, np.transpose), tr(mag_b, tb, np.transpose))):
            # float16 rounding of each scaled ct term, then of the result (subnormal results:
            # 2^-25); terms below 2^-24 of the largest |ct| (subnormals after scaling)
            bound = 2.0**-10 * mag + 2.0**-11 * np.abs(want) + 2.0**-20 * mag.max() + 2.0**-25
            assert np.all(np.isfinite(f64(got)))
            assert np.all(np.abs(f64(got) - want) <= bound), np.max(np.abs(f64(got) - want) / bound)
