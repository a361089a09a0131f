"""The record of a cell whose process did not write one (attnbench.launch runs the cell's command
again to write it): stopped at its time budget (`timeout`), or ended without a record (`crashed`,
with how it ended and the last lines of its log). No timings."""

from __future__ import annotations

import json
from pathlib import Path

from ..grid.spec import CellSpec


def write_not_run(
    spec: CellSpec,
    out: str,
    peak_path: str | None,
    timed_out_after_s: float | None,
    crash: dict | None,
) -> dict | None:
    """Writes and returns that record; None where the cell's own run had already written one (it
    was stopped while exiting), which is kept."""
    from ..families import not_run_record
    from .record import write_record

    if spec.device == "cuda":
        import torch  # noqa: F401  (the fingerprint then names the device)
    if Path(out).exists():
        return None
    peak = json.loads(Path(peak_path).read_text()) if peak_path else None
    if timed_out_after_s is not None:
        record = not_run_record(spec, peak, timed_out_after_s=timed_out_after_s)
    else:
        record = not_run_record(spec, peak, crash=crash)
    write_record(record, out)
    return record
