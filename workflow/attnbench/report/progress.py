"""What a person reads while a run goes and when it ends: one line per finished cell (grid, cell,
status, its seconds, the counts so far by status, the time left), then a closing summary (counts
by status per grid, the cells that crashed or have no record with their logs, where the outputs
are, what to run next). The workflow calls these (workflow/rules/common.smk); torch-free.

The time left: each cell counted at its reference seconds (REFERENCE_S: by family, and per unit
of work: length squared, heads, head dim, repetitions, a backward's extra; a run goes shortest
first, so the cells left are longer than those done, and a CP cell costs ten kernel cells), at
the rate this run has shown so far (its elapsed seconds over the reference seconds of the cells it
finished: this machine's speed, its cores, its load); plus the tables and figures, as long as the
last run into the folder took for them (kept in REPORT_SECONDS) where it is known, else at
REPORT_REFERENCE_S per grid the run draws, at the same rate. Until a cell
has finished, from the records of the same cells in other grids of the output folder
(families.estimate), where there are some."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..record.record import outcome_details
from ..status import CRASHED


def log_of(record_path: str) -> str:
    """A cell's log, beside the records: <out>/logs/cells/... for <out>/cells/...json."""
    p = Path(record_path)
    i = len(p.parts) - 1 - p.parts[::-1].index("cells")
    return str(Path(*p.parts[:i], "logs", *p.parts[i:]).with_suffix(".log"))


def duration(seconds: float) -> str:
    """'45 s', '12 min', '3.4 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# The seconds the last run into an output folder took after its last cell (the tidy table,
# tables and figures), kept for the next run's time left: OUT/REPORT_SECONDS.
REPORT_SECONDS = ".attnbench/report_seconds.json"


def cell_work(cell: dict) -> float:
    """A cell's work, up to a factor: what its time grows with (the fit finds how much)."""
    seqlen = cell.get("seqlen") or cell.get("tokens_per_gpu", 1) * cell.get("gpus", 1)
    calls = cell.get("warmup", 0) + cell.get("reps", 1)
    backward = 3.5 if cell.get("direction") in ("bwd", "fwdbwd") else 1.0
    return float(seqlen) ** 2 * cell.get("heads_q", 1) * cell.get("head_dim", 1) * calls * backward


def fitted_rates(counts: list[dict], elapsed: list[float]) -> dict:
    """Seconds per unit of each feature (a family's cells, WORK) such that at each finish so far
    elapsed = sum of rate x what was done by then, by least squares, no rate below 0 (a feature
    whose rate comes out negative is left out and the rest fitted again). In elapsed time, so that
    what a cell's own seconds leave out (its process's start, Snakemake's scheduling, cells run at
    once) is in."""
    names = sorted({k for c in counts for k in c})
    t = np.asarray(elapsed, dtype=float)
    while names:
        x = np.array([[c.get(k, 0.0) for k in names] for c in counts], dtype=float)
        scale = np.maximum(np.abs(x).max(axis=0), 1e-300)
        rates = np.linalg.lstsq(x / scale, t, rcond=None)[0] / scale
        if (rates >= 0).all():
            return dict(zip(names, rates.tolist()))
        names = [k for k, r in zip(names, rates) if r > 0] or names[:0]
    return {}


def features(cell: dict) -> dict:
    """What a cell adds to a run's time: one cell of its family, and its work."""
    return {cell.get("family", "kernel"): 1.0, WORK: cell_work(cell)}


WORK = "work"
# A CPU cell's share of a run's elapsed seconds, by family and per work: fitted_rates over the
# finishes of a clean clone's `make run` (tests/make_run_cells.tsv: 220 cells, a shared 2-core VM,
# 2026-12-07; tests/test_progress.py fits them again). Only their ratios matter: a run scales
# them by its own rate. A GPU cell counts one unit: its time is not the CPU's shape.
REFERENCE_S = {"kernel": 0.809, "sparse": 0.653, "cp": 8.53, WORK: 8.68e-9}


# The tables' and figures' seconds per grid, in the same units: the run REFERENCE_S was fitted on
# took 32.7 s after its last cell for its 3 grids (tests/make_run_cells.tsv). For a first run into
# a folder, before one has been timed there.
REPORT_REFERENCE_S = 32.7 / 3


def reference_seconds(cell: dict) -> float:
    if cell.get("device", "cpu") != "cpu":
        return 1.0
    f = features(cell)
    return sum(v * REFERENCE_S.get(k, REFERENCE_S["kernel"]) for k, v in f.items())


