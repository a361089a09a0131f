"""The measured families, each one folder with the same small interface:

    NAME                     the family's name in config.yaml (`family:`)
    problems(cfg, grid, product, where) -> [str]     what is wrong with one product of a grid
    expand(cfg, grid_name) -> [cell]                 the grid's cells
    CELL_COMMAND             the `python -m attnbench` subcommand that runs one cell (`cell`: the
                             kernel rule runs it, kernels.smk; `cp-cell`: context_parallel.smk)
    record_skeleton(spec)    the record a cell starts with (as is for a cell stopped at its budget)
    provenance(spec)         the code and libraries a cell runs with (record.code; pipeline/currency.py)
    table_stems(grid), figure_stems(grid)            the files its tables and figures write
    tables.py, figures.py    its two modules (the same names in every family) holding
                             tables(df, out, samples) -> paths, table_captions(df) -> ({stem: text}, {stem: rst}),
                             figures(df, out, style, only, inputs) -> paths,
                             figure_captions(df, style, inputs) -> {stem: text}
                             (inputs: report.figures.Inputs: the per-sample table, the whole
                             tidy table, the grid's tables folder and settings)
    advice.ADVICE            what its answers are about (report.advice.AdviceFamily: point keys,
                             contenders, words), in its module advice.py

A new family is a new folder here and one line in FAMILIES. Families sit above the stages they
use (grid, harness, record, report) and import nothing from one another but the kernel family's
shared pieces. This module composes them: config loading with every family's checks, expansion,
and the drivers of the table and figure commands.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from importlib import import_module
from pathlib import Path

# name in config.yaml -> its folder (imported on first use, so a rule loads only its family)
FAMILIES = {
    "kernel": "kernel",
    "sparse": "sparse",
    "cp": "cp",
}


def family(name: str):
    """The family's module; ValueError naming the valid families."""
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; valid families: {', '.join(FAMILIES)}")
    return import_module(f"{__name__}.{FAMILIES[name]}")


def advice_of(name: str):
    """The family's AdviceFamily (its advice.py): what its answers are about (report.advice)."""
    return import_module(f"{family(name).__name__}.advice").ADVICE


def running_with(command: str) -> list[str]:
    """The families whose cells the given subcommand runs (the wildcard of their cell rule)."""
    return [name for name in FAMILIES if family(name).CELL_COMMAND == command]


def of_grid(grid: dict):
    return family(grid["family"])


# Every family has the same two modules: its tables and its figures (the report's drivers of the
# same names call them).
PARTS = {"TABLES": "tables", "FIGURES": "figures"}


def part_module(name: str, which: str) -> str:
    """The name of a family's TABLES or FIGURES module."""
    return f"{family(name).__name__}.{PARTS[which]}"


def command_modules(name: str, which: str) -> list[str]:
    """The modules the `tables` (which: TABLES) or `figures` (FIGURES) command of a family's grid
    runs beyond this one: the report's driver and the family's module, and for tables the advice
    every grid gets (what the rule's code inputs are computed from, attnbench.codegraph)."""
    report = f"{__package__.rsplit('.', 1)[0]}.report"
    every_grid = (
        [f"{report}.advice_text", f"{family(name).__name__}.advice"] if which == "TABLES" else []
    )
    return [f"{report}.{PARTS[which]}", part_module(name, which), *every_grid]


def part(name: str, which: str):
    """A family's TABLES or FIGURES module."""
    return import_module(part_module(name, which))


# ---------------------------------------------------------------- config and cells


def product_problems(cfg, grid, prod, fam, at) -> list[str]:
    """The family's own checks of one product of a grid (an unknown family is the problem)."""
    if fam not in FAMILIES:
        return [
            f"{at.split('.also[')[0]}.family: unknown family {fam!r}; valid families: {', '.join(FAMILIES)}"
        ]
    return family(fam).problems(cfg, grid, prod, at)


def validate(cfg: dict) -> dict:
    from ..grid.config import validate as validate_with

    return validate_with(cfg, product_problems)


def load_config(paths, overrides: dict | None = None, base=None) -> dict:
    """`paths` (one config file or several) validated with every family's checks (over `base`:
    grid.config.config_files)."""
    from ..grid.config import load_config as load_with

    return load_with(paths, product_problems, overrides, base)


def expand_grid(cfg: dict, gname: str) -> list[dict]:
    return of_grid(cfg["grids"][gname]).expand(cfg, gname)


def expand_cells(cfg: dict, grids=None) -> list[dict]:
    out = []
    for g in grids or cfg["run"]:
        out += expand_grid(cfg, g)
    return out


# Fewer draws than this per multi-draw mask on a GPU cannot say how often a winner wins.
GPU_DRAWS = 10


