"""Which test modules are slow: measured, never guessed.

`make test` keeps every test's seconds (setup, call and teardown) per stage in
.pytest-durations-STAGE.tsv (conftest.py). tests/durations.tsv holds the seconds of a whole run
(`make durations` writes it from the latest run's files). A module whose tests took SLOW_MODULE_S
or more in all is `slow`: its tests run in make test's second stage, beside the Slurm cluster's,
and the main stage keeps the rest. A module, not a test: a module's tests share fixtures (a
Snakemake run, a gloo world) that a split would set up twice. A module not measured yet is not
slow; tests/test_durations.py fails the second stage when a module that took twice the threshold
ran in the main stage, naming it.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
MEASURED = HERE / "durations.tsv"
SLOW_MODULE_S = 30.0


def read_seconds(path: Path) -> dict[str, float]:
    """Test id -> seconds, from a durations TSV (columns seconds and test, among others)."""
    with open(path, newline="") as f:
        return {row["test"]: float(row["seconds"]) for row in csv.DictReader(f, delimiter="\t")}


def module_of(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def by_module(seconds: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for test, s in seconds.items():
        out[module_of(test)] += s
    return dict(out)


def slow_modules(path: Path = MEASURED, threshold: float = SLOW_MODULE_S) -> set[str]:
    """The modules (paths as in test ids, 'tests/x.py') measured at `threshold` seconds or more."""
    if not path.exists():
        return set()
    return {m for m, s in by_module(read_seconds(path)).items() if s >= threshold}


def mark_slow(items, slow: set[str] | None = None) -> None:
    """Give every collected test of a slow module the `slow` marker (conftest.py calls this)."""
    import pytest

    slow = slow_modules() if slow is None else slow
    for item in items:
        if module_of(item.nodeid) in slow:
            item.add_marker(pytest.mark.slow)


def write_measured(runs: list[Path], path: Path = MEASURED) -> None:
    """tests/durations.tsv from the durations files of one `make test` (its stages)."""
    seconds: dict[str, float] = {}
    for run in runs:
        seconds.update(read_seconds(run))
    rows = sorted(seconds.items(), key=lambda kv: (module_of(kv[0]), kv[0]))
    path.write_text("seconds\ttest\n" + "".join(f"{s:.2f}\t{t}\n" for t, s in rows))


if __name__ == "__main__":
    import sys

    write_measured([Path(p) for p in sys.argv[1:]])
    slow = slow_modules()
    print(f"{MEASURED}: {len(read_seconds(MEASURED))} tests; {len(slow)} slow modules")
