"""How long a grid's cells will take, estimated from records already on disk of the same cells (any
grid: the same kernel, mask, length, heads, head dim, dtype and direction), before anything runs.

A kernel record times its phases per sample (kernels/cell.py: mask, inputs, prepare, first call,
timed, memory, check). A new cell of the same point is estimated as the first call once, the timed
phase scaled to its warm-ups + repetitions, the other phases per sample, the check per checked
sample. Records without phases (context parallelism) are scaled by their wall time per sample.
Each cell also takes its start (its job, the hand-over to the warm worker, its record's writing),
which no phase holds: the mean time between one record's end and the next one's start in the same
worker, over the kernel records in the folder (start_seconds). What no record informs is counted,
not guessed."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path

from ..grid.expand import cell_path
from ..grid.spec import CellSpec
from ..harness.samples import checked_samples, n_samples

PER_SAMPLE = ("mask", "inputs", "prepare", "memory")


@dataclass(frozen=True)
class Estimate:
    """A grid's estimated time: seconds over the cells a record informs, and what informs it."""

    seconds: float
    informed: int  # cells with a record of the same point to estimate from
    cells: int
    sources: tuple[str, ...]  # the grids whose records were used
    start_s: float = 0.0  # each cell's start, included in seconds (start_seconds)

    def text(self) -> str:
        if not self.informed:
            return f"no records of the same cells to estimate from (of {self.cells} cells)"
        minutes = self.seconds / 60
        rest = self.cells - self.informed
        return (
            f"estimated {minutes:.0f} min of device time for {self.informed} of {self.cells} cells "
            f"(from records of the same points in {', '.join(self.sources)}: their per-sample "
            f"phases scaled to this grid's draws and repetitions, and {self.start_s:.1f} s per "
            "cell to start it, as between records of one worker)"
            + (f"; {rest} cells have no such record" if rest else "")
        )


# A longer pause between two records of one worker is not a cell's start (the run was waiting).
MAX_START_S = 60.0


