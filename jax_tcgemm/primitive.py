"""The primitives and all of their rules (abstract evaluation, lowerings, batching, AD).

tcgemm_p(a, b, [c], [bias], [scale]) -> [d] or [d, pre]:  the GEMM with its epilogue,

    pre = alpha * op(a) @ op(b) + beta * c + bias     d = act(pre)

in float32 from the accumulator, rounded once (problem.py describes the operands). Params
describe the math: transpose_a, transpose_b, out_dtype, alpha, beta (floats; ignored for a
traced scale operand), activation (a name of problem.ACTIVATIONS), has_c, has_bias,
has_scale, aux (also return pre, what the backward pass of the activation reads), and `plan`:
None (the CUDA lowering plans for the device: configs.py), or a (config name, split_k)
override; overwrite_c, a memory hint: d may reuse c's buffer (input_output_aliases) where
c has d's shape and dtype, so that a donated c is updated in place; and `precision`, in the
canonical form lax.dot_general keeps in its own params (problem.canonical_precision), kept
through every transformation: it changes float32 math only (float16/bfloat16 products are
exact in the float32 accumulator at any precision); float32 operands run the algorithm it
names (problem.f32_algorithm: one TF32 pass, f16x3, 3xTF32, the bfloat16 presets;
_f32_lowering).

tcgemm_dact_p(ct, pre) -> [g], [dbias]: the backward pass of the epilogue in one pass over the
cotangent: g = ct * act'(pre) and the bias gradient (float32 column sums of g); the
transpose of tcgemm_dbcast_p(pre, t, tbias) = act'(pre) * (t + tbias), the epilogue's tangent.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.lax import dot_general as _lax_dot_general  # as imported: safe under a monkeypatch
from jax.interpreters import ad, batching, mlir

from . import _ffi, epilogue, lowering, problem, sharding
from .epilogue import activate_grad
from .problem import IN_DTYPES, OPERAND_DTYPES, OUT_DTYPES, C_DTYPES, ACTIVATIONS, F32, dims
from .problem import split_operands
from .problem import canonical_precision, is_canonical_precision, swap_precision

tcgemm_p = Primitive("tcgemm")
tcgemm_p.multiple_results = True
tcgemm_dact_p = Primitive("tcgemm_dact")
tcgemm_dact_p.multiple_results = True
tcgemm_dbcast_p = Primitive("tcgemm_dbcast")


def tcgemm(a, b, c=None, bias=None, scale=None, *, transpose_a=False, transpose_b=False,
           out_dtype=None, alpha=1.0, beta=0.0, activation=None, aux=False, config=None,
           split_k=None, overwrite_c=False, precision=None):
    """Binds tcgemm_p; returns d, or (d, pre) with aux. out_dtype defaults to a's dtype.
    config (and split_k, default 1 with a config) override the plan the CUDA lowering makes;
    an sm90 config runs on any GPU (elsewhere, or on operands TMA cannot address, as its sm80
    fallback). precision: anything lax.dot_general takes, kept in canonical form
    (canonical_precision; None: the jax_default_matmul_precision in effect, as in lax)."""
    out_dtype = np.dtype(a.dtype if out_dtype is None else out_dtype)
    plan = None if config is None else (str(config), 1 if split_k is None else int(split_k))
    if config is None and split_k is not None:
        raise ValueError("tcgemm: split_k needs a config")
    args = [a, b] + [x for x in (c, bias, scale) if x is not None]
    out = tcgemm_p.bind(
        *args, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b),
        out_dtype=out_dtype, alpha=float(alpha), beta=float(beta),
        activation="none" if activation is None else str(activation), has_c=c is not None,
        has_bias=bias is not None, has_scale=scale is not None, aux=bool(aux), plan=plan,
        overwrite_c=bool(overwrite_c) and c is not None, precision=canonical_precision(precision))
    return tuple(out) if aux else out[0]


# ---------------------------------------------------------------------------------------------
# Abstract evaluation: the one place that validates.

def _abstract_eval(*args, transpose_a, transpose_b, out_dtype, alpha, beta, activation, has_c,
                   has_bias, has_scale, aux, plan, overwrite_c, precision):
    a, b, c, bias, scale = split_operands(args, has_c, has_bias, has_scale)
    desc = (f"a{tuple(a.shape)} {a.dtype} transpose_a={transpose_a}, "
            f"b{tuple(b.shape)} {b.dtype} transpose_b={transpose_b}")
    if a.ndim != 3 or b.ndim != 3:
        raise ValueError(f"tcgemm: operands must have rank 3 (batch, rows, cols); got {desc}")
    if a.dtype != b.dtype or np.dtype(a.dtype) not in OPERAND_DTYPES:
        raise TypeError(f"tcgemm: operands must both be float16, both bfloat16 or both float32; "
                        f"got {desc}")
    if np.dtype(out_dtype) not in OUT_DTYPES:
        raise TypeError(f"tcgemm: out_dtype must be float16, bfloat16 or float32; got {out_dtype}")
    bt, m, n, ka, kb = dims(a.shape, b.shape, transpose_a, transpose_b)
    if ka != kb:
        raise ValueError(f"tcgemm: contracting sizes differ ({ka} vs {kb}): {desc}")
    if any(not problem.symbolic(d) and d >= 2**31 for d in (m, n, ka)):
        raise ValueError(f"tcgemm: M, N and K must each be below 2^31: {desc}")
    if a.shape[0] not in (1, bt) or b.shape[0] not in (1, bt):
        raise ValueError(f"tcgemm: batch sizes must be equal or 1: {desc}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"tcgemm: unknown activation {activation!r}; known: {ACTIVATIONS}")
    if not is_canonical_precision(precision):
        raise ValueError(f"tcgemm: precision must be in lax's canonical form (None, a pair of "
                         f"lax.Precision, a lax.DotAlgorithmPreset or a lax.DotAlgorithm: "
                         f"canonical_precision); got {precision!r}")
    if c is not None:
        if c.ndim != 3 or any(x not in (1, y) for x, y in zip(c.shape, (bt, m, n))):
            raise ValueError(f"tcgemm: c{tuple(c.shape)} does not broadcast to the result "
                             f"{(bt, m, n)}: {desc}")
        if np.dtype(c.dtype) not in C_DTYPES:
            raise TypeError(f"tcgemm: c must be float16, bfloat16 or float32; got {c.dtype}")
    if bias is not None and (bias.ndim != 2 or bias.shape[1] != n or bias.shape[0] not in (1, bt)
                             or np.dtype(bias.dtype) not in C_DTYPES):
        raise ValueError(f"tcgemm: bias must be float16, bfloat16 or float32 (1 or {bt}, {n}); "
                         f"got {tuple(bias.shape)} {bias.dtype}: {desc}")
    if scale is not None and (scale.shape != (2,) or np.dtype(scale.dtype) != np.float32):
        raise ValueError(f"tcgemm: scale must be float32 [alpha, beta]; got {tuple(scale.shape)} "
                         f"{scale.dtype}")
    if plan is not None:
        from . import configs  # the table, read from the module
        config, split = plan
        if config not in configs.BY_NAME:
            raise ValueError(f"tcgemm: unknown config {config!r}; known: {sorted(configs.BY_NAME)}")
        if configs.BY_NAME[config] not in configs.CONFIGS16:
            only = "8-bit" if configs.BY_NAME[config].kind == "narrow" else "fp8"
            raise ValueError(f"tcgemm: config {config} has kernels for {only} operands only: {desc}")
        if not 1 <= split <= configs.MAX_SPLIT_K:
            raise ValueError(f"tcgemm: split_k must be in [1, {configs.MAX_SPLIT_K}]; got {split}")
    out = jax.core.ShapedArray((bt, m, n), np.dtype(out_dtype),
                               **sharding.result_sharding(a, b, transpose_a, transpose_b))
    return [out, out] if aux else [out]


# ---------------------------------------------------------------------------------------------
# Reference semantics in lax (the lowering on every platform but CUDA; tests' oracle).

def reference(*args, transpose_a, transpose_b, out_dtype, alpha=1.0, beta=0.0,
              activation="none", has_c=False, has_bias=False, has_scale=False, aux=False,
              plan=None, overwrite_c=False, precision=None):
    """tcgemm_p's semantics in lax: float32 accumulation and epilogue, rounded once."""
    del plan, overwrite_c
    a, b, c, bias, scale = split_operands(args, has_c, has_bias, has_scale)
    bt = b.shape[0] if a.shape[0] == 1 else a.shape[0]
    # float32 operands (XLA:CPU has no batched bf16 x bf16 -> f32 dot for some layouts). A
    # float16 / bfloat16 product is exact in float32 at any precision, as in the kernels: those
    # at HIGHEST whatever the param; float32 operands at their precision, as lax does.
    half = np.dtype(a.dtype) in IN_DTYPES
    prec = lax.Precision.HIGHEST if half else precision
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    if bt == 1:  # lax.dot_general's own 2-D product (a float32 call matches lax bit for bit)
        dn = (((0 if transpose_a else 1,), (1 if transpose_b else 0,)), ((), ()))
        acc = _lax_dot_general(a[0], b[0], dn, precision=prec,
                               preferred_element_type=jnp.float32)[None]
    else:
        a = jnp.broadcast_to(a, (bt,) + a.shape[1:])
        b = jnp.broadcast_to(b, (bt,) + b.shape[1:])
        dn = (((1 if transpose_a else 2,), (2 if transpose_b else 1,)), ((0,), (0,)))
        acc = _lax_dot_general(a, b, dn, precision=prec, preferred_element_type=jnp.float32)
    return epilogue.apply(acc, c, bias, scale, alpha=alpha, beta=beta, activation=activation,
                          out_dtype=out_dtype, aux=aux)


