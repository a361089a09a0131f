"""The winner map of any family's answers (report.advice): one panel per direction (fwd, bwd, the
training step), a row and a column per point, each cell coloured by the contender the answer
names. A family says where its answers sit (MapAxes: kernels by mask and length, block-sparse
kernels by block setting and length, CP methods by mask and tokens per GPU x GPUs); the drawing
and the words are the same for all. It draws the answers, never ranks anew."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch, Rectangle

from .advice import DIRECTIONS, TRAIN, Answer, grid_answers
from .labels import direction_label, heads_label, order, seqlen_label
from .paired import Standing
from .plotting import grid_axes, legend_and_notes, title_above
from .style import colour

TIE_HATCH = "////"


@dataclass(frozen=True)
class Column:
    """A column of the map: its place (columns of one group side by side, a heavier line between
    groups) and its tick."""

    group: tuple  # e.g. the heads setting; columns are ordered by group, then `at`
    at: float  # its place within its group (a length, a GPU count)
    label: str  # its tick: '32K'
    group_label: str  # the group in words, under the tick where the map has several: 'GQA 64:8'


@dataclass(frozen=True)
class MapAxes:
    """Where a family's answers sit in its winner map (each family's figures give one)."""

    row: Callable[[Answer], str]  # an answer's row: 'causal', 'B=64 d=0.2'
    rows: Callable[[list[Answer]], list[str]]  # the rows of these answers, in the map's order
    column: Callable[[Answer], Column]
    row_words: str  # the rows in words, for the notes: 'mask'
    column_words: str  # the columns in words (the axis label): 'sequence length'
    group_words: str  # what a group is, for the notes: 'heads'
    # the registry name a contender is coloured by (a CP contender 'ring_p2p [auto]': ring_p2p)
    base: Callable[[str], str] = lambda name: name
    cell_width: float = 1.1  # inches: wide enough for its contenders' names and their ties


def length_column(a: Answer) -> Column:
    """A column per length, grouped by heads setting (the one-GPU families' maps)."""
    heads = (int(a.point["heads_q"]), int(a.point["heads_kv"]))
    return Column(heads, a.seqlen, seqlen_label(a.seqlen), heads_label(*heads))


def directions(found: list[Answer]) -> list[str]:
    have = {a.direction for a in found}
    return [d for d in DIRECTIONS if d in have]


def direction_words(d: str) -> str:
    return "training step (fwd + bwd)" if d == TRAIN else direction_label(d)


def family_answers(df, fam, samples=None) -> list[Answer]:
    """A grid's answers at every point and direction (fwd, bwd, train = fwd + bwd, fwdbwd)."""
    if df.empty:
        return []
    return grid_answers(df, str(df["grid"].iloc[0]), fam, samples)[0]


def ratio_text(s: Standing) -> str:
    """Its time over the fastest's per draw, '1.05x' or '1.04-1.06x', as advice.md writes it
    (written here: the figures import no table code, so editing the tables reruns no figure)."""

    def r(x: float) -> str:
        return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"

    lo, hi = r(s.ratio_lo), r(s.ratio_hi)
    return f"{lo}x" if lo == hi else f"{lo}-{hi}x"


def cell_text(a: Answer) -> tuple[str, str]:
    """(who, margin) written in a map cell: the winner, the tie (the first two names joined by ~,
    '+n' for n more) or the only one ok; then the runner-up's time over the fastest's per draw
    and the draws the fastest won."""
    if not a.ok:
        return "none ok", ""
    if len(a.ok) == 1:
        return a.fastest.name, "only one ok"
    tied = [c.name for c in a.tied]
    who = (
        a.winner.name
        if a.winner
        else "~".join(tied[:2]) + (f" +{len(tied) - 2}" if len(tied) > 2 else "")
    )
    best, second = a.standing[a.fastest.name], a.standing[a.runner_up.name]
    won = "1 draw" if a.draws == 1 else f"{best.wins}/{a.draws}"
    return who, f"{ratio_text(second)} {won}"


def _ink(fill: str, alpha: float) -> str:
    """Black or white text, whichever reads on the fill (blended over white at alpha)."""
    r, g, b = (alpha * c + (1 - alpha) for c in to_rgb(fill))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def _kind(a: Answer) -> str:
    if not a.ok:
        return "none"
    return "only" if len(a.ok) == 1 else "winner" if a.winner else "tie"


def _name_size(who: str) -> float:
    return 4.9 if len(who) > 20 else 5.4 if len(who) > 15 else 5.9 if len(who) > 11 else 6.4


def _columns(found: list[Answer], axes: MapAxes) -> list[Column]:
    cols = {axes.column(a) for a in found}
    groups = list(dict.fromkeys(axes.column(a).group for a in found))
    return sorted(cols, key=lambda c: (groups.index(c.group), c.at, c.label))


def _cell(ax, a: Answer, i: int, j: int, axes: MapAxes, d: str, col: Column) -> tuple:
    """One answer's cell: its fill, hatch and words; (kind, who, margin)."""
    who, margin = cell_text(a)
    kind = _kind(a)
    fill = colour(axes.base(a.fastest.name)) if a.ok else "white"
    alpha = 0.9 if kind in ("winner", "only") else 0.45
    row = axes.row(a)
    ax.add_patch(
        Rectangle(
            (j - 0.5, i - 0.5),
            1,
            1,
            facecolor=fill,
            alpha=alpha if a.ok else 1,
            hatch=TIE_HATCH if kind == "tie" else None,
            edgecolor="white",
            lw=1.0,
            gid=f"win|{kind}|{row}|{col.label}|{col.group_label}|{d}|{a.verdict()}",
        )
    )
    ink = _ink(fill, alpha) if a.ok else "0.4"
    size = _name_size(who)
    ax.text(
        j, i - 0.13, who, ha="center", va="center", fontsize=size, fontweight="bold", color=ink
    )
    ax.text(j, i + 0.2, margin, ha="center", va="center", fontsize=5.4, color=ink)
    return kind, who, margin


def winner_map(found: list[Answer], axes: MapAxes, title: str, subtitle: str = ""):
    """One panel per direction (fwd, bwd, the training step): a row and a column per point
    (`axes`). A cell's colour is the winning contender's; a tie is hatched in the fastest's
    colour. Returns the figure and what was drawn (per kind of cell, and each cell as
    (direction, row, column, who, margin))."""
    if not found:  # e.g. a CP grid of one-GPU cells only: baselines, never advice
        fig = plt.figure(figsize=(6.0, 1.5))
        fig.text(0.5, 0.5, "No answers to map: advice.md says which cells compete", ha="center")
        title_above(fig, title, subtitle)
        return fig, {"winner": 0, "tie": 0, "only": 0, "none": 0, "cells": []}
    dirs = directions(found)
    rows = axes.rows(found)
    cols = _columns(found, axes)
    at = {(a.direction, axes.row(a), axes.column(a)): a for a in found}
    width = 1.6 + axes.cell_width * len(cols)
    fig, panels = grid_axes(len(dirs), ncols=1, w=width, h=0.9 + 0.36 * len(rows))
    drawn = {"winner": 0, "tie": 0, "only": 0, "none": 0, "cells": []}
    shown = set()
    several = len({c.group for c in cols}) > 1
    for ax, d in zip(panels, dirs):
        for i, row in enumerate(rows):
            for j, col in enumerate(cols):
                a = at.get((d, row, col))
                if a is None:
                    continue
                kind, who, margin = _cell(ax, a, i, j, axes, d, col)
                drawn[kind] += 1
                drawn["cells"].append((d, row, col, who, margin))
                if a.ok:
                    shown.add(axes.base(a.fastest.name))
        ticks = [c.label + (f"\n{c.group_label}" if several else "") for c in cols]
        ax.set_xticks(range(len(cols)), ticks, fontsize="small")
        ax.set_yticks(range(len(rows)), rows, fontsize="small")
        ax.set_xlim(-0.5, len(cols) - 0.5)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.tick_params(length=0)
        ax.grid(False)
        for j in range(1, len(cols)):  # a heavier line between groups
            if cols[j].group != cols[j - 1].group:
                ax.axvline(j - 0.5, color="0.2", lw=1.5)
        ax.set_title(direction_words(d).capitalize(), fontsize="medium")
        ax.set_xlabel(axes.column_words + (f" and {axes.group_words}" if several else ""))
    fig.tight_layout(h_pad=1.0)
    title_above(fig, title, subtitle)
    handles = {k: Patch(color=colour(k), alpha=0.9) for k in order(shown)}
    keys = {
        "tie (the fastest's colour, hatched): fastest~next +n more tied": Patch(
            facecolor="0.75", hatch=TIE_HATCH, edgecolor="white"
        )
    }
    what = found[0].family.what if found else "contender"
    groups = ", ".join(dict.fromkeys(c.group_label for c in cols))
    notes = [
        f"In each cell: the winner (every other {what} slower by the advice's rule: on k of n "
        "draws by a sign test, or p20-p80 apart on each of few draws, and by the threshold), "
        f"or the tie of the fastest with every {what} not slower than it; below, the runner-up's "
        "time over the fastest's on each draw (min-max) and the draws the fastest won "
        "('1 draw': a single sampled mask). Only ok cells compete (advice.md lists the others).",
        f"A row per {axes.row_words}; {axes.group_words}: {groups}.",
    ]
    legend_and_notes(fig, handles, notes, keys)
    return fig, drawn


def caption(axes: MapAxes, what: str) -> str:
    """What a winner map shows, for its caption file (`what`: the family's contender in words)."""
    return (
        f"Which {what} wins at each {axes.row_words} (row) and {axes.column_words} (column, "
        f"grouped by {axes.group_words}), one panel per direction and one for the training step "
        f"(fwd + bwd of the same draw): the answers of advice.md, each {what} compared draw by "
        f"draw. A cell's colour is the winning {what}'s: every other one is slower than the "
        "winner by the advice's rule (slower on k of n draws by a one-sided sign test, or p20-p80 "
        "apart on each draw where too few draws for it, and by at least the threshold as a "
        "geometric mean: config.yaml report.verdict); where it is not, the cell is hatched in "
        f"the fastest's colour and names the tie (A~B: the fastest and each {what} not slower). "
        "Below the name: the runner-up's time over the fastest's on each draw (min-max) and the "
        "draws the fastest won. Only ok cells compete."
    )