def plan_lines(cfg: dict, grids=None) -> list[str]:
    """Per grid: its cells, the device time its records on disk estimate (families.estimate),
    and a note where a GPU grid draws fewer than GPU_DRAWS masks per multi-draw mask."""
    from pathlib import Path

    from .. import masks as M
    from .estimate import estimate

    lines = []
    for g in grids or cfg["run"]:
        grid, cells = cfg["grids"][g], expand_grid(cfg, g)
        line = f"{g}: {len(cells)} cells"
        if grid["device"] == "cuda":
            line += "; " + estimate(cells, Path(cfg["output_dir"])).text()
        lines.append(line)
        drawn = sorted({c["mask"] for c in cells if M.pattern(c["mask"]).sample_class != "single"})
        if grid["device"] == "cuda" and drawn and grid["samples"]["document"] < GPU_DRAWS:
            lines.append(
                f"  note: {g} draws {grid['samples']['document']} masks per point of "
                f"{', '.join(drawn)} (samples.document); with fewer than {GPU_DRAWS} the paired "
                "answers cannot say how often a winner wins"
            )
    return lines


# ---------------------------------------------------------------- the files a grid writes


def table_stems(grid: dict) -> list[str]:
    """The family's tables, and the advice every grid gets (report.advice, written with them)."""
    from ..report.outputs import ADVICE_STEM

    return [*of_grid(grid).table_stems(grid), ADVICE_STEM]


def table_names(grid: dict) -> list[str]:
    from ..report.outputs import TABLE_FORMATS

    return [f"{stem}.{fmt}" for stem in table_stems(grid) for fmt in TABLE_FORMATS]


def figure_stems(grid: dict) -> list[str]:
    return of_grid(grid).figure_stems(grid)


def figure_names(grid: dict, formats) -> list[str]:
    return [f"{stem}.{fmt}" for stem in figure_stems(grid) for fmt in formats]


def figure_caption_names(grid: dict) -> list[str]:
    from ..report.outputs import CAPTION_SUFFIX

    return [f"{stem}{CAPTION_SUFFIX}" for stem in figure_stems(grid)]


def table_caption_names(grid: dict) -> list[str]:
    from ..report.outputs import CAPTION_SUFFIX

    return [f"{stem}{CAPTION_SUFFIX}" for stem in table_stems(grid)]


# ---------------------------------------------------------------- drivers of `tables` and `figures`


def register_own_classes(grid_cfg: dict | None) -> None:
    """Kernels and CP methods a grid names as 'module:Class' are drawn with their own registry
    entry (colour, marker, label) once imported; the tables and figures commands import them here."""
    from ..cp.catalog import resolve_method
    from ..grid.expand import grid_products
    from ..kernels.catalog import resolve

    for prod in grid_products(grid_cfg) if grid_cfg else ():
        for entries, register in (
            (prod.get("kernels", ()), resolve),
            (prod.get("methods", ()), resolve_method),
        ):
            for entry in entries:
                if ":" in entry:
                    register(entry)


def write_tables(cells_csv, out_dir, *, grid_cfg: dict | None = None, **where) -> list[Path]:
    """The grid's tables, written by its family, and a report caption per table
    (report.tables.write_tables; `where`: grid, family, missing: the record paths of the grid's
    cells without a record, which the captions list); the answers by grid_cfg's `report:`
    settings (grid.config.report_settings)."""
    from ..report.advice_text import write_advice
    from ..report.collect import read_samples
    from ..report.paired import Verdict, ruled_by
    from ..report.tables import write_tables as write_with

    def advice(df, out, grid, name):  # every grid's: the paired answers, from both tidy tables
        return write_advice(df, out, grid, advice_of(name), read_samples(cells_csv))

    register_own_classes(grid_cfg)
    tables_of = partial(part, which="TABLES")
    with naming_the_input("tables", cells_csv, where), ruled_by(Verdict.of(grid_cfg)):
        return write_with(
            cells_csv, out_dir, tables_of, grid_cfg=grid_cfg, every_grid=advice, **where
        )


def write_figures(cells_csv, out_dir, style=None, *, grid_cfg: dict | None = None, **where):
    """The grid's figures, drawn by its family, and their captions (report.figures.write_figures;
    `where`: grid, only, strict, missing)."""
    from ..report.figures import write_figures as write_with
    from ..report.paired import Verdict, ruled_by

    register_own_classes(grid_cfg)
    promised = figure_stems(grid_cfg) if grid_cfg is not None else None
    figures_of = partial(part, which="FIGURES")
    with naming_the_input("figures", cells_csv, where), ruled_by(Verdict.of(grid_cfg)):
        return write_with(
            cells_csv, out_dir, figures_of, style, promised, grid_cfg=grid_cfg, **where
        )


@contextmanager
def naming_the_input(what: str, cells_csv, where: dict):
    """Any failure of drawing becomes a ReportError naming the grid and the tidy table read (the
    error itself, chained, keeps its traceback)."""
    from ..report.collect import ReportError

    try:
        yield
    except ReportError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with the input named
        grid = where.get("grid")
        only = f" ({', '.join(sorted(where['only']))})" if where.get("only") else ""
        raise ReportError(
            f"the {what}{only} of {f'grid {grid}' if grid else 'every grid'} from {cells_csv} "
            f"failed: {type(e).__name__}: {e}"
        ) from e