# ---------------------------------------------------------------------------------------------
# CUDA lowering: the FFI custom call, planned here for the local shapes and the device.

def _cuda_lowering(ctx, *args, **params):
    if np.dtype(ctx.avals_in[0].dtype) == F32:
        return _f32_lowering(ctx, *args, **params)
    return lowering.kernel_lowering(ctx, *args, **params)


_fallback_lowering = mlir.lower_fun(reference, multiple_results=True)


_TF32_PASS = lax.DotAlgorithmPreset.TF32_TF32_F32


def _f32_lowering(ctx, *args, **params):
    """float32 operands on CUDA, by their precision's algorithm (problem.f32_algorithm). On
    compute capability 9.0 the multi-pass algorithms are one product of the operands' parts
    side by side along K (f32.layout; lowering.f32_parts: by the tcgemm_split kernel in front
    of the call, or XLA ops for small operands; f16x3: lowering.f16x3_product, which scales
    them back in the epilogue); one TF32 pass is
    XLA's (problem.F32_ON_KERNELS says why) unless a config is forced, then it is the FFI call
    (K-major operands with K % 4 == 0 as they are, others made so). lax computes the
    algorithms our kernels lack, and all on other GPUs (XLA's TF32 / presets: one contract)."""
    from . import configs
    a_aval, b_aval = ctx.avals_in[:2]
    ta, tb, plan = params["transpose_a"], params["transpose_b"], params["plan"]
    k = dims(a_aval.shape, b_aval.shape, ta, tb)[3]
    algo = problem.f32_algorithm(params["precision"])
    arch = configs.device_arch()
    if (algo not in problem.F32_ON_KERNELS and plan is None) or algo is None or \
            not _ffi.available() or arch is None or tuple(arch[:2]) != (9, 0):
        return _fallback_lowering(ctx, *args, **params)
    if plan is not None and algo in ("tf32", "tf32x3", "f16x3") and \
            not configs.BY_NAME[plan[0]].f32:
        raise ValueError(f"tcgemm: config {plan[0]} has no float32 (TF32, f16x3) kernel; rows "
                         f"that do: {[c.name for c in configs.CONFIGS if c.f32]}")
    if algo == "tf32" and not ta and tb and k % 4 == 0:
        return lowering.kernel_lowering(ctx, *args, **params)
    if algo == "f16x3":
        return lowering.f16x3_lowering(ctx, *args, **params)
    return mlir.lower_fun(functools.partial(_f32_product, algo=algo, **params),
                          multiple_results=True)(ctx, *args)


