"""The record every cell fills, kernel or context-parallel: its start (identity, what ran, the data
seed), the cell-level statistics from the samples, its end (status, statistics, device, times:
finish_record, the same for every family and for a cell stopped or crashed), and the atomic,
strict-JSON write, of a record checked against its schema (record.schema)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..grid.expand import stable_hash
from ..grid.spec import CellSpec
from ..harness.inputs import data_seed
from ..status import IMPLAUSIBLE, OK, TIMED, Status, implausible_reason
from .schema import Record, SchemaError

SCHEMA_VERSION = 1


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def base_record(spec: CellSpec, implementation: dict, provenance: dict) -> dict:
    """The fields every record starts with; `implementation` describes what ran, `provenance` the
    code and libraries it ran with (the family says both: its `provenance(spec)`)."""
    cell = spec.to_dict()
    return {
        "schema_version": SCHEMA_VERSION,
        "cell_id": stable_hash(cell),
        # the cell's whole effective config (cell_id is its short form)
        "config_sha256": stable_hash(cell, 64),
        "cell": cell,
        "kernel": implementation,
        "code": provenance[
            "code"
        ],  # record.code.cell_code: what attnbench.pipeline.currency compares
        "libraries": provenance["libraries"],
        "data_seed": data_seed(spec.problem),
        "started_at": now(),
        "samples": [],
    }


def finish_record(
    record: dict,
    status: str,
    reason: str | None,
    peak: dict | None,
    device: str,
    gpus: int = 1,
    t0: float | None = None,
    details: dict | None = None,
    summary=None,
) -> dict:
    """The end of every record: its status and reason (with `details` of the status between
    them: a timeout's budget, a crash's end), the statistics of its samples where it was timed
    (summarise; per GPU over `gpus`), the family's `summary(record)` (a CP cell's columns), the
    device's matmul ceiling, the machine, when it finished and how long the cell took since `t0`
    (its time.perf_counter(); none for a cell whose own process wrote no record). Your own kernel's or method's code
    modified from its commit marks the machine's git state dirty."""
    record["status"] = Status(status).value  # a record is JSON data: the plain value
    record.update(details or {})
    record["status_reason"] = reason
    if status in TIMED and record["samples"]:  # an incorrect one may have none
        summarise(record, peak, gpus)
    if summary is not None:
        summary(record)
    record["matmul_peak"] = peak
    record["environment"] = environment(device)
    if record["kernel"].get("source", {}).get("git") in ("modified", "untracked"):
        record["environment"]["git_dirty"] = True  # your own code is not the commit's
    record["finished_at"] = now()
    if t0 is not None:
        record["wall_s"] = time.perf_counter() - t0
    return record