@cache
def start_seconds(out: Path) -> float:
    """The mean seconds from one kernel record's end to the next one's start in the same warm
    worker (same host and process), over the records under `out`: what running a cell costs
    beyond its measured phases. 0.0 where no worker wrote two records in a row."""
    runs = defaultdict(list)
    for path in out.glob("cells/*/kernel/*/*/*.json"):
        try:
            r = json.loads(path.read_text())
            worker = (r.get("environment", {}).get("host"), r["worker"]["pid"])
            runs[worker].append(
                (datetime.fromisoformat(r["started_at"]), datetime.fromisoformat(r["finished_at"]))
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a record, or not one a worker wrote
    gaps = []
    for spans in runs.values():
        spans.sort()
        gaps += [
            g
            for (_, end), (start, _) in zip(spans, spans[1:])
            if 0 <= (g := (start - end).total_seconds()) <= MAX_START_S
        ]
    return sum(gaps) / len(gaps) if gaps else 0.0


def _same_point(out: Path, cell: dict) -> list[Path]:
    """Records of other grids at the cell's point (same family, kernel, mask and file name)."""
    own = Path(cell_path(cell))
    pattern = str(Path("cells", "*", *own.parts[2:]))
    return sorted(p for p in out.glob(pattern) if p.parts[-5] != cell["grid"])


def cell_seconds(record: dict, cell: dict) -> float | None:
    """The estimated seconds of `cell` from a record of the same point; None where it has no
    timing to scale."""
    samples = record.get("samples") or []
    old = record.get("cell", {})
    spec = CellSpec.from_dict(cell)
    n_new = n_samples(spec.problem, spec.measurement)
    if not samples or not all("phases_s" in s for s in samples):
        wall = record.get("wall_s")
        return None if wall is None else wall * n_new / max(1, len(samples) or 1)
    phases = [s["phases_s"] for s in samples]
    calls_old = old.get("warmup", 0) + old.get("reps", 1)
    calls_new = spec.measurement.warmup + spec.measurement.reps
    mean = lambda k: sum(p.get(k, 0.0) for p in phases) / len(phases)  # noqa: E731
    checks = [p["check"] for p in phases if "check" in p]
    per_sample = mean("timed") * calls_new / max(1, calls_old) + sum(map(mean, PER_SAMPLE))
    check = (sum(checks) / len(checks)) if checks else 0.0
    checked = checked_samples(spec.problem, spec.measurement)
    return phases[0].get("first_call", 0.0) + n_new * per_sample + checked * check


def estimate(cells: list[dict], out: Path) -> Estimate:
    """The estimate of these cells from the records under `out` (an output folder)."""
    total, informed, sources = 0.0, 0, []
    start = start_seconds(out)
    for cell in cells:
        for path in _same_point(out, cell):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            s = cell_seconds(record, cell)
            if s is not None:
                total, informed = total + s + start, informed + 1
                sources.append(path.parts[-5])
                break
    return Estimate(total, informed, len(cells), tuple(dict.fromkeys(sources)), start)


def cell_estimate(cell: dict, out: Path) -> float | None:
    """The estimated seconds of one cell, its start included, from the first record of its point
    on disk, or None."""
    for path in _same_point(out, cell):
        try:
            s = cell_seconds(json.loads(path.read_text()), cell)
        except (OSError, ValueError):
            continue
        if s is not None:
            return s + start_seconds(out)
    return None


def units(cells: list[dict]) -> list[list[dict]]:
    """The cells as the jobs that measure them: a side-by-side grid point's cells together (one
    point job measures them all, families/kernel/point.py), every other cell alone."""
    from ..grid.expand import point_id

    groups: dict[tuple, list[dict]] = {}
    for i, c in enumerate(cells):
        key = (c["grid"], c["family"], c["mask"], point_id(c)) if c.get("side_by_side") else (i,)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def unit_estimate(unit: list[dict], out: Path) -> float | None:
    """A job's estimated seconds: its cells' sum (None where a record informs none of them)."""
    known = [s for s in (cell_estimate(c, out) for c in unit) if s is not None]
    return sum(known) if known else None


def _smallest_units(cells: list[dict], out: Path) -> list[tuple[float | None, list[dict]]]:
    timed = [(unit_estimate(u, out), i, u) for i, u in enumerate(units(cells))]
    timed.sort(key=lambda t: (t[0] is None, t[0] or 0.0, t[1]))
    return [(s, u) for s, _, u in timed]


def smallest_first(cells: list[dict], out: Path, budget_s: float | None = None) -> list[dict]:
    """The cells in order of their job's estimated seconds, smallest first (those no record
    informs last), a side-by-side point's cells together, and with a budget only the jobs whose
    running sum of estimates fits it: a call of limited time measures the most it can and keeps
    what it measured."""
    kept, total = [], 0.0
    for s, u in _smallest_units(cells, out):
        if budget_s is not None:
            if s is None or total + s > budget_s:
                break
            total += s
        kept += u
    return kept


def calls(cells: list[dict], out: Path, call_s: float) -> list[tuple[list[dict], float]]:
    """The cells, smallest job first, cut into calls of at most call_s estimated seconds each
    ((cells, estimated seconds) per call), a side-by-side point never split; a job no record
    informs, or longer than a call, gets a call of its own at the end."""
    plan: list[tuple[list[dict], float]] = []
    batch, total = [], 0.0
    for s, u in _smallest_units(cells, out):
        if s is None or s > call_s:
            plan.append((u, s or 0.0))
            continue
        if total + s > call_s:
            plan.append((batch, total))
            batch, total = [], 0.0
        batch, total = batch + u, total + s
    if batch:
        plan.append((batch, total))
    plan.sort(key=lambda p: any(cell_estimate(c, out) is None for c in p[0]))
    return plan


def write_calls(plan, out: Path, folder: Path) -> list[Path]:
    """Each call's record paths, one file per call (callNN.txt, in order), replacing the folder's,
    and order.tsv: every cell's estimated seconds and record path, in the plan's order (a call
    that finds some of a file's cells measured, or a kernel not installed yet, fills its budget
    from the next cells instead)."""
    from ..grid.expand import cell_path

    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("call*.txt"):
        old.unlink()
    paths = []
    for i, (batch, _) in enumerate(plan, 1):
        path = folder / f"call{i:02d}.txt"
        path.write_text("".join(f"{out / cell_path(c)}\n" for c in batch))
        paths.append(path)
    order = folder / "order.tsv"
    order.write_text(
        "".join(
            f"{cell_estimate(c, out) or 0.0:.1f}\t{out / cell_path(c)}\n"
            for batch, _ in plan
            for c in batch
        )
    )
    return [*paths, order]