def _f32_product(a, b, *rest, algo, transpose_a, transpose_b, precision, **params):
    """tcgemm_p on the parts of float32 a and b for algorithm `algo`, laid out along K'
    (lowering.f32_parts; f32.layout): TF32 parts K-major as one TF32 pass of our kernel
    (planned here unless forced), bfloat16 parts as a bfloat16 product."""
    bf16 = not algo.startswith("tf32")
    a, b, ta, tb, _ = lowering.f32_parts(a, b, algo, transpose_a, transpose_b, keep_layout=bf16)
    if bf16:
        return tcgemm_p.bind(a, b, *rest, transpose_a=ta, transpose_b=tb, precision=precision,
                             **params)
    from . import configs
    plan = params.pop("plan")
    if plan is None:
        bt, m, n, kk, _ = dims(a.shape, b.shape, False, True)
        plan = configs.plan_f32(m, n, kk, bt, epilogue=problem.fused_epilogue(
            params["has_c"], params["has_bias"], params["has_scale"], params["aux"],
            params["activation"]))
    return tcgemm_p.bind(a, b, *rest, transpose_a=False, transpose_b=True,
                         precision=_TF32_PASS, plan=plan, **params)


# ---------------------------------------------------------------------------------------------
# Batching: vmapped axes fold into the kernel's batch dimension (one launch).

