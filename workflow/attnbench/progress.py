"""What a person reads while a run goes and when it ends: one line per finished cell (grid, cell,
status, its seconds, the counts so far by status, the time left), then a closing summary (counts
by status per grid, the cells that crashed or have no record with their logs, where the outputs
are, what to run next). The workflow calls these (workflow/rules/common.smk); torch-free.

The time left is estimated from the run itself: the wall time since the run began, per cell
finished, times the cells left; until a cell has finished, from the records of the same cells in
other grids of the output folder (families.estimate), where there are some."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .record.record import outcome_details
from .record.status import CRASHED


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


@dataclass
class Progress:
    """A run's cells and those finished so far in it."""

    cells: dict  # record path -> cell (the run's, whatever is on disk)
    todo: int  # cells the run set out to make (those it planned)
    started: float = field(default_factory=time.monotonic)
    done: dict = field(default_factory=dict)  # record path -> status, in this run
    estimate_s: float | None = None  # the records' estimate of the todo cells, where known

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
        cell = self.cells[path]
        seconds = record.get("wall_s")
        took = f" in {seconds:.1f} s" if isinstance(seconds, int | float) else ""
        details = outcome_details(record)
        counts = ", ".join(f"{n} {s}" for s, n in Counter(self.done.values()).most_common())
        left = self.todo - len(self.done)
        return (
            f"{cell['grid']}: {Path(path).parent.parent.name}/{Path(path).parent.name}/"
            f"{Path(path).stem}: {status}{took}{f' ({details})' if details else ''} | "
            f"{len(self.done)} of {self.todo} done ({counts}){self.left_text(left)}"
        )

    def left_text(self, left: int) -> str:
        if left <= 0:
            return ""
        if self.done:
            per_cell = (time.monotonic() - self.started) / len(self.done)
            return f"; about {duration(per_cell * left)} left"
        if self.estimate_s is not None:
            return f"; about {duration(self.estimate_s)} left (from earlier records)"
        return ""


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
        f"{out}/tables/cells.csv --mask MASK --seqlen 32K (the answer for your case); "
        "make report (the HTML report); make figures (redraw, no cell runs)"
        + ("; the same snakemake command again (retries what crashed or is missing)" if crashed or missing else ""),
    ]  # fmt: skip
    return lines
