"""The tidy table, tables and figures from the records on disk, running no cell: `python -m
attnbench regenerate` (`make figures`), the workflow's collect rule (tidy_table), and a run that
ended with cells missing, which still draws what finished (workflow/rules/common.smk).

The tidy table of an output folder is the union of every grid's records there: the records of the
grids drawn now (the cells their config names), and every record of the other grids' folders under
<output_dir>/cells, so that running one grid never drops another's rows. Its `outdated` column
names the records a run would not make as they are (attnbench.pipeline.currency); the captions count them.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..families import expand_cells, figure_stems, write_figures, write_tables
from ..grid.expand import cell_path
from ..report.collect import (
    ReportError,
    collect,
    collect_samples,
    read_records,
    samples_path,
    write_cells,
)
from ..terminal import bar
from .currency import judge, limits, outdated_column


def other_grid_records(out: Path, grids) -> list[str]:
    """Every record under out/cells of a grid not among `grids`."""
    folder = Path(out) / "cells"
    if not folder.is_dir():
        return []
    return sorted(
        str(p)
        for g in sorted(folder.iterdir())
        if g.is_dir() and g.name not in grids
        for p in g.rglob("*.json")
    )


def folder_cells(cfg: dict, out: Path) -> dict:
    """{record path: cell} of every grid of the config that has records under out/cells, in the
    config's order of grids: what the tidy table is made of, whichever grids a run or a
    regeneration asked for (the table does not depend on which)."""
    folder = Path(out) / "cells"
    grids = [g for g in cfg["grids"] if (folder / g).is_dir()]
    if not grids:
        return {}
    return {str(Path(out) / cell_path(c)): c for c in expand_cells(cfg, grids)}


def tidy_table(out: Path, cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The output folder's tidy tables: the records on disk of every config grid's cells
    (folder_cells), and every record of the folders of grids the config does not name; the
    cells' table with the `outdated` column, and the per-sample table. The same tables whichever
    grids were run or asked for. RecordError (naming the file) where a file is not its cell's
    record."""
    cells = folder_cells(cfg, out)
    grids = {c["grid"] for c in cells.values()}
    ours = [p for p in cells if Path(p).exists()]
    others = other_grid_records(out, set(cfg["grids"]))
    records = read_records(ours + others)
    df = collect(records=records)
    outdated = judge({p: cells[p] for p in ours}, limits(cfg, grids)) + judge(
        dict.fromkeys(others), {}
    )
    df["outdated"] = outdated_column(df["record"], outdated)
    return df, collect_samples(records)


def write_tidy_tables(df: pd.DataFrame, samples: pd.DataFrame, cells_csv) -> None:
    """cells.csv and samples.csv beside it, each whole or not at all."""
    write_cells(df, cells_csv)
    write_cells(samples, samples_path(cells_csv))


@dataclass(frozen=True)
class Drawn:
    """What a regeneration drew from."""

    records: int  # of the grids drawn
    expected: int  # cells the grids name
    other_rows: int  # rows of other grids in the tidy table
    missing: dict  # grid -> record paths of its cells without a record
    grids: tuple  # the grids drawn (those with a record)
    tasks: int


def _part(task):
    """One piece of drawing (a grid's tables, or some of its figures), run in a worker."""
    kind, cells, out_dir, cfg, grid, only, complete, missing = task
    grid_cfg = {**cfg["grids"][grid], "report": cfg.get("report", {})}  # the verdict's settings
    if kind == "tables":
        write_tables(cells, out_dir, grid=grid, grid_cfg=grid_cfg, missing=missing)
    else:
        write_figures(
            cells,
            out_dir,
            cfg["figures"],
            grid=grid,
            grid_cfg=grid_cfg,
            only=only,
            strict=complete,
            missing=missing,
        )
    return task


def drawing_tasks(cfg, grids, out: Path, missing: dict) -> list:
    """Tables and figures of each grid as independent tasks, the costliest first (memory figures,
    then the mask-family figures); a kernel grid's figures one task each. A grid with missing
    records draws what it can (not every promised figure), and its captions list them."""
    cells = out / "tables" / "cells.csv"
    tasks = []
    for g in grids:
        grid, gone, complete = cfg["grids"][g], tuple(missing.get(g, ())), not missing.get(g)
        stems = figure_stems(grid) if grid["family"] == "kernel" else [None]
        stems.sort(
            key=lambda s: (not str(s).startswith("memory"), not str(s).startswith("tflops_vs"))
        )
        tasks += [
            (
                "figures",
                cells,
                out / "figures" / g,
                cfg,
                g,
                None if s is None else {s},
                complete,
                gone,
            )
            for s in stems
        ]
        tasks.append(("tables", cells, out / "tables" / g, cfg, g, None, complete, gone))
    return tasks


def regenerate(cfg: dict, grids=None, jobs: int = 1, say=print) -> Drawn:
    """Write the output folder's tidy table and the grids' tables and figures from the records on
    disk. ValueError when none of the grids' records is there; RecordError, ReportError as
    collect and drawing raise them."""
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
    df, samples = tidy_table(out, cfg)
    write_tidy_tables(df, samples, out / "tables" / "cells.csv")
    other = int((~df["grid"].isin(grids)).sum())
    t1 = time.perf_counter()
    say(
        f"{len(present)} records -> {out}/tables/cells.csv and samples.csv ({len(samples)} "
        f"samples) in {t1 - t0:.1f} s"
        + (f" (and {other} rows of other grids' records there)" if other else "")
    )
    drawn = [g for g in grids if g in set(df["grid"])]
    tasks = drawing_tasks(cfg, drawn, out, missing)
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            list(bar(pool.map(_part, tasks), len(tasks), "tables and figures"))
    else:
        for t in bar(tasks, len(tasks), "tables and figures"):
            _part(t)
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
