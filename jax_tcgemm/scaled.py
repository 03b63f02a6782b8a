"""tg.scaled_matmul: fp8 and int8 GEMMs with per-tensor, per-row / per-column and DeepSeek-V3
block scales, composed with the fused epilogue (issue 26).

    D = act(sum_k a[m,k] * b[k,n] * scale(m, n, k) + beta * C + bias)

in float32 (int8: exact int32 products), rounded once to out_dtype.

Two paths compute it, with the same numbers (up to float32 summation order):
- the kernels: on a GPU of compute capability 9.0, one call of the sm90
  8-bit kernels (wgmma; ffi/kernels/sm90/kernels_sm90_byte.cu) does the product, the scales
  (block scales of fp8 in the main loop, the others in the epilogue) and the whole epilogue;
  int8 on other GPUs from 8.0 on, one call of the sm80 int8 kernels (mma.sync m16n8k32;
  ffi/kernels/sm80/kernels_s8.cu) does the same (no block scales: those are fp8's). Both read
  b K-major, as (N, K): a b given as (K, N) is copied K-major by the same call first (one pass
  over b; pass transpose_b=True with a (N, K) b to avoid it). They take K a multiple of 16: a
  and b with another K are padded with zeros along K first (_padded_plan);
- lax (everywhere else: CPU, fp8 off compute capability 9.0, GPUs before 8.0, int8 with block
  scales):
  lax.dot_general with float32 / int32 accumulation, the scales applied to the float32
  accumulator, never to a dequantised copy of a or b. It is also the reference of the kernels'
  tests, and it defines the derivatives of both paths.
Rules (shapes, dtypes, scale forms) are pure functions of shapes and dtypes, checked at trace
time.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero
# As imported: a user may monkeypatch jax.lax.dot_general = tg.dot_general.
from jax.lax import dot_general as _lax_dot_general

from . import _ffi, configs, epilogue, lowering
from .ops import _as_array

E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
I8, I32, F32 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float32)
F16, BF16 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16)

# (a dtype, b dtype) -> kind. e5m2 x e5m2 is not a wgmma fp8 form the kernels will take
# (issue 26), nor are the fnuz / e8m0 / 4-bit types; int8 pairs only with int8.
PAIRS = {(E4M3, E4M3): "fp8", (E4M3, E5M2): "fp8", (E5M2, E4M3): "fp8", (I8, I8): "int8"}
FLOAT_OUT = (BF16, F16, F32)
BLOCK = 128  # DeepSeek-V3 block: a has one scale per row per 128 of K, b one per 128 x 128

# Scale forms, decided from shapes: "tensor" (a scalar), "row" (one per row of a), "column"
# (one per column of b), "block" (DeepSeek-V3). Allowed combinations: any of tensor / row for
# a with any of tensor / column for b (all scale the float32 accumulator: the kernels'
# epilogue), or block with block (the kernels' main loop). Anything else is a ValueError.
OUTER_A, OUTER_B = ("tensor", "row"), ("tensor", "column")


def _name(fn="scaled_matmul"):
    return f"jax_tcgemm.{fn}"


def kind_of(a_dtype, b_dtype):
    """"fp8" or "int8" for a supported (a, b) dtype pair; TypeError otherwise."""
    kind = PAIRS.get((np.dtype(a_dtype), np.dtype(b_dtype)))
    if kind is None:
        raise TypeError(
            f"{_name()}: unsupported operand dtypes a {np.dtype(a_dtype)} x b "
            f"{np.dtype(b_dtype)}; supported: float8_e4m3fn x float8_e4m3fn, float8_e4m3fn x "
            f"float8_e5m2, float8_e5m2 x float8_e4m3fn, int8 x int8 (not float8_e5m2 x "
            f"float8_e5m2; for float16 / bfloat16 use tg.gemm)")
    return kind


def a_scale_form(shape, a_shape):
    """The form of a_scale of shape `shape` for a of shape a_shape (..., M, K): "tensor" (() or
    (1,)), "row" (batch + (M,), each batch dim its own or 1) or "block" (batch + (M, ceil(K /
    128))). ValueError otherwise."""
    shape, a_shape = tuple(shape), tuple(a_shape)
    batch, m, k = a_shape[:-2], a_shape[-2], a_shape[-1]
    kb = -(-k // BLOCK)

    def fits(lead):
        return len(lead) == len(batch) and all(s in (1, d) for s, d in zip(lead, batch))
    if shape in ((), (1,)):
        return "tensor"
    if len(shape) == len(batch) + 1 and shape[-1] == m and fits(shape[:-1]):
        return "row"
    if len(shape) == len(batch) + 2 and shape[-2:] == (m, kb) and fits(shape[:-2]):
        return "block"
    bt = "".join(f"{d}, " for d in batch)
    raise ValueError(
        f"{_name()}: a_scale{shape} fits no scale form of a{a_shape}: per-tensor () or (1,), "
        f"per-row ({bt}{m},), or 1x128 blocks ({bt}{m}, {kb}) = (M, ceil(K/128)) (batch dims "
        f"may be 1)")


def b_scale_form(shape, b_shape, transpose_b):
    """The form of b_scale for b (K, N), or (N, K) with transpose_b: "tensor" (() or (1,)),
    "column" ((N,)) or "block": 128 x 128 blocks laid out as b is, (ceil(K/128), ceil(N/128)),
    or (ceil(N/128), ceil(K/128)) with transpose_b (DeepSeek-V3 keeps the weight and its
    scales in the same orientation). ValueError otherwise."""
    shape = tuple(shape)
    n, k = (b_shape[0], b_shape[1]) if transpose_b else (b_shape[1], b_shape[0])
    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    grid = (nb, kb) if transpose_b else (kb, nb)
    if shape in ((), (1,)):
        return "tensor"
    if shape == (n,):
        return "column"
    if shape == grid:
        return "block"
    what = "(ceil(N/128), ceil(K/128))" if transpose_b else "(ceil(K/128), ceil(N/128))"
    raise ValueError(
        f"{_name()}: b_scale{shape} fits no scale form of b{tuple(b_shape)} "
        f"(transpose_b={transpose_b}): per-tensor () or (1,), per-column ({n},), or 128x128 "
        f"blocks {grid} = {what}")


def check_forms(fa, fb, a_desc, b_desc):
    if (fa in OUTER_A and fb in OUTER_B) or (fa == fb == "block"):
        return
    raise ValueError(
        f"{_name()}: a_scale is {fa} ({a_desc}) but b_scale is {fb} ({b_desc}): block scales "
        f"go with block scales only, per-tensor / per-row / per-column scales with each other. "
        f"A per-tensor or per-row scale of a is a block scale broadcast to (M, ceil(K/128)), a "
        f"per-tensor scale of b one broadcast to the block grid (jnp.broadcast_to)")


def _scale(x, name, a_desc):
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return jnp.asarray(x, jnp.float32)
    dt = getattr(x, "dtype", None)  # before any conversion (numpy float64 -> float32)
    x = _as_array(x, name)
    dt = np.dtype(x.dtype if dt is None else dt)
    if dt != F32:
        raise TypeError(f"{_name()}: {name} must be float32; got {name}{x.shape} {dt} "
                        f"({a_desc})")
    return x


# ---------------------------------------------------------------------------------------------
# The product in lax: a (R, K), b (K, N) or (N, K); sa None, () , (R,) or (R, Kb); sb None, (),
# (N,) or (Kb, Nb) (block grid K-major whatever b's layout). Returns the scaled float32
# accumulator (R, N).

def _pad_k(x, y, transpose_b):
    """x (R, K) and y ((N, K) with transpose_b, else (K, N)) padded with zeros along K to a
    multiple of 16 (the product is unchanged: the padding's products are zero)."""
    pad = -x.shape[1] % 16
    if not pad:
        return x, y
    return (jnp.pad(x, ((0, 0), (0, pad))),
            jnp.pad(y, ((0, 0), (0, pad)) if transpose_b else ((0, pad), (0, 0))))


def _int_dot(x, y, transpose_b):
    """x @ op(y) of int8 operands as exact int32, K padded to a multiple of 16 (_pad_k): XLA's
    own int8 GEMM gave twice the product for K = 33-35 and 63 on the H200 (jax 0.11.2;
    benchmarks/NOTES.md v62), right for the multiples of 16 tried."""
    x, y = _pad_k(x, y, transpose_b)
    dn = (((1,), (1 if transpose_b else 0,)), ((), ()))
    return _lax_dot_general(x, y, dn, preferred_element_type=jnp.int32)


def _dot(x, y, transpose_b, kind):
    """x @ op(y) with float32 accumulation (int8: exact int32, then converted to float32).
    fp8 at HIGHEST: on GPU, XLA's cuBLASLt fp8 path otherwise may use the fast (fewer-bit)
    accumulation."""
    if kind == "int8":
        return _int_dot(x, y, transpose_b).astype(jnp.float32)
    dn = (((1,), (1 if transpose_b else 0,)), ((), ()))
    return _lax_dot_general(x, y, dn, precision=lax.Precision.HIGHEST,
                            preferred_element_type=jnp.float32)


def _outer(sa, sb):
    """sa[m] * sb[n] (float32, rounded once), None when both are absent."""
    if sa is None:
        return None
    sa = sa[:, None] if sa.ndim == 1 else sa
    return sa * sb


def _impl(a, b, sa, sb, form, transpose_b, kind):
    if form != "block":
        acc = _dot(a, b, transpose_b, kind)
        s = _outer(sa, sb)
        return acc if s is None else acc * s  # acc * (sa * sb), as the kernels' epilogue
    r, k = a.shape
    n = b.shape[0] if transpose_b else b.shape[1]
    sbx = jnp.repeat(sb, BLOCK, axis=1, total_repeat_length=sb.shape[1] * BLOCK)[:, :n]

    def step(kb, acc, width):
        # K block kb: its float32 (int8: exact int32) partial product, scaled by
        # sa[m, kb] * sb[kb, n // 128] and added to the float32 accumulator, in K order (the
        # kernels' main loop, DeepGEMM's promotion every 128 of K).
        ak = lax.dynamic_slice_in_dim(a, kb * BLOCK, width, axis=1)
        bk = lax.dynamic_slice_in_dim(b, kb * BLOCK, width, axis=1 if transpose_b else 0)
        s = (lax.dynamic_index_in_dim(sa, kb, axis=1, keepdims=True)
             * lax.dynamic_index_in_dim(sbx, kb, axis=0, keepdims=True))
        return acc + s * _dot(ak, bk, transpose_b, kind)

    acc = jnp.zeros((r, n), jnp.float32)
    full, tail = divmod(k, BLOCK)
    # checkpoint: under AD the loop keeps no per-block partial product (Kb x R x N) as a
    # residual; the backward recomputes it.
    if full:  # (a loop of no trips would still trace a 128-wide slice)
        acc = lax.fori_loop(0, full, jax.checkpoint(lambda kb, acc: step(kb, acc, BLOCK)), acc)
    if tail:  # the last, partial block: a static slice (no padded copy of a or b)
        acc = step(full, acc, tail)
    return acc


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5, 6))
def _product(a, b, sa, sb, form, transpose_b, kind):
    return _impl(a, b, sa, sb, form, transpose_b, kind)


