"""Is a parsed JSON file a cell record of this benchmark? The fields every record has, a known
status, and timings exactly where the status says the cell was timed."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..status import IMPLAUSIBLE, OK, STATUSES, WITH_TIMINGS


class RecordError(ValueError):
    """A file where a cell record should be that is not one; the message names the file."""


CELL_KEYS = ("grid", "family", "impl", "mask", "seqlen", "direction", "device")
# The cell-level numbers the tables and figures draw: each, where the record has it, a finite
# number >= 0 (a time, a throughput, a count of FLOPs or bytes). max_rel_err is not among them:
# an incorrect kernel's NaN output makes it nan or inf, and the record says so.
NUMBERS = (
    "time_ms_median",
    "time_ms_p20",
    "time_ms_p80",
    "tflops",
    "tflops_p20",
    "tflops_p80",
    "flops",
    "fraction_of_peak",
    "peak_mem_bytes",
    "peak_mem_increment_bytes",
    "device_busy_ms",
)


def number_problems(record: dict) -> list[str]:
    """The record's NUMBERS that are not finite numbers >= 0."""
    out = []
    for key in NUMBERS:
        v = record.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            out.append(f"{key} is {v!r}, not a number")
        elif not math.isfinite(v) or v < 0:
            out.append(f"{key} is {v!r}, not a finite number >= 0")
    return out


def record_problems(record) -> list[str]:
    """What makes a parsed JSON value not a cell record: the fields every record has, a known
    status, and timings exactly where the status says the cell was timed."""
    if not isinstance(record, dict):
        return [f"a JSON {type(record).__name__}, not an object"]
    missing = [k for k in ("schema_version", "cell", "status") if k not in record]
    if missing:
        return [f"no {', '.join(missing)} (keys present: {', '.join(list(record)[:8]) or 'none'})"]
    problems = []
    cell = record["cell"]
    if not isinstance(cell, dict) or any(k not in cell for k in CELL_KEYS):
        problems.append(f"its 'cell' lacks some of {', '.join(CELL_KEYS)}")
    status = record["status"]
    if status not in STATUSES:
        problems.append(f"status {status!r} is none of {', '.join(STATUSES)}")
    elif status in (OK, IMPLAUSIBLE) and record.get("tflops") is None:
        problems.append(f"status {status!r} without the timings it implies (tflops)")
    elif status not in WITH_TIMINGS and record.get("tflops") is not None:
        problems.append(
            f"status {status!r} with timings (tflops), which only {', '.join(WITH_TIMINGS)} carry"
        )
    return problems + number_problems(record)


def read_record(path) -> dict:
    """One record; RecordError naming the file when it is unreadable, not JSON or not a record."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(
            f"{path}: not a readable JSON cell record ({e}). Move it away, or delete it and run "
            "the workflow again to remeasure that cell; no other file was changed"
        ) from None
    problems = record_problems(record)
    if problems:
        raise RecordError(
            f"{path}: not a cell record of this benchmark: {'; '.join(problems)}. Move it out of the "
            "records folder; no other file was changed"
        )
    return record
