"""Which of a run's cells were not measured to the end: those without a record on disk (their job
did not finish: a run interrupted, a Slurm job stopped at its time limit) and those whose record is
`crashed` (their process ended without writing one; the next run retries them). A run's closing
summary and the report captions list them."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..status import CRASHED

# Cells named one by one in a summary (the rest are counted).
LISTED = 10


@dataclass(frozen=True)
class Unfinished:
    """A run's cells by what their records say."""

    total: int  # cells of the run
    statuses: dict  # status -> cells with a readable record of that status
    missing: tuple  # record paths without a file
    crashed: tuple  # (record path, status_reason) of crashed records

    def lines(self) -> list[str]:
        """The closing summary: counts by status, then every crashed and missing cell (the
        first LISTED of each)."""
        counts = ", ".join(f"{n} {s}" for s, n in self.statuses.items())
        out = [
            f"{self.total - len(self.missing)} of the run's {self.total} cells have a record"
            + (f" ({counts})" if counts else "")
        ]
        for what, items in (
            ("crashed (the next run retries them)", [f"{p}: {why}" for p, why in self.crashed]),
            ("without a record (their job did not finish; the next run runs them)", self.missing),
        ):
            if items:
                out.append(f"{len(items)} {what}:")
                out += [f"  {x}" for x in list(items)[:LISTED]]
                if len(items) > LISTED:
                    out.append(f"  ... and {len(items) - LISTED} more")
        return out


def unfinished(paths) -> Unfinished:
    """What the records at `paths` (a run's cells) say."""
    paths = list(paths)
    statuses, missing, crashed = Counter(), [], []
    for p in paths:
        if not Path(p).exists():
            missing.append(str(p))
            continue
        try:
            record = json.loads(Path(p).read_text())
            status = record["status"]
        except (OSError, ValueError, KeyError, TypeError):
            statuses["unreadable"] += 1
            continue
        statuses[status] += 1
        if status == CRASHED:
            crashed.append((str(p), str(record.get("status_reason", ""))[:300]))
    return Unfinished(len(paths), dict(statuses), tuple(missing), tuple(crashed))
