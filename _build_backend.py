"""In-tree PEP 517 backend: scikit-build-core, plus CUDA 13.0 from PyPI where needed.

Everything is scikit-build-core's (``scikit_build_core.build``) except two additions:

* ``get_requires_for_build_wheel`` / ``_editable`` add the CUDA 13.0 compiler wheels
  (:data:`CUDA_WHEELS`) to the isolated build environment when this machine has no CUDA
  toolkit; CMakeLists.txt then finds ``site-packages/nvidia/cu13/bin/nvcc`` through the
  build's Python. ``JAX_TCGEMM_CUDA_WHEELS=1`` always adds them, ``=0`` never does.
  (With ``--no-build-isolation`` pip asks for no requirements: the environment you have
  is what CMake gets.)
* ``build_wheel`` / ``build_editable`` default ``CMAKE_BUILD_PARALLEL_LEVEL`` to the CPUs
  we may use, bounded by memory (nvcc on many template instantiations is slow and big).

The search for a system toolkit mirrors the one in CMakeLists.txt: CMAKE_CUDA_COMPILER
(as a -C cmake.define / CMAKE_ARGS / SKBUILD_CMAKE_DEFINE), $CUDACXX, $CUDA_HOME/bin/nvcc,
$CUDA_PATH/bin/nvcc, nvcc on PATH, /usr/local/cuda/bin/nvcc.
"""

from __future__ import annotations

import os
import shutil

from scikit_build_core import build as _skbuild
from scikit_build_core.build import (  # noqa: F401  (re-exported PEP 517/660 hooks)
    build_sdist,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

# CUDA 13.0 as PyPI wheels; they unpack under site-packages/nvidia/cu13. Same versions
# as the CI / GPU machines' system toolkit.
CUDA_WHEELS = [
    "nvidia-cuda-nvcc==13.0.88",     # nvcc, ptxas, fatbinary, nvlink, cudafe++
    "nvidia-nvvm==13.0.88",          # cicc, libdevice
    "nvidia-cuda-crt==13.0.88",      # include/crt (host_config.h, ...)
    "nvidia-cuda-runtime==13.0.96",  # cuda_runtime.h, libcudart_static.a
    "nvidia-cuda-cccl==13.0.85",     # include/cccl (cuda/std, cub, thrust)
]


def _system_cuda_compiler(config_settings: dict | None) -> str | None:
    """Where the CUDA compiler CMake will use comes from, or None to use the wheels."""
    settings = config_settings or {}
    for key, value in settings.items():
        if "CMAKE_CUDA_COMPILER" in key or "CMAKE_CUDA_COMPILER" in str(value):
            return f"config setting {key}"
    for var in ("CMAKE_ARGS", "SKBUILD_CMAKE_DEFINE", "SKBUILD_CMAKE_ARGS"):
        if "CMAKE_CUDA_COMPILER" in os.environ.get(var, ""):
            return f"${var}"
    if os.environ.get("CUDACXX"):
        return f"$CUDACXX={os.environ['CUDACXX']}"
    candidates = [
        os.path.join(os.environ[var], "bin", "nvcc")
        for var in ("CUDA_HOME", "CUDA_PATH")
        if os.environ.get(var)
    ]
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(on_path)
    candidates.append("/usr/local/cuda/bin/nvcc")
    for nvcc in candidates:
        if os.path.isfile(nvcc):
            return nvcc
    return None


def _cuda_requires(config_settings: dict | None) -> list[str]:
    mode = os.environ.get("JAX_TCGEMM_CUDA_WHEELS", "auto").strip().lower()
    if mode in ("1", "true", "yes", "on"):
        return list(CUDA_WHEELS)
    if mode in ("0", "false", "no", "off"):
        return []
    return [] if _system_cuda_compiler(config_settings) else list(CUDA_WHEELS)


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return _skbuild.get_requires_for_build_wheel(config_settings) + _cuda_requires(
        config_settings
    )


def get_requires_for_build_editable(config_settings: dict | None = None) -> list[str]:
    return _skbuild.get_requires_for_build_editable(config_settings) + _cuda_requires(
        config_settings
    )


def _default_parallel_level() -> None:
    if os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL"):
        return
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    jobs = cpus
    try:  # ~3 GiB per nvcc job on big template instantiations
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        avail_gib = int(info["MemAvailable"].split()[0]) / 2**20
        jobs = min(jobs, max(1, int(avail_gib // 3)))
    except (OSError, KeyError, ValueError):
        pass
    os.environ["CMAKE_BUILD_PARALLEL_LEVEL"] = str(max(1, jobs))


def build_wheel(
    wheel_directory: str,
    config_settings: dict | None = None,
    metadata_directory: str | None = None,
) -> str:
    _default_parallel_level()
    return _skbuild.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(
    wheel_directory: str,
    config_settings: dict | None = None,
    metadata_directory: str | None = None,
) -> str:
    _default_parallel_level()
    return _skbuild.build_editable(wheel_directory, config_settings, metadata_directory)
