"""Figures of `family: cp` grids, from the tidy tables alone (attnbench.families calls these).

Both throughput figures draw, per panel (mask, direction, tokens per GPU), a group of bars per GPU
count with one bar per method and local kernel (its colour the method's, in every figure):
- cp_efficiency: each CP cell's per-GPU TFLOP/s as a share of the bare local kernel on one GPU over
  the same documents (report.share_of: the rule of cp_vs_single_gpu, checked draw by draw; the
  baseline may be a `local` cell of another grid of the same tidy table, over the same draws);
- cp_tflops_vs_gpus: per-GPU TFLOP/s, the bare kernel over the same whole sequence in the 1-GPU group.
Measured cells are bars (whisker: min-max over the draws, or p20-p80); emulated cells (cp.emulate,
one device, never a distributed measurement: this grid's or another grid's at the same points) are
hollow diamonds; the CP model's prediction for a measured cell (tables/<grid>/cp_model_validation.csv,
where the model ran) is a black bar-wide tick. And cp_breakdown: compute-only / communication-only /
measured times per method and GPU count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text

from ...cp.catalog import BARE_KERNEL
from ...report import plotting
from ...report.advice import draws_by_cell
from ...report.collect import emulated
from ...report.figures import Inputs
from ...report.labels import STATUS_LABEL, order, seqlen_label
from ...report.style import colour
from ...report.winner_map import caption as map_caption
from ...report.winner_map import family_answers, winner_map
from ...status import TIMED
from .advice import ADVICE
from .tables import (
    baseline_of,
    baselines,
    cp_panels,
    emulated_note,
    is_emulated_name,
    method_name,
    panel_rows,
    panel_title,
    share_of,
    with_variants,
)
from .winners import MAP_AXES

MODEL_CSV = "cp_model_validation.csv"  # the model at each measured cell, with its local kernel
KINDS = ("measured", "emulated", "modelled")


@dataclass(frozen=True)
class Mark:
    """One number drawn in a panel: a method variant at a GPU count, measured, emulated or
    modelled, with its spread (lo-hi) where it has one."""

    slot: str  # the variant: method and local kernel (and its other settings)
    method: str  # its colour
    gpus: int
    kind: str  # one of KINDS
    value: float
    lo: float | None = None
    hi: float | None = None
    resolved: bool = True  # a share: apart from the baseline's spread on every draw
    wrong: bool = False  # disagrees with the float64 reference


def _text(v) -> str:
    return "" if v is None or pd.isna(v) else str(v)


def slot_of(r, ref=None) -> str:
    """'ring_p2p | fa3' (+ ', dkv input', ', split as_needed' where not the default; + ', vs fa2'
    where its baseline `ref` ran another local kernel: the share rule's fallback to the same
    local-kernel setting, report.baseline_of)."""
    parts = [_text(r.get("local_kernel")) or "?"]
    dkv = _text(r.get("dkv_comm_dtype"))
    if dkv and dkv != "accumulator":
        parts.append(f"dkv {dkv}")
    split = _text(r.get("split_documents"))
    if split and split != "all":
        parts.append(f"split {split}")
    theirs = _text(ref.get("local_kernel")) if ref is not None else ""
    if theirs and theirs != parts[0]:
        parts.append(f"vs {theirs}")
    return f"{r['impl']} | {', '.join(parts)}"


def panel_key(r) -> tuple:
    return (r["mask"], r["direction"], int(r["tokens_per_gpu"]))


def companions(df: pd.DataFrame, cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From the whole tidy table: emulated CP cells of other grids at this grid's points (mask,
    direction, tokens per GPU, heads, head dim, dtype), and every `local` cell (a baseline is
    found among them by the share's own rule: same documents, draw by draw)."""
    if cells.empty or df.empty:
        return df.iloc[0:0], df.iloc[0:0]
    others = cells[(cells["family"] == "cp") & ~cells["grid"].isin(set(df["grid"]))]
    keys = ["mask", "direction", "tokens_per_gpu", "heads_q", "heads_kv", "head_dim", "dtype"]
    mine = set(map(tuple, df.reindex(columns=keys).astype(str).values))
    emu = others[emulated(others)] if len(others) else others
    if len(emu):
        emu = emu[[tuple(v) in mine for v in emu.reindex(columns=keys).astype(str).values]]
    local = cells[(cells["impl"] == BARE_KERNEL) & (cells["gpus"] == 1)]
    return emu, local