def _fold(x, d, v, bt):
    """Operand x with its vmapped axis d (None: unmapped) folded into the kernel's batch: a
    mapped x becomes (v * bt, ...); an unmapped x keeps batch 1 (shared by everything) or is
    repeated v times."""
    if d is None:
        if x.shape[0] == 1:
            return x
        return jnp.broadcast_to(x[None], (v,) + x.shape).reshape((v * x.shape[0],) + x.shape[1:])
    x = jnp.moveaxis(x, d, 0)
    x = jnp.broadcast_to(x, (v, bt) + x.shape[2:])
    return x.reshape((v * bt,) + x.shape[2:])


def _batch_rule(args, bdims, **params):
    flags = params["has_c"], params["has_bias"], params["has_scale"]
    if split_operands(bdims, *flags)[4] is not None:  # per-item alpha / beta
        return _batch_by_loop(args, bdims, params)
    v = next(x.shape[d] for x, d in zip(args, bdims) if d is not None)
    item = [x.shape if d is None else x.shape[:d] + x.shape[d + 1:] for x, d in zip(args, bdims)]
    bt = dims(item[0], item[1], params["transpose_a"], params["transpose_b"])[0]
    new = [x if i == len(args) - 1 and params["has_scale"] else _fold(x, d, v, bt)
           for i, (x, d) in enumerate(zip(args, bdims))]
    outs = tcgemm_p.bind(*new, **dict(params, plan=None))
    return [o.reshape((v, bt) + o.shape[1:]) for o in outs], [0] * len(outs)


def map_items(fn, args, bdims):
    """fn over the vmapped items one at a time (lax.map): args with their vmapped axes bdims
    (None: unmapped, passed whole to every item); the items' results stacked on axis 0."""
    mapped = [jnp.moveaxis(x, d, 0) for x, d in zip(args, bdims) if d is not None]

    def one(xs):
        it = iter(xs)
        return fn(*[x if d is None else next(it) for x, d in zip(args, bdims)])
    return lax.map(one, mapped)


def _batch_by_loop(args, bdims, params):
    """vmap with a mapped scale (traced alpha / beta per item): one product per item."""
    outs = map_items(lambda *xs: tcgemm_p.bind(*xs, **params), args, bdims)
    return list(outs), [0] * len(outs)


# ---------------------------------------------------------------------------------------------
# Differentiation. The product is bilinear in (a, b), linear in c and bias; the activation
# makes the whole nonlinear, so the JVP runs the forward once with aux (it also writes pre, as
# cuBLASLt's *_AUX epilogues do) and builds the tangent from our primitives:
#   t_lin = alpha * (op(ta) @ op(b) + op(a) @ op(tb)) + beta * tc  (+ dalpha, dbeta terms)
#   t_out = tcgemm_dbcast(pre, t_lin, tbias) = act'(pre) * (t_lin + tbias)
# Reverse mode transposes tcgemm_dbcast into tcgemm_dact (our kernel: g and the bias gradient
# in one pass) and each product into tcgemm_p with flipped layout flags (no transposes).

def _zero(t):
    return t is None or type(t) is ad.Zero


