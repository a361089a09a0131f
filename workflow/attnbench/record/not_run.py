"""The record of a cell whose process did not write one (attnbench.launch runs the cell's command
again to write it): stopped at its time budget (`timeout`), or ended without a record (`crashed`,
with how it ended and the last lines of its log). No timings."""

from __future__ import annotations

import json
from pathlib import Path

from ..grid.spec import CellSpec


def write_not_run(
    spec: CellSpec,
    skeleton,
    out: str,
    peak_path: str | None,
    timed_out_after_s: float | None,
    crash: dict | None,
) -> dict | None:
    """Writes and returns that record; None where the cell's own run had already written one (it
    was stopped while exiting), which is kept. `skeleton`: the family's record_skeleton."""
    from .record import write_record

    if spec.device == "cuda":
        import torch  # noqa: F401  (the fingerprint then names the device)
    if Path(out).exists():
        return None
    peak = json.loads(Path(peak_path).read_text()) if peak_path else None
    if timed_out_after_s is not None:
        record = not_run_record(spec, skeleton, peak, timed_out_after_s=timed_out_after_s)
    else:
        record = not_run_record(spec, skeleton, peak, crash=crash)
    write_record(record, out)
    return record


def not_run_record(
    spec: CellSpec,
    skeleton,
    peak: dict | None,
    timed_out_after_s: float | None = None,
    crash: dict | None = None,
) -> dict:
    """The record of a cell whose own process wrote none, without timings: stopped at its time
    budget (`timeout`), or ended without a record (`crashed`: how it ended, from
    attnbench.launch, and the last lines of its log). The family's `skeleton(spec)` (its
    record_skeleton) gives the rest (CP's: also its tables' columns)."""
    from . import status as S
    from .record import finish_record

    record = skeleton(spec)
    record["started_at"] = None
    if crash is None:
        status, details = S.TIMEOUT, {"time_budget_s": timed_out_after_s}
        reason = (
            f"still running after {timed_out_after_s:g} s, the grid's time budget "
            "(cell_timeout_s); stopped"
        )
    else:
        last = next(
            (line.strip() for line in reversed(crash.get("log_tail", [])) if line.strip()), ""
        )
        status, details = S.CRASHED, {"crash": crash}
        reason = f"its process {crash['how']} without writing a record" + (
            f"; its log ends: {last[:300]}" if last else ""
        )
    return finish_record(record, status, reason, peak, spec.device, details=details)
