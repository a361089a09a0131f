"""Family `cp`: context-parallel methods over N ranks (attnbench.cp), each cell one distributed
job started by attnbench.run.launch (`python -m attnbench cp-cell`, cell.py)."""

from __future__ import annotations

from .provenance import provenance  # noqa: F401  (the family interface)

# Imports inside the functions: a cp cell imports this package, and what it imports is the cell's
# code (record.code), which attnbench.pipeline.currency compares. Grid expansion is not what it runs.


def expand(cfg: dict, gname: str) -> list[dict]:
    from .grid import expand as expand_grid

    return expand_grid(cfg, gname)


def problems(cfg, grid, prod, at) -> list[str]:
    from .grid import problems as grid_problems

    return grid_problems(cfg, grid, prod, at)


NAME = "cp"
CELL_COMMAND = "cp-cell"


def record_skeleton(spec) -> dict:
    """The record a cell (grid.spec.CellSpec) starts with (emulated.py; imported when called)."""
    from .emulated import record_skeleton as skeleton

    return skeleton(spec)


def table_stems(grid: dict) -> list[str]:
    return ["cp_tflops", "cp_vs_single_gpu", "cp_breakdown"]


def figure_stems(grid: dict) -> list[str]:
    return ["cp_tflops_vs_gpus", "cp_efficiency", "cp_breakdown", "winner_map"]
