"""Family `cp`: context-parallel methods over N ranks (attnbench.cp), each cell one distributed
job started by attnbench.launch (`python -m attnbench cp-cell`, cell.py)."""

from __future__ import annotations

from .grid import expand, problems  # noqa: F401  (the family interface)

NAME = "cp"
CELL_COMMAND = "cp-cell"
TABLES = "report"
FIGURES = "figures"


def record_skeleton(spec: dict) -> dict:
    """The record with what ran (method and local kernel) and the CP tables' columns."""
    from ...record.record import base_record
    from .cell import cp_summary, implementation
    from .emulated import emulated_summary, is_emulated

    if is_emulated(spec):  # cp.emulate: the record says so whatever its status
        record = base_record(spec, {**implementation(spec), "emulated": True})
        emulated_summary(record, spec)
        return record
    record = base_record(spec, implementation(spec))
    cp_summary(record, spec)
    return record


def table_stems(grid: dict) -> list[str]:
    return ["cp_tflops", "cp_vs_single_gpu", "cp_breakdown"]


def figure_stems(grid: dict) -> list[str]:
    return ["cp_tflops_vs_gpus", "cp_efficiency", "cp_breakdown"]
