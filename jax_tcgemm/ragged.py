"""Ragged (grouped) GEMM: `tg.ragged_dot`, `tg.ragged_dot_general` (drop-ins for lax's) and
`tg.ragged_gemm` (with a per-group bias and an activation), on tcgemm_ragged_p.

tcgemm_ragged_p(a, b, group_sizes, [bias]) -> [d]; group g owns rows [start_g, end_g) of a:

  mode 0 (ragged rows: the MoE forward and dgrad): a (M, K), b (G, K, N), or (G, N, K) with
      transpose_b; d (M, N), d[rows of g] = act(a[rows of g] @ op(b[g]) + bias[g]); rows that
      no group owns are zeros. bias float16, bfloat16 or float32 (G, N), added in float32.
  mode 1 (ragged contraction: the MoE wgrad): a (M, K), b (M, N); d (G, K, N),
      d[g] = a[rows of g].T @ b[rows of g] (zeros for an empty group). No bias, no activation.

a and b are both float16 or both bfloat16, group_sizes int32 (G,); accumulation and epilogue
in float32, rounded once to out_dtype (float16, bfloat16 or float32). Params describe the math
(mode, transpose_b, out_dtype, activation, has_bias) plus `plan`: None (the CUDA lowering asks
configs.plan_ragged, which names an sm90 config on compute capability 9.0, an sm80 config on
every other GPU from 8.0 on, and none below 8.0, where the product lowers through
lax.ragged_dot_general with the same contract) or a config name, an override (a row with
grouped kernels, Config.ragged: every sm90 row, which runs on 9.0 only, and some sm80 rows,
which run on any GPU from 8.0 on).

Group boundaries (the clamping rule, the same in the kernel, the lax reference and the
partitioner): a negative size counts as 0, and ends are cut at M (end_g = min(M, sum of the
clamped sizes up to g), start_g = end_{g-1}): nothing is ever read or written out of bounds.
For sizes >= 0 this is exactly lax.ragged_dot's result, a sum above M included (lax also cuts
at M). For a negative size lax (jax 0.11.2, its dense lowering on CPU) differs: it takes the
raw prefix sums, so a negative size moves the later groups' starts back and the rows where two
groups' ranges overlap get the SUM of both groups' products (sizes [3, -1, 2] on 6 rows: rows
0-2 group 0, rows 2-3 group 2, row 2 both, rows 4-5 zeros; ours: rows 0-2 group 0, rows 3-4
group 2, row 5 zeros). ragged_dot* therefore reject negative sizes they can see (concrete
arrays, not traced ones) with a ValueError; traced sizes follow the clamping rule.

AD: the gradients are tcgemm_ragged_p again (no dense masked products): for mode 0,
d a = mode 0 of the cotangent against b with transpose_b flipped, d b = mode 1 (wgrad), d bias =
per-group float32 column sums of the cotangent (a segment sum); for mode 1, d a and
d b are mode 0 products of b, a with the cotangent. An activation runs, under differentiation,
as one launch writing the float32 pre-activation, the activation in lax on it (the same value,
rounded once), and the existing tcgemm_dbcast_p / tcgemm_dact_p pair (primitive.py) for
g = ct * act'(pre) in reverse mode. Sharding: sharding.py (ragged_rule, ragged_partition).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
# As imported, not looked up at call time: safe under jax.lax.ragged_dot = tg.ragged_dot.
from jax.lax import ragged_dot_general as _lax_ragged_dot_general

from . import _ffi, epilogue, problem, sharding
from .ops import _as_array, _check_out_dtype, _kernel_dtype
from .primitive import _jitted_impl, _zero, tcgemm_dbcast_p
from .problem import ACTIVATIONS, C_DTYPES, IN_DTYPES, OUT_DTYPES

tcgemm_ragged_p = Primitive("tcgemm_ragged")
tcgemm_ragged_p.multiple_results = True  # one result; the shape custom_partitioning lowers
F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)


def ragged(a, b, group_sizes, bias=None, *, mode=0, transpose_b=False, out_dtype=None,
           activation=None, config=None):
    """Binds tcgemm_ragged_p; returns d. out_dtype defaults to a's dtype; config (a config
    name, a row with grouped kernels: Config.ragged) overrides configs.plan_ragged."""
    out = tcgemm_ragged_p.bind(
        a, b, group_sizes, *([] if bias is None else [bias]), mode=int(mode),
        transpose_b=bool(transpose_b), out_dtype=np.dtype(a.dtype if out_dtype is None
                                                          else out_dtype),
        activation="none" if activation is None else str(activation), has_bias=bias is not None,
        plan=config)
    return out[0]


# ---------------------------------------------------------------------------------------------
# The clamping rule (see the module docstring), in lax on int32 sizes of any leading shape.

def group_ends(group_sizes, m):
    """end_g = min(m, clamped sizes summed up to g), along the last axis: a saturating prefix
    sum (y + min(x, m - y) = min(x + y, m) for x, y in [0, m]: no int32 overflow)."""
    s = jnp.clip(group_sizes, 0, m).astype(jnp.int32)
    return lax.associative_scan(lambda x, y: y + jnp.minimum(x, m - y), s, axis=-1)


def row_groups(ends, m):
    """The group of each of the m rows (G for rows past the last group), from group_ends."""
    rows = jnp.arange(m, dtype=jnp.int32)
    return jnp.where(rows < ends[-1], jnp.searchsorted(ends, rows, side="right"),
                     ends.shape[0]).astype(jnp.int32)


def group_starts(ends):
    return jnp.concatenate([jnp.zeros_like(ends[..., :1]), ends[..., :-1]], axis=-1)


def local_sizes(group_sizes, m, row0, rows, group0, groups):
    """The sizes of groups [group0, group0 + groups) within rows [row0, row0 + rows) of m (a
    shard's window; groups past G are empty), and the window row where the first of them
    starts: how a device of a sharded product sees the global group_sizes."""
    ends = group_ends(group_sizes, m)
    starts = group_starts(ends)
    idx = group0 + jnp.arange(groups)
    valid = idx < ends.shape[-1]
    idx = jnp.minimum(idx, ends.shape[-1] - 1)
    s = jnp.where(valid, starts[idx], ends[-1])
    e = jnp.where(valid, ends[idx], ends[-1])
    cs, ce = jnp.clip(s - row0, 0, rows), jnp.clip(e - row0, 0, rows)
    return (ce - cs).astype(jnp.int32), cs[0]


# ---------------------------------------------------------------------------------------------
# Abstract evaluation: the one place that validates.

def _dims(a_shape, b_shape, mode, transpose_b):
    """(M, N, K of a, K of b): mode 0 from a (M, K) and b (G, K, N) / (G, N, K); mode 1 from a
    (M, K) and b (M, N)."""
    if mode == 1:
        return a_shape[0], b_shape[1], a_shape[1], a_shape[1]
    kb, n = (b_shape[2], b_shape[1]) if transpose_b else (b_shape[1], b_shape[2])
    return a_shape[0], n, a_shape[1], kb


def _abstract_eval(a, b, gs, *bias, mode, transpose_b, out_dtype, activation, has_bias, plan):
    desc = (f"a{tuple(a.shape)} {a.dtype}, b{tuple(b.shape)} {b.dtype}, group_sizes"
            f"{tuple(gs.shape)} {gs.dtype} (mode {mode}, transpose_b={transpose_b})")
    if mode not in (0, 1):
        raise ValueError(f"tcgemm_ragged: mode must be 0 (ragged rows) or 1 (ragged "
                         f"contraction); got {mode}")
    if a.ndim != 2 or b.ndim != (3 if mode == 0 else 2):
        want = "b (G, K, N) or (G, N, K)" if mode == 0 else "b (M, N)"
        raise ValueError(f"tcgemm_ragged: needs a (M, K) and {want}; got {desc}")
    if a.dtype != b.dtype or np.dtype(a.dtype) not in IN_DTYPES:
        raise TypeError(f"tcgemm_ragged: a and b must both be float16 or both bfloat16; got {desc}")
    if gs.ndim != 1 or np.dtype(gs.dtype) != I32:
        raise TypeError(f"tcgemm_ragged: group_sizes must be int32 (G,); got {desc}")
    if np.dtype(out_dtype) not in OUT_DTYPES:
        raise TypeError(f"tcgemm_ragged: out_dtype must be float16, bfloat16 or float32; got "
                        f"{out_dtype}")
    m, n, k, kb = _dims(a.shape, b.shape, mode, transpose_b)
    groups = gs.shape[0]
    if mode == 0 and (k != kb or b.shape[0] != groups):
        raise ValueError(f"tcgemm_ragged: b must be (G, K, N) (or (G, N, K) with transpose_b) "
                         f"for a (M, K) and G group sizes: {desc}")
    if mode == 1 and (b.shape[0] != m or transpose_b):
        raise ValueError(f"tcgemm_ragged: mode 1 needs b (M, N) with a (M, K), transpose_b=False: "
                         f"{desc}")
    if groups < 1:
        raise ValueError(f"tcgemm_ragged: needs at least one group: {desc}")
    if any(not problem.symbolic(d) and d >= 2**31 for d in (m, n, k, groups)):
        raise ValueError(f"tcgemm_ragged: M, N, K and G must each be below 2^31: {desc}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"tcgemm_ragged: unknown activation {activation!r}; known: {ACTIVATIONS}")
    if mode == 1 and (has_bias or activation != "none"):
        raise ValueError(f"tcgemm_ragged: mode 1 (the weight gradient) takes no bias or "
                         f"activation: {desc}")
    if has_bias and (bias[0].shape != (groups, n) or np.dtype(bias[0].dtype) not in C_DTYPES):
        raise ValueError(f"tcgemm_ragged: bias must be float16, bfloat16 or float32 (G, N) = "
                         f"{(groups, n)}; got {tuple(bias[0].shape)} {bias[0].dtype}: {desc}")
    if plan is not None:
        from . import configs  # the table, read from the module (empty where it is not built)
        grouped = sorted(c.name for c in configs.CONFIGS if c.ragged)
        if not isinstance(plan, str) or (configs.CONFIGS and plan not in grouped):
            raise ValueError(f"tcgemm_ragged: the config override must name a config with "
                             f"grouped kernels (an sm90 row, or an sm80 row with grouped "
                             f"kernels); got {plan!r}; known: {grouped}")
    shape = (m, n) if mode == 0 else (groups, k, n)
    typed = (sharding.typed((a, 0), (b, 1 if transpose_b else 2)) if mode == 0  # rows of a
             else sharding.typed(None, (a, 1), (b, 1)))  # (G, K, N): rows summed away
    return [jax.core.ShapedArray(shape, np.dtype(out_dtype), **typed)]


# ---------------------------------------------------------------------------------------------
# Reference semantics in lax (the lowering on every platform but CUDA, and on GPUs without the
# grouped kernel; tests' oracle): lax.ragged_dot_general on the clamped sizes (>= 0, summing to
# at most M, where lax's rule is ours), float32 accumulation, the epilogue in float32.

def _lax_dims(mode, transpose_b):
    if mode == 1:
        return lax.RaggedDotDimensionNumbers((([0], [0]), ([], [])), [0], [])
    return lax.RaggedDotDimensionNumbers((([1], [2 if transpose_b else 1]), ([], [])), [0], [0])


def reference(a, b, gs, *bias, mode, transpose_b, out_dtype, activation="none", has_bias=False,
              plan=None, exact_operands=True):
    """tcgemm_ragged_p's semantics: float32 accumulation and epilogue, rounded once.
    exact_operands: the operands as float32 (half-precision products are exact in float32;
    XLA:CPU lacks some bf16 x bf16 -> f32 dots), else as they are (the GPU's tensor cores)."""
    del plan
    m = a.shape[0]
    ends = group_ends(gs, m)
    if exact_operands:
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    acc = _lax_ragged_dot_general(a, b, ends - group_starts(ends), _lax_dims(mode, transpose_b),
                                  precision=lax.Precision.HIGHEST,
                                  preferred_element_type=jnp.float32)
    if has_bias:  # row r gets its group's bias; rows no group owns stay 0
        group = row_groups(ends, m)
        owned = group < ends.shape[0]
        rows = bias[0].astype(jnp.float32)[jnp.where(owned, group, 0)]
        acc = acc + jnp.where(owned[:, None], rows, 0.0)
    return [epilogue.activate(activation, acc).astype(out_dtype)]


_fallback_lowering = mlir.lower_fun(reference, multiple_results=True)
_lax_gpu_lowering = mlir.lower_fun(functools.partial(reference, exact_operands=False),
                                   multiple_results=True)


# ---------------------------------------------------------------------------------------------
# CUDA lowering: the FFI custom call, planned here for the local shapes and the device.

def _cuda_lowering(ctx, a, b, gs, *bias, mode, transpose_b, out_dtype, activation, has_bias,
                   plan):
    a_aval, b_aval, gs_aval = ctx.avals_in[:3]
    params = dict(mode=mode, transpose_b=transpose_b, out_dtype=out_dtype,
                  activation=activation, has_bias=has_bias, plan=plan)
    if plan is None:
        from . import configs
        _ffi.require()  # the planner reads the extension's table; an override needs neither
        m, n, k, _ = _dims(a_aval.shape, b_aval.shape, mode, transpose_b)
        plan = configs.plan_ragged(m, n, k, gs_aval.shape[0], a_aval.dtype, mode, transpose_b)
        if plan is None:  # no grouped kernel for this GPU
            return _lax_gpu_lowering(ctx, a, b, gs, *bias, **params)
    m, n, k, _ = _dims(a_aval.shape, b_aval.shape, mode, transpose_b)
    if k % 8 or n % 8:  # the grouped kernels read 16-byte rows (TMA, cp.async): pad K and N
        return mlir.lower_fun(functools.partial(_padded, **params), multiple_results=True)(
            ctx, a, b, gs, *bias)
    (d_aval,) = ctx.avals_out
    return jax.ffi.ffi_lowering(_ffi.RAGGED_TARGET)(
        ctx.replace(avals_out=[d_aval]), a, b, gs, *bias, mode=np.int32(mode),
        transpose_b=bool(transpose_b), config=str(plan),
        activation=np.int32(problem.activation_index(activation)), has_bias=bool(has_bias))


def _padded(a, b, gs, *bias, mode, transpose_b, plan, **params):
    """The product on operands whose K and N are zero-padded to multiples of 8 (16 bytes of a
    16-bit element: what the grouped kernels' TMA and cp.async reads need), d cut back. Zeros
    in K add nothing; the padded columns of d are dropped."""
    m, n, k, _ = _dims(a.shape, b.shape, mode, transpose_b)
    pk, pn = -k % 8, -n % 8
    a = jnp.pad(a, ((0, 0), (0, pk)))
    if mode == 1:
        b = jnp.pad(b, ((0, 0), (0, pn)))
    else:
        b = jnp.pad(b, ((0, 0), (0, pn), (0, pk)) if transpose_b else ((0, 0), (0, pk), (0, pn)))
    bias = [jnp.pad(x, ((0, 0), (0, pn))) for x in bias]
    (d,) = tcgemm_ragged_p.bind(a, b, gs, *bias, mode=mode, transpose_b=transpose_b, plan=plan,
                                **params)
    return [d[..., :k, :n] if mode == 1 else d[:, :n]]


# ---------------------------------------------------------------------------------------------
# Batching. Items fold into one launch of V * G groups over V * M rows: item v's groups in
# order, its rows past its own sum given to its last group (so that every item spans exactly M
# rows) and then zeroed: mode 0 zeroes those rows of d, mode 1 those rows of its smaller
# operand before the product. Only mode 0 with a shared b (folding would copy b V times) runs
# as a loop over the items.

def _lead(x, d, v):
    return jnp.broadcast_to(x, (v,) + x.shape) if d is None else jnp.moveaxis(x, d, 0)


def _batch_rule(args, bdims, **params):
    v = next(x.shape[d] for x, d in zip(args, bdims) if d is not None)
    if params["mode"] == 0 and bdims[1] is None:
        mapped = [jnp.moveaxis(x, d, 0) for x, d in zip(args, bdims) if d is not None]

        def one(xs):
            it = iter(xs)
            return tcgemm_ragged_p.bind(*[x if d is None else next(it)
                                          for x, d in zip(args, bdims)], **params)
        return list(lax.map(one, mapped)), [0]
    a, b, gs, *bias = [_lead(x, d, v) for x, d in zip(args, bdims)]
    m, groups = a.shape[1], gs.shape[1]
    ends = group_ends(gs, m)                                       # (V, G)
    sizes = (ends - group_starts(ends)).at[:, -1].add(m - ends[:, -1])
    live = jnp.arange(m)[None, :] < ends[:, -1:]                   # (V, M) rows some group owns
    if params["mode"] == 1:
        if a.shape[2] <= b.shape[2]:
            a = jnp.where(live[..., None], a, jnp.zeros((), a.dtype))
        else:
            b = jnp.where(live[..., None], b, jnp.zeros((), b.dtype))
    fold = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    (out,) = tcgemm_ragged_p.bind(fold(a), fold(b), sizes.reshape(-1), *map(fold, bias),
                                  **dict(params, plan=None))
    if params["mode"] == 1:
        return [out.reshape((v, groups) + out.shape[1:])], [0]
    out = out.reshape((v, m) + out.shape[1:])
    return [jnp.where(live[..., None], out, jnp.zeros((), out.dtype))], [0]


# ---------------------------------------------------------------------------------------------
# Differentiation. Bilinear in (a, b) and linear in bias; the activation runs as described in
# the module docstring, so that the linearised products are plain tcgemm_ragged_p.

def _group_sums(ct, gs, dtype):
    """(G, N) column sums of ct over each group's rows (rows no group owns: none), one float32
    segment sum over ct, rounded to `dtype` (the bias's). (Through the grouped kernel against a
    column of ones, ct rounded to the operand type as hi + lo halves, the sums were 1.6e-3 off
    the float64 ones on an H100; a bias gradient is summed in float32, as tg.gemm's dact kernel
    does.)"""
    m, groups = ct.shape[0], gs.shape[0]
    seg = row_groups(group_ends(gs, m), m)
    return jax.ops.segment_sum(ct.astype(F32), seg, num_segments=groups + 1)[:groups].astype(dtype)


def _jvp(primals, tangents, *, mode, transpose_b, out_dtype, activation, has_bias, plan):
    a, b, gs, *bias = primals
    ta, tb, _, *tbias = tangents
    lin = dict(mode=mode, transpose_b=transpose_b, out_dtype=out_dtype)
    if activation == "none":
        (d,) = tcgemm_ragged_p.bind(*primals, mode=mode, transpose_b=transpose_b,
                                    out_dtype=out_dtype, activation=activation,
                                    has_bias=has_bias, plan=plan)
    else:  # one launch for the float32 pre-activation; d = act(pre), rounded once
        pre = ragged(a, b, gs, *bias, mode=mode, transpose_b=transpose_b, out_dtype=F32,
                     config=plan)
        d = epilogue.activate(activation, pre).astype(out_dtype)
    t_bias = tbias[0] if has_bias and not _zero(tbias[0]) else None
    terms = []
    for x, y, tx in ((ta, b, ta), (a, tb, tb)):
        if not _zero(tx):  # the bias tangent rides on the first product
            x, y = ad.instantiate_zeros(x), ad.instantiate_zeros(y)
            terms.append(ragged(x, y, gs, t_bias, **lin))
            t_bias = None
    if t_bias is not None:  # bias rows alone: the kernel's bias path on zero operands, K = 1
        n = d.shape[1]
        zb = jnp.zeros((gs.shape[0], n, 1) if transpose_b else (gs.shape[0], 1, n), a.dtype)
        terms.append(ragged(jnp.zeros((a.shape[0], 1), a.dtype), zb, gs, t_bias, **lin))
    if not terms:
        return [d], [ad.Zero(jax.core.ShapedArray(d.shape, d.dtype))]
    t = functools.reduce(jnp.add, terms)
    if activation != "none":  # act'(pre) * t; reverse mode: tcgemm_dact_p (our kernel)
        lift = lambda x: x.reshape((1,) + x.shape)  # noqa: E731  (rank 3: (1, M, N))
        t = tcgemm_dbcast_p.bind(lift(pre), lift(t), activation=activation, has_bias=False,
                                 out_dtype=np.dtype(out_dtype)).reshape(t.shape)
    return [d], [t]


def _transpose(cts, a, b, gs, *bias, mode, transpose_b, out_dtype, activation, has_bias, plan):
    """Reverse mode of the linear form (no activation: _jvp keeps it outside the tangent)."""
    del out_dtype, plan
    (ct,) = cts
    res = [None] * (3 + has_bias)
    if type(ct) is ad.Zero:
        return res
    if activation != "none":
        raise NotImplementedError("tcgemm_ragged: the activation is not linear")
    ua, ub = ad.is_undefined_primal(a), ad.is_undefined_primal(b)
    g, inv = epilogue.narrow_cotangent(ct, (b if ua else a).dtype)

    def prod(x, y, aval, **kw):  # out = inv * x . y (float32 before the rounding when scaled)
        if inv is None:
            return ragged(x, y, gs, out_dtype=aval.dtype, **kw)
        return (ragged(x, y, gs, out_dtype=F32, **kw) * inv).astype(aval.dtype)

    if mode == 0:
        if ua:  # d a (M, K) = ct (M, N) . op(b[g])^T: the same rows, transpose_b flipped
            res[0] = prod(g, b, a.aval, transpose_b=not transpose_b)
        if ub:  # d b[g] = a[rows].T ct[rows] (K, N), or ct[rows].T a[rows] (N, K) stored
            x, y = (g, a) if transpose_b else (a, g)
            res[1] = prod(x, y, b.aval, mode=1)
        if has_bias and ad.is_undefined_primal(bias[0]):
            res[3] = _group_sums(ct, gs, bias[0].aval.dtype)
    else:
        if ua:  # d a[r] = ct[g] (K, N) . b[r] (N): b against ct stored (G, K, N) as (G, N', K')
            res[0] = prod(b, g, a.aval, transpose_b=True)
        if ub:  # d b[r] = a[r] (K) . ct[g] (K, N)
            res[1] = prod(a, g, b.aval)
    return res


# ---------------------------------------------------------------------------------------------
# Registration of every rule, in one place.

tcgemm_ragged_p.def_impl(lambda *xs, **params: _jitted_impl(tcgemm_ragged_p, **params)(*xs))
tcgemm_ragged_p.def_abstract_eval(_abstract_eval)
for _plat, _lax_low, _low in ((None, _fallback_lowering, _fallback_lowering),
                             ("cuda", _lax_gpu_lowering, _cuda_lowering)):
    mlir.register_lowering(tcgemm_ragged_p, sharding.symbolic_or(_lax_low, sharding.partitioned(
        _low, tcgemm_ragged_p, sharding.ragged_rule)), platform=_plat)
batching.primitive_batchers[tcgemm_ragged_p] = _batch_rule
ad.primitive_jvps[tcgemm_ragged_p] = _jvp
ad.primitive_transposes[tcgemm_ragged_p] = _transpose


# ---------------------------------------------------------------------------------------------
# Public entry points.

_BASIC = _lax_dims(0, False)  # lax.ragged_dot's


def _form(lhs, rhs, gs, dn):
    """(mode, transpose_b) where the dimension numbers are one of the kernel's forms with the
    operands as stored, else None. Forward / dgrad: lhs (M, K) ragged in M against rhs
    (G, K, N) / (G, N, K); wgrad: lhs (M, K) and rhs (M, N), both contracted over the ragged
    M, giving (G, K, N). Anything else (batch dims, other ranks or orders) is lax's."""
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    if lb or rb or gs.ndim != 1 or lhs.ndim != 2 or tuple(dn.lhs_ragged_dimensions) != (0,):
        return None
    if tuple(lc) == (1,) and rhs.ndim == 3 and tuple(dn.rhs_group_dimensions) == (0,):
        return {(1,): (0, False), (2,): (0, True)}.get(tuple(rc))
    if tuple(lc) == (0,) and tuple(rc) == (0,) and rhs.ndim == 2 and not dn.rhs_group_dimensions:
        return 1, False
    return None


def _sizes(gs, m):
    """group_sizes as the kernel's int32, with the clamping rule's result unchanged (a type
    int32 cannot hold is first clipped to [0, M]); negative sizes that can be seen (not
    traced) are refused (where lax's result differs from ours: module docstring)."""
    if not isinstance(gs, jax.core.Tracer) and np.any(np.asarray(gs) < 0):
        raise ValueError(f"jax_tcgemm.ragged_dot: negative group sizes {np.asarray(gs)}; lax "
                         "sums overlapping groups there, the kernel counts them as 0")
    info = np.iinfo(gs.dtype)
    if info.min < -2**31 or info.max >= 2**31:
        gs = jnp.clip(gs, 0, m)
    return gs.astype(jnp.int32)


def _describe(lhs, rhs, gs):
    return (f"lhs{tuple(lhs.shape)} {lhs.dtype}, rhs{tuple(rhs.shape)} {rhs.dtype}, "
            f"group_sizes{tuple(gs.shape)} {gs.dtype}")


def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None,
                       preferred_element_type=None, group_offset=None, out_sharding=None, *,
                       reduction_order=None):
    """Drop-in for `lax.ragged_dot_general` (same signature and result) on the tensor cores.

    Kernel forms (float16 or bfloat16 operands of one type, result float16, bfloat16 or
    float32 after lax's normalisation of preferred_element_type): lhs (M, K) ragged in M
    against rhs (G, K, N) (forward) or (G, N, K) (dgrad: the transposed weights, no copy), and
    lhs (M, K), rhs (M, N) contracted over the ragged M (wgrad, giving (G, K, N)). Everything
    else (other dtypes, batch or ragged-batch dims, other dim orders, group_sizes of rank > 1,
    group_offset, which lax itself does not implement in jax 0.11.2, and a reduction_order
    other than None or 'unordered', jax >= 0.12.1) is computed by lax.ragged_dot_general.
    `precision` is validated as lax does and has no effect on the kernel (half-precision
    products are exact in its float32 accumulator). Invalid group sizes: the module docstring.
    """
    lhs, rhs = _as_array(lhs, "lhs"), _as_array(rhs, "rhs")
    gs = _as_array(group_sizes, "group_sizes")
    dn = ragged_dot_dimension_numbers
    order_kw = problem.lax_reduction_order(reduction_order, _lax_ragged_dot_general,
                                           "jax_tcgemm.ragged_dot_general")
    lax_kw = dict(precision=precision, preferred_element_type=preferred_element_type,
                  group_offset=group_offset, out_sharding=out_sharding, **order_kw)
    if group_offset is not None or order_kw:
        return _lax_ragged_dot_general(lhs, rhs, gs, dn, **lax_kw)
    try:  # lax's checks and result type, on shapes only; our message adds the shapes
        with sharding.meshless():
            want = jax.eval_shape(
                lambda x, y, g: _lax_ragged_dot_general(
                    x, y, g, dn, precision=precision,
                    preferred_element_type=preferred_element_type),
                *(jax.ShapeDtypeStruct(v.shape, v.dtype) for v in (lhs, rhs, gs)))
    except (TypeError, ValueError) as e:
        raise type(e)(f"jax_tcgemm.ragged_dot_general: {e} ({_describe(lhs, rhs, gs)}, "
                      f"{dn})") from None
    form = _form(lhs, rhs, gs, dn)
    if form is None or not _kernel_dtype(lhs, rhs, IN_DTYPES) or np.dtype(want.dtype) not in OUT_DTYPES:
        return _lax_ragged_dot_general(lhs, rhs, gs, dn, **lax_kw)
    mode, tb = form
    out_dtype = _check_out_dtype(want.dtype, "preferred_element_type")
    if 0 in lhs.shape + rhs.shape + gs.shape:  # nothing to multiply: zeros, no launch
        out = jnp.zeros(want.shape, out_dtype)
    else:
        out = ragged(lhs, rhs, _sizes(gs, lhs.shape[0]), mode=mode, transpose_b=tb,
                     out_dtype=out_dtype)
    if out_sharding is not None:
        out = jax.sharding.reshard(out, out_sharding)
    return out


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None,
               group_offset=None, out_sharding=None, *, reduction_order=None):
    """Drop-in for `lax.ragged_dot`: lhs (M, K), rhs (G, K, N), group_sizes (G,) integers; the
    rows of group g are contiguous in lhs (in group order) and multiply rhs[g]; rows past
    sum(group_sizes) are zeros. See ragged_dot_general."""
    return ragged_dot_general(lhs, rhs, group_sizes, _BASIC, precision=precision,
                              preferred_element_type=preferred_element_type,
                              group_offset=group_offset, out_sharding=out_sharding,
                              reduction_order=reduction_order)