def _product_jvp(form, transpose_b, kind, primals, tangents):
    a, b, sa, sb = primals
    ta, tb, tsa, tsb = tangents
    for name, x, t in (("a", a, ta), ("b", b, tb)):
        if not isinstance(t, SymbolicZero):
            raise TypeError(
                f"{_name()}: {name} ({x.dtype}) is quantised data and has no gradient here; "
                f"differentiate with respect to the scales, bias, c or beta, or give the "
                f"quantiser a straight-through gradient outside (jax.custom_vjp), as Flax's fp8 "
                f"ops do")
    out = _impl(a, b, sa, sb, form, transpose_b, kind)
    tan = jnp.zeros_like(out)  # D is linear in each scale: d D = D(d sa, sb) + D(sa, d sb)
    if sa is not None and not isinstance(tsa, SymbolicZero):
        tan = tan + _impl(a, b, tsa, sb, form, transpose_b, kind)
    if sb is not None and not isinstance(tsb, SymbolicZero):
        tan = tan + _impl(a, b, sa, tsb, form, transpose_b, kind)
    return out, tan


_product.defjvp(_product_jvp, symbolic_zeros=True)


# ---------------------------------------------------------------------------------------------
# The kernel path: one custom call (ffi/xla/gemm_ffi.cc with 8-bit operands) computes what
# _reference computes. Its derivatives are _reference's (the scales, c, bias and beta enter
# linearly or through the activation; a and b have none).

