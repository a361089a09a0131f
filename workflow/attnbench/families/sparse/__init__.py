"""Family `sparse`: block-sparse kernels on one GPU against dense references at equal visible
area. Its grids and cells are the kernel family's (`python -m attnbench cell`); its tables and
figures are its own (report.py)."""

from __future__ import annotations

from ..kernel import grid as kernel_grid
from ..kernel import provenance, record_skeleton  # noqa: F401  (the family interface)
from ..kernel.grid import expand  # noqa: F401

NAME = "sparse"
CELL_COMMAND = "cell"


def problems(cfg, grid, prod, at) -> list[str]:
    return kernel_grid.problems(cfg, grid, prod, at, family=NAME)


def table_stems(grid: dict) -> list[str]:
    return [
        "sparse_tflops",
        "sparse_memory",
        "sparse_vs_dense",
        "sparse_not_measured",
        "sparse_vs_paper",
    ]


def figure_stems(grid: dict) -> list[str]:
    return ["winner_map", "sparse_tflops_vs_seqlen", "sparse_tflops_vs_density", "sparse_memory"]
