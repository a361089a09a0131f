"""One question to the tidy tables (`python -m attnbench advise`): the answers that match it, one
per question from one grid, measured answers apart from emulated ones, in the format asked."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from .advice import AdviceError, Choice, answers, one_per_question, select
from .advice_text import advice_markdown, overview, render, verdict_lines
from .against import against
from .collect import ReportError, read_cells, read_samples

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
    local_kernel: str = ""  # modelled answers only: the CP model's local kernel ("": its default)
    network: str = ""  # modelled answers only: the CP model's network preset ("": its default)

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
    except ReportError as e:  # names the file and what is wrong with it, in one line
        raise AdviceError(str(e)) from None
    if df.empty:
        raise AdviceError(f"{cells} has no cells (a header only): nothing to advise on")
    try:
        samples = read_samples(cells)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise AdviceError(f"the per-sample table beside {cells} is unreadable ({e})") from None
    return df, samples


def _label_emulated(text: str) -> str:
    return f"[{EMULATED_NOTE}]\n\n{text}"


MODELLED_NOTE = (
    "modelled: the CP model's prediction (cp_model/, docs/cp-model.md), never a measurement; its "
    "error against published CP benchmarks is stated below"
)


def _measured_gpus(found) -> set[int]:
    return {a.gpus for a in found}


def respond(df: pd.DataFrame, samples: pd.DataFrame, families, q: Question, modelled=None) -> str:
    """The answer to a question, as text in the format asked; AdviceError naming a bad value and
    the valid ones. `modelled(question, gpus) -> text`: the CP model's answer where --gpus asks
    for GPU counts no grid measured (None: such a question gets the measured counts' names)."""
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
    found_all = answers(df, families, samples)
    asked = q.wanted.get("gpus") or []
    beyond = [n for n in asked if n > 1 and n not in _measured_gpus(found_all)]
    if beyond and modelled is not None:
        kept = [n for n in asked if n not in beyond]
        parts = (
            [_measured(found_all, replace(q, wanted={**q.wanted, "gpus": kept}))] if kept else []
        )
        for n in beyond:
            text = modelled(q, n)
            parts.append(f"[{MODELLED_NOTE}]\n\n{text}" if q.fmt in ("text", "md") else text)
        return "\n\n".join(parts)
    return _measured(found_all, q)


def _measured(found_all, q: Question) -> str:
    """The answers of the tidy tables: measured ones, then emulated ones in a block of their own."""
    found = select(found_all, **q.wanted)
    if q.by_mask:
        return _overview(found, q)
    choices = one_per_question(found)
    measured = [c for c in choices if not c.answer.emulated]
    emulated = [c for c in choices if c.answer.emulated]
    parts = []
    for block, label in ((measured, False), (emulated, True)):
        if not block:
            continue
        text = _block(block, q, found_all)
        parts.append(_label_emulated(text) if label and q.fmt in ("text", "md") else text)
    if q.fmt == "json":
        import json

        return json.dumps([x for p in parts for x in json.loads(p)], indent=1)
    return "\n\n".join(parts)


def _block(choices: list[Choice], q: Question, found_all) -> str:
    if q.every_grid:  # every grid's answer, each labelled by its grid, the chosen one first
        choices = [Choice(a, ()) for c in choices for a in (c.answer, *c.others)]
    # each answer set against its family's baselines, looked up among every grid's answers
    choices = [replace(c, against=against(c.answer, found_all)) for c in choices]
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
        if table.empty:  # e.g. forward cells only: no train answer (the default direction)
            have = ", ".join(sorted({a.direction for a in found}))
            raise AdviceError(f"--overview: no {d} answers to show; valid --direction: {have}")
        if q.fmt == "csv":
            parts.append(table.to_csv().rstrip("\n"))
        elif q.fmt == "json":
            parts.append(table.reset_index().to_json(orient="records", indent=1))
        else:
            parts.append(table.to_markdown())
    return "\n\n".join(parts)