def _jvp(primals, tangents, **params):
    hc, hb, hs = params["has_c"], params["has_bias"], params["has_scale"]
    a, b, c, bias, scale = split_operands(primals, hc, hb, hs)
    ta, tb, tc, tbias, tscale = split_operands(tangents, hc, hb, hs)
    act = params["activation"]
    want_pre = act != "none" or params["aux"]
    outs = tcgemm_p.bind(*primals, **dict(params, aux=want_pre, overwrite_c=False))
    d, pre = outs[0], (outs[1] if want_pre else None)
    out_dtype = params["out_dtype"]
    # The tangent in d's type: in reverse mode the cotangent of the products then comes out of
    # tcgemm_dact already rounded for them (no conversion pass over M x N).
    lin = dict(transpose_a=params["transpose_a"], transpose_b=params["transpose_b"],
               out_dtype=out_dtype, precision=params["precision"])  # operands in place: as is
    al_kw = dict(alpha=params["alpha"]) if scale is None else {}
    sc = None if scale is None else jnp.stack([scale[0], jnp.float32(1.0)])
    t = None
    if not _zero(ta):
        t = tcgemm(ad.instantiate_zeros(ta), b, scale=sc, **al_kw, **lin)
    if not _zero(tb):
        if t is None:
            t = tcgemm(a, ad.instantiate_zeros(tb), scale=sc, **al_kw, **lin)
        else:  # fused: alpha * op(a) @ op(tb) + 1 * t (sc's beta is 1 already)
            t = tcgemm(a, ad.instantiate_zeros(tb), t, scale=sc, beta=1.0, **al_kw, **lin)
    bshape = d.shape
    extra = []
    if not _zero(tc):
        tc32 = jnp.broadcast_to(tc.astype(jnp.float32), bshape)
        static_one = scale is None and params["beta"] == 1.0
        extra.append(tc32 if static_one else (params["beta"] if scale is None else scale[1]) * tc32)
    if scale is not None and not _zero(tscale):
        ab = tcgemm(a, b, transpose_a=params["transpose_a"], transpose_b=params["transpose_b"],
                    out_dtype=np.float32, precision=params["precision"])
        extra.append(tscale[0] * ab)
        if c is not None:
            extra.append(tscale[1] * jnp.broadcast_to(c.astype(jnp.float32), bshape))
    for e in extra:
        t = e.astype(lin["out_dtype"]) if t is None else t + e.astype(t.dtype)
    tb_ = None if _zero(tbias) else tbias
    if act == "none" and tb_ is None:  # linear in the products alone: no epilogue tangent
        t_out = (ad.Zero(jax.core.ShapedArray(d.shape, d.dtype)) if t is None
                 else jnp.broadcast_to(t, d.shape).astype(out_dtype))
        return ([d, pre] if params["aux"] else [d]), ([t_out, t_out] if params["aux"] else [t_out])
    if t is None and tb_ is None:
        t_out = ad.Zero(jax.core.ShapedArray(d.shape, d.dtype))
        t_pre = t_out
    else:
        if t is None:
            t = jnp.zeros(d.shape, lin["out_dtype"])
        t = jnp.broadcast_to(t, d.shape)
        # pre is read only for an activation; without one a scalar stands in for it
        pre_or_t = pre if pre is not None else jnp.zeros((), out_dtype)
        t_out = tcgemm_dbcast_p.bind(pre_or_t, t, *([tb_] if tb_ is not None else []),
                                     activation=act, has_bias=tb_ is not None,
                                     out_dtype=np.dtype(out_dtype))
        t_pre = (tcgemm_dbcast_p.bind(pre_or_t, t, *([tb_] if tb_ is not None else []),
                                      activation="none", has_bias=tb_ is not None,
                                      out_dtype=np.dtype(out_dtype))
                 if params["aux"] else None)
    primal_out = [d, pre] if params["aux"] else [d]
    tangent_out = [t_out, t_pre] if params["aux"] else [t_out]
    return primal_out, tangent_out


def _sum_to(x, shape):
    """x (float32, broadcast result shape) summed down to `shape` (a broadcastable operand)."""
    axes = tuple(i for i, (s, t) in enumerate(zip(shape, x.shape)) if s == 1 and t != 1)
    return jnp.sum(x, axis=axes, keepdims=True, dtype=jnp.float32) if axes else x


