"""Is a parsed JSON file a cell record of this benchmark? Its schema (record.schema: the fields
every record has, a known status, the fields each status carries, its numbers), and a record that
agrees with itself: its statistics are those of its samples, its status those of its correctness
check, its times not ahead of now, its content what was written (its checksum)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from ..grid.expand import cell_path, output_root, stable_hash
from ..status import IMPLAUSIBLE, INCORRECT, OK, WITH_TIMINGS
from .schema import CELL_KEYS, REQUIRED, Record, SchemaError


class RecordError(ValueError):
    """A file where a cell record should be that is not one; the message names the file."""


# Relative difference allowed between a statistic and the same statistic recomputed from the
# samples: JSON keeps floats exactly, so only summation order can move one.
RECOMPUTED = 1e-6
# A record's time may be ahead of this machine's clock by this much (clocks of a cluster's nodes).
CLOCK_SKEW = timedelta(minutes=10)
SAMPLE_KEYS = ("index", "mask_area", "flops", "time_ms")


def _sample_problems(samples) -> list[str]:
    """The samples' schema: a list of objects with an index, the mask's area, its FLOPs and the
    repetitions' times (numbers)."""
    if not isinstance(samples, list):
        return [f"samples is a JSON {type(samples).__name__}, not a list"]
    out = []
    for i, s in enumerate(samples):
        if not isinstance(s, dict):
            out.append(f"samples[{i}] is not an object")
            continue
        missing = [k for k in SAMPLE_KEYS if k not in s and not (k == "time_ms" and "check" in s)]
        if missing:
            out.append(f"samples[{i}] lacks {', '.join(missing)}")
        times = s.get("time_ms", [])
        if not isinstance(times, list) or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 for t in times
        ):
            out.append(f"samples[{i}].time_ms is not a list of times > 0")
    return out


def _differs(recorded, recomputed) -> bool:
    if not isinstance(recorded, (int, float)) or isinstance(recorded, bool):
        return True
    return abs(recorded - recomputed) > RECOMPUTED * max(abs(recomputed), 1e-12)


def _statistics_problems(record: dict) -> list[str]:
    """Where the record's statistics are not those of its samples (record.record.summarise): the
    pooled repetitions' median and p20-p80 of time and TFLOP/s (per GPU), their worst error and
    whether every check passed. Only a timed record is summarised: one that ended otherwise
    (out of memory at its third sample, say) keeps the samples it had timed, unsummarised."""
    if record["status"] not in WITH_TIMINGS:
        return []
    samples = [s for s in record.get("samples") or [] if s.get("time_ms")]
    out = []
    if samples:
        gpus = (record.get("cell") or {}).get("gpus") or 1
        times = [t for s in samples for t in s["time_ms"]]
        tflops = [s["flops"] / (t * 1e-3) / 1e12 / gpus for s in samples for t in s["time_ms"]]
        a, b = np.percentile(times, [20, 80]), np.percentile(tflops, [20, 80])
        want = {
            "time_ms_median": np.median(times),
            "time_ms_p20": a[0],
            "time_ms_p80": a[1],
            "tflops": np.median(tflops),
            "tflops_p20": b[0],
            "tflops_p80": b[1],
        }
        out += [
            f"{k} is {record.get(k)!r}, its samples give {float(v):.6g}"
            for k, v in want.items()
            if _differs(record.get(k), float(v))
        ]
    checks = [s["check"] for s in record.get("samples") or [] if isinstance(s.get("check"), dict)]
    if checks and "errors" in checks[0]:
        errs = [e for c in checks for n, e in c.get("errors", {}).items() if n != "lse"]
        worst = max(errs) if errs else None
        passed = all(c.get("passed") for c in checks)
        if (
            worst is not None
            and isinstance(worst, (int, float))
            and _differs(record.get("max_rel_err"), worst)
        ):
            out.append(
                f"max_rel_err is {record.get('max_rel_err')!r}, its samples give {worst:.6g}"
            )
        if record.get("check_passed") is not passed:
            out.append(
                f"check_passed is {record.get('check_passed')!r}, its samples' checks give {passed}"
            )
    return out


def _status_problems(record: dict) -> list[str]:
    """A status its correctness check contradicts: ok or implausible with a failed check,
    incorrect with a passed one."""
    status, passed = record["status"], record.get("check_passed")
    if status in (OK, IMPLAUSIBLE) and passed is False:
        return [f"status {status!r} with check_passed false"]
    if status == INCORRECT and passed is True:
        return [f"status {status!r} with check_passed true"]
    return []