def _reference(a2, b, sa, sb, c3, bias2, scale, st):
    form, transpose_b, kind, activation, out_dtype, al, be, bsz, m, n = st
    if out_dtype == I32:  # int8 x int8 -> int32: exact, nothing else
        return _int_dot(a2, b, transpose_b).reshape(bsz, m, n)
    acc = _product(a2, b, sa, sb, form, transpose_b, kind)
    return epilogue.apply(acc.reshape(bsz, m, n), c3, bias2, scale, alpha=al, beta=be,
                          activation=activation or "none", out_dtype=out_dtype, aux=False)[0]


def _kernel(a2, b, sa, sb, c3, bias2, scale, st, plan):
    """The product on the 8-bit kernels (sm90 rows; int8 also sm80 rows): a2 (R, K), b (N, K)
    or (K, N) (copied K-major by the call), sa None / () / (R,), sb None / () / (N,):
    per-tensor scales fold into alpha (read on the device), the others are the epilogue's row
    and column scales. Block form: sa (R, Kb) and sb (Kb, Nb), applied in the kernel's main loop
    (passed as (Kb, R) and (Kb, Nb))."""
    form, transpose_b, kind, activation, out_dtype, al, be, bsz, m, n = st
    config, split = plan  # configs.plan_byte: K slices summed by the split-K reduction
    r, k = a2.shape
    # wgmma reads 8-bit operands K-major only: a (K, N) b is copied K-major inside the call
    # (pack=1: ffi/host PlanWorkspace / LaunchTransposeBytes), not by an XLA transpose
    int_out = out_dtype == I32
    args = [a2[None], b[None]]
    if c3 is not None:
        if c3.shape[0] != 1 or (bsz > 1 and c3.shape[1] != 1):  # the batch folds into the rows
            c3 = jnp.broadcast_to(c3, (bsz, m, c3.shape[2])).reshape(1, r, c3.shape[2])
        args.append(c3)
    if bias2 is not None:
        args.append(bias2)
    block = form == "block"
    row = not block and sa is not None and sa.ndim == 1
    col = not block and sb is not None and sb.ndim == 1
    if not int_out:  # [alpha, beta]: the per-tensor scales' product, beta (static or traced)
        alpha = jnp.float32(al)
        for x in (sa, sb):
            if not block and x is not None and x.ndim == 0:
                alpha = alpha * x
        beta = jnp.float32(be) if scale is None else scale[1]
        if scale is not None:
            alpha = alpha * scale[0]
        args.append(jnp.stack([alpha, beta]).astype(jnp.float32))
    if row:
        args.append(sa.reshape(1, r))
    if col:
        args.append(sb.reshape(1, n))
    if block:  # a's scales K-major, rows padded to 16 bytes (a tile's scales: one bulk copy)
        args += [jnp.pad(sa.T, ((0, 0), (0, -r % 4))), sb]
    # (none at split_k 1 without packing; traced also where the extension is missing, as the
    # CUDA branch of platform_dependent, never lowered there)
    ws = (configs.workspace_floats(r, n, k, 1, True, True, False, transpose_b, config, split,
                                   not transpose_b, 1) if _ffi.available() else 0)
    call = jax.ffi.ffi_call(
        _ffi.TARGET, (jax.ShapeDtypeStruct((1, r, n), out_dtype),
                      jax.ShapeDtypeStruct((ws,), jnp.float32)),
        vmap_method="sequential")
    d, _ = call(*args, **lowering.ffi_attrs(
        transpose_a=False, transpose_b=transpose_b, config=config, split_k=split,
        pack=not transpose_b, has_c=c3 is not None, has_bias=bias2 is not None,
        has_scale=not int_out, aux=False, activation=activation, row_scale=row, col_scale=col,
        block_scale=block))
    return d.reshape(bsz, m, n)


