"""tcgemm inside XLA command buffers (CUDA graphs), forced on for custom calls (gpu test).

XLA records runs of command-compatible ops into CUDA graphs ("command buffers"); custom
calls join only when CUSTOM_CALL is among --xla_gpu_enable_command_buffer's types AND the FFI
handler has the kCmdBufferCompatible trait (ours does: no scratch allocation, no host sync).
XLA reads XLA_FLAGS once per process, so a subprocess runs with

    --xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE,CONDITIONAL
    --xla_gpu_graph_min_graph_size=1

and (1) compiles 8 independent products in one jit, whose compiled HLO must hold our custom
call inside a `command_buffer` computation, (2) runs them, a lax.scan of 30 products, a
fori_loop of 30 dependent ones, and a chain of 7 dependent products through every launch path
(sm90 row, clustered split-K by push and by pull, workspace split-K and its reduction kernel,
packed operands, the sliced-K row) with XLA ops between them, and saves the results. A second
subprocess runs the same programs with command buffers off (--xla_gpu_enable_command_buffer=):
the graph replays must equal those runs bitwise (a replay with stale pointers or a missing
launch would differ), and each product lie within bounds of float32 jnp.dot / the float64
product of its actual inputs. (3) runs fused epilogues (C, bias, activation) on an sm90 row,
a clustered and a workspace split-K, and grad through one (aux forward, the dact kernel),
against float64.
"""
import json
import os
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_tcgemm

from conftest import act_grad64, assert_close, bound, epilogue_ref64, f64, rel_err

pytestmark = pytest.mark.gpu

CMD_BUFFER_FLAGS = ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE,"
                    "CONDITIONAL --xla_gpu_graph_min_graph_size=1")

# The subprocesses' inputs and programs (python -c).
PROGRAMS = r'''
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax_tcgemm.primitive import tcgemm
F16, F32 = jnp.float16, jnp.float32
rng = np.random.default_rng(20240611)
A = jnp.asarray(rng.standard_normal((30, 96, 80), np.float32).astype(F16))
B = jnp.asarray(rng.standard_normal((1, 80, 72), np.float32).astype(F16))
W = jnp.asarray((rng.standard_normal((1, 80, 80), np.float32) / 9).astype(F16))

@jax.jit
def straight(A, B):   # 8 independent products: one run of commands
    return jnp.stack([tcgemm(A[i][None], B, out_dtype=F32)[0] for i in range(8)])

@jax.jit
def scanned(A, B):    # 30 independent products in a while loop
    return lax.scan(lambda c, a: (c, tcgemm(a[None], B, out_dtype=F32)[0]), 0, A)[1]

@jax.jit
def chained(x, W):    # 30 dependent products: x <- x @ W
    return lax.fori_loop(0, 30, lambda i, x: tcgemm(x[None], W)[0], x)

# (config, split_k, output width) per step of `mixed`; its input is 512 x 264. 1028-wide rows
# are not 16-byte multiples: steps 2 and 3 pack an operand. Splits past 8 and sm90 splits sum
# in the workspace with a second kernel; sm80 splits up to 8 reduce in a cluster (push for 2).
STEPS = (("sm90_128x128x64_s6_g2", 1, 256), ("sm80_64x64x32_s4_w2x2", 2, 1028),
         ("sm80_64x64x64_s4_w2x2", 4, 128), ("sm80_16x64x64_s6_w1x4", 2, 512),
         ("sm80_64x64x32_s4_w2x2", 16, 256), ("sm90_128x256x64_s4_g2", 2, 384),
         ("sm80_16x64x128_s6_w1x4x2", 1, 264))
X0 = jnp.asarray(rng.standard_normal((512, 264), np.float32).astype(F16))
WS, d = [], 264
for _, _, n in STEPS:
    WS.append(jnp.asarray((rng.standard_normal((d, n), np.float32) / np.sqrt(d)).astype(F16)))
    d = n

@jax.jit
def mixed(x, ws):     # dependent products through every launch path, XLA ops between them
    pairs = []
    for (cfg, split, _), w in zip(STEPS, ws):
        y = tcgemm(x[None], w[None], config=cfg, split_k=split)[0]
        pairs.append((x, y))
        x = (jnp.tanh(y.astype(F32)) * 2).astype(F16)
    return pairs

# Fused epilogues (C, bias, activation) on an sm90 row, a clustered and a workspace split-K,
# and grad through one (the forward writes the pre-activation; the dact kernel and three
# products run backward).
import jax_tcgemm as tg
C = jnp.asarray(rng.standard_normal((96, 72), np.float32))
BIAS = jnp.asarray(rng.standard_normal((72,), np.float32))
CT = jnp.asarray(rng.standard_normal((96, 72), np.float32))
EPI = (("sm90_128x128x64_s6_g2", 1, "gelu_tanh"), ("sm80_64x64x64_s4_w2x2", 2, "relu"),
       ("sm80_64x64x32_s4_w2x2", 16, "silu"))

@jax.jit
def epilogues(a, b, c, bias, ct):
    outs = [tcgemm(a[None], b, c[None], bias[None], alpha=0.5, beta=-1.25, activation=act,
                   out_dtype=F32, config=cfg, split_k=s)[0] for cfg, s, act in EPI]
    loss = lambda x, w, bb: jnp.sum(tg.gemm(x, w, c, beta=0.75, bias=bb, activation="gelu",
                                            out_dtype=F32) * ct)
    return outs, jax.grad(loss, argnums=(0, 1, 2))(a, b[0], bias)

def run():
    out = {"straight": np.asarray(straight(A, B)), "scanned": np.asarray(scanned(A, B)),
           "chained": np.asarray(chained(A[0], W).astype(F32))}
    for i, (x, y) in enumerate(mixed(X0, WS)):
        out[f"mixed_in{i}"], out[f"mixed_out{i}"] = np.asarray(x, np.float32), np.asarray(y, np.float32)
    outs, grads = epilogues(A[0], B, C, BIAS, CT)
    for i, y in enumerate(outs):
        out[f"epi_out{i}"] = np.asarray(y)
    for name, g in zip("xwb", grads):
        out[f"epi_grad_{name}"] = np.asarray(g, np.float32)
    return out
'''

