"""The report rules' commands: `collect` (records -> the tidy table), `tables` and `figures` (the
tidy table -> one grid's files)."""

from __future__ import annotations

import sys

from ..families.cell_entry import json_option
from .common import exit_naming_input, known_grids


def cmd_collect(a):
    from ..report.collect import RecordError, collect, write_cells

    try:
        df = collect(a.records, a.root)
    except RecordError as e:
        sys.exit(f"collect: {e}")
    write_cells(df, a.out)
    print(f"{len(df)} cells -> {a.out}")


def grid_of_table(a) -> None:
    """tables, figures: --grid one of the tidy table's grids, before any file is written."""
    from ..report.collect import read_cells

    if a.grid:
        grids = [str(g) for g in dict.fromkeys(read_cells(a.cells)["grid"])]
        known_grids(a.cmd, "--grid", [a.grid], grids, f"in {a.cells}")


def tidy_files(a) -> None:
    """tables, figures: --cells as one tidy table of its files (their union, named by them)."""
    from ..report.collect import TidyFiles

    a.cells = TidyFiles(a.cells)


def cmd_tables(a):
    from ..families import write_tables
    from ..report.collect import ReportError

    grid_cfg = json_option(a, "grid_config")
    tidy_files(a)
    try:
        grid_of_table(a)
        where = dict(grid=a.grid, grid_cfg=grid_cfg, source=a.source)
        for p in write_tables(a.cells, a.out_dir, **where):
            print(p)
    except ReportError as e:
        exit_naming_input("tables", e)


def cmd_figures(a):
    from ..families import write_figures
    from ..report.collect import ReportError

    style = json_option(a, "style") or {}
    grid_cfg = json_option(a, "grid_config")
    tidy_files(a)
    try:
        grid_of_table(a)
        where = dict(grid=a.grid, grid_cfg=grid_cfg, source=a.source, tables_dir=a.tables_dir)
        for p in write_figures(a.cells, a.out_dir, style, **where):
            print(p)
    except ReportError as e:
        exit_naming_input("figures", e)


def _report_parser(sub, name, what, fn, grid_config_help):
    """A command that reads the tidy table and writes one grid's report files (tables, figures)."""
    c = sub.add_parser(name, help=what)
    c.add_argument(
        "--cells",
        required=True,
        nargs="+",
        help="the tidy table (samples.csv beside it), or several read as their union",
    )
    c.add_argument("--out-dir", required=True, help="the folder the grid's files go to")
    c.add_argument("--grid", help="only this grid's cells")
    c.add_argument("--grid-config", help=grid_config_help)
    c.add_argument("--source", help="the tidy table the captions name (default: --cells)")
    c.set_defaults(fn=fn)
    return c


def add_parsers(sub) -> None:
    c = sub.add_parser("collect", help="cell records -> one tidy CSV")
    c.add_argument("records", nargs="*", help="record files")
    c.add_argument("--root", help="collect every record under this folder instead")
    c.add_argument("--out", required=True, help="the tidy table (CSV) written")
    c.set_defaults(fn=cmd_collect)
    _report_parser(
        sub,
        "tables",
        "tidy CSV -> Markdown and LaTeX tables",
        cmd_tables,
        "the grid's config as JSON (its family and description)",
    )
    c = _report_parser(
        sub,
        "figures",
        "tidy CSV -> PNG and PDF figures",
        cmd_figures,
        "the grid's config as JSON (checks the expected files were written)",
    )
    c.add_argument("--style", help="figure style settings as JSON")
    c.add_argument(
        "--tables-dir", help="the grid's tables folder (default: <--cells folder>/<grid>)"
    )
