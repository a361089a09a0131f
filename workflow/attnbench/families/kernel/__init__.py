"""Family `kernel`: one attention kernel on one GPU, every mask, length, heads setting, dtype and
direction (the paper's kernel study). Cells run with `python -m attnbench cell` (cell.py)."""

from __future__ import annotations

from .provenance import provenance  # noqa: F401  (the family interface)

# Imports inside the functions: a kernel cell imports this package, and what it imports is the
# cell's code (record.code), which a record names and attnbench.pipeline.currency compares. Grid expansion
# and file names are not what a cell measures with.


def expand(cfg: dict, gname: str) -> list[dict]:
    from .grid import expand as expand_grid

    return expand_grid(cfg, gname)


def problems(cfg, grid, prod, at) -> list[str]:
    from .grid import problems as grid_problems

    return grid_problems(cfg, grid, prod, at)


NAME = "kernel"
CELL_COMMAND = "cell"


def record_skeleton(spec) -> dict:
    """The record a cell (grid.spec.CellSpec) starts with (cell.py; imported when called)."""
    from .cell import record_skeleton as skeleton

    return skeleton(spec)


def table_stems(grid: dict) -> list[str]:
    # a GPU grid's host overhead (tables.host_table): a CPU is its own host, there is none apart
    return ["tflops", "memory", "support"] + (["host"] if grid.get("device") == "cuda" else [])


def figure_stems(grid: dict) -> list[str]:
    from ...report.labels import mask_families
    from ...report.outputs import grid_axis, grid_directions

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
