"""Autotuning: time every (config, split_k) candidate for a new problem once, keep the fastest.

Off by default (the selector's cost model in configs.plan decides). Turn it on with the
environment variable ``JAX_TCGEMM_AUTOTUNE=1`` or ``jax_tcgemm.autotune.enable()``. Then the
first CUDA lowering of a problem (GPU name, batch x M x N x K, dtype, layout) times the
candidates with the benchmark's harness (timing.py: R distinct A's per call, medians after
warm-up) and caches the winner persistently as JSON in
``$JAX_TCGEMM_CACHE_DIR/autotune.json`` (default ``$XDG_CACHE_HOME/jax_tcgemm`` or
``~/.cache/jax_tcgemm``). Tuning happens in Python when the lowering plans the product
(configs.plan_for_device, which imports this module only when autotuning is on), never inside
the FFI handler (XLA command buffers record the handler's launches).
"""
from __future__ import annotations

import json
import os
import pathlib
import threading

import numpy as np

from . import configs, timing

_ENV = "JAX_TCGEMM_AUTOTUNE"
_lock = threading.Lock()
_enabled: bool | None = None  # None: follow the environment variable
_cache: dict | None = None


def enable(on: bool = True) -> None:
    """Turn autotuning on (or off) for this process, overriding JAX_TCGEMM_AUTOTUNE."""
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    if _enabled is not None:
        return _enabled
    return os.environ.get(_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def cache_path() -> pathlib.Path:
    root = os.environ.get("JAX_TCGEMM_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "jax_tcgemm")
    return pathlib.Path(root) / "autotune.json"


def key(device_kind: str, m: int, n: int, k: int, batch: int, dtype, layout: str) -> str:
    return f"{device_kind}|{batch}x{m}x{n}x{k}|{np.dtype(dtype).name}|{layout}"


def _load() -> dict:
    global _cache
    if _cache is None:
        try:
            _cache = json.loads(cache_path().read_text())
        except (OSError, ValueError):
            _cache = {}
    return _cache


def _store(k: str, entry: dict) -> None:
    cache = _load()
    cache[k] = entry
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:  # read-only home: keep the result for this process only
        pass


def candidates(m: int, n: int, k: int, batch: int = 1, arch=None) -> list[tuple[str, int]]:
    """Every config worth trying on a device of compute capability `arch` (configs.configs_for:
    sm90 rows on 9.0 only; None as in configs.plan: sm80 rows only) with split 1, its
    modelled best split, and powers of two up to 16, within configs.splits and what
    configs.competes allows (skinny rows: small M only)."""
    out = []
    for c in configs.configs_for(arch):
        allowed = {s for s in configs.splits(c, k, m) if configs.competes(c, s, m, n, k, batch)}
        for s in sorted({1, configs.split_k(c, m, n, k, batch), 2, 4, 8, 16} & allowed):
            out.append((c.name, s))
    return out


def measure(m: int, n: int, k: int, batch: int, dtype, layout: str, reps: int = 7,
            cands=None) -> list[dict]:
    """Median seconds per product of each candidate, on the default device: rows
    {config, split_k, seconds}, fastest first. Runs eagerly even when called while tracing or lowering.
    cands: (config, split_k) pairs; default: candidates() for the default device's arch."""
    import jax
    from .primitive import tcgemm

    ta, tb = layout[0] == "T", layout[1] == "T"
    flops = 2 * m * n * k * batch
    r = min(timing.MAX_R, max(1, round(0.25e12 / max(flops, 1))))
    with jax.ensure_compile_time_eval():
        a_list, b = timing.harness_operands(
            r, (batch, k, m) if ta else (batch, m, k), (batch, n, k) if tb else (batch, k, n),
            np.dtype(dtype), k, seed=1)
        fns = {}
        for name, s in (cands or candidates(m, n, k, batch, configs.device_arch())):
            op = (lambda x, y, name=name, s=s:
                  tcgemm(x, y, transpose_a=ta, transpose_b=tb, config=name, split_k=s))
            fns[(name, s)] = timing.harness(op, barrier=True)
        # blocking calls: the dispatch each adds is one constant for every candidate, where a
        # stream of calls as short as ~0.25 TFLOP could time several at the host's pace
        times = timing.medians(timing.time_fns(fns, (a_list, b), reps, stream=False))
    rows = [{"config": c, "split_k": s, "seconds": t / r} for (c, s), t in times.items()]
    return sorted(rows, key=lambda row: row["seconds"])


def plan(m: int, n: int, k: int, batch: int, dtype, layout: str) -> tuple[str, int]:
    """(config, split_k): the cached or freshly tuned winner when autotuning is on and a GPU
    is the default backend; configs.plan's model otherwise. Either way for the default
    device's compute capability (configs.device_arch(): sm90 configs on 9.0 only)."""
    arch = configs.device_arch()
    if not enabled() or m * n * k * batch == 0:
        return configs.plan(m, n, k, batch, dtype, layout, arch)
    import jax
    if jax.default_backend() != "gpu":
        return configs.plan(m, n, k, batch, dtype, layout, arch)
    kk = key(jax.devices()[0].device_kind, m, n, k, batch, dtype, layout)
    with _lock:
        hit = _load().get(kk)
        if hit is None or hit.get("config") not in configs.BY_NAME:
            rows = measure(m, n, k, batch, dtype, layout)  # candidates for device_arch()
            hit = {"config": rows[0]["config"], "split_k": rows[0]["split_k"],
                   "us": round(rows[0]["seconds"] * 1e6, 2),
                   "model": list(configs.plan(m, n, k, batch, dtype, layout, arch))}
            _store(kk, hit)
    return hit["config"], int(hit["split_k"])


def main(argv=None) -> int:
    """``python -m jax_tcgemm.autotune [--suite S] [--shape MxNxK] [--dtype D]``: time every
    candidate of the benchmark's cases and print them beside the cost model's choice."""
    import argparse

    import jax
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--suite", default="llm")
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    if jax.default_backend() != "gpu":
        print("autotune: no GPU; nothing to time")
        return 0
    cs = ([c for spec in args.shape for c in timing.parse_shape(spec, (args.dtype,))]
          or timing.cases(args.suite, (args.dtype,)))  # epilogue rows: their plain product
    for c in cs:
        flop = 2 * c.m * c.n * c.k * c.batch  # one product (an epilogue row's forward GEMM)
        model = configs.plan(c.m, c.n, c.k, c.batch, c.dtype, c.layout, configs.device_arch())
        rows = measure(c.m, c.n, c.k, c.batch, c.dtype, c.layout, reps=args.reps)
        t_model = next(r["seconds"] for r in rows if (r["config"], r["split_k"]) == model)
        print(f"{c.name} {c.batch}x{c.m}x{c.n}x{c.k} {c.dtype}: model {model[0]} k{model[1]} "
              f"{flop / t_model / 1e12:.1f} TFLOP/s")
        for r in rows[:6]:
            print(f"    {r['config']:<26} k{r['split_k']:<3} {r['seconds'] * 1e6:9.1f} us "
                  f"{flop / r['seconds'] / 1e12:7.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
