"""Is a record on disk still what a run would make now?

A record is current when all of these hold, read from the record itself (never from Snakemake's
.snakemake metadata, which one clone has and another lacks):

- its cell is the cell the config asks for now (`config_sha256`: every setting of the cell,
  repetitions, warm-up, samples, seeds, mask settings, tolerance, histogram);
- the code it ran is the code a cell would run now (`code`: the package files the cell runs and
  your own kernel's files, file by file: record.code);
- the libraries it depends on have the versions installed now (`libraries`: torch, numpy, the kernel's
  or the local kernel's library);
- it is not `crashed` (a process that ended without its record: the next run retries it), nor a
  `timeout` under a smaller time budget than the grid's cell_timeout_s now;
- a CPU kernel (or block-sparse) cell's timings were measured on the threads a run would give it now (the grid's
  `cpu_threads`, capped at this machine's cores as Snakemake caps them): on a CPU the thread count
  is part of what is timed, on a GPU it only speeds host-side work outside the timed region;
- it was measured on the machine the rest of its grid point was (`machine`: the GPU by its UUID,
  else the device and host), since contenders are compared draw by draw: a record of another
  machine than most of its point's is outdated, and so is the older side of a tie.

Anything else makes it outdated, and a run makes it again (workflow/rules/common.smk), unless the
config says `outdated_records: keep`; then the tidy table's `outdated` column and the captions say
which records are outdated, and why. Records from before records named their code are outdated.

An environment that cannot run a record's device at all (a CUDA record where torch has no CUDA:
a laptop, CI) judges its config and code but not its libraries, which are another machine's, and
never makes it again: a run there would replace a measurement with `unavailable`. It is kept,
still named outdated where it is (`Outdated.kept`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .. import status as S
from ..families import expand_cells, family
from ..grid.config import cell_timeout_s
from ..grid.expand import cell_path, point_id, stable_hash
from ..grid.spec import CellSpec
from ..record.code import code_changes
from ..record.validate import read_all

# Why a record is outdated, in the order they are looked for (the first found is the reason).
CRASHED, CONFIG, BUDGET, CODE, LIBRARIES = "crashed", "config", "time budget", "code", "libraries"
MACHINE = "machine"
KINDS = (CRASHED, CONFIG, BUDGET, CODE, LIBRARIES, MACHINE)


@dataclass(frozen=True)
class Outdated:
    """One record that a run would not make as it is."""

    path: str
    kind: str  # one of KINDS
    detail: str
    kept: str | None = None  # why no run in this environment makes it again (missing_runtime)

    def line(self) -> str:
        return f"{self.path}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class GridLimits:
    """What a grid gives each of its cells now, beside the cell itself (its resources)."""

    budget_s: float  # cell_timeout_s
    cpu_threads: int  # the threads a CPU kernel cell runs on here

    @classmethod
    def of(cls, grid: dict) -> GridLimits:
        threads = min(int(grid.get("cpu_threads", 1)), os.cpu_count() or 1)
        return cls(budget_s=cell_timeout_s(grid), cpu_threads=threads)


def limits(cfg: dict, grids) -> dict[str, GridLimits]:
    """Each named grid's GridLimits, from a validated config."""
    return {g: GridLimits.of(cfg["grids"][g]) for g in grids}


@cache
def missing_runtime(device: str) -> str | None:
    """Why this Python environment cannot run cells on `device` at all, or None. CUDA needs a
    torch built with it: torch/version.py's `cuda`, read without importing torch (the workflow's
    planning reads it). A torch with CUDA on a machine without a GPU may still submit to GPU
    nodes, so only the build is judged."""
    if device != "cuda":
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return "torch is not installed here"
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None  # not knowable: judged as any other record
    if re.search(r"^cuda\s*(:[^=]*)?=\s*None\s*$", text, re.M):
        version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
        torch = f"torch {version.group(1)}" if version else "torch"
        return f"{torch} here is built without CUDA"
    return None


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "histograms":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _shown(v) -> str:
    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 40 else "..."