@dataclass
class Progress:
    """A run's cells and those finished so far in it."""

    cells: dict  # record path -> cell (the run's, whatever is on disk)
    todo: list  # the record paths of the cells the run set out to make (those it planned)
    started: float = field(default_factory=time.monotonic)
    done: dict = field(default_factory=dict)  # record path -> status, in this run
    estimate_s: float | None = None  # the records' estimate of the todo cells, where known
    report_s: float | None = None  # the tables' and figures' seconds, from the last run
    clock: object = time.monotonic  # a fake one in tests
    reference_done: float = 0.0  # REFERENCE_S of the cells finished
    last_done: float | None = None  # clock() when the last cell finished

    def __post_init__(self):
        self.todo = list(self.todo)

    def line(self, path: str) -> str | None:
        """The line for a cell whose record was just written; None for one already told."""
        if path in self.done or path not in self.cells:
            return None
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return f"cell {path}: no readable record"
        status = record.get("status", "?")
        self.done[path] = status
        self.last_done = self.clock()
        cell = self.cells[path]
        self.reference_done += reference_seconds(cell)
        seconds = record.get("wall_s")
        took = f" in {seconds:.1f} s" if isinstance(seconds, int | float) else ""
        details = outcome_details(record)
        counts = ", ".join(f"{n} {s}" for s, n in Counter(self.done.values()).most_common())
        return (
            f"{cell['grid']}: {Path(path).parent.parent.name}/{Path(path).parent.name}/"
            f"{Path(path).stem}: {status}{took}{f' ({details})' if details else ''} | "
            f"{len(self.done)} of {len(self.todo)} done ({counts}){self.left_text()}"
        )

    def left_s(self) -> float | None:
        """The seconds left: the cells left counted at REFERENCE_S (relative costs), at this run's
        rate so far (its elapsed seconds over the reference seconds of the cells it finished),
        and the tables and figures (where the last run measured them); None while nothing
        tells."""
        left = [p for p in self.todo if p not in self.done and p in self.cells]
        if not left:
            return None
        if not self.done:
            return self.estimate_s
        rate = (self.last_done - self.started) / max(self.reference_done, 1e-9)
        ahead = rate * sum(reference_seconds(self.cells[p]) for p in left)
        if self.report_s is not None:
            return ahead + self.report_s
        # the grids whose tables and figures this run draws: those of the cells it makes
        grids = {self.cells[p].get("grid") for p in self.todo if p in self.cells}
        return ahead + rate * REPORT_REFERENCE_S * len(grids)

    def left_text(self) -> str:
        s = self.left_s()
        if s is None:
            return ""
        if not self.done:
            return f"; about {duration(s)} left (from earlier records)"
        return f"; about {duration(s)} left"


def report_seconds(out: str) -> float | None:
    """The tables' and figures' seconds the last run into `out` took, or None."""
    try:
        return float(json.loads((Path(out) / REPORT_SECONDS).read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep_report_seconds(out: str, progress: Progress) -> None:
    """At a run's successful end: the time since its last cell, for the next run's time left."""
    if progress.last_done is None:
        return
    path = Path(out) / REPORT_SECONDS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seconds": round(progress.clock() - progress.last_done, 1)}))


@dataclass(frozen=True)
class GridCounts:
    grid: str
    statuses: dict  # status -> cells
    missing: int


def counts_by_grid(cells: dict) -> list[GridCounts]:
    """Each grid's cells by their records' status, and those without a record."""
    by: dict[str, Counter] = {}
    missing: Counter = Counter()
    for path, cell in cells.items():
        g = cell["grid"]
        by.setdefault(g, Counter())
        try:
            by[g][json.loads(Path(path).read_text())["status"]] += 1
        except FileNotFoundError:
            missing[g] += 1
        except (OSError, ValueError, KeyError, TypeError):
            by[g]["unreadable"] += 1
    return [GridCounts(g, dict(c.most_common()), missing[g]) for g, c in by.items()]


def example_question(cells: dict) -> str:
    """advise's mask and length options for a question these cells answer: the longest length of
    the kernel cells (of any where there are none), causal where it was measured there."""
    timed = [c for c in cells.values() if c.get("seqlen") and c.get("mask")]
    kernel = [c for c in timed if c.get("family") == "kernel"] or timed
    if not kernel:
        return "--mask MASK --seqlen 32K"
    longest = max(c["seqlen"] for c in kernel)
    masks = sorted({c["mask"] for c in kernel if c["seqlen"] == longest})
    mask = "causal" if "causal" in masks else masks[0]
    length = f"{longest // 1024}K" if longest % 1024 == 0 else str(longest)
    return f"--mask {mask} --seqlen {length}"


def closing_summary(cells: dict, out: str, report_outputs=(), listed: int = 10) -> list[str]:
    """The lines a run ends with: per grid its cells by status; every crashed cell and every cell
    without a record (the first `listed` of each) with its log; where the tidy table, tables,
    figures and report are; the next commands."""
    lines = ["summary:"]
    for g in counts_by_grid(cells):
        counts = ", ".join(f"{n} {s}" for s, n in g.statuses.items()) or "none"
        gone = f", {g.missing} without a record" if g.missing else ""
        lines.append(f"  {g.grid}: {counts}{gone}")
    crashed, missing = [], []
    for path in cells:
        if not Path(path).exists():
            missing.append(path)
            continue
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if record.get("status") == CRASHED:
            crashed.append(path)
    for what, paths in (("crashed (the next run retries them)", crashed), ("without a record (their job failed or did not run)", missing)):  # fmt: skip
        if paths:
            lines.append(f"  {len(paths)} {what}:")
            lines += [f"    {p} (log: {log_of(p)})" for p in paths[:listed]]
            if len(paths) > listed:
                lines.append(f"    ... and {len(paths) - listed} more")
    lines += [
        f"  tidy tables: {out}/tables/cells.csv, {out}/tables/samples.csv; tables: "
        f"{out}/tables/<grid>/ (advice.md: the answers); figures: {out}/figures/<grid>/",
        "  next: python -m attnbench advise --cells "
        f"{out}/tables/cells.csv {example_question(cells)} (the answer for your case); "
        "make report (the HTML report); make figures (redraw, no cell runs)"
        + ("; the same snakemake command again (retries what crashed or is missing)" if crashed or missing else ""),
    ]  # fmt: skip
    return lines