@functools.partial(jax.custom_jvp, nondiff_argnums=(7, 8))
def _fused(a2, b, sa, sb, c3, bias2, scale, st, config):
    def ref(*xs):
        return _reference(*xs, st)

    def ker(*xs):
        return _kernel(*xs, st, config)
    return lax.platform_dependent(a2, b, sa, sb, c3, bias2, scale, cuda=ker, default=ref)


def _fused_jvp(st, config, primals, tangents):
    # The reference's derivatives, with respect to the inputs that have tangents (a tangent of
    # a or b reaches _product's rule, which raises its TypeError).
    live = [i for i, t in enumerate(tangents)
            if primals[i] is not None and not isinstance(t, SymbolicZero)
            and not (hasattr(t, "dtype") and t.dtype == jax.dtypes.float0)]

    def f(*xs):
        full = list(primals)
        for i, x in zip(live, xs):
            full[i] = x
        return _reference(*full, st)
    out = _fused(*primals, st, config)
    if not live:
        return out, jnp.zeros_like(out)
    _, tan = jax.jvp(f, [primals[i] for i in live], [tangents[i] for i in live])
    return out, tan


_fused.defjvp(_fused_jvp, symbolic_zeros=True)


def kernel_config(kind, r, n, k, form):
    """(row, K slices) that run this product (configs.plan_byte; K a multiple of 16), or None
    where lax does (int8 with block scales, no extension, fp8 on a device other than compute
    capability 9.0, int8 on one below 8.0)."""
    if (form == "block" and kind != "fp8") or not _ffi.available():
        return None
    return configs.plan_byte(r, n, k, kind, block_scales=form == "block")