def model_rows(inputs: Inputs) -> pd.DataFrame:
    """The CP model's prediction at each measured cell (method, mask, direction, GPUs, tokens per
    GPU, local kernel -> predicted_tflops_per_gpu); empty where the model did not run."""
    path = inputs.tables_dir / MODEL_CSV if inputs.tables_dir else None
    need = ["method", "mask", "direction", "gpus", "tokens_per_gpu", "local_kernel"]
    if path is None or not path.exists():
        return pd.DataFrame(columns=[*need, "predicted_tflops_per_gpu"])
    m = pd.read_csv(path)
    missing = [c for c in [*need, "predicted_tflops_per_gpu"] if c not in m]
    if missing:
        raise ValueError(f"{path}: lacks the columns {', '.join(missing)}")
    return m.dropna(subset=["predicted_tflops_per_gpu"])


class Sources:
    """The rows a CP figure draws: the grid's cells, emulated cells of other grids at its points,
    the `local` cells that can be baselines, the model's predictions, and every cell's draws."""

    def __init__(self, df: pd.DataFrame, inputs: Inputs | None):
        inputs = inputs or Inputs()
        emu, local = companions(df, inputs.cells)
        self.rows = pd.concat([df, emu], ignore_index=True) if len(emu) else df
        self.rows = self.rows.assign(_emulated=emulated(self.rows).values)
        self.other_emulated = sorted(set(emu["grid"])) if len(emu) else []
        bases = pd.concat([df, local], ignore_index=True).drop_duplicates("cell_id")
        self.refs = baselines(bases)
        self.draws = draws_by_cell(inputs.samples)
        self.model = model_rows(inputs)

    def baseline(self, r):
        return baseline_of(self.refs, r)

    def cp_rows(self) -> pd.DataFrame:
        return self.rows[self.rows["impl"] != BARE_KERNEL]

    def heads(self) -> dict:
        """The grid's heads, head dim and dtype (one each: grid.config checks), for the model's rows."""
        first = self.rows.iloc[0]
        return {k: first[k] for k in ("heads_q", "heads_kv", "head_dim", "dtype")}


def share_marks(src: Sources) -> dict:
    """{panel: [Mark]} of every CP cell with a share of its baseline, and the model's prediction
    over the same baseline; {panel: [why not]} of the cells without one."""
    marks: dict = {}
    missing: dict = {}
    for _, r in src.cp_rows().iterrows():
        share = share_of(r, src.baseline(r), src.draws)
        if share is None:
            continue
        if share.median is None:
            missing.setdefault(panel_key(r), []).append(
                f"{r['impl']} at {int(r['gpus'])}: {share.why}"
            )
            continue
        kind = "emulated" if r["_emulated"] else "measured"
        marks.setdefault(panel_key(r), []).append(
            Mark(
                slot_of(r, src.baseline(r)),
                str(r["impl"]),
                int(r["gpus"]),
                kind,
                100 * share.median,
                100 * share.lo,
                100 * share.hi,
                share.apart,
            )
        )
    for m in model_marks(src, share=True):
        marks.setdefault(m[0], []).append(m[1])
    return marks, missing


def model_marks(src: Sources, share: bool) -> list[tuple]:
    """(panel, Mark) of each model prediction: per-GPU TFLOP/s, or (share) its share of the
    baseline the measured cell of the same point and local kernel has."""
    out = []
    for _, m in src.model.iterrows():
        r = {
            "impl": m["method"],
            "mask": m["mask"],
            "direction": m["direction"],
            "gpus": int(m["gpus"]),
            "tokens_per_gpu": int(m["tokens_per_gpu"]),
            "seqlen": int(m["gpus"]) * int(m["tokens_per_gpu"]),
            "local_kernel": m["local_kernel"],
            **src.heads(),
        }
        value = float(m["predicted_tflops_per_gpu"])
        ref = src.baseline(pd.Series(r)) if share else None
        if share:
            if ref is None or ref["status"] != "ok" or pd.isna(ref["tflops"]):
                continue
            value = 100 * value / float(ref["tflops"])
        out.append((panel_key(r), Mark(slot_of(r, ref), r["impl"], r["gpus"], "modelled", value)))
    return out


