"""One question to the tidy tables (`python -m attnbench advise`): the answers that match it, one
per question from one grid, measured answers apart from emulated ones, in the format asked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .advice import AdviceError, Choice, answers, one_per_question, select
from .advice_text import advice_markdown, overview, render, verdict_lines
from .collect import read_cells, read_samples

# A question matching more answers than this prints one verdict line each, not their tables.
MANY = 8
FORMATS = ("text", "md", "json", "csv")
EMULATED_NOTE = (
    "emulated: one GPU ran every rank's compute in turn (never a distributed measurement; "
    "no communication is timed)"
)


@dataclass(frozen=True)
class Question:
    """What `advise` was asked: filters (each a list of values, or None) and how to answer."""

    wanted: dict
    fmt: str = "text"
    verbose: bool = False
    every_grid: bool = False  # --all: also the other grids' answers, labelled
    by_mask: bool = False  # --overview: one row per mask, two columns per length

    @property
    def filtered(self) -> bool:
        return any(v is not None for k, v in self.wanted.items() if k != "grid")


def read_tables(cells: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tidy table and its per-sample table; AdviceError in one line where there is no
    usable table (missing, unreadable, empty, or with no cells)."""
    if not cells.is_file():
        raise AdviceError(
            f"no tidy table at {cells}; pass --cells (e.g. results/h200/tables/cells.csv) or make "
            "it (python -m attnbench regenerate)"
        )
    try:
        df = read_cells(cells)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise AdviceError(f"{cells} is not a readable tidy table ({type(e).__name__})") from None
    if "grid" not in df or "status" not in df:
        raise AdviceError(f"{cells} is not a tidy table of this benchmark (no grid/status column)")
    if df.empty:
        raise AdviceError(f"{cells} has no cells (a header only): nothing to advise on")
    try:
        samples = read_samples(cells)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise AdviceError(f"the per-sample table beside {cells} is unreadable ({e})") from None
    return df, samples


def _label_emulated(text: str) -> str:
    return f"[{EMULATED_NOTE}]\n\n{text}"


def respond(df: pd.DataFrame, samples: pd.DataFrame, families, q: Question) -> str:
    """The answer to a question, as text in the format asked; AdviceError naming a bad value and
    the valid ones."""
    if q.fmt not in FORMATS:
        raise AdviceError(f"--format {q.fmt}: valid --format: {', '.join(FORMATS)}")
    if q.wanted.get("grid"):
        grids = list(dict.fromkeys(df["grid"]))
        for g in q.wanted["grid"]:
            if g not in grids:
                raise AdviceError(f"--grid {g}: no such grid; valid --grid: {', '.join(grids)}")
    if not q.filtered and not q.by_mask and q.fmt in ("text", "md"):
        g = q.wanted.get("grid")
        return advice_markdown(df if not g else df[df["grid"].isin(g)], families, samples)
    found = select(answers(df, families, samples), **q.wanted)
    if q.by_mask:
        return _overview(found, q)
    choices = one_per_question(found)
    measured = [c for c in choices if not c.answer.emulated]
    emulated = [c for c in choices if c.answer.emulated]
    parts = []
    for block, label in ((measured, False), (emulated, True)):
        if not block:
            continue
        text = _block(block, q)
        parts.append(_label_emulated(text) if label and q.fmt in ("text", "md") else text)
    if q.fmt == "json":
        import json

        return json.dumps([x for p in parts for x in json.loads(p)], indent=1)
    return "\n\n".join(parts)


def _block(choices: list[Choice], q: Question) -> str:
    if q.every_grid:  # every grid's answer, each labelled by its grid, the chosen one first
        choices = [Choice(a, ()) for c in choices for a in (c.answer, *c.others)]
    if q.fmt == "text" and len(choices) > MANY and not q.verbose:
        return (
            verdict_lines(choices)
            + f"\n({len(choices)} answers: narrow the question, e.g. with --seqlen and "
            "--direction, for each one's ranked table)"
        )
    return render(choices, q.fmt, q.verbose)


def _overview(found, q: Question) -> str:
    found = [c.answer for c in one_per_question(found)]
    directions = q.wanted.get("direction") or ["train"]
    parts = []
    for d in directions:
        table = overview(found, d)
        if q.fmt == "csv":
            parts.append(table.to_csv().rstrip("\n"))
        elif q.fmt == "json":
            parts.append(table.reset_index().to_json(orient="records", indent=1))
        else:
            parts.append(table.to_markdown())
    return "\n\n".join(parts)