def _padded_plan(a2, b, kind, n, form, transpose_b):
    """(a2, b, plan): the kernels take K a multiple of 16 (16-byte rows); any other K runs on
    them too, with a2 and b padded with zeros along K to the next multiple (exact: the padding's
    products are zero, and the block scales' 128-slices stay as they are), wherever they run.
    XLA's own int8 GEMM gave twice the product for some such K on the H200 (K = 33-35, 63; jax
    0.11.2; benchmarks/NOTES.md v62): lax is left only where no kernel runs."""
    r, k = a2.shape
    plan = kernel_config(kind, r, n, -(-k // 16) * 16, form)
    return (*(_pad_k(a2, b, transpose_b) if plan is not None else (a2, b)), plan)


# ---------------------------------------------------------------------------------------------

def scaled_matmul(a, b, a_scale, b_scale, *, out_dtype=jnp.bfloat16, bias=None, activation=None,
                  c=None, beta=0.0, transpose_b=False):
    """D = activation(sum_k a[..., m, k] * b[k, n] * scales + beta * c + bias): fp8 / int8
    GEMM with scales (issue 26).

    On an H100/H200 (compute capability 9.0), one call of the sm90 8-bit kernels computes
    everything (product, scales, epilogue); int8 on other GPUs from 8.0 on (A100, L4, ...), one
    call of the sm80 int8 kernels. A (K, N) b is copied K-major by the call first (the kernels
    read b as (N, K)); a K that is not a multiple of 16 is padded with zeros first. int8 with
    block scales, fp8 off 9.0 and the CPU run through lax (module docstring); the numbers are
    the same contract.

    a: (..., M, K); b: (K, N), or (N, K) with transpose_b (K-major b: what Hopper fp8 wgmma
    reads). Leading batch dims of a are folded into M (b is shared; vmap for a batched b).
    dtypes (a x b): float8_e4m3fn x float8_e4m3fn, float8_e4m3fn x float8_e5m2,
    float8_e5m2 x float8_e4m3fn, int8 x int8.

    a_scale, b_scale: float32 arrays (Python numbers are taken as float32 per-tensor scales),
    or both None (no scaling). Their form is decided from their shapes:
      per-tensor   a_scale () or (1,)                  b_scale () or (1,)
      per-row/col  a_scale batch + (M,)                b_scale (N,)
      block        a_scale batch + (M, ceil(K/128))    b_scale (ceil(K/128), ceil(N/128)),
                   (1 x 128, DeepSeek-V3)              or (ceil(N/128), ceil(K/128)) with
                                                       transpose_b (128 x 128, b's layout)
    (batch dims of a_scale: a's or 1.) Per-tensor and per-row scales of a combine with
    per-tensor and per-column scales of b: D = acc * (sa[m] * sb[n]), acc the float32 (int8:
    exact int32, then float32) sum over all of K. Block scales combine with block scales only:
    for each 128-slice kb of K, in K order, acc += (sa[m, kb] * sb[kb, n // 128]) * P_kb with
    P_kb the slice's float32 (int8: exact int32) partial product. Other mixes are a ValueError
    (broadcast a per-tensor / per-row scale to the block form instead).

    out_dtype: bfloat16 (default), float16 or float32; int32 for int8 x int8 without scales or
    epilogue: the exact integer product (wrapping on overflow as int32 does, K > 131072).
    Then the epilogue of tg.gemm (same rules: jax_tcgemm.epilogue): c (out_dtype or float32,
    broadcast to the result: full, per-row (M, 1), per-column (N,), with or without batch
    dims) times beta (Python number or float32 scalar, traced allowed), bias (N,) floating,
    activation None / "relu" / "gelu" / "gelu_tanh" / "silu", all in float32, then rounded
    once to out_dtype.

    AD: jit, vmap, jvp and grad work with respect to the scales, c, bias and beta. a and b are
    quantised data: differentiating with respect to them is a TypeError (an fp8 cotangent would
    be a silently lossy gradient); give the quantiser its own straight-through rule instead.
    Under grad the block form keeps no per-block partial products (they are recomputed).
    """
    a, b = _as_array(a, "a"), _as_array(b, "b")
    desc = f"a{a.shape} {a.dtype}, b{b.shape} {b.dtype}, transpose_b={transpose_b}"
    if a.ndim < 2 or b.ndim != 2:
        raise ValueError(f"{_name()}: a must have rank >= 2 (..., M, K) and b rank 2 ((K, N), "
                         f"or (N, K) with transpose_b; vmap for a batched b); got {desc}")
    kind = kind_of(a.dtype, b.dtype)
    m, k = a.shape[-2:]
    kb_, n = (b.shape[1], b.shape[0]) if transpose_b else b.shape
    if k != kb_:
        raise ValueError(f"{_name()}: contracting dimensions differ (K = {k} vs {kb_}): {desc}")
    out_dtype = np.dtype(out_dtype)
    allowed = FLOAT_OUT + ((I32,) if kind == "int8" else ())
    if out_dtype not in allowed:
        raise TypeError(f"{_name()}: out_dtype must be one of {[str(d) for d in allowed]} for "
                        f"{a.dtype} x {b.dtype}; got {out_dtype}")
    if (a_scale is None) != (b_scale is None):
        raise ValueError(f"{_name()}: give both a_scale and b_scale or neither; got a_scale "
                         f"{'None' if a_scale is None else 'given'}, b_scale "
                         f"{'None' if b_scale is None else 'given'} ({desc})")
    batch = tuple(a.shape[:-2])
    out_shape = batch + (m, n)
    bsz = math.prod(batch)
    epi = c is not None or bias is not None or activation is not None
    if out_dtype == I32 and (a_scale is not None or epi):
        raise ValueError(f"{_name()}: out_dtype int32 is the exact integer product of int8 x "
                         f"int8: it takes no scales (a_scale=b_scale=None) and no epilogue (c, "
                         f"bias, activation); use a float out_dtype for those ({desc})")
    epilogue.check_activation(activation, "scaled_matmul")

    sa = sb = None
    form = "tensor"
    if a_scale is not None:
        a_scale = _scale(a_scale, "a_scale", desc)
        b_scale = _scale(b_scale, "b_scale", desc)
        fa = a_scale_form(a_scale.shape, a.shape)
        fb = b_scale_form(b_scale.shape, b.shape, transpose_b)
        check_forms(fa, fb, f"a_scale{a_scale.shape}, {desc}", f"b_scale{b_scale.shape}")
        form = "block" if fa == "block" else "outer"
        if fa == "tensor":
            sa = a_scale.reshape(())
        elif fa == "row":
            sa = jnp.broadcast_to(a_scale, batch + (m,)).reshape(bsz * m)
        else:
            sa = jnp.broadcast_to(a_scale, batch + a_scale.shape[-2:]).reshape(bsz * m, -1)
        sb = b_scale.reshape(()) if fb == "tensor" else b_scale
        if fb == "block" and transpose_b:
            sb = sb.T  # (Kb, Nb): tiny
    elif kind == "int8" and out_dtype == I32:
        st = (form, bool(transpose_b), kind, None, out_dtype, 1.0, 0.0, bsz, m, n)
        a2, b, config = _padded_plan(a.reshape(bsz * m, k), b, kind, n, form, transpose_b)
        args = (a2, b, None, None, None, None, None, st)
        out = _reference(*args) if config is None else _fused(*args, config)
        return out.reshape(out_shape)

    c3 = None if c is None else epilogue.c_operand(_as_array(c, "c"), out_shape, out_dtype,
                                                    "scaled_matmul", desc)
    bias2 = None if bias is None else epilogue.bias_operand(_as_array(bias, "bias"), n,
                                                            "scaled_matmul", desc)
    al, be, scale = epilogue.scale_operand(1.0, beta, "scaled_matmul")
    st = (form, bool(transpose_b), kind, activation, out_dtype, al, be, bsz, m, n)
    a2, b, config = _padded_plan(a.reshape(bsz * m, k), b, kind, n, form, transpose_b)
    if config is None:
        out = _reference(a2, b, sa, sb, c3, bias2, scale, st)
    else:
        out = _fused(a2, b, sa, sb, c3, bias2, scale, st, config)
    return out.reshape(out_shape)