def tflops_marks(src: Sources) -> tuple[dict, dict]:
    """{panel: [Mark]} of per-GPU TFLOP/s: every timed CP cell, the bare kernel over the same
    whole sequence as a panel's CP cells (in its 1-GPU group), the model's predictions; and
    {panel: [what did not run]}."""
    marks: dict = {}
    notes: dict = {}
    for _, r in src.cp_rows().iterrows():
        key = panel_key(r)
        if r["status"] in TIMED and pd.notna(r["tflops"]):
            kind = "emulated" if r["_emulated"] else "measured"
            marks.setdefault(key, []).append(
                Mark(
                    slot_of(r),
                    str(r["impl"]),
                    int(r["gpus"]),
                    kind,
                    float(r["tflops"]),
                    _num(r.get("tflops_p20")),
                    _num(r.get("tflops_p80")),
                    wrong=r["status"] == "incorrect",
                )
            )
            ref = src.baseline(r)
            if ref is not None and ref["status"] in TIMED and pd.notna(ref["tflops"]):
                bare = Mark(
                    f"{BARE_KERNEL} | {_text(ref.get('local_kernel')) or '?'} ({seqlen_label(int(ref['seqlen']))})",
                    BARE_KERNEL,
                    1,
                    "measured",
                    float(ref["tflops"]),
                    _num(ref.get("tflops_p20")),
                    _num(ref.get("tflops_p80")),
                    wrong=ref["status"] == "incorrect",
                )
                if bare not in marks[key]:
                    marks[key].append(bare)
        else:
            word = STATUS_LABEL.get(r["status"], r["status"])
            notes.setdefault(key, []).append(f"{r['impl']} {word} at {int(r['gpus'])}")
    for key, m in model_marks(src, share=False):
        marks.setdefault(key, []).append(m)
    return marks, notes