def _transpose(cts, *args, **params):
    """Reverse mode of a linearised tcgemm_p: only the plain linear form appears here (no
    activation or aux: _jvp keeps those outside the tangent), with at most one of a, b
    undefined, plus c (scaled by beta), never bias or scale.

    precision as lax's dot_general transpose assigns it: each backward product is there
    dot_general(ct, other operand, precision=the same (lhs, rhs) pair), so the cotangent takes
    the forward's lhs part and the other operand the rhs part. Our products keep that where
    the cotangent is their a, and swap the pair (swap_precision) where it is their b."""
    hc, hb, hs = params["has_c"], params["has_bias"], params["has_scale"]
    a, b, c, bias, scale = split_operands(args, hc, hb, hs)
    (ct,) = cts
    ta, tb = params["transpose_a"], params["transpose_b"]
    prec, prec_swapped = params["precision"], swap_precision(params["precision"])
    res = [None] * len(args)
    if type(ct) is ad.Zero:
        return res
    g, inv = epilogue.narrow_cotangent(ct, (b if ad.is_undefined_primal(a) else a).dtype)
    al_kw, sc = dict(alpha=params["alpha"]), None  # alpha static, or traced (scale[0]) or
    if scale is not None or inv is not None:       # undoing the cotangent's scaling (inv)
        al = scale[0] if scale is not None else jnp.float32(params["alpha"])
        al_kw, sc = {}, jnp.stack([al if inv is None else al * inv, jnp.float32(0.0)])
    if ad.is_undefined_primal(a):
        av = a.aval
        acc = np.dtype(np.float32) if av.shape[0] != g.shape[0] else av.dtype
        if not ta:  # dA (M, K) = alpha dC (M, N) . op(B)^T (N, K)
            da = tcgemm(g, b, scale=sc, transpose_a=False, transpose_b=not tb, out_dtype=acc,
                        precision=prec, **al_kw)
        else:       # dA^T (K, M) = alpha op(B) (K, N) . dC^T (N, M)
            da = tcgemm(b, g, scale=sc, transpose_a=tb, transpose_b=True, out_dtype=acc,
                        precision=prec_swapped, **al_kw)
        res[0] = _sum_to(da, av.shape).astype(av.dtype)
    if ad.is_undefined_primal(b):
        bv = b.aval
        acc = np.dtype(np.float32) if bv.shape[0] != g.shape[0] else bv.dtype
        if not tb:  # dB (K, N) = alpha op(A)^T (K, M) . dC (M, N)
            db = tcgemm(a, g, scale=sc, transpose_a=not ta, transpose_b=False, out_dtype=acc,
                        precision=prec_swapped, **al_kw)
        else:       # dB^T (N, K) = alpha dC^T (N, M) . op(A) (M, K)
            db = tcgemm(g, a, scale=sc, transpose_a=True, transpose_b=ta, out_dtype=acc,
                        precision=prec, **al_kw)
        res[1] = _sum_to(db, bv.shape).astype(bv.dtype)
    if hc and ad.is_undefined_primal(c):
        be = params["beta"] if scale is None else scale[1]
        g = ct if (scale is None and be == 1.0) else be * ct.astype(jnp.float32)
        res[2] = _sum_to(g, c.aval.shape).astype(c.aval.dtype)
    for x, i in ((bias, 2 + hc), (scale, 2 + hc + hb)):
        if x is not None and ad.is_undefined_primal(x):
            raise NotImplementedError("tcgemm: bias / scale are not linear inputs of tcgemm_p")
    return res


# ---------------------------------------------------------------------------------------------
# tcgemm_dbcast_p(pre, t, [tbias]) = act'(pre) * (t + tbias): the epilogue's tangent, linear in
# (t, tbias). Evaluated only in forward mode (lax); reverse mode transposes it into
# tcgemm_dact_p, our kernel.

def _dbcast_ref(pre, t, *tbias, activation, has_bias, out_dtype):
    x = t.astype(jnp.float32)
    if has_bias:
        x = x + tbias[0].astype(jnp.float32)[:, None, :]
    if activation != "none":
        x = x * activate_grad(activation, pre.astype(jnp.float32))
    return x.astype(out_dtype)


def _dbcast_abstract(pre, t, *tbias, activation, has_bias, out_dtype):
    return jax.core.ShapedArray(t.shape, np.dtype(out_dtype), sharding=t.sharding)


