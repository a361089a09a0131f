"""Whether two runs of the same grids computed the same things: every record under A's cells/ and
B's, field by field, leaving out what depends on time, the host or the code's hashes (timings and
their rates, dates, memory, environment, worker, the record's `code`). What remains must be equal:
the cell, its id and config hash, the data seed, the status, each sample's mask, area and FLOPs,
and every float64 check's errors to the last bit (a CPU run is deterministic). For a refactor
that must not change what cells compute: run the same grids before and after, then

    python benchmarks/same_records.py BEFORE_OUTPUT_DIR AFTER_OUTPUT_DIR

It prints each record that differs (and the keys where it does) and a count; exit status 1 if any.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SUFFIXES = ("ms", "_s", "_at")  # times and dates
PARTS = ("_ms_", "tflops", "time", "busy", "phases", "wall", "mem", "histogram", "environment")
PARTS += ("peak", "process", "gpu_wait", "matmul", "worker", "overlap", "fraction", "bytes_per")


def timed(key: str) -> bool:
    """A field a second run may change without computing anything else."""
    return key == "code" or key.endswith(SUFFIXES) or any(p in key for p in PARTS)


def timeless(x):
    if isinstance(x, dict):
        return {k: timeless(v) for k, v in x.items() if not timed(k)}
    if isinstance(x, list):
        return [timeless(v) for v in x]
    return x


def differing(a: Path, b: Path) -> tuple[list[str], int]:
    files = sorted(p.relative_to(a) for p in (a / "cells").rglob("*.json"))
    other = sorted(p.relative_to(b) for p in (b / "cells").rglob("*.json"))
    if files != other:
        only = sorted(set(files) ^ set(other))
        return [f"not in both: {p}" for p in only], len(files)
    out = []
    for f in files:
        ra, rb = (timeless(json.loads((root / f).read_text())) for root in (a, b))
        if ra != rb:
            keys = sorted(k for k in ra.keys() | rb.keys() if ra.get(k) != rb.get(k))
            out.append(f"differs: {f} ({', '.join(keys)})")
    return out, len(files)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="one run's output_dir")
    p.add_argument("b", type=Path, help="the other run's output_dir")
    a = p.parse_args(argv)
    lines, n = differing(a.a, a.b)
    print("\n".join(lines + [f"{n} records, {len(lines)} differ in a time-free field"]))
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
