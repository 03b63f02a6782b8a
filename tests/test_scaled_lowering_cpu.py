"""The CUDA lowering of tg.scaled_matmul's kernel path, from the CPU host (issue 26): what the
custom call receives for each layout of b and each plan. The plan is forced (on the CPU host
scaled.kernel_config finds no GPU), the lowering is the one a GPU would compile."""
import jax.numpy as jnp
import pytest

import jax_tcgemm as tg
from jax_tcgemm import _ffi, configs, scaled
from test_cpu import cuda_text, custom_calls

pytestmark = pytest.mark.skipif(not _ffi.available(),
                                reason="the extension is not built (the workspace rule is C++'s)")
CFG = "sm90_128x128x64_s6_g2"


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_call_takes_b_as_given(monkeypatch, kind, transpose_b, split):
    """A (K, N) b reaches the custom call as it is, with pack=1 (the handler copies it K-major
    into the workspace: no XLA transpose in front of the call), a (N, K) b with pack=0; the
    plan's K slices are the call's split_k; the workspace result is what the C++ rule
    (configs.workspace_floats, PlanWorkspace) asks for."""
    monkeypatch.setattr(scaled, "kernel_config", lambda *a: (CFG, split))
    m, n, k = 40, 200, 1024
    dt = jnp.float8_e4m3fn if kind == "fp8" else jnp.int8
    a = jnp.ones((m, k), dt)
    b = jnp.ones((n, k) if transpose_b else (k, n), dt)
    out, s = (jnp.int32, None) if kind == "int8" else (jnp.bfloat16, 1.0)
    text = cuda_text(lambda a, b: tg.scaled_matmul(a, b, s, s, out_dtype=out,
                                                   transpose_b=transpose_b), a, b)
    (call,) = custom_calls(text)
    assert call["transpose_b"] == str(transpose_b).lower()
    assert call["pack"] == str(not transpose_b).lower()
    assert call["split_k"].split(":")[0].strip() == str(split) and call["config"] == CFG
    assert "stablehlo.transpose" not in text
    shape_b = f"1x{n}x{k}" if transpose_b else f"1x{k}x{n}"
    assert f"tensor<{shape_b}x" in call["line"].split("->")[0]
    ws = configs.workspace_floats(m, n, k, 1, True, True, False, transpose_b, CFG, split,
                                  not transpose_b, 1)
    # split slices of M x N float32 (int8: int32) partials, then N x K bytes of b's copy
    want = (split * m * n if split > 1 else 0) + (0 if transpose_b else n * k // 4)
    assert ws == want and f"tensor<{ws}xf32>" in call["results"]
