"""The kernel family's figures of the paired answers (report.advice: kernels compared draw by draw):
where its answers sit in the winner map (report.winner_map: a row per mask, a column per length),
and each kernel's speedup over a reference kernel, per draw. Both read the answers the advice
tables give; neither ranks anew."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from ...report.advice import Answer
from ...report.labels import heads_label, mask_families, order
from ...report.labels import seqlen_label as S
from ...report.plotting import (
    grid_axes,
    legend_and_notes,
    outer_labels,
    title_above,
)
from ...report.style import colour, marker, marker_size
from ...report.winner_map import MapAxes, family_answers, length_column
from .advice import ADVICE

# Speedups are over the paper's baseline, FA2, unless the grid names others (`reference_kernel`);
# where FA2 cannot run a mask (or is not installed), over FlexAttention, which runs every mask.
DEFAULT_REFERENCES = ("fa2", "flex")


def answers(df: pd.DataFrame, samples: pd.DataFrame | None) -> list[Answer]:
    """The grid's answers at every point and direction (fwd, bwd, train = fwd + bwd, fwdbwd)."""
    return family_answers(df, ADVICE, samples)


def heads_of(a: Answer) -> tuple[int, int]:
    return int(a.point["heads_q"]), int(a.point["heads_kv"])


# ----------------------------------------------------------------------------- the winner map


def _mask_rows(found: list[Answer]) -> list[str]:
    return [m for ms in mask_families(a.point["mask"] for a in found).values() for m in ms]


# A row per mask (in its figure family's order), a column per length, grouped by heads setting.
MAP_AXES = MapAxes(
    row=lambda a: a.point["mask"],
    rows=_mask_rows,
    column=length_column,
    row_words="mask",
    column_words="sequence length",
    group_words="heads",
)


# ----------------------------------------------------------------------------- speedup


def references(grid_cfg: dict | None) -> list[str]:
    """The kernels speedups are over, in order of preference (the grid's `reference_kernel`)."""
    named = (grid_cfg or {}).get("reference_kernel") or DEFAULT_REFERENCES
    return [named] if isinstance(named, str) else list(named)


def reference_words(refs: list[str]) -> str:
    """'fa2; flex where fa2 is not ok at a mask' (what 1x is)."""
    if len(refs) == 1:
        return refs[0]
    return f"{refs[0]}; " + "; ".join(
        f"{r} where {', '.join(refs[: i + 1])} {'is' if i == 0 else 'are'} not ok at a mask"
        for i, r in enumerate(refs[1:])
    )


def reference_title(refs: list[str]) -> str:
    """'fa2 (flex where fa2 is not ok)'."""
    return refs[0] + (
        f" ({', '.join(refs[1:])} where {refs[0]} is not ok)" if len(refs) > 1 else ""
    )


def reference_at(panel: list[Answer], refs: list[str]) -> str | None:
    """The first of `refs` with an ok cell at some length of a mask's answers."""
    ok = {c.name for a in panel for c in a.ok}
    return next((r for r in refs if r in ok), None)


@dataclass(frozen=True)
class Speedup:
    """A kernel's speedup over the reference at one point: the reference's time over its own,
    per draw (the draws both have): their median and min-max."""

    impl: str
    median: float
    lo: float
    hi: float
    draws: int


def speedups(a: Answer, ref: str) -> list[Speedup]:
    """Every ok kernel's speedup over `ref` at an answer's point (none where `ref` is not ok)."""
    base = {c.name: c for c in a.ok}.get(ref)
    if base is None:
        return []
    mine = {d.key: d for d in base.timed().draws}
    out = []
    for c in a.ok:
        if c.name == ref:
            continue
        ratios = [mine[d.key].median / d.median for d in c.timed().draws if d.key in mine]
        if ratios:
            out.append(
                Speedup(c.name, float(np.median(ratios)), min(ratios), max(ratios), len(ratios))
            )
    return out