def _num(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


# ---------------------------------------------------------------- drawing


def _slots(marks: list[Mark]) -> list[tuple[int, str, str]]:
    """(GPUs, slot, method) in drawing order: GPU counts ascending, methods in the registry's order."""
    seen = {(m.gpus, m.slot, m.method) for m in marks}
    methods = order({m.method for m in marks})
    return sorted(seen, key=lambda s: (s[0], methods.index(s[2]), s[1]))


def slot_bars(ax, marks: list[Mark], percent: bool, drawn: dict, tag: str):
    """A group per GPU count, a slot per variant: the measured value as a bar (whisker: its
    spread), emulated as a hollow diamond, modelled as a black tick across the slot."""
    slots = _slots(marks)
    x_of = {}
    x, last = 0.0, None
    for gpus, slot, method in slots:
        if last is not None and gpus != last:
            x += 0.6  # a gap between GPU counts
        x_of[(gpus, slot)] = x
        x += 1.0
        last = gpus
    for m in marks:
        xs = x_of[(m.gpus, m.slot)]
        c = colour(m.method)
        gid = f"{m.kind}|{tag}|{m.slot}|{m.gpus}"
        if m.kind == "measured":
            ax.bar(
                xs,
                m.value,
                0.8,
                color=c,
                edgecolor="red" if m.wrong else "none",
                hatch="////" if m.wrong else None,
                gid=gid,
            )
            if m.lo is not None and m.hi is not None and m.hi > m.lo:
                ax.errorbar(
                    xs,
                    m.value,
                    yerr=[[m.value - m.lo], [m.hi - m.value]],
                    color="0.15",
                    lw=0,
                    elinewidth=0.9,
                    capsize=2,
                )
            if percent:
                text = f"{m.value:.0f}%" if m.resolved else f"~{m.value:.0f}%"
                ax.annotate(
                    text,
                    (xs, m.hi if m.hi else m.value),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=6,
                )
        elif m.kind == "emulated":
            ax.plot(xs, m.value, "D", mfc="white", mec=c, mew=1.6, ms=6.5, zorder=5, gid=gid)
        else:
            ax.plot(xs, m.value, "_", color="black", ms=16, mew=2.2, zorder=6, gid=gid)
        drawn[m.kind] += 1
    ticks = [(x_of[(g, s)], s.replace(" | ", "\n")) for g, s, _ in slots]
    ax.set_xticks([t for t, _ in ticks], [lab for _, lab in ticks], fontsize=6.5, rotation=90)
    for g in dict.fromkeys(s[0] for s in slots):  # the GPU count under its group
        xs = [x_of[(gg, s)] for gg, s, _ in slots if gg == g]
        ax.text(
            np.mean(xs),
            1.01,
            f"{g} GPU{'s' * (g > 1)}",
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize="small",
            fontweight="bold",
        )
    ax.set_xlim(-0.7, x - 0.3)
    ax.grid(axis="x", visible=False)


def kind_handles(drawn: dict, what: str) -> dict:
    h = {}
    if drawn["measured"]:
        h[f"measured ({what})"] = Patch(color="0.55")
    if drawn["emulated"]:
        h["emulated on one device (cp.emulate: no transfer; not a distributed measurement)"] = (
            Line2D([], [], ls="", marker="D", mfc="white", mec="0.3", mew=1.6, ms=6.5)
        )
    if drawn["modelled"]:
        h["modelled (the CP model's prediction for the cell: cp_model_validation.csv)"] = Line2D(
            [], [], ls="", marker="_", color="black", ms=16, mew=2.2
        )
    return h


def _panels_of(marks: dict) -> list[tuple]:
    masks = list(dict.fromkeys(k[0] for k in marks))
    dirs = ["fwd", "bwd", "fwdbwd"]
    return sorted(
        marks, key=lambda k: (masks.index(k[0]), dirs.index(k[1]) if k[1] in dirs else 9, k[2])
    )


def slot_figure(
    marks: dict,
    notes: dict,
    percent: bool,
    ylabel: str,
    title: str,
    what: str,
    extra_notes: list[str],
):
    panels = _panels_of(marks)
    width = max(3.6, 0.3 * max((len(_slots(marks[p])) for p in panels), default=4) + 1.2)
    ncols = max(1, min(4, len(panels), int(16 // width)))
    fig, axes = plotting.grid_axes(max(1, len(panels)), ncols=ncols, w=width, h=3.4)
    drawn = {k: 0 for k in KINDS}
    drawn["panels"] = panels
    for ax, p in zip(axes, panels):
        slot_bars(ax, marks[p], percent, drawn, f"{p[0]}|{p[1]}|{p[2]}")
        if percent:
            ax.axhline(100, color="0.2", ls=(0, (4, 2)), lw=1.0, zorder=1)
            top = max([m.hi or m.value for m in marks[p]] + [100])
            ax.set_ylim(0, top * 1.15)
        else:
            ax.set_ylim(bottom=0)
            ax.set_ylim(top=ax.get_ylim()[1] * 1.08)
        ax.set_ylabel(ylabel)
        ax.set_title(panel_title(*p), fontsize="medium", pad=14)
        if notes.get(p):
            plotting.panel_notes(ax, notes[p])
    if not panels:
        axes[0].text(0.5, 0.5, "nothing to draw", ha="center", transform=axes[0].transAxes)
    plotting.outer_labels(axes, ncols)
    fig.tight_layout(h_pad=1.5)
    plotting.title_above(fig, title)
    methods = order({m.method for ms in marks.values() for m in ms})
    handles = {method_name(m): Patch(color=colour(m)) for m in methods}
    keys = kind_handles(drawn, what)
    if percent:
        keys["100%: the bare kernel on one GPU over the same documents"] = Line2D(
            [], [], color="0.2", ls=(0, (4, 2)), lw=1.0
        )
    plotting.legend_and_notes(fig, handles, extra_notes, keys)
    return fig, drawn


def efficiency(df: pd.DataFrame, inputs: Inputs | None = None):
    """Per-GPU TFLOP/s of each CP cell as a share of the bare kernel on one GPU over the same
    documents, per panel (mask, direction, tokens per GPU), grouped by GPU count."""
    src = Sources(df, inputs)
    marks, missing = share_marks(src)
    measured_panels = {k for k, ms in marks.items() if any(m.kind != "modelled" for m in ms)}
    marks = {k: v for k, v in marks.items() if k in measured_panels}
    notes = [
        "Share = the bare kernel's time on one GPU over GPUs x the CP cell's time, on each sampled "
        "mask (draw) of the same documents (cp_vs_single_gpu's rule); the bar is their median, the "
        "whisker their min-max over the draws; '~': within the p20-p80 spread on some draw."
    ]
    if src.other_emulated:
        notes.append(f"Emulated cells from grid {', '.join(src.other_emulated)}.")
    lost = sorted({(k, w) for k, ws in missing.items() for w in ws if k not in marks})
    if lost:
        words = sorted({w.split(": ", 1)[1] for _, w in lost})
        panels = sorted({panel_title(*k) for k, _ in lost})
        notes.append(f"No share ({'; '.join(words)}): {'; '.join(panels)}.")
    title = f"Context parallelism: share of the bare kernel on one GPU | {plotting.describe(df)}"
    return slot_figure(
        marks,
        {},
        True,
        "share of the bare kernel (%)",
        title,
        "bar: median over the draws, whisker min-max",
        notes,
    )


def tflops_vs_gpus(df: pd.DataFrame, inputs: Inputs | None = None):
    """Per-GPU TFLOP/s per panel (mask, direction, tokens per GPU), grouped by GPU count; the
    bare kernel over the same whole sequence in the 1-GPU group."""
    src = Sources(df, inputs)
    marks, notes = tflops_marks(src)
    for k in notes:
        marks.setdefault(k, [])
    extra = [TFLOPS_NOTE]
    if src.other_emulated:
        extra.append(f"Emulated cells from grid {', '.join(src.other_emulated)}.")
    title = (
        f"Context parallelism: TFLOP/s per GPU ({', '.join(map(str, _tokens(src.rows)))} tokens per "
        f"GPU) | {plotting.describe(df)}"
    )
    return slot_figure(
        marks, notes, False, "TFLOP/s per GPU", title, "bar: median, whisker p20-p80", extra
    )


def _tokens(df) -> list[int]:
    return sorted(set(df["tokens_per_gpu"].dropna().astype(int))) if "tokens_per_gpu" in df else []


TFLOPS_NOTE = (
    "per-GPU TFLOP/s = global FLOPs of the exact mask area / (slowest rank's time x GPUs); "
    "the 1-GPU group holds the bare kernel over the same whole sequence (its length in brackets) "
    "and CP methods run on one rank; a hatched red-edged bar disagrees with the float64 reference"
)


BREAKDOWN_NOTE = (
    "solid: the schedule with transfers disabled; hatched: with computation disabled; "
    "dot: the real schedule (a dot below the bar's top means communication overlapped computation)"
)


def breakdown(df: pd.DataFrame):
    """Per (mask, direction) panel, for each GPU count a group of stacked bars per method:
    compute-only time and, above it, communication-only time; a black dot marks the measured
    time (below the bar's top: the schedule overlapped the two)."""
    panels = cp_panels(df)
    fig, axes = plotting.grid_axes(len(panels), ncols=min(3, max(1, len(panels))), w=4.6, h=3.0)
    drawn = {"bars": 0}
    for ax, (mask, direction, tpg) in zip(axes, panels):
        d = panel_rows(df, mask, direction, tpg)
        d = d[d["status"].isin(TIMED)]
        methods = order(d["impl"])
        gpus = sorted(set(d["gpus"]))
        width = 0.8 / max(1, len(methods))
        for gi, n in enumerate(gpus):
            for mi, m in enumerate(methods):
                r = d[(d["impl"] == m) & (d["gpus"] == n)]
                if r.empty:
                    continue
                r = r.iloc[0]
                x = gi + (mi - (len(methods) - 1) / 2) * width
                comp, comm = r.get("compute_only_ms"), r.get("comm_only_ms")
                if pd.notna(comp) and pd.notna(comm):
                    ax.bar(x, comp, width * 0.9, color=colour(m), label=method_name(m))
                    ax.bar(
                        x,
                        comm,
                        width * 0.9,
                        bottom=comp,
                        color=colour(m),
                        alpha=0.35,
                        hatch="//",
                        edgecolor=colour(m),
                    )
                    drawn["bars"] += 2
                if is_emulated_name(m):  # its time is compute only: never the measured dot
                    ax.plot(
                        x,
                        r["time_ms_median"],
                        "D",
                        mfc="none",
                        mec=colour(m),
                        ms=5,
                        label="emulated compute (one device, no transfer; not measured)",
                    )
                    drawn["emulated"] = drawn.get("emulated", 0) + 1
                    continue
                ax.plot(
                    x,
                    r["time_ms_median"],
                    "o",
                    color="black",
                    ms=3.5,
                    label="measured (real schedule)",
                )
        ax.set_xticks(range(len(gpus)), [str(n) for n in gpus])
        ax.set_xlabel("GPUs (ranks)")
        ax.set_ylabel("time per call (ms, slowest rank)")
        ax.set_title(panel_title(mask, direction, tpg), fontsize="medium")
        ax.grid(alpha=0.3, axis="y")
    from matplotlib.patches import Patch

    styles = [
        Patch(facecolor="0.5", label="compute-only (transfers off)"),
        Patch(
            facecolor="0.5",
            alpha=0.35,
            hatch="//",
            edgecolor="0.5",
            label="communication-only (compute off)",
        ),
    ]
    _legend(fig, axes, ncol=4, extra=styles)
    fig.suptitle(
        f"Context parallelism: communication vs computation | {plotting.describe(df)}", y=1.0
    )
    plotting.note_below(fig, BREAKDOWN_NOTE + emulated_note(df), -0.16)
    return fig, drawn


def _legend(fig, axes, ncol=6, extra=()):
    handles = plotting.collect_handles(axes)
    for h in extra:
        handles[h.get_label()] = h
    if handles:
        plotting.legend_below(fig, handles, min(ncol, len(handles)))


def ranks_are_processes(df: pd.DataFrame) -> bool:
    """A CPU grid's ranks are processes on one machine (gloo), not GPUs."""
    return len(df) > 0 and "device" in df and bool(df["device"].eq("cpu").all())


def as_processes(text: str) -> str:
    """The words of a GPU grid's figure for a CPU grid's: 'per-GPU', '2 GPUs', 'GPU count'."""
    return re.sub(r"GPU(s?)", lambda m: "processes" if m.group(1) else "process", text)


def _words_for(df: pd.DataFrame, draw):
    """draw() whose every text says processes where the grid's ranks are (ranks_are_processes)."""
    if not ranks_are_processes(df):
        return draw

    def drawn():
        fig, marks = draw()
        for t in fig.findobj(Text):
            t.set_text(as_processes(t.get_text()))
        return fig, marks

    return drawn


def answers_map(df: pd.DataFrame, inputs: Inputs | None):
    """The winner map of the grid's answers (advice.md's, the methods compared draw by draw)."""
    found = family_answers(df, ADVICE, inputs.samples if inputs else None)
    title = (
        "Which context-parallel method wins: the paired answers per mask, tokens per GPU and GPUs"
    )
    return winner_map(found, MAP_AXES, title, plotting.describe(df))


def figures(df: pd.DataFrame, out: Path, style, only=None, inputs: Inputs | None = None):
    """Every figure at once (`only` is not used: they share no costly part worth splitting).
    The throughput figures name each variant by its slot (slot_of), the breakdown by
    with_variants."""
    paths = []
    for stem, draw in (
        ("cp_tflops_vs_gpus", lambda: tflops_vs_gpus(df, inputs)),
        ("cp_efficiency", lambda: efficiency(df, inputs)),
        ("cp_breakdown", lambda: breakdown(with_variants(df))),
        ("winner_map", lambda: answers_map(df, inputs)),
    ):
        paths += plotting.save_drawn(_words_for(df, draw), out, stem, style)
    return paths


def figure_captions(df: pd.DataFrame, style, inputs: Inputs | None = None) -> dict:
    """What each figure shows (the report adds machine, data and software)."""
    kinds = (
        "Measured cells are bars; emulated cells (cp.emulate: every rank's compute on one device, "
        "no transfer; never a distributed measurement; from this grid or another grid of the tidy "
        "table at the same points) hollow diamonds; the CP model's prediction for a measured cell "
        "(tables/<grid>/cp_model_validation.csv, where the model ran) a black tick. A bar's colour "
        "is its method's; its label names the local kernel that ran."
    )
    texts = {
        "cp_efficiency": (
            "Per-GPU TFLOP/s of each context-parallel cell as a share of the bare local kernel on one "
            "GPU over the same documents (the table cp_vs_single_gpu: the same mask, direction, whole "
            "sequence and local kernel, checked draw by draw; the baseline may come from another grid "
            "of the tidy table over the same draws), one panel per mask, direction and tokens per "
            "GPU, a group per GPU count; the bar is the median over the draws, the whisker their "
            f"min-max; 100% is the bare kernel. {kinds}"
        ),
        "cp_tflops_vs_gpus": (
            "Per-GPU TFLOP/s of every context-parallel cell, one panel per mask, direction and tokens "
            "per GPU, a group per GPU count (the bare kernel over the same whole sequence in the 1-GPU "
            f"group); bar: the median over all timed repetitions, whisker p20-p80. {kinds}"
        ),
        "cp_breakdown": (
            "Time per call (ms, the slowest rank) of every context-parallel method, one panel per "
            "mask, direction and tokens per GPU, a group of bars per GPU count: the compute-only "
            "time (transfers off; solid) under the communication-only time (hatched) where the "
            "cell measured them, and the measured time of the real schedule as a black dot, which "
            "is below the stack where the method overlaps its transfers with its compute. Emulated "
            "cells (cp.emulate: one device, no transfer) show their compute only."
        ),
        "winner_map": map_caption(MAP_AXES, ADVICE.what),
    }
    words = as_processes if ranks_are_processes(df) else str
    return {stem: words(text) for stem, text in texts.items()}
