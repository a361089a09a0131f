"""The tidy tables, tables and figures from the records on disk, running no cell: `python -m
attnbench regenerate` (`make figures`), and a run that ended with cells missing, which still draws
what finished (workflow/rules/common.smk).

As the workflow's rules do (pipeline/tidy.py): every grid with records in the output folder gets
its own tidy tables, from its records alone (a grid of the config: the cells it names; another
grid's folder: every record there); the output folder's tidy tables are their union, so that
running or regenerating one grid never drops another's rows; each grid is drawn from its own
(and, where its family reads them, its family's other grids'). The `outdated` column names the
records a run would not make as they are (attnbench.pipeline.currency); the captions count them.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..families import expand_cells, figure_stems, write_figures, write_tables
from ..grid.expand import cell_path
from ..report.collect import ReportError, TidyFiles, read_cells, read_samples
from ..terminal import bar
from .tidy import (
    drawn_from,
    folder_grids,
    grid_table,
    union_table,
    write_grid_tables,
    write_union,
)


def write_tidy_tables(cfg: dict, out: Path) -> list[str]:
    """Every grid's tidy tables in the output folder (those with records there) and their union
    (tables/cells.csv, samples.csv); the grids, by name."""
    grids = folder_grids(out)
    for g in grids:
        write_grid_tables(cfg, out, g)
    write_union([grid_table(out, g) for g in grids], union_table(out))
    return grids


@dataclass(frozen=True)
class Drawn:
    """What a regeneration drew from."""

    records: int  # of the grids drawn
    expected: int  # cells the grids name
    other_rows: int  # rows of other grids in the tidy table
    missing: dict  # grid -> record paths of its cells without a record
    grids: tuple  # the grids drawn (those with a record)
    tasks: int


@dataclass(frozen=True)
class DrawTask:
    """One piece of drawing: a grid's tables, or some of its figures."""

    kind: str  # "tables" or "figures"
    cells: tuple  # the tidy tables it reads (tidy.drawn_from)
    out_dir: Path
    grid: str
    only: frozenset | None  # figures: just these stems
    complete: bool  # every record of the grid there: every promised figure must be written
    missing: tuple  # the record paths of the grid's cells without one


def _part(task: DrawTask, cfg: dict) -> DrawTask:
    """One piece of drawing, run in a worker."""
    grid_cfg = {**cfg["grids"][task.grid], "report": cfg.get("report", {})}  # the verdict's
    out = Path(cfg["output_dir"])
    where = dict(grid=task.grid, grid_cfg=grid_cfg, missing=task.missing, source=union_table(out))
    if task.kind == "tables":
        write_tables(TidyFiles(task.cells), task.out_dir, **where)
    else:
        write_figures(
            TidyFiles(task.cells),
            task.out_dir,
            cfg["figures"],
            only=task.only,
            strict=task.complete,
            tables_dir=out / "tables" / task.grid,
            **where,
        )
    return task


def drawing_tasks(cfg, grids, out: Path, missing: dict, tabled) -> list[DrawTask]:
    """Tables and figures of each grid as independent tasks, the costliest first (memory figures,
    then the mask-family figures); a kernel grid's figures one task each. A grid with missing
    records draws what it can (not every promised figure), and its captions list them. `tabled`:
    the grids with tidy tables (what a grid's figures may read beside its own)."""
    tasks = []
    for g in grids:
        grid, gone, complete = cfg["grids"][g], tuple(missing.get(g, ())), not missing.get(g)
        figures_read = tuple(drawn_from(cfg, out, g, tabled))
        stems = figure_stems(grid) if grid["family"] == "kernel" else [None]
        stems.sort(
            key=lambda s: (not str(s).startswith("memory"), not str(s).startswith("tflops_vs"))
        )
        tasks += [
            DrawTask(
                "figures",
                figures_read,
                out / "figures" / g,
                g,
                None if s is None else frozenset({s}),
                complete,
                gone,
            )
            for s in stems
        ]
        own = (grid_table(out, g),)
        tasks.append(DrawTask("tables", own, out / "tables" / g, g, None, complete, gone))
    return tasks


def regenerate(cfg: dict, grids=None, jobs: int = 1, say=print) -> Drawn:
    """Write the output folder's tidy tables (each grid's, and their union) and the grids'
    tables and figures from the records on disk. ValueError when none of the grids' records is
    there; RecordError, ReportError as collect and drawing raise them."""
    t0 = time.perf_counter()
    out = Path(cfg["output_dir"])
    grids = list(grids or cfg["run"])
    cells = {str(out / cell_path(c)): c for c in expand_cells(cfg, grids)}
    present = [p for p in cells if Path(p).exists()]
    if not present:
        raise ValueError(
            f"none of the {len(cells)} records of grids {', '.join(grids)} is under {out}/cells"
        )
    missing = {}
    for p, c in cells.items():
        if p not in present:
            missing.setdefault(c["grid"], []).append(p)
    if missing:
        n = sum(map(len, missing.values()))
        say(f"{n} of {len(cells)} cells have no record yet; they are left out")
    tabled = write_tidy_tables(cfg, out)
    df = read_cells(union_table(out))
    samples = len(read_samples(union_table(out)))
    other = int((~df["grid"].isin(grids)).sum())
    t1 = time.perf_counter()
    say(
        f"{len(present)} records -> {out}/tables/cells.csv and samples.csv ({samples} "
        f"samples) in {t1 - t0:.1f} s"
        + (f" (and {other} rows of other grids' records there)" if other else "")
    )
    drawn = [g for g in grids if g in set(df["grid"])]
    tasks = drawing_tasks(cfg, drawn, out, missing, tabled)
    draw = partial(_part, cfg=cfg)
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            list(bar(pool.map(draw, tasks), len(tasks), "tables and figures"))
    else:
        for t in bar(tasks, len(tasks), "tables and figures"):
            draw(t)
    say(
        f"tables and figures of {', '.join(drawn)} ({len(tasks)} tasks, {jobs} processes) in "
        f"{time.perf_counter() - t1:.1f} s"
    )
    return Drawn(len(present), len(cells), other, missing, tuple(drawn), len(tasks))


def write_report(cfg: dict, grids: list, report: Path, snakefile: str) -> None:
    """`snakemake --report` over the same config (the grids regenerated), running nothing; a
    ReportError carries Snakemake's output where it fails."""
    import subprocess
    import sys
    import tempfile

    import yaml

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({**cfg, "run": list(grids)}, f)
    try:
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", snakefile]
        cmd += ["--configfile", f.name, "--cores", "1", "--report", str(report)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            raise ReportError(f"snakemake --report failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    finally:
        Path(f.name).unlink()
