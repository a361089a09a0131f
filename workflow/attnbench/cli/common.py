"""What the commands share: reading the config as Snakemake does (--configfile, --config), the
grids given checked against it, lengths on the command line, and how a command fails."""

from __future__ import annotations

import argparse
import sys

# Snakemake's `configfile:` reads config.yaml in the folder it runs in; a --config FILE of one's own
# grids is read over it, as `snakemake --configfile FILE` reads it (grid.config.config_files).
WORKFLOW_CONFIG = "config.yaml"


def config_of(a, files=()):
    """The validated config of a command's --configfile files (and `files` before them) over
    config.yaml, with its --config KEY=VALUE settings over all, as Snakemake reads them; a
    config error, an old spelling, or a --grids name not in it, on stderr and exit 2 (every
    command alike)."""
    from ..families import load_config
    from ..grid.config import ConfigError, key_values

    try:
        if getattr(a, "overrides", None) is not None:
            raise ConfigError(
                [
                    "--overrides is no option any more: give settings as --config KEY=VALUE "
                    "(values as YAML, e.g. --config output_dir=results/h200), or in a file read "
                    "over config.yaml with --configfile FILE, as snakemake takes them"
                ]
            )
        paths = [*files, *a.configfile] or [WORKFLOW_CONFIG]
        cfg = load_config(paths, key_values(a.config), WORKFLOW_CONFIG)
    except ConfigError as e:
        print(f"{a.cmd}: {e}", file=sys.stderr)
        sys.exit(2)
    known_grids(a.cmd, "--grids", getattr(a, "grids", None), list(cfg["grids"]), "in the config")
    return cfg


def known_grids(cmd: str, flag: str, given, valid: list, where: str) -> None:
    """Before any work: a grid given that is not one of `valid`, named with the valid ones on
    stderr, and exit 2."""
    for g in given or ():
        if g not in valid:
            print(
                f"{cmd}: {flag} {g}: no such grid {where}; valid {flag}: {', '.join(valid)}",
                file=sys.stderr,
            )
            sys.exit(2)


def exit_naming_input(command: str, e: Exception):
    """The traceback for the log, then one line naming what failed and the input it read."""
    import traceback

    traceback.print_exception(e.__cause__ or e, file=sys.stderr)
    sys.exit(f"{command}: {e}")


def parse_length(text: str) -> int:
    """A length on the command line: 32768 or 32K."""
    from ..report.advice import parse_length as parse

    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a length (e.g. 32768 or 32K)") from None


class Once(argparse.Action):
    """An option of one value: given twice, an error naming it (argparse would keep the last)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = vars(namespace).setdefault("_given_once", set())
        if self.dest in given:
            raise argparse.ArgumentError(
                self, f"given twice ({getattr(namespace, self.dest)}, {values}): give it once"
            )
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def config_options(c) -> None:
    """--configfile and --config, as Snakemake takes them (and the old spelling, refused)."""
    c.add_argument(
        "--configfile",
        action="append",
        default=[],
        metavar="FILE",
        help="a YAML file of settings read over config.yaml (repeat it: later files over "
        "earlier ones), as snakemake --configfile",
    )
    c.add_argument(
        "--config",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="settings over the files, each value YAML (e.g. output_dir=results/h200 "
        "'run=[h200_sweep]'), as snakemake --config",
    )
    c.add_argument(
        "--overrides", help=argparse.SUPPRESS
    )  # the old spelling: refused, naming these


def grids_parser(sub, name, what, fn):
    """A command over grids of a config (by default the grids of its run list)."""
    c = sub.add_parser(name, help=what, description=what)
    config_options(c)
    c.add_argument(
        "--grids", nargs="*", action="extend", help="these grids (default: the config's run list)"
    )
    c.set_defaults(fn=fn)
    return c
