"""`regenerate`: the tidy table, tables and figures (and the report) from the records on disk."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .common import config_of, exit_naming_input, grids_parser


def cmd_regenerate(a):
    """Tidy table, tables, figures (and the report) from the records already on disk; runs no cell."""
    import time

    from ..pipeline.regenerate import regenerate, write_report
    from ..report.collect import RecordError, ReportError
    from ..run.lock import RunLock, RunLocked

    t0 = time.perf_counter()
    cfg = config_of(a)
    try:
        with RunLock(cfg["output_dir"]):  # not while a run writes the same folder
            drawn = regenerate(cfg, a.grids, a.jobs)
    except RunLocked as e:
        sys.exit(f"regenerate: {e}")
    except (ValueError, RecordError) as e:
        sys.exit(f"regenerate: {e}")
    except ReportError as e:
        exit_naming_input("regenerate", e)
    if a.report is not None:
        t2 = time.perf_counter()
        report = Path(a.report) if a.report else Path(cfg["output_dir"]) / "report.html"
        try:
            write_report(cfg, list(drawn.grids), report, a.snakefile)
        except ReportError as e:
            sys.exit(str(e))
        print(f"report -> {report} in {time.perf_counter() - t2:.1f} s")
    print(f"regenerated in {time.perf_counter() - t0:.1f} s")


def add_parsers(sub) -> None:
    c = grids_parser(
        sub,
        "regenerate",
        "tidy table, tables and figures from the records on disk (no cell runs)",
        cmd_regenerate,
    )
    c.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes drawing (default 2)",
    )
    c.add_argument(
        "--report",
        nargs="?",
        const="",
        help="also write the Snakemake HTML report (default path: <output_dir>/report.html)",
    )
    c.add_argument("--snakefile", default="Snakefile", help="for --report")