def _dbcast_transpose(ct, pre, t, *tbias, activation, has_bias, out_dtype):
    res = [None, None] + ([None] if has_bias else [])
    if type(ct) is ad.Zero:
        return res
    want_g = ad.is_undefined_primal(t)
    want_b = has_bias and ad.is_undefined_primal(tbias[0])
    if activation == "none" and want_g:  # g = ct: no pass over it; the kernel only for dbias
        res[1] = ct.astype(t.aval.dtype)
        want_g = False
    g_dtype = t.aval.dtype if want_g else ct.dtype
    bias_batched = has_bias and tbias[0].aval.shape[0] != 1
    outs = tcgemm_dact_p.bind(ct, pre, activation=activation, has_g=want_g, has_dbias=want_b,
                              g_dtype=np.dtype(g_dtype), bias_batched=bool(bias_batched))
    it = iter(outs)
    if want_g:
        res[1] = next(it)
    if want_b:
        res[2] = next(it).astype(tbias[0].aval.dtype)
    return res


def _dbcast_batch(args, bdims, *, activation, has_bias, out_dtype):
    v = next(x.shape[d] for x, d in zip(args, bdims) if d is not None)
    pre, t = args[0], args[1]
    mv = lambda x, d: jnp.broadcast_to(x, (v,) + x.shape) if d is None else jnp.moveaxis(x, d, 0)
    t = mv(t, bdims[1])
    shp = t.shape
    if activation != "none":  # else pre is an unread scalar stand-in
        pre = mv(pre, bdims[0]).reshape((-1,) + shp[2:])
    new = [pre, t.reshape((-1,) + shp[2:])]
    if has_bias:
        tb = mv(args[2], bdims[2])  # (v, Bb, N) -> (v * B, N)
        tb = jnp.broadcast_to(tb, (v, shp[1], tb.shape[-1])).reshape((-1, tb.shape[-1]))
        new.append(tb)
    out = tcgemm_dbcast_p.bind(*new, activation=activation, has_bias=has_bias,
                               out_dtype=out_dtype)
    return out.reshape(shp[:2] + out.shape[1:]), 0


# ---------------------------------------------------------------------------------------------
# tcgemm_dact_p(ct, pre) -> [g], [dbias]: g = act'(pre) * ct, dbias = column sums of g.

def _dact_ref(ct, pre, *, activation, has_g, has_dbias, g_dtype, bias_batched):
    g = ct.astype(jnp.float32)
    if activation != "none":
        g = g * activate_grad(activation, pre.astype(jnp.float32))
    gq = g.astype(g_dtype)
    outs = [gq] if has_g else []
    if has_dbias:
        gs = gq.astype(jnp.float32)
        outs.append(jnp.sum(gs, axis=1) if bias_batched else jnp.sum(gs, axis=(0, 1))[None])
    return outs


def _dact_abstract(ct, pre, *, activation, has_g, has_dbias, g_dtype, bias_batched):
    if ct.ndim != 3:
        raise ValueError(f"tcgemm_dact: ct must have rank 3; got {ct.shape}")
    g = jax.core.ShapedArray(ct.shape, np.dtype(g_dtype), sharding=ct.sharding)
    db = jax.core.ShapedArray(((ct.shape[0] if bias_batched else 1), ct.shape[2]),
                              np.dtype(np.float32), **sharding.dbias_sharding(ct, bias_batched))
    return [g] * has_g + [db] * has_dbias


def _dact_cuda(ctx, ct, pre, *, activation, has_g, has_dbias, g_dtype, bias_batched):
    _ffi.require()
    return jax.ffi.ffi_lowering(_ffi.DACT_TARGET)(
        ctx, ct, pre, activation=np.int32(problem.activation_index(activation)), has_g=has_g,
        has_dbias=has_dbias, bias_batched=bias_batched)


def _dact_transpose(cts, ct, pre, *, activation, has_g, has_dbias, g_dtype, bias_batched):
    it = iter(cts)
    cg = next(it) if has_g else None
    cb = next(it) if has_dbias else None
    x = jnp.zeros(ct.aval.shape, jnp.float32)
    if cg is not None and type(cg) is not ad.Zero:
        x = x + cg.astype(jnp.float32)
    if cb is not None and type(cb) is not ad.Zero:
        x = x + cb.astype(jnp.float32)[:, None, :]
    if activation != "none":
        x = x * activate_grad(activation, pre.astype(jnp.float32))
    return [x.astype(ct.aval.dtype), None]


