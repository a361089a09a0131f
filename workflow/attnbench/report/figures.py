"""Figures from the tidy table alone (never a record, never a GPU): PNG/PDF per grid, drawn by
the grid's family, and a caption per figure for the Snakemake report."""

from __future__ import annotations

from pathlib import Path

from . import captions
from .collect import grid_rows
from .plotting import apply_theme


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
) -> list[Path]:
    """Draw a grid's figures with its family's module (`part_of(family)`: its figures(df, out,
    style, only) and figure_captions(df, style)), and their captions. `only`: just these stems, so
    regeneration can share the figures among processes. `strict`: fail unless every promised
    figure (stems) was written; off when regenerating from an incomplete set of records, whose
    missing record paths (`missing`) the captions list."""
    style = apply_theme(style)
    df, name = grid_rows(cells_csv, grid, None, grid_cfg)
    part = part_of(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = part.figures(df, out, style, only)
    whats = part.figure_captions(df, style)
    if (
        strict and promised is not None
    ):  # make sure the files Snakemake expects are the ones written
        stems = [s for s in promised if only is None or s in only]
        expected = {out / f"{s}.{fmt}" for s in stems for fmt in style["formats"]}
        missing = expected - set(paths)
        if missing:
            raise RuntimeError(f"figures not produced: {sorted(map(str, missing))}")
    stems = list(dict.fromkeys(Path(p).stem for p in paths))
    return paths + captions.write_captions(
        out,
        stems,
        whats,
        df,
        kind="figure",
        grid=grid,
        grid_cfg=grid_cfg,
        source=cells_csv,
        missing=missing,
    )
