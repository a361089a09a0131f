"""The status of a cell (docs/measurement.md): one explicit field, never a sentinel number."""

from __future__ import annotations

OK = "ok"
OOM = "oom"
UNSUPPORTED = "unsupported"
UNAVAILABLE = "unavailable"
INCORRECT = "incorrect"
# Still running at the grid's time budget (cell_timeout_s): stopped by the launcher, which then
# writes a record without timings (attnbench.launch --time-limit-s).
TIMEOUT = "timeout"
# The cell's process ended without writing its record (a segfault, a kill, an exit, an exception):
# attnbench.launch --record then writes one saying how it ended, with the last lines of its log.
# Never current: the next run retries the cell (attnbench.currency).
CRASHED = "crashed"
STATUSES = (OK, OOM, UNSUPPORTED, UNAVAILABLE, INCORRECT, TIMEOUT, CRASHED)
# Statuses whose record carries timings (an `incorrect` one may lack them: a kernel whose output
# is malformed is found out before it is timed).
TIMED = (OK, INCORRECT)


class CellOutcome(Exception):
    """A non-crash outcome that ends a cell early with a record (not a failed job)."""

    status = ""

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
