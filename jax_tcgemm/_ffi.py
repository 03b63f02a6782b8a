"""The only importer of the compiled extension `_tcgemm`; registers its FFI targets.

If the extension is missing or fails to load, CPU use still works (the primitive lowers
through lax.dot_general there) and GPU lowering raises `require()`'s error.
"""
from __future__ import annotations

import pathlib

import jax

TARGET = "tcgemm"  # FFI target names (C++: TcgemmHandler, TcgemmDactHandler in ffi/xla/gemm_ffi.cc)
DACT_TARGET = "tcgemm_dact"
RAGGED_TARGET = "tcgemm_ragged"
SPLIT_TARGET = "tcgemm_split"  # TcgemmSplitHandler (ffi/xla/split_ffi.cc)

_HERE = pathlib.Path(__file__).resolve().parent
try:
    from . import _tcgemm  # noqa: F401
    _LOAD_ERROR: str | None = None
except ImportError as e:  # not built, or built for another Python/CUDA
    _tcgemm = None
    if not any(_HERE.glob("_tcgemm*.so")) and not any(_HERE.glob("_tcgemm*.pyd")):
        _LOAD_ERROR = f"no compiled _tcgemm module in {_HERE} (the package was not built)"
    else:
        _LOAD_ERROR = f"{type(e).__name__}: {e}"


def available() -> bool:
    return _tcgemm is not None


def require() -> None:
    """Raises a RuntimeError saying why the CUDA kernels cannot be used and how to rebuild."""
    if _tcgemm is None:
        raise RuntimeError(
            "jax_tcgemm: the CUDA extension jax_tcgemm._tcgemm could not be loaded "
            f"({_LOAD_ERROR}). GPU execution needs it; rebuild "
            "with `pip install --force-reinstall --no-deps .` from the source tree (CUDA 13 "
            "toolkit or the nvidia-cuda-nvcc wheel), or run on CPU, where jax_tcgemm falls "
            "back to lax.dot_general.")


def config_names() -> list[str] | None:
    """Config names compiled into the extension (None if it is not loaded)."""
    return None if _tcgemm is None else list(_tcgemm.config_names())


def module():
    """The extension module (the host planner's rules and the config table), or a
    RuntimeError saying why it cannot be loaded."""
    require()
    return _tcgemm


if _tcgemm is not None:
    for _name, _capsule in _tcgemm.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")
