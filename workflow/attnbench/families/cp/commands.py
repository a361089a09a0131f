"""The CP family's command, run by each rank of its cells (under attnbench.run.launch / torchrun):
`cp-cell`. `python -m attnbench` hands it here before it reads any other command
(attnbench/__main__.py), so a cell's process runs only the files its record lists."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..cell_entry import (
    cell_options,
    cell_spec,
    claim_gpu_after_start,
    record_not_run,
    run_command,
    say_outcome,
)
from .provenance import provenance


def skeleton(spec) -> dict:
    """The family's record_skeleton, imported only where a record of a cell that did not run is
    written (this module imports neither torch nor the family's package)."""
    from .emulated import record_skeleton

    return record_skeleton(spec)


COMMANDS = ("cp-cell",)


def cmd_cp_cell(a):
    """One rank of a distributed cell (start it with python -m attnbench.run.launch)."""
    spec = cell_spec(a)
    if a.timed_out_after is not None or a.crashed is not None:
        return record_not_run(spec, a, skeleton)
    provenance(spec)  # the code its record names, hashed before the cell imports it
    from .cell import run_cp_cell
    from .emulated import is_emulated, run_emulated_cell

    claim_gpu_after_start(spec.device)
    peak = json.loads(Path(a.peak).read_text()) if a.peak else None
    # cp.emulate: the compute of every rank in this one process (families/cp/emulated.py)
    record = (run_emulated_cell if is_emulated(spec) else run_cp_cell)(spec, a.out, peak)
    if int(os.environ.get("RANK", 0)) == 0:
        say_outcome(record, a.out)


def add_parsers(sub) -> None:
    c = sub.add_parser(
        "cp-cell",
        help="one rank of a context-parallel cell (under attnbench.run.launch / torchrun)",
    )
    cell_options(c, "the record (written by rank 0)")
    c.set_defaults(fn=cmd_cp_cell)


def main(argv) -> None:
    """`python -m attnbench cp-cell ...` (attnbench/__main__.py)."""
    run_command(argv, add_parsers)