def _ratio_tick(v: float, _=None) -> str:
    return f"{v:g}x" if v >= 1 else f"1/{1 / v:g}x"


def _log2_axis(ax, values):
    lo, hi = min([*values, 1.0]) / 1.25, max([*values, 1.0]) * 1.25
    ax.set_yscale("log", base=2)
    ax.set_ylim(lo, hi)
    k0, k1 = int(np.floor(np.log2(lo))), int(np.ceil(np.log2(hi)))
    step = max(1, (k1 - k0) // 6)  # at most about 7 ticks
    ax.yaxis.set_major_locator(FixedLocator([2.0**k for k in range(k0, k1 + 1, step)]))
    ax.yaxis.set_major_formatter(FuncFormatter(_ratio_tick))
    ax.yaxis.set_minor_locator(NullLocator())


def _panel_lengths(here: list[Answer]) -> tuple[list, list, dict]:
    """(heads settings drawn along length, the lengths, {heads: its lengths}): the settings
    measured at several lengths; where none is, the first setting (drawn as bars)."""
    lengths_of: dict = {}
    for a in here:
        lengths_of.setdefault(heads_of(a), set()).add(a.seqlen)
    along = [h for h, ls in lengths_of.items() if len(ls) > 1] or list(lengths_of)[:1]
    lengths = sorted({a.seqlen for a in here if heads_of(a) in along})
    return along, lengths, lengths_of


def speedup_figure(found: list[Answer], direction: str, refs: list[str], title, subtitle=""):
    """One panel per mask: each kernel's speedup over the mask's reference (the first of `refs` ok
    there) against length: the median over the draws, the bar their min-max; 1x is the
    reference. Heads settings measured at one length only are left to the winner map and
    advice.md (one point on a length axis says nothing of length); a figure whose every setting
    has one length draws bars per kernel."""
    here = [a for a in found if a.direction == direction]
    masks = [m for ms in mask_families(a.point["mask"] for a in here).values() for m in ms]
    heads, lengths, lengths_of = _panel_lengths(here)
    styles = dict(zip(heads, ["-", "--", ":", "-."]))
    ncols = min(4, len(masks))
    fig, axes = grid_axes(len(masks), ncols=ncols, w=3.4, h=2.6)
    drawn = {"points": 0, "bars": 0, "reference": {}, "no_reference": {}}
    for ax, mask in zip(axes, masks):
        panel = [a for a in here if a.point["mask"] == mask and heads_of(a) in heads]
        ref = reference_at(panel, refs)
        drawn["reference"][mask] = ref
        series: dict = {}
        for a in panel if ref else []:
            if ref not in {c.name for c in a.ok}:
                why_not = next((c.why_not() for c in a.not_ok if c.name == ref), "no cell")
                drawn["no_reference"].setdefault(mask, []).append((a.seqlen, why_not))
            for sp in speedups(a, ref):
                series.setdefault((sp.impl, heads_of(a)), []).append((a.seqlen, sp))
        names = order({impl for impl, _ in series})
        if len(lengths) > 1:
            drawn["points"] += _speedup_lines(
                ax, series, names, heads, styles, lengths, mask, direction
            )
        else:
            drawn["bars"] += _speedup_bars(ax, series, names, heads[0], mask, direction)
            ax.set_xlabel(f"kernel, at {S(lengths[0])}" if lengths else "kernel")
        values = [v for pts in series.values() for _, sp in pts for v in (sp.lo, sp.hi)]
        if values:
            _log2_axis(ax, values)
            ax.axhline(1.0, color="0.2", lw=1.0, ls=REFERENCE_LS, zorder=1)
        ax.set_ylabel("speedup over the reference")
        ax.grid(alpha=0.3)
        ax.set_title(f"{mask} (over {ref})" if ref else mask, fontsize="medium")
        if not ref:
            note = f"none of {', '.join(refs)} is ok here: no reference"
        elif drawn["no_reference"].get(mask):
            missing = sorted(drawn["no_reference"][mask])
            words = "; ".join(sorted({w for _, w in missing}))
            note = f"{ref} not ok at {', '.join(S(s) for s, _ in missing)}: {words}"
        else:
            note = ""
        if note:
            ax.text(
                0.02,
                0.97,
                note,
                transform=ax.transAxes,
                fontsize="x-small",
                va="top",
                color="0.35",
                wrap=True,
            )
    outer_labels(axes, ncols)
    fig.tight_layout()
    title_above(fig, title, subtitle)
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    keys = {f"1x: the reference ({reference_words(refs)})": ref_line("0.2", REFERENCE_LS)}
    if len(heads) > 1:
        keys.update({f"{heads_label(*h)} (line style)": ref_line("0.3", styles[h]) for h in heads})
    notes = [
        "Speedup = the reference's time over the kernel's on the same sampled mask (draw), at each "
        "point where both are ok; the marker is the median over the draws, the bar their min-max "
        "(no bar: one draw). Above 1x: faster than the reference.",
    ]
    left = [h for h in lengths_of if h not in heads]
    if left:
        notes.append(
            ", ".join(
                f"{heads_label(*h)} (at {', '.join(S(s) for s in sorted(lengths_of[h]))} only)"
                for h in left
            )
            + ": in the winner map and advice.md, not as single points on a length axis."
        )
    legend_and_notes(fig, {k: handles[k] for k in order(handles)}, notes, keys)
    return fig, drawn


REFERENCE_LS = (0, (4, 2))


def _speedup_lines(ax, series, names, heads, styles, lengths, mask, direction) -> int:
    """A line per kernel and heads setting against length, its draws' min-max as bars."""
    x_of = {s: i for i, s in enumerate(lengths)}
    n = 0
    for k, impl in enumerate(names):
        shift = (k - (len(names) - 1) / 2) * min(0.05, 0.45 / max(1, len(names)))
        for hk in heads:
            pts = sorted(series.get((impl, hk), []), key=lambda p: p[0])
            if not pts:
                continue
            y = np.array([sp.median for _, sp in pts])
            ax.errorbar(
                np.array([x_of[s] for s, _ in pts]) + shift,
                y,
                yerr=[y - [sp.lo for _, sp in pts], [sp.hi for _, sp in pts] - y],
                ls=styles[hk],
                color=colour(impl),
                marker=marker(impl),
                ms=marker_size(impl, 3.8),
                lw=1.2,
                elinewidth=0.9,
                capsize=1.5,
                label=impl,
                gid=f"speedup|{impl}|{mask}|{hk[0]}:{hk[1]}|{direction}",
            )
            n += len(pts)
    ax.set_xticks(
        range(len(lengths)), [S(s) for s in lengths], rotation=45 if len(lengths) > 9 else 0
    )
    ax.set_xlim(-0.5, len(lengths) - 0.5)
    ax.set_xlabel("sequence length (tokens)")
    return n


def _speedup_bars(ax, series, names, hk, mask, direction) -> int:
    """At one length: a bar per kernel, its draws' min-max as a whisker."""
    n = 0
    for k, impl in enumerate(names):
        pts = series.get((impl, hk), [])
        if not pts:
            continue
        sp = pts[0][1]
        ax.bar(
            k,
            sp.median,
            0.8,
            color=colour(impl),
            label=impl,
            gid=f"speedup_bar|{impl}|{mask}|{direction}",
        )
        ax.errorbar(
            k,
            sp.median,
            yerr=[[sp.median - sp.lo], [sp.hi - sp.median]],
            color="0.2",
            lw=0,
            elinewidth=0.9,
            capsize=1.5,
        )
        n += 1
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", rotation_mode="anchor")
    return n


def ref_line(colour_: str, ls) -> Line2D:
    return Line2D([], [], color=colour_, ls=ls, lw=1.2)