def ragged_gemm(lhs, rhs, group_sizes, *, bias=None, activation=None, transpose_b=False,
                out_dtype=None):
    """activation(lhs[rows of g] @ op(rhs[g]) + bias[g]) for every group g, in one launch.

    lhs (M, K); rhs (G, K, N), or (G, N, K) with transpose_b; both float16 or both bfloat16.
    group_sizes (G,) integers (rows of each group, contiguous, in group order; rows past their
    sum are zeros). bias (G, N) floating, added in float32. activation None, "relu", "gelu",
    "gelu_tanh" or "silu". Computed in float32 from the accumulator, rounded once to out_dtype
    (default: the operands' dtype). Differentiable wrt lhs, rhs and bias on our kernels.
    """
    lhs, rhs = _as_array(lhs, "lhs"), _as_array(rhs, "rhs")
    gs = _as_array(group_sizes, "group_sizes")
    desc = _describe(lhs, rhs, gs)
    if lhs.ndim != 2 or rhs.ndim != 3 or gs.ndim != 1:
        raise ValueError(f"jax_tcgemm.ragged_gemm: needs lhs (M, K), rhs (G, K, N) or (G, N, K) "
                         f"and group_sizes (G,); got {desc}")
    if not _kernel_dtype(lhs, rhs, IN_DTYPES):
        raise TypeError(f"jax_tcgemm.ragged_gemm: lhs and rhs must both be float16 or both "
                        f"bfloat16; got {desc}")
    if not jnp.issubdtype(gs.dtype, jnp.integer):
        raise TypeError(f"jax_tcgemm.ragged_gemm: group_sizes must be integers; got {desc}")
    if activation is not None and activation not in ACTIVATIONS[1:]:
        raise ValueError(f"jax_tcgemm.ragged_gemm: unknown activation {activation!r}; use None "
                         f"or one of {ACTIVATIONS[1:]}")
    out_dtype = _check_out_dtype(lhs.dtype if out_dtype is None else out_dtype, "out_dtype")
    m, n, k, kb = _dims(lhs.shape, rhs.shape, 0, transpose_b)
    if k != kb or rhs.shape[0] != gs.shape[0]:
        raise ValueError(f"jax_tcgemm.ragged_gemm: rhs must be (G, K, N) (or (G, N, K) with "
                         f"transpose_b={transpose_b}) for K = {k} and G = {gs.shape[0]}: {desc}")
    if bias is not None:
        bias = _as_array(bias, "bias")
        if bias.shape != (gs.shape[0], n) or not jnp.issubdtype(bias.dtype, jnp.floating):
            raise ValueError(f"jax_tcgemm.ragged_gemm: bias must be floating (G, N) = "
                             f"{(gs.shape[0], n)}; got {bias.shape} {bias.dtype} ({desc})")
        bias = epilogue.kernel_bias(bias)
    kw = dict(mode=0, transpose_b=transpose_b, out_dtype=out_dtype,
              activation="none" if activation is None else activation,
              has_bias=bias is not None)
    args = (lhs, rhs, _sizes(gs, m)) + (() if bias is None else (bias,))
    if 0 in (m, n, k, gs.shape[0]):  # no launch: the formula (act(bias rows) for K = 0)
        return reference(*args, **kw)[0]
    return tcgemm_ragged_p.bind(*args, plan=None, **kw)[0]
