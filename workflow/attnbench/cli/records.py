"""`records`: the record paths still to make, as Snakemake targets, or the plan of device calls
that would make them (the planning is attnbench.pipeline.plan's and
attnbench.families.estimate's)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..pipeline.plan import OUTDATED
from ..status import STATUSES
from .common import config_of, grids_parser


def cmd_records(a):
    """Record paths of the grids' cells still missing or outdated (attnbench.pipeline.currency; not those
    it keeps: outdated_records: keep, or a device this environment cannot run), as Snakemake
    targets: a session with little device time runs the short lengths first
    (tools/offline-gpu/gpu_session.sh), so whatever it does not reach is the longest cells;
    --smallest-first / --budget-s order and cut them by their estimated time, and --calls S
    prints the plan of calls of S seconds instead; --rerun STATUS... the cells whose records on disk
    have those statuses (or are outdated), for `snakemake --forcerun`. Saying so on stderr where
    there are none (stdout stays the targets alone: scripts read it)."""
    from collections import Counter

    from ..grid.expand import cell_path
    from ..pipeline.plan import cells_to_rerun, cells_to_run, in_order
    from ..record.validate import RecordError

    cfg = config_of(a)
    out = Path(cfg["output_dir"])
    only = {"seqlen": a.seqlen, "kernels": a.kernels, "masks": a.masks}
    try:
        if a.rerun:
            cells = cells_to_rerun(cfg, a.grids, set(a.rerun), only)
        else:
            cells = cells_to_run(cfg, a.grids, only, a.all)
    except RecordError as e:
        sys.exit(f"records: {e}")
    if not cells:
        grids = ", ".join(a.grids or cfg["run"])
        what = (
            f"records with status {' or '.join(a.rerun)}"
            if a.rerun
            else "cells missing or outdated"
        )
        print(f"records: no {what} in {grids} under {out}", file=sys.stderr)
        return
    if a.calls:
        from ..families.estimate import calls, write_calls

        plan = calls(cells, out, a.calls)
        for i, (batch, s) in enumerate(plan, 1):
            kinds = Counter(f"{c['impl']} {c['mask']} {c['seqlen']}" for c in batch)
            print(
                f"call {i}: {len(batch)} cells, estimated {s:.0f} s; e.g. {', '.join(list(kinds)[:3])}"
            )
        if a.calls_dir:
            print(f"written: {', '.join(map(str, write_calls(plan, out, Path(a.calls_dir))))}")
        return
    for cell in in_order(cells, out, a.smallest_first, a.budget_s):
        print(out / cell_path(cell))


def add_parsers(sub) -> None:
    c = grids_parser(
        sub,
        "records",
        "record paths of the grids' cells not on disk or outdated (Snakemake targets)",
        cmd_records,
    )
    c.add_argument("--seqlen", nargs="*", type=int, help="only kernel cells of these lengths")
    c.add_argument("--kernels", nargs="*", help="only these kernels (or CP methods)")
    c.add_argument("--masks", nargs="*", help="only these masks")
    c.add_argument("--all", action="store_true", help="also the records already on disk")
    c.add_argument(
        "--rerun",
        nargs="+",
        choices=[*STATUSES, OUTDATED],
        metavar="STATUS",
        help="instead: the records on disk with these statuses (or outdated: those a run would "
        "make again), to measure again with `snakemake --forcerun $(attnbench records --rerun "
        f"implausible)`; one or more of {', '.join([*STATUSES, OUTDATED])}",
    )
    c.add_argument(
        "--smallest-first",
        action="store_true",
        help="in order of the time records of the same points on disk estimate, smallest first",
    )
    c.add_argument(
        "--budget-s",
        type=float,
        help="only the smallest-first cells whose estimates add up to at most this many seconds",
    )
    c.add_argument(
        "--calls",
        type=float,
        metavar="SECONDS",
        help="print the plan instead: the missing cells, smallest first, in calls of SECONDS each",
    )
    c.add_argument(
        "--calls-dir",
        help="with --calls: also write each call's record paths to DIR/callNN.txt, and every cell's "
        "estimate and path in order to DIR/order.tsv (a device call that carries them needs no "
        "records to plan from)",
    )
