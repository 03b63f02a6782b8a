"""Kernel configs: the table of ffi/gemm_config.inc (the one source, also compiled into C++)
and the choice of a config for a problem."""
from __future__ import annotations

import dataclasses
import math
import pathlib
import re

_ROW = re.compile(r"^\s*TCGEMM_CONFIG\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,"
                  r"\s*(\d+)\s*,\s*(\d+)\s*\)", re.M)

LAYOUTS = ("NN", "NT", "TN", "TT")  # BLAS letters for (A, B): N = as stored, T = transposed


def layout_name(transpose_a: bool, transpose_b: bool) -> str:
    return ("T" if transpose_a else "N") + ("T" if transpose_b else "N")


@dataclasses.dataclass(frozen=True)
class Config:
    bm: int
    bn: int
    bk: int
    stages: int
    warps_m: int
    warps_n: int

    @property
    def name(self) -> str:  # same rule as ConfigName() in ffi/gemm_config.h
        return (f"sm80_{self.bm}x{self.bn}x{self.bk}_s{self.stages}"
                f"_w{self.warps_m}x{self.warps_n}")

    def tiles(self, m: int, n: int) -> int:
        return math.ceil(m / self.bm) * math.ceil(n / self.bn)


def _table_text() -> str:
    here = pathlib.Path(__file__).resolve().parent
    for path in (here / "gemm_config.inc", here.parent / "ffi" / "gemm_config.inc"):
        if path.is_file():
            return path.read_text()
    raise FileNotFoundError("jax_tcgemm: gemm_config.inc not found next to the package "
                            "(installed by CMake) nor in ../ffi (source tree)")


CONFIGS: tuple[Config, ...] = tuple(
    Config(*map(int, m.groups())) for m in _ROW.finditer(_table_text()))
BY_NAME: dict[str, Config] = {c.name: c for c in CONFIGS}

_SMS = 132  # streaming multiprocessors of an H100/H200 SXM: one wave of 1-block-per-SM tiles


def select(m: int, n: int, k: int, batch: int = 1, dtype=None, layout: str = "NN") -> str:
    """Name of the config for a (batch x) M x N x K product: the largest tile that still gives
    about a wave of threadblocks."""
    del k, dtype, layout  # the heuristic depends on the output tiling only (for now)
    by_area = sorted(CONFIGS, key=lambda c: c.bm * c.bn, reverse=True)
    for c in by_area[:-1]:
        if c.tiles(m, n) * batch >= _SMS * 0.9:
            return c.name
    return by_area[-1].name