def _time_problems(record: dict, now: datetime | None = None) -> list[str]:
    """started_at / finished_at that are not ISO times, or ahead of now (by more than CLOCK_SKEW)."""
    now = now or datetime.now(timezone.utc)
    out = []
    for key in ("started_at", "finished_at"):
        value = record.get(key)
        if value is None:
            continue
        try:
            when = datetime.fromisoformat(value)
        except (TypeError, ValueError):
            out.append(f"{key} {value!r} is not an ISO time")
            continue
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        if when > now + CLOCK_SKEW:
            out.append(f"{key} {value} is ahead of now ({now.isoformat(timespec='seconds')})")
    return out


def consistency_problems(record: dict) -> list[str]:
    """Where a record (one with the fields every record has) contradicts itself."""
    if not isinstance(record.get("environment", {}), dict):
        return ["environment is not an object"]
    problems = _sample_problems(record.get("samples", []))
    if problems:
        return problems
    return _status_problems(record) + _statistics_problems(record) + _time_problems(record)


def record_problems(record) -> list[str]:
    """What makes a parsed JSON value not a cell record: its schema (record.schema: read through
    Record), then whether it agrees with itself and with its checksum."""
    try:
        Record.from_dict(record)
    except SchemaError as e:
        if not isinstance(record, dict) or any(k not in record for k in REQUIRED):
            return e.problems  # no record at all: nothing more to judge
        return e.problems + checksum_problems(record)
    return consistency_problems(record) + checksum_problems(record)


def checksum_problems(record: dict) -> list[str]:
    """A record whose content is not what was written (its record_sha256; older records have
    none and are judged by their content alone)."""
    from .record import CHECKSUM, content_sha256

    if CHECKSUM not in record:
        return []
    if record[CHECKSUM] != content_sha256(record):
        return [f"{CHECKSUM} does not match its content: edited after it was written"]
    return []


def file_problems(path) -> tuple[dict | None, list[str]]:
    """(the record, []) at path, or (what was read, what makes it not a consistent record)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, [f"not readable JSON ({e})"]
    return record, record_problems(record)


def read_record(path) -> dict:
    """One record; RecordError naming the file when it is unreadable, not JSON or not a record."""
    record, problems = file_problems(path)
    if problems:
        raise RecordError(
            f"{path}: not a cell record of this benchmark: {'; '.join(problems)}. Move it out of the "
            "records folder, or delete it and run the workflow again to remeasure that cell; no "
            "other file was changed"
        )
    return record


def identity_problems(records: dict) -> list[str]:
    """Records that are not where their cell's record belongs: a cell_id that is not its cell's
    (an edited record), a path that names another cell (…/cells/{grid}/{family}/{impl}/{mask}/
    {point}.json of its own cell: grid.expand.cell_path), one cell in two files."""
    problems, seen = [], {}
    for path, record in records.items():
        cell, rid = record["cell"], record.get("cell_id")
        try:
            own, home = stable_hash(cell), output_root(path, cell)
        except (KeyError, ValueError, TypeError) as e:  # not a cell's dict (grid.spec says what)
            problems.append(f"{path}: its cell is not one this package makes ({e})")
            continue
        if rid is not None and rid != own:
            problems.append(
                f"{path}: its cell_id {rid} is not the id of the cell it describes ({own}): the "
                "record was edited after it was written; delete it and remeasure the cell"
            )
        if home is None:
            problems.append(
                f"{path}: holds the record of another cell, {cell_path(cell)} (cell_id {own}); "
                "a record is read only at its own cell's path: move it there or delete it"
            )
        if own in seen:
            problems.append(f"{seen[own]} and {path} hold the record of the same cell ({own})")
        seen.setdefault(own, path)
    return problems


def read_all(paths, consequence: str) -> dict:
    """{path: record} of those of `paths` on disk; RecordError listing every file that is not a
    consistent record of its own cell, each with all its problems, in one pass (`consequence`:
    what was not done because of them)."""
    records, problems = {}, []
    for path in paths:
        if not Path(path).exists():
            continue
        record, why = file_problems(path)
        if why:
            problems.append(f"{path}: {'; '.join(why)}")
        cell = record.get("cell") if isinstance(record, dict) else None
        if isinstance(cell, dict) and all(k in cell for k in CELL_KEYS):
            records[str(path)] = record  # its identity judged too: every problem in one pass
    problems += identity_problems(records)
    if problems:
        raise RecordError(
            f"{len(problems)} record file(s) refused, not cell records of this benchmark or not "
            f"consistent ({consequence}; no file was changed):\n  "
            + "\n  ".join(problems)
            + "\nMove them out of the records folder, or delete them and run the workflow again "
            "to remeasure their cells"
        )
    return records
