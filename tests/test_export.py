"""jax.export of tcgemm programs: serialized for CUDA anywhere (CPU tests, run in CI), run on a
GPU after a serialize/deserialize round trip (gpu test), exported for CPU and run here.

Our custom calls are not among jax's stable targets, so exporting for CUDA needs
`disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(t) for t in ("tcgemm",
"tcgemm_dact")]` (the second for the backward pass of an epilogue): the caller takes on the
compatibility of the FFI targets (same jax_tcgemm build on both sides). Exports
never contain custom_partitioning callbacks (they cannot be serialized): under export,
tcgemm_p lowers directly even over several devices. Exporting for CUDA runs the CUDA lowering
(it plans and sizes the workspace with the compiled module's rules), so those tests skip
without the extension; exporting for CPU needs nothing.
"""
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_tcgemm as tg
from jax_tcgemm import _ffi, configs
from jax_tcgemm.primitive import tcgemm

from conftest import assert_close, f64, rand, ref64

F16, BF16, F32 = np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32)
ALLOW_TCGEMM = [jax.export.DisabledSafetyCheck.custom_call(t)
                for t in (_ffi.TARGET, _ffi.DACT_TARGET, _ffi.SPLIT_TARGET)]


@pytest.fixture
def cuda_lowering():  # lowering for CUDA only emits the call, but needs the module's rules
    if not _ffi.available():
        pytest.skip(f"needs the compiled extension jax_tcgemm._tcgemm: {_ffi._LOAD_ERROR}")


def export_cuda(f, *args):
    return jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=ALLOW_TCGEMM)(*args)


def round_trip(exp):
    """serialize -> deserialize (jax needs the `flatbuffers` package for it)."""
    pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")
    return jax.export.deserialize(exp.serialize())


def tcgemm_calls(module_text):
    return [line for line in module_text.splitlines() if "stablehlo.custom_call @tcgemm(" in line]


@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)], ids=["NN", "TT"])
def test_export_for_cuda_round_trip(cuda_lowering, ta, tb):
    a = jax.ShapeDtypeStruct((3, 40, 24) if ta else (3, 24, 40), BF16)
    b = jax.ShapeDtypeStruct((1, 56, 40) if tb else (1, 40, 56), BF16)
    f = partial(tcgemm, transpose_a=ta, transpose_b=tb, out_dtype=F16)
    exp = export_cuda(f, a, b)
    back = round_trip(exp)
    assert back.platforms == ("cuda",)
    assert back.in_avals == exp.in_avals and back.out_avals[0].shape == (3, 24, 56)
    assert back.out_avals[0].dtype == F16
    (call,) = tcgemm_calls(back.mlir_module())
    assert f"transpose_a = {str(ta).lower()}" in call and f"transpose_b = {str(tb).lower()}" in call
    config = re.search(r'config = "([^"]+)"', call).group(1)
    assert config in configs.BY_NAME
    assert "tensor<3x24x56xf16>" in call and "CustomSPMDPartitioning" not in back.mlir_module()


def test_export_for_cuda_needs_the_disabled_check(cuda_lowering):
    x = jax.ShapeDtypeStruct((8, 16), F16)
    with pytest.raises(ValueError, match="tcgemm"):
        jax.export.export(jax.jit(tg.matmul), platforms=["cuda"])(x, x.update(shape=(16, 8)))


def test_export_of_grad_for_cuda(cuda_lowering):
    g = jax.value_and_grad(lambda a, b: tg.matmul(a, b, out_dtype=F32).sum(), argnums=(0, 1))
    exp = export_cuda(g, jax.ShapeDtypeStruct((5, 7), F16), jax.ShapeDtypeStruct((7, 3), F16))
    assert len(tcgemm_calls(round_trip(exp).mlir_module())) == 3