def _dact_batch(args, bdims, *, activation, has_g, has_dbias, g_dtype, bias_batched):
    ct, pre = args
    v = next(x.shape[d] for x, d in zip(args, bdims) if d is not None)
    mv = lambda x, d: jnp.broadcast_to(x, (v,) + x.shape) if d is None else jnp.moveaxis(x, d, 0)
    ct = mv(ct, bdims[0])
    shp = ct.shape  # (v, B, M, N)
    live = activation != "none"  # else pre is an unread scalar stand-in
    if live:
        pre = mv(pre, bdims[1])
    if bias_batched:
        new = (ct.reshape((-1,) + shp[2:]), pre.reshape((-1,) + shp[2:]) if live else pre)
    else:  # per-item sums over (B, M): rows of one (v * 1, B * M, N) problem
        new = (ct.reshape((v, -1, shp[3])), pre.reshape((v, -1, shp[3])) if live else pre)
    outs = tcgemm_dact_p.bind(*new, activation=activation, has_g=has_g, has_dbias=has_dbias,
                              g_dtype=g_dtype, bias_batched=True)
    res = []
    it = iter(outs)
    if has_g:
        res.append(next(it).reshape(shp))
    if has_dbias:
        db = next(it)
        res.append(db.reshape((v, shp[1], shp[3])) if bias_batched else db[:, None, :])
    return res, [0] * len(res)


def _jvp_by_reference(ref, prim):
    """A JVP rule that differentiates the lax reference (second derivatives: grad of grad)."""
    def rule(primals, tangents, **params):
        out = prim.bind(*primals, **params)
        tangents = [ad.instantiate_zeros(t) for t in tangents]
        _, t = jax.jvp(lambda *xs: ref(*xs, **params), tuple(primals), tuple(tangents))
        return out, t
    return rule


# ---------------------------------------------------------------------------------------------
# Registration of every rule, in one place.

@functools.lru_cache(maxsize=None)
def _jitted_impl(prim, **params):
    return jax.jit(lambda *xs: prim.bind(*xs, **params))


for _p in (tcgemm_p, tcgemm_dact_p, tcgemm_dbcast_p):
    _p.def_impl(functools.partial(lambda prim, *xs, **params: _jitted_impl(prim, **params)(*xs),
                                  _p))
tcgemm_p.def_abstract_eval(_abstract_eval)
tcgemm_dact_p.def_abstract_eval(_dact_abstract)
tcgemm_dbcast_p.def_abstract_eval(_dbcast_abstract)
# Over several devices tcgemm_p and tcgemm_dact_p lower through custom_partitioning
# (sharding.py), which binds them again on the local shards; there they lower directly.
# Symbolic shapes (shape polymorphism) lower through lax on every platform (symbolic_or).
_dact_lax = mlir.lower_fun(_dact_ref, multiple_results=True)
for _plat, _low, _dlow in ((None, _fallback_lowering, _dact_lax),
                           ("cuda", _cuda_lowering, _dact_cuda)):
    mlir.register_lowering(tcgemm_p, sharding.symbolic_or(_fallback_lowering, sharding.partitioned(
        _low, tcgemm_p, sharding.gemm_rule)), platform=_plat)
    mlir.register_lowering(tcgemm_dact_p, sharding.symbolic_or(_dact_lax, sharding.partitioned(
        _dlow, tcgemm_dact_p, sharding.dact_rule)), platform=_plat)
mlir.register_lowering(tcgemm_dbcast_p, mlir.lower_fun(_dbcast_ref, multiple_results=False))
batching.primitive_batchers[tcgemm_p] = _batch_rule
batching.primitive_batchers[tcgemm_dact_p] = _dact_batch
batching.primitive_batchers[tcgemm_dbcast_p] = _dbcast_batch
ad.primitive_jvps[tcgemm_p] = _jvp
ad.primitive_transposes[tcgemm_p] = _transpose
ad.primitive_jvps[tcgemm_dact_p] = _jvp_by_reference(_dact_ref, tcgemm_dact_p)
ad.primitive_transposes[tcgemm_dact_p] = _dact_transpose
ad.primitive_jvps[tcgemm_dbcast_p] = _jvp_by_reference(_dbcast_ref, tcgemm_dbcast_p)
ad.primitive_transposes[tcgemm_dbcast_p] = _dbcast_transpose
