"""Figures from the tidy tables alone (never a record, never a GPU): PNG/PDF per grid, drawn by
the grid's family, and a caption per figure for the Snakemake report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import captions
from .collect import SAMPLE_COLUMNS, grid_rows, read_cells, read_samples, table_files
from .plotting import apply_theme


@dataclass(frozen=True)
class Inputs:
    """What a grid's figures may read beyond its own rows of cells.csv."""

    # the per-sample table beside cells.csv (the grid's cells' draws)
    samples: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SAMPLE_COLUMNS))
    # the whole tidy table: cells of other grids over the same documents (a CP cell's one-GPU
    # baseline, emulated cells of the same points); empty where not given
    cells: pd.DataFrame = field(default_factory=pd.DataFrame)
    # the grid's tables folder (tables/<grid>/: the CP model's tables, where it ran); None: none
    tables_dir: Path | None = None
    # the grid's settings (report_settings: e.g. its reference kernel)
    grid_cfg: dict = field(default_factory=dict)


def read_inputs(cells_csv, grid: str | None, grid_cfg: dict | None, tables_dir=None) -> Inputs:
    """The Inputs of a grid's figures from the tidy table at `cells_csv` (its files) and the
    samples beside it; the grid's tables folder `tables_dir`, by default beside the first file."""
    if tables_dir is None and grid:
        tables_dir = table_files(cells_csv)[0].parent / grid
    return Inputs(
        samples=read_samples(cells_csv),
        cells=read_cells(cells_csv),
        tables_dir=Path(tables_dir) if tables_dir else None,
        grid_cfg=dict(grid_cfg or {}),
    )


def write_figures(
    cells_csv,
    out_dir,
    part_of,
    style=None,
    promised=None,
    grid: str | None = None,
    grid_cfg: dict | None = None,
    only=None,
    strict: bool = True,
    missing=(),
    source=None,
    tables_dir=None,
) -> list[Path]:
    """Draw a grid's figures with its family's module (`part_of(family)`: its figures(df, out,
    style, only, inputs) and figure_captions(df, style, inputs)), and their captions. `only`: just
    these stems, so regeneration can share the figures among processes. `strict`: fail unless
    every promised figure (stems) was written; off when regenerating from an incomplete set of
    records, whose missing record paths (`missing`) the captions list. `source`: the tidy table
    the captions name (default: cells_csv); `tables_dir`: the grid's tables folder (read_inputs)."""
    style = apply_theme(style)
    df, name = grid_rows(cells_csv, grid, None, grid_cfg)
    inputs = read_inputs(cells_csv, grid, grid_cfg, tables_dir)
    part = part_of(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = part.figures(df, out, style, only, inputs)
    whats = part.figure_captions(df, style, inputs)
    if (
        strict and promised is not None
    ):  # make sure the files Snakemake expects are the ones written
        stems = [s for s in promised if only is None or s in only]
        expected = {out / f"{s}.{fmt}" for s in stems for fmt in style["formats"]}
        not_written = expected - set(paths)
        if not_written:
            raise RuntimeError(f"figures not produced: {sorted(map(str, not_written))}")
    stems = list(dict.fromkeys(Path(p).stem for p in paths))
    return paths + captions.write_captions(
        out,
        stems,
        whats,
        df,
        kind="figure",
        grid=grid,
        grid_cfg=grid_cfg,
        source=source or cells_csv,
        missing=missing,
    )