def test_export_epilogue_for_cuda(cuda_lowering):
    """gelu(x @ w + bias) and its gradient export as our calls: the forward with the bias and
    activation attributes (and, under grad, aux: d, workspace, pre), the backward's activation
    derivative and bias gradient as one tcgemm_dact call."""
    S = jax.ShapeDtypeStruct
    x, w, bias = S((6, 16), BF16), S((16, 8), BF16), S((8,), F32)
    f = lambda x, w, bias: tg.gemm(x, w, bias=bias, activation="gelu_tanh")  # noqa: E731
    text = round_trip(export_cuda(f, x, w, bias)).mlir_module()
    (call,) = tcgemm_calls(text)
    assert "has_bias = true" in call and "activation = 3 : i32" in call
    assert "aux = false" in call
    loss = lambda x, w, bias: f(x, w, bias).astype(F32).sum()  # noqa: E731
    text = round_trip(export_cuda(jax.grad(loss, argnums=(0, 1, 2)), x, w, bias)).mlir_module()
    calls = tcgemm_calls(text)
    fwd = [c for c in calls if "aux = true" in c]
    assert len(fwd) == 1 and "has_bias = true" in fwd[0] and "activation = 3 : i32" in fwd[0]
    assert len(calls) == 3  # forward, dx, dw
    assert len([l for l in text.splitlines() if "stablehlo.custom_call @tcgemm_dact(" in l]) == 1


def test_export_for_cpu_runs():
    cpu = jax.devices("cpu")[0]  # also on a GPU machine: the export is for CPU
    a = jax.device_put(rand(("exp-cpu-a",), (2, 33, 17), F16), cpu)
    b = jax.device_put(rand(("exp-cpu-b",), (17, 9), F16), cpu)
    exp = jax.export.export(jax.jit(partial(tg.matmul, out_dtype=F32)), platforms=["cpu"])(a, b)
    back = round_trip(exp)
    assert "custom_call @tcgemm" not in back.mlir_module()
    out = back.call(a, b)
    assert_close(out, ref64(a, b), F32, 17, "exported cpu")
    np.testing.assert_array_equal(f64(out), f64(jax.jit(partial(tg.matmul, out_dtype=F32))(a, b)))


def test_export_sharded_has_no_partitioning_callback():
    """Over 4 CPU devices, the export lowers tcgemm_p directly (serializable) and runs."""
    mesh = jax.make_mesh((4,), ("d",), devices=jax.devices("cpu")[:4])
    a, b = rand(("exp-sh-a",), (4, 16, 24), F16), rand(("exp-sh-b",), (4, 24, 8), F16)
    xa, xb = (jax.device_put(v, NamedSharding(mesh, P("d"))) for v in (a, b))
    exp = jax.export.export(jax.jit(partial(tg.matmul, out_dtype=F32)), platforms=["cpu"])(xa, xb)
    back = round_trip(exp)
    assert back.nr_devices == 4 and "CustomSPMDPartitioning" not in back.mlir_module()
    assert_close(jax.jit(back.call)(xa, xb), ref64(a, b), F32, 24, "exported sharded")


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [F16, F32], ids=str)
def test_export_for_cuda_runs_on_gpu(out_dtype):
    """Export for CUDA, serialize, deserialize, call: bitwise equal to direct execution and
    within bounds of the float64 reference."""
    a, b = rand(("exp-gpu-a",), (3, 130, 70), F16), rand(("exp-gpu-b",), (3, 70, 90), F16)
    f = jax.jit(partial(tg.matmul, out_dtype=out_dtype))
    exp = export_cuda(f, a, b)
    direct = f64(f(a, b))
    np.testing.assert_array_equal(f64(exp.call(a, b)), direct)
    back = round_trip(exp)
    assert len(tcgemm_calls(back.mlir_module())) == 1
    out = back.call(a, b)
    np.testing.assert_array_equal(f64(out), direct)
    assert_close(out, ref64(a, b), out_dtype, 70, "exported cuda")


