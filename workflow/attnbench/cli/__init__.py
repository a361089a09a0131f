"""attnbench: attention kernels and context-parallel methods, measured cell by cell.

Run the grids with `snakemake` (README); these commands are what its rules call, and what a user
asks the results: `advise` (which kernel, which method), `check-config`, `regenerate`, `predict`.
Settings as Snakemake takes them: --configfile FILE (over config.yaml), --config KEY=VALUE."""

# (The docstring above is `attnbench --help`'s description.) Each command's module declares its
# options beside its function (add_parsers); this module only puts them together. What they share
# is common.py's.

from __future__ import annotations

import argparse

from ..families.cp import commands as cp_commands
from ..families.kernel import commands as kernel_commands
from . import advise, check_config, peak, predict, records, regenerate, tables

# The commands in the order `attnbench --help` lists them. A cell's own (kernel_commands,
# cp_commands) are run through __main__ before this parser (its CELL_COMMANDS): listed for --help.
COMMANDS = (
    kernel_commands,
    cp_commands,
    peak,
    tables,  # collect, tables, figures
    check_config,
    regenerate,
    records,
    predict,
    advise,
)


def main(argv=None):
    from ..run.lock import end_with_run

    p = parser()
    a = p.parse_args(argv)
    end_with_run()  # a report step of a run (tables, figures) ends with it
    if a.cmd is None:  # bare `attnbench`: what it can do
        p.print_help()
        return
    a.fn(a)


def parser() -> argparse.ArgumentParser:
    """Every command, its options and their help."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("attnbench")
    except PackageNotFoundError:  # a bare checkout, not installed
        release = "not installed"
    p = argparse.ArgumentParser(prog="attnbench", description=__doc__)
    p.add_argument("--version", action="version", version=f"attnbench {release}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parsers(sub)
    return p
