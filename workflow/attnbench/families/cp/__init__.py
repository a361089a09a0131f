"""Family `cp`: context-parallel methods over N ranks (attnbench.cp), each cell one distributed
job started by attnbench.launch (`python -m attnbench cp-cell`, cell.py)."""

from __future__ import annotations

from .provenance import provenance  # noqa: F401  (the family interface)

# Imports inside the functions: a cp cell imports this package, and what it imports is the cell's
# code (record.code), which attnbench.currency compares. Grid expansion is not what it runs.


def expand(cfg: dict, gname: str) -> list[dict]:
    from .grid import expand as expand_grid

    return expand_grid(cfg, gname)


def problems(cfg, grid, prod, at) -> list[str]:
    from .grid import problems as grid_problems

    return grid_problems(cfg, grid, prod, at)


NAME = "cp"
CELL_COMMAND = "cp-cell"


def record_skeleton(spec) -> dict:
    """The record with what ran (method and local kernel) and the CP tables' columns."""
    from ...record.record import base_record
    from .cell import cp_summary, implementation
    from .emulated import emulated_summary, is_emulated

    if is_emulated(spec):  # cp.emulate: the record says so whatever its status
        record = base_record(spec, {**implementation(spec), "emulated": True}, provenance(spec))
        emulated_summary(record, spec)
        return record
    record = base_record(spec, implementation(spec), provenance(spec))
    cp_summary(record, spec)
    return record


def table_stems(grid: dict) -> list[str]:
    return ["cp_tflops", "cp_vs_single_gpu", "cp_breakdown"]


def figure_stems(grid: dict) -> list[str]:
    return ["cp_tflops_vs_gpus", "cp_efficiency", "cp_breakdown"]
