"""`advise`: which kernel or CP method, answered from the tidy tables (report.question), and by
the CP model at GPU counts no grid measured."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import WORKFLOW_CONFIG, Once, config_of, config_options, parse_length


def cmd_advise(a):
    """The answer to a question from the tidy tables (report.question); without filters, the
    whole advice. A question it cannot answer names the valid values (exit 2)."""
    from ..families import advice_of
    from ..report.advice import AdviceError
    from ..report.paired import Verdict, ruled_by
    from ..report.question import Question, read_tables, respond

    cells = Path(a.cells) if a.cells else None
    try:
        if cells is None:
            cells = Path(config_of(a)["output_dir"]) / "tables" / "cells.csv"
        df, samples = read_tables(cells)
        wanted = {k: getattr(a, k) for k in ADVISE_FILTERS}
        q = Question(wanted, a.format, a.verbose, a.all, a.overview)
        # the verdict rule's settings: the config's report.verdict (defaults where none is here)
        has_config = a.configfile or a.config or Path(WORKFLOW_CONFIG).is_file()
        with ruled_by(Verdict.of(config_of(a) if has_config else None)):
            print(respond(df, samples, advice_of, q, modelled_answers(a, cells)))
    except AdviceError as e:  # naming the table, where the message does not already
        where = "" if str(cells) in str(e) else f" (in {cells})"
        print(f"advise: {e}{where}", file=sys.stderr)
        sys.exit(2)


def modelled_answers(a, cells: Path):
    """advise's answers at GPU counts no grid measured: the CP model's (cp_model/advise.py), over
    the records of the tidy table's output folder; loaded only when asked."""

    def respond(q, gpus):
        from ..cp_model.advise import modelled

        cfg = config_of(a)
        return modelled(cfg, cells.resolve().parent.parent, a.local_kernel, a.network)(q, gpus)

    return respond


ADVISE_FILTERS = (
    "grid",
    "mask",
    "seqlen",
    "tokens_per_gpu",
    "gpus",
    "heads",
    "block_size",
    "density",
    "direction",
)


def add_parsers(sub) -> None:
    c = sub.add_parser(
        "advise",
        help="which kernel or CP method, for a mask, length, direction (and GPUs): from the tidy "
        "tables, compared draw by draw, with the records it rests on; without filters, the "
        "whole advice",
        description="A question that several grids answer is answered from one: --grid, else "
        "the grid with the most ok contenders there, then the most draws, then the newest "
        "records (--all shows the others). Emulated answers come in a block of their own. "
        "--gpus N that no grid measured is answered by the CP model (with --mask and --seqlen "
        "or --tokens-per-gpu), labelled modelled, with its validated error. Every filter takes "
        "one or more values (--mask causal full, or --mask causal --mask full).",
    )
    many = dict(nargs="+", action="extend")  # a filter: its values, of every time it is given
    c.add_argument("--mask", **many, help="mask patterns, e.g. causal_document")
    c.add_argument("--seqlen", **many, type=parse_length, help="whole sequences, e.g. 32K")
    c.add_argument("--direction", **many, help="fwd, bwd, or train (fwd + bwd of the same draw)")
    c.add_argument("--gpus", **many, type=int, help="1: the one-GPU grids; 2 or more: CP")
    c.add_argument("--tokens-per-gpu", **many, type=parse_length, help="context parallelism only")
    c.add_argument("--heads", **many, help="query:KV heads, e.g. 64:8")
    c.add_argument("--block-size", **many, type=int, help="block-sparse: block (or average)")
    c.add_argument("--density", **many, type=float, help="block-sparse: kept block density")
    c.add_argument("--grid", **many, help="answer from these grids only")
    c.add_argument("--all", action="store_true", help="also every other grid's answer, labelled")
    c.add_argument("--verbose", action="store_true", help="with the record paths")
    c.add_argument(
        "--format",
        action=Once,
        default="text",
        choices=["text", "md", "json", "csv"],
        help="default: text",
    )
    c.add_argument(
        "--overview",
        action="store_true",
        help="one row per mask, the verdict and runner-up per length (direction: train)",
    )
    c.add_argument(
        "--local-kernel",
        action=Once,
        default="",
        help="--gpus beyond the measured: the CP model's local kernel (default cp_model's)",
    )
    c.add_argument(
        "--network",
        action=Once,
        default="",
        help="--gpus beyond the measured: the CP model's network preset (default cp_model's)",
    )
    c.add_argument(
        "--cells", action=Once, help="the tidy table (default: <output_dir>/tables/cells.csv)"
    )
    config_options(c)  # output_dir without --cells; the CP model's settings for --gpus
    c.set_defaults(fn=cmd_advise)
