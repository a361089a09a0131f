"""Family `kernel`: one attention kernel on one GPU, every mask, length, heads setting, dtype and
direction (the paper's kernel study). Cells run with `python -m attnbench cell` (cell.py)."""

from __future__ import annotations

from ...report.labels import mask_families
from ...report.outputs import grid_axis, grid_directions
from .grid import expand, problems  # noqa: F401  (the family interface)

NAME = "kernel"
CELL_COMMAND = "cell"
TABLES = "tables"
FIGURES = "figures"


def record_skeleton(spec: dict) -> dict:
    from ...record.record import base_record
    from .cell import implementation

    return base_record(spec, implementation(spec))


def table_stems(grid: dict) -> list[str]:
    return ["tflops", "memory", "support"]


def figure_stems(grid: dict) -> list[str]:
    # Figs. 3 and 7 (bars at one length) and 16-17 (memory) per direction; Figs. 8-14 per mask
    # family; the paired answers: the winner map, and the speedup over the reference kernel per
    # direction and for the training step (fwd + bwd) where both are measured
    dirs = grid_directions(grid)
    steps = dirs + (["train"] if {"fwd", "bwd"} <= set(dirs) else [])
    return (
        [f"{kind}_{d}" for d in dirs for kind in ("tflops_bars", "memory_vs_seqlen")]
        + [f"tflops_vs_seqlen_{fam}" for fam in mask_families(grid_axis(grid, "masks"))]
        + ["winner_map"]
        + [f"speedup_{d}" for d in steps]
    )
