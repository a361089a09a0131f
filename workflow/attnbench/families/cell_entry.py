"""What every cell's own processes share (the kernel family's `cell`, `point`, `point-child` and
the CP family's `cp-cell`: families/*/commands.py): reading the cell's spec, claiming its GPU after
the slow imports, the record of a cell that did not run, one line per outcome. A cell's record
lists these files among its code (record.code), as it lists every file its process runs."""

from __future__ import annotations

import json
import sys

TIMED_OUT_HELP = (
    "only write the cell's `timeout` record: attnbench.run.launch --time-limit-s stopped it after "
    "SECONDS (run nothing)"
)
CRASHED_HELP = (
    "only write the cell's `crashed` record: attnbench.run.launch --record saw its process end "
    "without one; JSON of how it ended and the last lines of its log (run nothing)"
)
SPEC_HELP = "the cell's parameters: a JSON file (as the workflow passes them), or inline JSON"


def cell_options(c, out_help: str) -> None:
    """The options every cell command takes: its spec, the device's ceiling, its record, and the
    two that only write the record of a cell that did not run."""
    c.add_argument("--spec", required=True, help=SPEC_HELP)
    c.add_argument("--peak", help="JSON file with the device's matmul ceiling")
    c.add_argument("--out", required=True, help=out_help)
    c.add_argument("--timed-out-after", type=float, metavar="SECONDS", help=TIMED_OUT_HELP)
    c.add_argument("--crashed", metavar="JSON", help=CRASHED_HELP)


def claim_gpu_after_start(device, kernel=None):
    """With `launch --claim-after-import`: torch, and the kernel's adapter and libraries, are
    imported (the slow part of a start) before the cell waits for a GPU of its own; nothing has
    touched CUDA yet."""
    if device == "cuda":
        import torch  # noqa: F401

        from ..harness.environment import prefetch
        from ..run.launch import claim_from_environment

        prefetch()
        if kernel:
            from ..kernels import catalog
            from ..kernels.base import preload

            preload(catalog.resolve(kernel))
        claim_from_environment()


def say_outcome(record, out):
    from ..record.record import outcome_details

    details = outcome_details(record)
    print(f"{record['status']}: {out}" + (f" ({details})" if details else ""))


def record_not_run(spec, a, skeleton) -> None:
    """--timed-out-after / --crashed: the record of a cell whose process did not write one."""
    from ..record.not_run import write_not_run

    crash = json.loads(a.crashed) if a.crashed is not None else None
    record = write_not_run(spec, skeleton, a.out, a.peak, a.timed_out_after, crash)
    if record is None:
        print(f"{a.out} was written before the cell ended; kept")
    else:
        say_outcome(record, a.out)


def json_option(a, name: str):
    """An option's JSON, from a file (how the workflow passes it: grid.json_files) or inline; None
    when the option is not given. Exits naming the option when it cannot be read."""
    from ..grid.json_files import read_json_arg

    value = getattr(a, name)
    if value is None:
        return None
    try:
        return read_json_arg(value, f"--{name.replace('_', '-')}")
    except ValueError as e:
        sys.exit(f"{a.cmd}: {e}")


def cell_spec(a):
    """--spec: the cell's parameters (grid.spec.CellSpec); exits naming what is wrong."""
    from ..grid.spec import CellSpec

    try:
        return CellSpec.from_dict(json_option(a, "spec"))
    except ValueError as e:
        sys.exit(f"{a.cmd}: --spec: {e}")


def start_cell_process() -> None:
    """A cell's process ends with its parent (the launcher, torchrun, a point's job) and with its
    run (run.lock): a record is accepted only from a process of the run that is measuring."""
    from ..run.lock import die_with_parent, end_with_run

    die_with_parent()
    end_with_run()


def run_command(argv, add_parsers) -> None:
    """`python -m attnbench COMMAND ...` for a family's cell commands (`add_parsers` adds them),
    handed here by attnbench/__main__.py: the process ends with its parent and its run."""
    import argparse

    p = argparse.ArgumentParser(prog="attnbench")
    add_parsers(p.add_subparsers(dest="cmd", required=True))
    a = p.parse_args(argv)
    start_cell_process()
    a.fn(a)