def test_export_float32_for_cuda(cuda_lowering, monkeypatch, split_threshold):
    """float32 exports as the lowering for an H100 makes it (configs.device_arch at export
    time): HIGHEST as one call of the promoted float16 kernels on the f16x3 parts (K-major,
    float16, row and column scales; the remainders' two terms padded to f16x3_lo_k = 128, whose
    pieces the kernel scales, then the big parts': K' = 168), written by one tcgemm_split call
    per operand (a K-major, b transposed by it), and its gradient likewise; one TF32 pass
    (DEFAULT) as XLA's dot."""
    monkeypatch.setattr(configs, "device_arch", lambda: (9, 0))
    split_threshold(0)  # these small operands on the kernel
    S = jax.ShapeDtypeStruct
    a, b = S((5, 40), F32), S((40, 24), F32)
    text = round_trip(export_cuda(partial(tg.matmul, precision="highest"), a, b)).mlir_module()
    (call,) = tcgemm_calls(text)
    assert "tensor<1x5x168xf16>" in call and "tensor<1x24x168xf16>" in call
    assert "transpose_b = true" in call and "promote = true" in call
    assert "piece_scale_k = 128 : i64" in call and "piece_scale = 4.8828125E-4 : f32" in call, call
    splits = [line for line in text.splitlines() if "stablehlo.custom_call @tcgemm_split(" in line]
    assert len(splits) == 2, splits
    sa, sb = sorted(splits, key=lambda s: "tensor<1x40x24xf32>" in s)
    assert "k_major = true" in sa and "(tensor<1x5x40xf32>)" in sa and "1x5x168xf16" in sa, sa
    assert "k_major = false" in sb and "1x24x168xf16" in sb, sb  # b (K, N) read as it is
    assert "stablehlo.transpose" not in text, text
    g = jax.value_and_grad(lambda x, y: tg.matmul(x, y, precision="highest").sum(),
                           argnums=(0, 1))
    assert len(tcgemm_calls(round_trip(export_cuda(g, a, b)).mlir_module())) == 3
    text = round_trip(export_cuda(tg.matmul, a, b)).mlir_module()
    assert not tcgemm_calls(text) and "dot_general" in text


# ---------------------------------------------------------------------------------------------
# Shape polymorphism: symbolic dims lower through lax (primitive.symbolic_or), on every
# platform; the primitives stay in the jaxpr (grad, vmap as usual).

def _sym_cases():
    """name -> (function, argument specs with symbolic dims b, m, and float64 reference)."""
    b, m = jax.export.symbolic_shape("b, m")
    S = jax.ShapeDtypeStruct
    rdn = jax.lax.RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])

    def ragged64(x, w, gs):
        ends = np.minimum(np.cumsum(np.asarray(gs)), x.shape[0])
        rows = np.searchsorted(ends, np.arange(x.shape[0]), side="right")
        live = (np.arange(x.shape[0]) < ends[-1])[:, None]
        return live * np.einsum("rk,rkn->rn", f64(x), f64(w)[np.minimum(rows, len(gs) - 1)])

    def epi64(x, w, c, z):
        pre = f64(x) @ f64(w) + 0.5 * f64(c) + f64(z)
        return 0.5 * pre * (1 + np.tanh(0.7978845608028654 * (pre + 0.044715 * pre**3)))
    return {
        "matmul": (partial(tg.matmul, out_dtype=F32), (S((b, m, 24), F16), S((24, 9), F16)),
                   lambda x, w: f64(x) @ f64(w)),
        "gemm_epilogue": (lambda x, w, c, z: tg.gemm(x, w, c, beta=0.5, bias=z,
                                                     activation="gelu_tanh", out_dtype=F32),
                          (S((m, 24), BF16), S((24, 9), BF16), S((m, 9), F32), S((9,), F32)),
                          epi64),
        "dot_general_batch": (lambda x, w: tg.dot_general(x, w, (((2,), (1,)), ((0,), (0,))),
                                                          preferred_element_type=F32),
                              (S((b, m, 24), F16), S((b, 24, 9), F16)),
                              lambda x, w: f64(x) @ f64(w)),
        "ragged_dot": (lambda x, w, gs: tg.ragged_dot_general(x, w, gs, rdn,
                                                              preferred_element_type=F32),
                       (S((m, 24), BF16), S((4, 24, 9), BF16), S((4,), np.int32)), ragged64),
        # the 8-bit call: a symbolic batch of b (one product per item), K = 40 (padded to 48
        # where a kernel runs)
        "int8_dot_general_batch": (
            lambda x, w: tg.dot_general(x, w, (((2,), (1,)), ((0,), (0,))),
                                        preferred_element_type=np.int32),
            (S((b, m, 40), np.int8), S((b, 40, 9), np.int8)), lambda x, w: f64(x) @ f64(w)),
        "scaled_matmul_batch": (
            lambda x, w: tg.scaled_matmul(x, w, 0.5, 2.0, out_dtype=F32),
            (S((b, m, 40), jnp.float8_e4m3fn), S((b, 40, 9), jnp.float8_e4m3fn)),
            lambda x, w: f64(x) @ f64(w)),
    }


