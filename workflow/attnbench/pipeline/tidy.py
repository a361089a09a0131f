"""Each grid's tidy tables, and the output folder's: their union.

A grid's tables and figures read only its own tidy tables, made from its records alone
(<output_dir>/.attnbench/tidy/<grid>/cells.csv, samples.csv beside it), so that a changed record
redraws only its own grid; a family whose figures read other grids' rows (READ_OTHER_GRIDS: cp
its own family's, sparse the kernel grids') reads theirs too. The output folder's tidy tables
(<output_dir>/tables/cells.csv and samples.csv), which the answers and a reader use, are the union
of the tables of every grid with records in the folder, their text one after another in the order
of the grids' names (the tables' first sort key), so the same whichever grids a run or a
regeneration asked for. Used by the workflow's rules (workflow/rules/report.smk) and by
`attnbench regenerate` alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..families import expand_cells
from ..grid.expand import cell_path
from ..report.collect import (
    OUTDATED,
    collect,
    collect_samples,
    read_records,
    samples_path,
    text_union,
    write_cells,
)
from .currency import judge, limits, outdated_column

TIDY = Path(".attnbench") / "tidy"
# The families whose figures read the rows of other grids (report.figures.Inputs.cells), and the
# families of those grids: cp's draw emulated cells of other grids at their points and one-GPU
# baselines over the same documents (families/cp/figures.py, companions); sparse's density figure
# draws dense full attention at each length from the kernel grids (report.against.answer_at). Kept
# here, not in the family's module: every cell's code includes that module, and editing it would
# make every record outdated.
READ_OTHER_GRIDS = {"cp": {"cp"}, "sparse": {"kernel"}}


def grid_table(out, grid: str) -> Path:
    """A grid's tidy table (its samples.csv beside it)."""
    return Path(out) / TIDY / grid / "cells.csv"


def union_table(out) -> Path:
    """The output folder's tidy table, every grid's rows (samples.csv beside it)."""
    return Path(out) / "tables" / "cells.csv"


def folder_grids(out) -> list[str]:
    """The grids with records under out/cells, by name."""
    folder = Path(out) / "cells"
    if not folder.is_dir():
        return []
    return sorted(g.name for g in folder.iterdir() if next(g.rglob("*.json"), None))


def family_of(cfg: dict, out, grid: str) -> str | None:
    """The grid's family: the config's, else the folder its records are in (cells/<grid>/<family>)."""
    if grid in cfg["grids"]:
        return cfg["grids"][grid]["family"]
    folder = Path(out) / "cells" / grid
    found = sorted(d.name for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
    return found[0] if len(found) == 1 else None


def drawn_from(cfg: dict, out, grid: str, grids) -> list[Path]:
    """The tidy tables a grid's figures read: its own, and where its family reads other grids'
    rows, those among `grids` of the families it reads; in the order of the grids' names."""
    family = family_of(cfg, out, grid)
    others = (
        [g for g in grids if g != grid and family_of(cfg, out, g) in READ_OTHER_GRIDS[family]]
        if family in READ_OTHER_GRIDS
        else []
    )
    return [grid_table(out, g) for g in sorted({grid, *others})]


def records_of(cfg: dict, out, grid: str, cells: dict | None = None) -> dict[str, dict | None]:
    """{record path: the cell the config names there} of a grid's records on disk: a config
    grid's cells (`cells`: its cells by record path, else expanded here) in their order; every
    *.json in the folder of a grid the config does not name (cell None: judged by itself)."""
    if grid not in cfg["grids"]:
        folder = Path(out) / "cells" / grid
        return dict.fromkeys(sorted(str(p) for p in folder.rglob("*.json")))
    if cells is None:
        cells = {str(Path(out) / cell_path(c)): c for c in expand_cells(cfg, [grid])}
    return {str(Path(p)): c for p, c in cells.items() if os.path.exists(p)}


@dataclass(frozen=True)
class GridTables:
    """A grid's tidy tables, as written."""

    grid: str
    cells: int  # rows: records
    samples: int


def grid_tables(cfg: dict, grid: str, records: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A grid's tidy tables from its records (records_of): one row per record with the
    `outdated` column (pipeline.currency), and one per record and sample. RecordError naming
    every file that is not its cell's record."""
    read = read_records(list(records)) if records else {}
    df = collect(records=read)
    df[OUTDATED] = outdated_column(
        df["record"], judge(records, limits(cfg, [grid]) if grid in cfg["grids"] else {})
    )
    return df, collect_samples(read)


def write_grid_tables(
    cfg: dict, out, grid: str, cells: dict | None = None, to: Path | None = None
) -> GridTables:
    """Write a grid's tidy tables (to: the cells table's path, default grid_table), each whole or
    not at all; the samples' table beside it (`samples.new.csv` beside `cells.new.csv`)."""
    df, samples = grid_tables(cfg, grid, records_of(cfg, out, grid, cells))
    path = Path(to or grid_table(out, grid))
    write_cells(df, path)
    write_cells(samples, sibling_samples(path))
    return GridTables(grid, len(df), len(samples))


def sibling_samples(cells_csv: Path) -> Path:
    """The samples table beside a cells table: samples.csv, or samples.new.csv beside cells.new.csv."""
    name = Path(cells_csv).name
    return Path(cells_csv).with_name(name.replace("cells", "samples", 1))


def write_union(tables, to: Path) -> tuple[int, int]:
    """The union of grids' tidy tables (their text, in the order given) and of their samples,
    written to `to` and the samples table beside it (sibling_samples); its (rows, sample rows)."""
    cells = text_union(tables)
    samples = text_union([samples_path(t) for t in tables])
    write_cells(cells, to)
    write_cells(samples, sibling_samples(to))
    return len(cells), len(samples)
