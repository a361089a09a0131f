"""`python -m attnbench COMMAND`. A cell's own commands go straight to their family's module
(CELL_COMMANDS), so that a cell's process runs only files its record lists (record.code); every
other command is attnbench.cli's. Both are imported by name: a record lists this file and its
family's module, never the CLI (attnbench.codegraph does not follow an import by name)."""

from __future__ import annotations

import importlib
import sys

CELL_COMMANDS = {
    "cell": "attnbench.families.kernel.commands",
    "point": "attnbench.families.kernel.commands",
    "point-child": "attnbench.families.kernel.commands",
    "cp-cell": "attnbench.families.cp.commands",
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    module = CELL_COMMANDS.get(argv[0] if argv else "", "attnbench.cli")
    importlib.import_module(module).main(argv)


def __getattr__(name):  # attnbench.__main__.parser and the like: the CLI's
    return getattr(importlib.import_module("attnbench.cli"), name)


if __name__ == "__main__":
    main()
