"""Seeded fuzz of tg.dot_general's dimension numbers against lax.dot_general on the CPU.

Each case draws 0-2 batch, 1-2 contracting and 0-2 free dims per side, in a random axis order on
each side, sizes among 1, primes and small tile-like values, operand dtypes mixed among float16,
bfloat16, float32, int8 and float8_e4m3fn, and a preferred_element_type. tg.dot_general must give
lax's shape and dtype, values within the output dtype's bound of lax's float32 product at HIGHEST
(integer results exactly lax's), the same vjp (float0 for integer operands) and the same vmap. The
fixed patterns are in test_cpu.py / test_transforms.py; this reaches the orders those lists do not
name. Cases are reproducible from (group, index).
"""
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_tcgemm as tg

from conftest import BOUNDS, bound, f64, rand

DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.int8, jnp.float8_e4m3fn)
GROUPS, PER_GROUP = 4, 30


def _case(group: int, i: int):
    r = random.Random(f"dims-fuzz {group} {i}")
    nb, nc = r.randint(0, 2), r.randint(1, 2)
    bs = [r.choice((1, 2, 3)) for _ in range(nb)]
    cs = [r.choice((1, 3, 16, 17, 40)) for _ in range(nc)]
    free = [[r.choice((1, 2, 5, 16, 33)) for _ in range(r.randint(0, 2))] for _ in range(2)]
    sides = []
    for f in free:
        roles = [("b", j) for j in range(nb)] + [("c", j) for j in range(nc)]
        roles += [("f", j) for j in range(len(f))]
        r.shuffle(roles)
        size = {"b": bs, "c": cs, "f": f}
        sides.append((roles, tuple(size[k][j] for k, j in roles)))
    (lr, ls), (rr, rs) = sides
    def axes(roles, kind, n):
        return tuple(roles.index((kind, j)) for j in range(n))
    dims = ((axes(lr, "c", nc), axes(rr, "c", nc)), (axes(lr, "b", nb), axes(rr, "b", nb)))
    dl, dr = r.choice(DTYPES), r.choice(DTYPES)
    ints = dl == jnp.int8 and dr == jnp.int8
    pet = r.choice((None, jnp.float32, jnp.bfloat16) + ((jnp.int32,) if ints else ()))
    x = rand(("dims-fuzz-l", group, i), ls, dl, 12.0 if dl == jnp.int8 else 1.0)
    y = rand(("dims-fuzz-r", group, i), rs, dr, 12.0 if dr == jnp.int8 else 1.0)
    return x, y, dims, pet, int(np.prod(cs)), r


def _check(out, want, ref, k, what):
    assert (out.shape, out.dtype) == (want.shape, want.dtype), what
    if np.dtype(out.dtype) in BOUNDS:  # float16 / bfloat16 / float32
        err = np.abs(f64(out) - ref).max(initial=0.0)
        scale = max(1.0, np.abs(ref).max(initial=0.0)) * max(1.0, k ** 0.5 / 4)
        lim = 4 * bound(out.dtype, k) * scale
        assert err <= lim, f"{what}: max error {err:.3g} > {lim:.3g}"
    elif jnp.issubdtype(out.dtype, jnp.integer):
        np.testing.assert_array_equal(np.asarray(out), np.asarray(want), err_msg=what)
    else:  # 8-bit float results: both roundings of nearly the same float32 sum
        np.testing.assert_allclose(f64(out), f64(want), rtol=0.13, atol=0.02, err_msg=what)


@pytest.mark.parametrize("group", range(GROUPS))
def test_dimension_numbers_fuzz_vs_lax(group):
    for i in range(PER_GROUP):
        x, y, dims, pet, k, r = _case(group, i)
        what = (f"case ({group}, {i}): {x.shape} {x.dtype} x {y.shape} {y.dtype} {dims} "
                f"pet={pet and np.dtype(pet).name}")

        def ours(a, b):
            return tg.dot_general(a, b, dims, preferred_element_type=pet)

        def theirs(a, b):
            return lax.dot_general(a, b, dims, preferred_element_type=pet)

        want = theirs(x, y)
        ref = lax.dot_general(x.astype(jnp.float32), y.astype(jnp.float32), dims,
                              precision=lax.Precision.HIGHEST)
        _check(jax.jit(ours)(x, y), want, f64(ref), k, what)
        # vjp (one cotangent through both; none of an integer result)
        if r.random() < 0.4 and not jnp.issubdtype(want.dtype, jnp.integer):
            ct = rand(("dims-fuzz-ct", group, i), want.shape, want.dtype)
            (_, f1), (_, f2) = jax.vjp(theirs, x, y), jax.vjp(ours, x, y)
            for g1, g2, name in zip(f1(ct), f2(ct), "xy"):
                assert (g1.shape, g1.dtype) == (g2.shape, g2.dtype), f"{what}: d{name}"
                if g1.dtype != jax.dtypes.float0 and g1.size:
                    scale = max(1.0, np.abs(f64(g1)).max())
                    assert np.abs(f64(g2) - f64(g1)).max() <= 0.05 * scale, f"{what}: d{name}"
        if r.random() < 0.3:  # vmap over a new leading axis of both
            xs, ys = jnp.stack([x, x]), jnp.stack([y, y])
            _check(jax.vmap(ours)(xs, ys), jax.vmap(theirs)(xs, ys),
                   np.stack([f64(ref)] * 2), k, f"{what}: vmap")