CHILD = PROGRAMS + r'''
import json, re, sys
text = straight.lower(A, B).compile().as_text()
comps = re.split(r"\n(?=\S)", text)  # one chunk per computation
in_cb = [c.split("(")[0] for c in comps
         if 'custom_call_target="tcgemm"' in c and "command_buffer" in c.split("\n")[0]]
holders = [c.split("(")[0][:80] for c in comps if 'custom_call_target="tcgemm"' in c]
np.savez(sys.argv[1], **run(), A=np.asarray(A, np.float32), B=np.asarray(B, np.float32),
         C=np.asarray(C), BIAS=np.asarray(BIAS), CT=np.asarray(CT),
         **{f"mixed_w{i}": np.asarray(w, np.float32) for i, w in enumerate(WS)})
print(json.dumps({"tcgemm_in_command_buffer": in_cb, "holders": holders,
                  "command_buffer_in_hlo": "command_buffer" in text}))
'''


def _child(tmp_path, name, flags):
    """Runs CHILD with `flags` appended to XLA_FLAGS; returns (its JSON line, its arrays)."""
    out_file = tmp_path / f"{name}.npz"
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
    # The child imports the jax_tcgemm this process imported (installed or source tree).
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(jax_tcgemm.__file__).resolve().parents[1])] +
        [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-P", "-c", CHILD, str(out_file)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), dict(np.load(out_file))


def test_command_buffers_with_custom_calls(tmp_path):
    info, graphs = _child(tmp_path, "graphs", CMD_BUFFER_FLAGS)
    # Whether XLA put the call into a graph is its scheduling decision, and jaxlib 0.11.2
    # converts thunks to commands after the HLO passes, so the HLO may show no command_buffer
    # even when the call is captured (H100: a tiny product costs 13.9 us per call with
    # command buffers on, 26.8 us off; benchmarks/NOTES.md). Reported; correctness is asserted.
    if not info["tcgemm_in_command_buffer"]:
        warnings.warn(f"no command_buffer computation holds tcgemm in the compiled HLO "
                      f"(capture may still happen at the thunk level): {info}")
    info_off, plain = _child(tmp_path, "plain", "--xla_gpu_enable_command_buffer=")
    assert not info_off["tcgemm_in_command_buffer"]
    names = [n for n in graphs
             if n.startswith(("straight", "scanned", "chained", "mixed_", "epi_"))]
    assert len(names) == 3 + 3 * 7 + 3 + 3
    for name in names:
        np.testing.assert_array_equal(graphs[name], plain[name], err_msg=f"{name}: graph vs stream")
    for i in range(7):  # each product of the chain against its own inputs
        x, w, y = plain[f"mixed_in{i}"], plain[f"mixed_w{i}"], plain[f"mixed_out{i}"]
        assert_close(y, f64(x) @ f64(w), np.float16, x.shape[1], f"mixed step {i}")
    A, B = graphs["A"], graphs["B"]
    dot32 = np.asarray(jnp.dot(jnp.asarray(A[:8].reshape(-1, 80)), jnp.asarray(B[0]),
                               precision=jax.lax.Precision.HIGHEST)).reshape(8, 96, 72)
    assert_close(graphs["straight"], dot32, np.float32, 80, "straight vs jnp.dot f32")
    assert_close(graphs["straight"], np.matmul(f64(A[:8]), f64(B)), np.float32, 80, "straight")
    assert_close(graphs["scanned"], np.matmul(f64(A), f64(B)), np.float32, 80, "scanned")
    x = graphs["chained"]
    assert np.isfinite(x).all() and np.abs(x).max() > 1e-3  # 30 float16 roundings: no f64 ref
    a, b, c, bias, ct = A[0], B[0], graphs["C"], graphs["BIAS"], graphs["CT"]
    for i, act in enumerate(("gelu_tanh", "relu", "silu")):
        want = epilogue_ref64(a, b, c, bias, alpha=0.5, beta=-1.25, activation=act)[0]
        assert_close(graphs[f"epi_out{i}"], want, np.float32, 80, f"epilogue {i} ({act})")
    # grad of sum(ct * gelu(a @ b + 0.75 c + bias)) in float64; the float16 gradients carry two
    # roundings (of g and of the product)
    _, pre = epilogue_ref64(a, b, c, bias, beta=0.75)
    g = f64(ct) * act_grad64("gelu", pre)
    for name, want, k in (("x", g @ f64(b).T, 72), ("w", f64(a).T @ g, 96),
                          ("b", g.sum(0), 96)):
        dt = np.float32 if name == "b" else np.float16
        assert rel_err(graphs[f"epi_grad_{name}"], want) <= 2 * bound(dt, k), f"grad {name}"