def _sym_args(specs, sizes, tag):
    """Concrete arrays for specs at sizes {"b": .., "m": ..}: fresh normals, group sizes."""
    out = []
    for i, s in enumerate(specs):
        shape = tuple(d if isinstance(d, int) else sizes[str(d)] for d in s.shape)
        if s.dtype == np.int32:
            out.append(jnp.asarray([sizes["m"] // 3, 0, sizes["m"] // 2, 2], np.int32))
        else:
            out.append(rand((tag, i) + shape, shape, s.dtype))
    return out


@pytest.mark.parametrize("name", ["matmul", "gemm_epilogue", "dot_general_batch", "ragged_dot",
                                  "int8_dot_general_batch", "scaled_matmul_batch"])
def test_symbolic_export_for_cpu_runs_at_any_size(name):
    """Exported once with symbolic b and m, called at two sizes each: the values of jit at those
    sizes, and the float64 reference within bounds; so is the gradient (matmul, gemm)."""
    f, specs, ref = _sym_cases()[name]
    exp = round_trip(jax.export.export(jax.jit(f), platforms=["cpu"])(*specs))
    assert "custom_call @tcgemm" not in exp.mlir_module()
    cpu = jax.devices("cpu")[0]
    for sizes in ({"b": 1, "m": 5}, {"b": 3, "m": 37}):
        args = [jax.device_put(x, cpu) for x in _sym_args(specs, sizes, ("sym", name))]
        out = exp.call(*args)
        np.testing.assert_allclose(f64(out), f64(jax.jit(f)(*args)), rtol=1e-6, atol=1e-6)
        assert_close(out, ref(*args), F32, 24, f"{name} {sizes}")
    if name in ("matmul", "gemm_epilogue"):
        g = jax.grad(lambda *xs: f(*xs).sum(), argnums=(0, 1))
        gexp = jax.export.export(jax.jit(g), platforms=["cpu"])(*specs)
        args = [jax.device_put(x, cpu) for x in _sym_args(specs, {"b": 2, "m": 11}, ("g", name))]
        for got, want in zip(gexp.call(*args), jax.jit(g)(*args)):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(f64(got), f64(want), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", ["matmul", "gemm_epilogue", "ragged_dot"])
def test_symbolic_export_for_cuda_lowers_through_lax(cuda_lowering, name):
    """For CUDA, symbolic dims lower through lax (the kernels are planned for concrete sizes):
    no custom call in the module, forward or backward; concrete dims keep the custom call."""
    f, specs, _ = _sym_cases()[name]
    text = round_trip(export_cuda(f, *specs)).mlir_module()
    assert "stablehlo.custom_call @tcgemm" not in text and "dot_general" in text
    if name != "ragged_dot":
        g = jax.grad(lambda *xs: f(*xs).sum(), argnums=(0, 1))
        assert "stablehlo.custom_call @tcgemm" not in export_cuda(g, *specs).mlir_module()
        concrete = [jax.ShapeDtypeStruct(tuple(d if isinstance(d, int) else 7 for d in s.shape),
                                         s.dtype) for s in specs]
        assert tcgemm_calls(export_cuda(f, *concrete).mlir_module())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["matmul", "gemm_epilogue", "dot_general_batch", "ragged_dot",
                                  "int8_dot_general_batch", "scaled_matmul_batch"])
def test_symbolic_export_for_cuda_runs_on_gpu(name):
    """The symbolic export for CUDA, deserialized and called on the GPU at two sizes: within
    bounds of the float64 reference."""
    f, specs, ref = _sym_cases()[name]
    exp = round_trip(export_cuda(f, *specs))
    for sizes in ({"b": 1, "m": 5}, {"b": 3, "m": 130}):
        args = _sym_args(specs, sizes, ("sym-gpu", name))
        assert_close(exp.call(*args), ref(*args), F32, 24, f"{name} {sizes}")
