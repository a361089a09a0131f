"""The status of a cell (docs/measurement.md): one explicit field, never a sentinel number.
Imports nothing of the package: kernels, harness and cp use it without the record's modules."""

from __future__ import annotations

import enum


class Status(enum.StrEnum):
    """A cell's status. A str: records keep it as its plain value ("ok"), and a value read from a
    record equals its member, so JSON, CSV and messages read the same as before it was an enum."""

    OK = "ok"
    OOM = "oom"
    UNSUPPORTED = "unsupported"
    UNAVAILABLE = "unavailable"
    INCORRECT = "incorrect"
    # Still running at the grid's time budget (cell_timeout_s): stopped by the launcher, which
    # then writes a record without timings (attnbench.launch --time-limit-s).
    TIMEOUT = "timeout"
    # The cell's process ended without writing its record (a segfault, a kill, an exit, an
    # exception): attnbench.launch --record then writes one saying how it ended, with the last
    # lines of its log. Never current: the next run retries the cell (attnbench.currency).
    CRASHED = "crashed"
    # Faster than the device can compute: its TFLOP/s exceed the measured matmul ceiling by more
    # than PLAUSIBLE_OVER_CEILING, so a FLOP count or a timing is wrong. Timings kept, never
    # compared.
    IMPLAUSIBLE = "implausible"


OK, OOM, UNSUPPORTED, UNAVAILABLE = Status.OK, Status.OOM, Status.UNSUPPORTED, Status.UNAVAILABLE
INCORRECT, TIMEOUT, CRASHED, IMPLAUSIBLE = (
    Status.INCORRECT,
    Status.TIMEOUT,
    Status.CRASHED,
    Status.IMPLAUSIBLE,
)
STATUSES = tuple(Status)
# Statuses whose numbers tables and figures show (flagged where incorrect; an `incorrect` record
# may lack them: a kernel whose output is malformed is found out before it is timed).
TIMED = (OK, INCORRECT)
# Statuses whose record carries timings (which fields each status carries: record.schema).
WITH_TIMINGS = (*TIMED, IMPLAUSIBLE)
PLAUSIBLE_OVER_CEILING = 0.05


def implausible_reason(tflops, ceiling) -> str | None:
    """Why TFLOP/s (per GPU) cannot be true on a device of this matmul ceiling, or None."""
    if tflops is None or not ceiling or tflops <= ceiling * (1 + PLAUSIBLE_OVER_CEILING):
        return None
    return (
        f"{tflops:.4g} TFLOP/s per GPU is {tflops / ceiling - 1:.0%} above the device's measured "
        f"matmul ceiling ({ceiling:.4g} TFLOP/s; more than {PLAUSIBLE_OVER_CEILING:.0%} is not "
        "possible): a FLOP count or a timing is wrong; not compared"
    )


class CellOutcome(Exception):
    """A non-crash outcome that ends a cell early with a record (not a failed job)."""

    status = ""  # each outcome names its Status

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Unsupported(CellOutcome):
    status = UNSUPPORTED


class Unavailable(CellOutcome):
    status = UNAVAILABLE


class OutOfMemory(CellOutcome):
    status = OOM


class Incorrect(CellOutcome):
    """The kernel's output is malformed (not the query's shape or the cell's dtype): `incorrect`
    before its values are compared, and without timings where it fails before any was taken."""

    status = INCORRECT


def is_oom(exc: BaseException) -> bool:
    """Device or host out-of-memory, whichever library raised it."""
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    text = str(exc).lower()
    return (
        "out of memory" in text
        or "can't allocate memory" in text
        or "cudaerrormemoryallocation" in text
    )