def spec_changes(old: dict, new: dict) -> list[str]:
    """The settings of a cell that differ: 'reps 2 -> 3'."""
    a, b = _flat(old), _flat(new)
    return [
        f"{k} {_shown(a.get(k, '(unset)'))} -> {_shown(b.get(k, '(unset)'))}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]


def outdated_reason(record: dict, spec: dict | None, grid: GridLimits | None) -> tuple | None:
    """(kind, detail) of why the record is not what a run would make now, or None. Without
    `spec` (a grid the config does not hold) the config, the threads and the time budget are not
    judged."""
    if record.get("status") == S.CRASHED:
        return CRASHED, str(record.get("status_reason") or "its process ended without a record")
    cell = record.get("cell") or {}
    if spec is not None and stable_hash(cell, 64) != stable_hash(spec, 64):
        changes = spec_changes(cell, spec) or ["its settings differ"]
        return CONFIG, ", ".join(changes[:6]) + (" ..." if len(changes) > 6 else "")
    if spec is not None and grid is not None and (why := _other_threads(record, spec, grid)):
        return CONFIG, why
    if (
        record.get("status") == S.TIMEOUT
        and grid is not None
        and (record.get("time_budget_s") or 0) < grid.budget_s
    ):
        return BUDGET, (
            f"stopped at {record.get('time_budget_s'):g} s; the grid's cell_timeout_s is now "
            f"{grid.budget_s:g} s"
        )
    if "code" not in record:
        return CODE, "the record names no code (made before records did)"
    try:
        spec = CellSpec.from_dict(cell)
    except ValueError as e:  # a cell of another version's shape
        return CODE, f"its cell is not one this package makes ({e})"
    try:
        now = family(spec.family).provenance(spec)
    except (KeyError, ValueError) as e:  # a kernel or method the package no longer has
        return CODE, f"its kernel or method is not in the package now ({e})"
    if record["code"].get("sha256") != now["code"]["sha256"]:
        changed = code_changes(record["code"], now["code"])
        return CODE, ", ".join(changed[:6]) + (" ..." if len(changed) > 6 else "")
    if record.get("libraries") != now["libraries"] and not missing_runtime(spec.device):
        old = record.get("libraries") or {}
        diff = [
            f"{k} {old.get(k, '(none)')} -> {now['libraries'].get(k, '(none)')}"
            for k in sorted(old.keys() | now["libraries"].keys())
            if old.get(k) != now["libraries"].get(k)
        ]
        return LIBRARIES, ", ".join(diff)
    return None


def _other_threads(record: dict, spec: dict, grid: GridLimits) -> str | None:
    """Why a CPU kernel record's timings are not on the threads a run gives its cell now."""
    timed = record.get("status") in (S.OK, S.INCORRECT, S.IMPLAUSIBLE)
    # kernel and sparse cells run on the grid's cpu_threads; a CP cell's threads are its ranks
    if not timed or spec.get("family") not in ("kernel", "sparse") or spec.get("device") != "cpu":
        return None
    ran = (record.get("environment") or {}).get("cpu_threads")
    if ran is None or ran == grid.cpu_threads:
        return None
    return (
        f"cpu_threads {ran} -> {grid.cpu_threads} (timed on {ran} threads; a run here gives the "
        f"cell {grid.cpu_threads}: the grid's cpu_threads, at most this machine's cores)"
    )


def judge(cells: dict, grids: dict[str, GridLimits]) -> list[Outdated]:
    """The outdated records among those on disk: `cells` maps each record's path to the cell the
    config asks for there (None: not judged against a config), `grids` each grid's GridLimits
    now. RecordError, before anything runs, listing every file there that is not a
    consistent record of its own cell (record.validate.read_all)."""
    out = []
    records = read_all(cells, "nothing was run")
    by_point = machines_by_point(records.values())
    for path, record in records.items():
        spec = cells[path]
        grid = (spec or record.get("cell") or {}).get("grid")
        why = outdated_reason(record, spec, grids.get(grid)) or other_machine(record, by_point)
        if why:
            out.append(Outdated(str(path), *why, kept=kept_here(record)))
    return out


def machine(record: dict) -> str:
    """The machine a record was measured on: its GPU (name and UUID, from the start of its
    job), else its device and host; '' where it names none (a record of a cell that never ran)."""
    start = (record.get("machine") or {}).get("start") or {}
    if start.get("uuid"):
        return f"{start.get('name', 'GPU')} {start['uuid']}"
    env = record.get("environment") or {}
    device = env.get("device_name") or env.get("cpu")
    return f"{device} on {env['host']}" if device and env.get("host") else ""


def _point_key(record: dict) -> tuple:
    cell = record.get("cell") or {}
    try:
        return cell["grid"], cell["family"], cell.get("mask"), point_id(cell)
    except KeyError:
        return ("",)


def machines_by_point(records) -> dict:
    """{grid point: {machine: (its records there, the latest finished_at)}}."""
    by: dict = {}
    for r in records:
        m = machine(r)
        if m:
            seen = by.setdefault(_point_key(r), {}).get(m, (0, ""))
            by[_point_key(r)][m] = (seen[0] + 1, max(seen[1], str(r.get("finished_at", ""))))
    return by


def other_machine(record: dict, by_point: dict) -> tuple | None:
    """(MACHINE, detail) where the record was measured on another machine than its grid point's
    other records (machines_by_point): the machine most of them name (a tie: the one measured
    last)."""
    mine = machine(record)
    names = by_point.get(_point_key(record), {})
    if not mine or len(names) < 2:
        return None
    chosen = max(names, key=lambda m: names[m])
    if chosen == mine:
        return None
    return MACHINE, f"measured on {mine}; the rest of its point on {chosen}"


def kept_here(record: dict) -> str | None:
    """Why an outdated record is not made again in this environment: its device cannot run
    here, and it holds more than `unavailable` (a crashed one holds nothing: it runs again)."""
    if record.get("status") in (S.UNAVAILABLE, S.CRASHED):
        return None
    return missing_runtime((record.get("cell") or {}).get("device"))


def to_make_again(outdated: list[Outdated], keep: bool) -> tuple[list[Outdated], list[Outdated]]:
    """(made again, kept) of the outdated records: all kept under `outdated_records: keep`, else
    those this environment cannot run (kept_here)."""
    if keep:
        return [], list(outdated)
    return [o for o in outdated if not o.kept], [o for o in outdated if o.kept]


def summary(outdated: list[Outdated], recorded: int, keep: bool = False) -> str:
    """One paragraph: how many records are outdated, of how many on disk, by reason (the first
    few of each), and what the run does with them."""
    if not outdated:
        return f"{recorded} records on disk, all current"
    kinds = Counter(o.kind for o in outdated)
    parts = []
    for kind in KINDS:
        if kind in kinds:
            first = next(o for o in outdated if o.kind == kind)
            parts.append(f"{kinds[kind]} {kind} (e.g. {first.line()})")
    again, kept = to_make_again(outdated, keep)
    named = "the tidy table's `outdated` column and the captions name them"
    if keep:
        what = f"kept as they are (outdated_records: keep); {named}"
    elif not kept:
        what = "they run again"
    else:
        first = kept[0]
        what = (
            f"{len(kept)} kept as they are, since this environment cannot run them "
            f"({first.kept}; e.g. {first.path}), and {named}; "
            + (f"{len(again)} run again" if again else "none runs again")
        )
    return (
        f"{len(outdated)} of {recorded} records on disk are outdated: {'; '.join(parts)}; {what}"
    )


def outdated_column(paths, outdated: list[Outdated]) -> list[str | None]:
    """The tidy table's `outdated` column for rows of these record paths: 'kind: detail', or None
    for a current record."""
    by_path = {str(Path(o.path)): f"{o.kind}: {o.detail}" for o in outdated}
    return [by_path.get(str(Path(p))) for p in paths]


def of_config(cfg: dict, grids=None) -> tuple[list[Outdated], int]:
    """The outdated records of a validated config's grids (default: its run list) under its
    output_dir, and how many of their records are on disk."""
    grids = list(grids or cfg["run"])
    out = Path(cfg["output_dir"])
    cells = {str(out / cell_path(c)): c for c in expand_cells(cfg, grids)}
    return judge(cells, limits(cfg, grids)), sum(Path(p).exists() for p in cells)


def config_report(cfg: dict) -> str:
    """What check-config says of the records already under output_dir."""
    outdated, recorded = of_config(cfg)
    if not recorded:
        return f"no records of these grids under {cfg['output_dir']}/cells yet"
    return summary(outdated, recorded, cfg["outdated_records"] == "keep")
