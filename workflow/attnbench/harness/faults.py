"""Fault injection for the tests of failure handling (a crashed cell, a hung cell), by
environment variable, in every family's cells."""

from __future__ import annotations

import os
import re
import time

from ..grid.expand import point_id
from ..grid.spec import CellSpec

CRASH_ENV = "ATTNBENCH_CRASH_CELLS"


def _name(spec: CellSpec) -> str:
    return f"{spec.impl}/{spec.problem.mask}/{point_id(spec.to_dict())}"


def crash_if_asked(spec: CellSpec):
    """Fault injection for tests of failure handling: a cell whose '{impl}/{mask}/{point}' matches
    the regex in $ATTNBENCH_CRASH_CELLS dies like a crashed kernel (no record, failed job)."""
    pattern = os.environ.get(CRASH_ENV)
    name = _name(spec)
    if pattern and re.search(pattern, name):
        raise RuntimeError(f"crash injected by {CRASH_ENV}={pattern!r} into {name}")


HANG_ENV = "ATTNBENCH_HANG_CELLS"
# With HANG_ENV: a file; only the first process to reach the hang (the one that makes the file)
# hangs, so that a cell measured again in a fresh process ends (a warm worker's missed deadline).
HANG_ONCE_ENV = "ATTNBENCH_HANG_ONCE"


def hang_if_asked(spec: CellSpec, keep_alive=None):
    """Fault injection for tests of the time budget: a cell whose '{impl}/{mask}/{point}' matches
    the regex in $ATTNBENCH_HANG_CELLS never ends (calling keep_alive, e.g. a barrier, meanwhile)."""
    pattern = os.environ.get(HANG_ENV)
    name = _name(spec)
    if not (pattern and re.search(pattern, name)):
        return
    once = os.environ.get(HANG_ONCE_ENV)
    if once:
        try:
            open(once, "x").close()
        except FileExistsError:
            return
    print(f"hanging: {HANG_ENV}={pattern!r} matches {name}", flush=True)
    while True:
        if keep_alive:
            keep_alive()
        time.sleep(0.2)
