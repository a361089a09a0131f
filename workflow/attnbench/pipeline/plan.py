"""Which cells to run next, and in what order: the grids' cells whose records are missing or
outdated (pipeline.currency), narrowed to some lengths, kernels or masks, then ordered and cut by
the time records on disk estimate for a session of limited device time (families.estimate, which
also cuts them into device calls: calls, write_calls)."""

from __future__ import annotations

import json
from pathlib import Path

from ..families import expand_cells
from ..families.estimate import smallest_first
from ..grid.expand import cell_path
from .currency import of_config, to_make_again

# what `records --rerun` selects besides a status: the records a run would make again
OUTDATED = "outdated"

# a selection's axis -> the cell's key it filters
AXES = {"seqlen": "seqlen", "kernels": "impl", "masks": "mask"}


def cells_to_run(cfg: dict, grids=None, only: dict | None = None, everything=False) -> list[dict]:
    """The cells of `grids` (default: the config's run list) whose record is not on disk, or is
    outdated and not kept (outdated_records: keep, or a device this environment cannot run), in
    the grids' order; `everything`: also those on disk. `only` maps an axis of AXES to the values
    wanted (None: any). Raises record.validate.RecordError on a record it cannot read."""
    out = Path(cfg["output_dir"])
    judged = of_config(cfg, grids)[0]
    again, _ = to_make_again(judged, cfg["outdated_records"] == "keep")
    outdated = {Path(o.path) for o in again}
    only = only or {}
    return [
        cell
        for cell in expand_cells(cfg, grids)
        if all(only.get(axis) is None or cell.get(key) in only[axis] for axis, key in AXES.items())
        and (
            everything or not (out / cell_path(cell)).exists() or out / cell_path(cell) in outdated
        )
    ]


def cells_to_rerun(cfg: dict, grids, wanted: set[str], only: dict | None = None) -> list[dict]:
    """The cells of `grids` whose record on disk has one of the `wanted` statuses, or (OUTDATED
    among them) is outdated, kept or not: for `snakemake --forcerun` to measure again. Raises
    record.validate.RecordError on a record it cannot read, as the judging does."""
    out = Path(cfg["output_dir"])
    judged = {Path(o.path) for o in of_config(cfg, grids)[0]} if OUTDATED in wanted else set()
    only = only or {}
    chosen = []
    for cell in expand_cells(cfg, grids):
        path = out / cell_path(cell)
        if not path.exists() or any(
            only.get(axis) is not None and cell.get(key) not in only[axis]
            for axis, key in AXES.items()
        ):
            continue
        if path in judged or json.loads(path.read_text()).get("status") in wanted:
            chosen.append(cell)
    return chosen


def in_order(cells: list[dict], out: Path, smallest: bool, budget_s: float | None) -> list[dict]:
    """The cells as given, or smallest job first (and, with a budget, only those that fit it)
    when either is asked: a session with little device time runs the short lengths first, so
    whatever it does not reach is the longest cells."""
    if smallest or budget_s is not None:
        return smallest_first(cells, out, budget_s)
    return cells