def summarise(record, peak, gpus: int = 1):
    """Cell-level statistics from the samples: pooled repetitions, max memory, worst error.
    TFLOP/s are per GPU: FLOPs / (time x gpus) (time: the slowest rank's, for CP cells). An ok
    cell faster than the device's matmul ceiling allows becomes `implausible`."""
    samples = record["samples"]
    times = [t for s in samples for t in s["time_ms"]]
    tflops = [s["flops"] / (t * 1e-3) / 1e12 / gpus for s in samples for t in s["time_ms"]]
    a, b = np.percentile(times, [20, 80]), np.percentile(tflops, [20, 80])
    record.update(
        time_ms_median=float(np.median(times)),
        time_ms_p20=float(a[0]),
        time_ms_p80=float(a[1]),
        flops=float(np.mean([s["flops"] for s in samples])),
        tflops=float(np.median(tflops)),
        tflops_p20=float(b[0]),
        tflops_p80=float(b[1]),
    )
    mems = [s["peak_mem_bytes"] for s in samples if s.get("peak_mem_bytes") is not None]
    incs = [
        s["peak_mem_increment_bytes"]
        for s in samples
        if s.get("peak_mem_increment_bytes") is not None
    ]
    record["peak_mem_bytes"] = max(mems) if mems else None
    record["peak_mem_increment_bytes"] = max(incs) if incs else None
    record["mem_source"] = samples[0].get("mem_source")
    # the host's overhead (a caller's time over the device's) and the windows NVML saw throttled
    overheads = [s["host_overhead_ms"] for s in samples if s.get("host_overhead_ms") is not None]
    record["host_overhead_ms"] = float(np.median(overheads)) if overheads else None
    windows = [s["gpu_window"] for s in samples if s.get("gpu_window")]
    record["throttled"] = any(w["throttled"] for w in windows) if windows else None
    # a window whose host had not queued every repetition before the GPU reached them (measure.py)
    ahead = [s["queued_ahead"] for s in samples if s.get("queued_ahead") is not None]
    record["host_waited"] = (not all(ahead)) if ahead else None
    busy = [s["device_busy_ms"] for s in samples if "device_busy_ms" in s]
    record["device_busy_ms"] = sum(busy) if busy else None
    ceiling = (peak or {}).get("matmul_peak_tflops")
    record["fraction_of_peak"] = record["tflops"] / ceiling if ceiling else None
    why = implausible_reason(record["tflops"], ceiling)
    if why and record.get("status") == OK:  # faster than the device: never compared
        record["status"], record["status_reason"] = IMPLAUSIBLE.value, why
    checks = [s["check"] for s in samples if "check" in s]
    errs = [
        e for c in checks for n, e in c["errors"].items() if n != "lse"
    ]  # the LSE's is absolute
    record["max_rel_err"] = max(errs) if errs else None
    record["check_passed"] = all(c["passed"] for c in checks) if checks else None


def outcome_details(record) -> str:
    """What a cell found, in a few words: its TFLOP/s (per GPU for CP) where it was timed, and
    the reason where its status gives one; '' for neither."""
    parts = []
    if record.get("tflops") is not None:
        per = " per GPU" if (record.get("cell") or {}).get("gpus", 1) > 1 else ""
        parts.append(f"{record['tflops']:.4g} TFLOP/s{per}")
    if record.get("status_reason"):
        parts.append(str(record["status_reason"]))
    return "; ".join(parts)


def environment(device) -> dict:
    """The machine's fingerprint; a record even where torch itself is missing."""
    try:
        from ..harness.environment import fingerprint

        return fingerprint(device)
    except ImportError as e:  # torch itself missing: still a record
        return {"error": str(e)}


def json_safe(obj):
    """Non-finite floats become the strings 'nan' / 'inf' (strict JSON has neither)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


class RunGone(RuntimeError):
    """The run this process belonged to has ended: nothing it writes is that run's."""


# The record's content hash, over everything else in it (as JSON reads it back, keys sorted):
# written with it, checked on every read (record.validate), so a hand edit is refused.
CHECKSUM = "record_sha256"


def content_sha256(record: dict) -> str:
    body = json.loads(json.dumps(json_safe(record), allow_nan=False))  # as a reader sees it
    body.pop(CHECKSUM, None)
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def write_record(record: dict, path) -> None:
    """Write a cell record (write_json), checked against its schema first (record.schema):
    SchemaError naming the file and every field at fault, and nothing written, where it is not
    one, so that no reader ever meets a record its writer could not have read."""
    try:
        Record.from_dict(json_safe(record))  # as a reader will see it
    except SchemaError as e:
        raise SchemaError([f"{path}: not written, not a cell record", *e.problems]) from None
    write_json(record, path)


def write_json(obj: dict, path) -> None:
    """Write atomically (a file of this process' own, renamed over the file): a crash never
    leaves a half-written file behind, and two writers never mix. Refused (RunGone) in a
    process whose run has ended (run.lock.run_gone): its file would be accepted by the next."""
    from ..run.lock import run_gone

    if run_gone():
        raise RunGone(f"{path}: not written: the run that started this process has ended")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
    signed = {**json_safe(obj), CHECKSUM: content_sha256(obj)}
    tmp.write_text(json.dumps(signed, indent=1, allow_nan=False) + "\n")
    tmp.replace(path)
