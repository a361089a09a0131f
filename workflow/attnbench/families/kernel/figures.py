"""The kernel family's figures (the paper's Figs. 3, 7, 8-14, 16-17), from the tidy table alone:
bars at one length, TFLOP/s vs length per mask family, memory vs length. Every figure states the
device and dtype; each kernel keeps its colour and marker (its registry entry)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd
from matplotlib.patches import Patch

from ...report.advice import TRAIN
from ...report.collect import one_row_per_point
from ...report.figures import Inputs
from ...report.labels import (
    DIRECTION_LABEL,
    direction_label,
    family_title,
    heads_label,
    mask_families,
    order,
    seqlen_label,
)
from ...report.plotting import (
    GIB,
    NotRun,
    categorical_lengths,
    ceiling_handle,
    ceiling_line,
    collect_handles,
    describe,
    draw_dots,
    draw_lines,
    finish_axes,
    grid_axes,
    heads_handles,
    heads_style_map,
    legend_and_notes,
    log_axis,
    memory_label,
    new_counts,
    no_data_note,
    outer_labels,
    per_draw,
    save_drawn,
    status_handles,
    title_above,
)
from ...report.style import BAR_MARK, INCORRECT_HATCH, colour
from ...report.winner_map import caption as map_caption
from ...report.winner_map import direction_words, winner_map
from ...status import TIMED
from .advice import ADVICE
from .winners import (
    MAP_AXES,
    reference_title,
    reference_words,
    references,
    speedup_figure,
)
from .winners import (
    answers as paired_answers,
)


def bar_length(df: pd.DataFrame, preferred: int | None) -> int:
    """The length of the bar figures: the configured one where the grid has it, else the longest."""
    lengths = set(int(s) for s in df["seqlen"].dropna())
    return int(preferred) if preferred in lengths else max(lengths)


def length_positions(df: pd.DataFrame):
    """x of rows: the index of their length among the figure's lengths (evenly spaced categories)."""
    pos = {s: i for i, s in enumerate(sorted(set(int(s) for s in df["seqlen"])))}
    return lambda rows: rows["seqlen"].astype(int).map(pos).to_numpy()


def _masks_in_order(df: pd.DataFrame) -> list:
    return [m for ms in mask_families(df["mask"]).values() for m in ms]


# ----------------------------------------------------------------------------- Figs. 3 and 7


def bars_at_length(df: pd.DataFrame, title: str, expected_impls=(), subtitle: str = ""):
    """Grouped bars: one group per mask, one bar per kernel, one panel per heads setting. `df` holds
    one direction at one length. Where a kernel has no number the bar's place carries its status
    (x unsupported, OOM, n/a); incorrect bars are hatched. Kernels unavailable in every cell get
    no place and are named under the figure, as are `expected_impls` without a cell here.
    """
    masks = _masks_in_order(df)
    heads = list(dict.fromkeys((int(a), int(b)) for a, b in zip(df["heads_q"], df["heads_kv"])))
    never = [
        i for i in order(df["impl"]) if (df[df["impl"] == i]["status"] == "unavailable").all()
    ]
    impls = [i for i in order(df["impl"]) if i not in never]
    n = max(1, len(impls))
    width = 0.84 / n
    fig, axes = grid_axes(
        max(1, len(heads)), ncols=1, w=max(7.0, 0.62 + len(masks) * (0.1 * n + 0.25)), h=2.9
    )
    drawn = {
        "bars": 0,
        "incorrect_bars": 0,
        "marks": {s: 0 for s in BAR_MARK},
        "not_installed": never,
        "slots": len(impls),
        "absent": sorted(set(expected_impls) - set(df["impl"])),
    }
    for ax, hk in zip(axes, heads):
        d = df[(df["heads_q"] == hk[0]) & (df["heads_kv"] == hk[1])]
        for k, impl in enumerate(impls):
            g = d[d["impl"] == impl].set_index("mask")
            for j, mask in enumerate(masks):
                if mask not in g.index:
                    continue
                r = g.loc[mask]
                x = j - 0.42 + width * (k + 0.5)
                tag = f"{impl}|{mask}|{hk[0]}:{hk[1]}"
                if r["status"] in TIMED and pd.notna(r["tflops"]):
                    bad = r["status"] == "incorrect"
                    ax.bar(
                        x,
                        r["tflops"],
                        width,
                        color=colour(impl),
                        edgecolor="red" if bad else "none",
                        hatch=INCORRECT_HATCH if bad else None,
                        lw=0.8 if bad else 0,
                        gid=f"bar|{tag}",
                    )
                    drawn["bars"] += 1
                    drawn["incorrect_bars"] += bad
                elif r["status"] in BAR_MARK:
                    ax.annotate(
                        BAR_MARK[r["status"]],
                        (x, 0),
                        xytext=(0, 2),
                        textcoords="offset points",
                        rotation=90 if r["status"] != "unsupported" else 0,
                        ha="center",
                        va="bottom",
                        fontsize=6.5 if r["status"] != "unsupported" else 9,
                        fontweight="bold",
                        color=colour(impl),
                        gid=f"mark|{r['status']}|{tag}",
                    )
                    drawn["marks"][r["status"]] += 1
        ax.set_xticks(range(len(masks)), masks, rotation=25, ha="right", rotation_mode="anchor")
        ax.set_xlim(-0.55, len(masks) - 0.45)
        for j in range(1, len(masks)):
            ax.axvline(j - 0.5, color="0.85", lw=0.6, zorder=0)
        ax.grid(axis="x", visible=False)
        finish_axes(ax, "TFLOP/s")
        drawn["ceiling"] = ceiling_line(ax, d)
        ax.set_title(heads_label(*hk), fontsize="medium")
    fig.tight_layout(h_pad=1.2)
    title_above(fig, title, subtitle)
    handles = {i: Patch(color=colour(i)) for i in impls}
    keys = {}
    if drawn.get("ceiling"):
        keys.update(ceiling_handle(drawn["ceiling"], ", ".join(sorted(set(df["dtype"].dropna())))))
    if drawn["incorrect_bars"]:
        keys["disagrees with float64 reference"] = Patch(
            facecolor="white", edgecolor="red", hatch=INCORRECT_HATCH
        )
    notes = [
        f"In place of a bar: {BAR_MARK['unsupported']} unsupported, OOM out of memory, "
        f"{BAR_MARK['timeout']} stopped at the time budget, {BAR_MARK['crashed']} its process ended "
        "without a record, n/a unavailable (not measured on this machine)."
    ]
    if never:
        notes.append(
            "Not measured on this machine (unavailable in every cell): " + ", ".join(never) + "."
        )
    if drawn["absent"]:
        notes.append(
            "No cell at this length in the grid: " + ", ".join(order(drawn["absent"])) + "."
        )
    legend_and_notes(fig, handles, notes, keys)
    return fig, drawn


# ----------------------------------------------------------------------------- Figs. 8-14, 16-17

BARS_NOTE = (
    f"In place of a bar: {BAR_MARK['unsupported']} unsupported, OOM out of memory, "
    f"{BAR_MARK['timeout']} stopped at the time budget."
)


def _finish_lines(fig, axes, ncols, title, subtitle, counts, notrun, keys=None):
    """Axis labels outside, the title, and below the panels: the kernels' legend, the line styles
    (keys) and status marks drawn, what did not run. Returns (fig, counts with `not_run`)."""
    outer_labels(axes, ncols)
    fig.tight_layout()
    title_above(fig, title, subtitle)
    marks = status_handles(
        oom=counts["oom_markers"] > 0,
        incorrect=counts["incorrect_markers"] > 0,
        timeout=counts["timeout_markers"] > 0,
    )
    notes = notrun.lines()
    if counts.get("bar_marks"):
        notes.insert(0, BARS_NOTE)
    legend_and_notes(fig, collect_handles(axes), notes, {**(keys or {}), **marks})
    counts["not_run"] = notrun
    return fig, counts


def family_lines(
    df: pd.DataFrame,
    masks: list,
    value: str,
    ylabel: str,
    title: str,
    subtitle: str = "",
    samples: pd.DataFrame | None = None,
):
    """TFLOP/s (or another value) vs length: one row of panels per mask, one column per
    (heads, direction) setting; one line per kernel, and each draw of a cell with several as a
    dot beside its point (`samples`: the per-sample table). A heads setting measured at one
    length only is drawn as bars, one per kernel (one point on a length axis says nothing)."""
    heads = list(dict.fromkeys((int(a), int(b)) for a, b in zip(df["heads_q"], df["heads_kv"])))
    dirs = [d for d in DIRECTION_LABEL if d in set(df["direction"])]
    settings = [(h, d) for h in heads for d in dirs]
    x_of = length_positions(df)
    draws = per_draw(samples, value)
    fig, axes = grid_axes(len(masks) * len(settings), ncols=len(settings), w=3.5, h=2.5)
    counts, notrun = new_counts(), NotRun()
    counts["bar_panels"] = 0
    for i, mask in enumerate(masks):
        for j, (hk, direction) in enumerate(settings):
            ax = axes[i * len(settings) + j]
            mine = (df["heads_q"] == hk[0]) & (df["heads_kv"] == hk[1])
            d = df[mine & (df["mask"] == mask) & (df["direction"] == direction)]
            if len(d):
                notrun.panel(mask, (hk, direction))
            lengths = sorted(set(int(s) for s in df[mine]["seqlen"]))
            if len(lengths) == 1:
                kernel_bars(ax, d, value, counts, notrun, mask, direction, draws)
                counts["bar_panels"] += 1
                ax.set_xlabel(f"kernel, at {seqlen_label(lengths[0])} only")
            else:
                draw_lines(ax, d, value, x_of, counts, notrun, mask, direction, draws=draws)
                categorical_lengths(ax, lengths)
            no_data_note(ax, d, value)
            finish_axes(ax, ylabel)
            ax.set_title(f"{mask} | {heads_label(*hk)} | {direction}", fontsize="medium")
    return _finish_lines(fig, axes, len(settings), title, subtitle, counts, notrun)


def hk_of(g) -> tuple[int, int]:
    return int(g["heads_q"].iloc[0]), int(g["heads_kv"].iloc[0])


def kernel_bars(ax, d, value, counts, notrun, where, direction, draws):
    """One panel's rows at one length: a bar per kernel with a number (its draws as dots), its
    status mark (BAR_MARK) in place of another's bar; kernels unavailable here get no place and
    are named under the figure."""
    impls = [i for i in order(d["impl"]) if (d[d["impl"] == i]["status"] != "unavailable").any()]
    for k, impl in enumerate(impls):
        g = d[d["impl"] == impl]
        hk = (int(g["heads_q"].iloc[0]), int(g["heads_kv"].iloc[0]))
        tag = f"{impl}|{where}|{hk[0]}:{hk[1]}|{direction}"
        ran = g[g["status"].isin(TIMED) & g[value].notna()]
        if len(ran):
            bad = ran["status"].iloc[0] == "incorrect"
            ax.bar(
                k,
                ran[value].iloc[0],
                0.8,
                color=colour(impl),
                edgecolor="red" if bad else "none",
                hatch=INCORRECT_HATCH if bad else None,
                gid=f"bar|{tag}",
            )
            counts["points"] += 1
            counts["incorrect_markers"] += int(bad)
            counts["draw_dots"] += draw_dots(ax, ran.assign(_x=[float(k)]), draws, impl, tag)
        else:
            status = g["status"].iloc[0]
            if status in BAR_MARK:
                unsup = status == "unsupported"
                ax.annotate(
                    BAR_MARK[status],
                    (k, 0),
                    xytext=(0, 2),
                    textcoords="offset points",
                    rotation=0 if unsup else 90,
                    ha="center",
                    va="bottom",
                    fontsize=9 if unsup else 6.5,
                    fontweight="bold",
                    color=colour(impl),
                    gid=f"mark|{status}|{tag}",
                )
                counts["bar_marks"] = counts.get("bar_marks", 0) + 1
    for impl in order(d["impl"]):
        g = d[d["impl"] == impl]
        if (g["status"] == "unavailable").any():  # no place: named under the figure
            notrun.add("unavailable", impl, where, (hk_of(g), direction))
    ax.set_xticks(range(len(impls)), impls, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, max(0, len(impls) - 1) + 0.6)
    ax.grid(axis="x", visible=False)


def memory_lines(df: pd.DataFrame, value: str, ylabel: str, title: str, subtitle: str = ""):
    """Peak memory vs length for one direction on a log axis: one panel per mask, one line per
    kernel and heads setting (line style per heads setting)."""
    masks = _masks_in_order(df)
    lengths = sorted(set(int(s) for s in df["seqlen"]))
    x_of = length_positions(df)
    styles = heads_style_map(df)
    fig, axes = grid_axes(len(masks), ncols=min(4, len(masks)), w=3.4, h=2.6)
    counts, notrun = new_counts(), NotRun()
    for ax, mask in zip(axes, masks):
        d = df[df["mask"] == mask]
        for hk, direction in dict.fromkeys(
            ((int(a), int(b)), dr) for a, b, dr in zip(d["heads_q"], d["heads_kv"], d["direction"])
        ):
            notrun.panel(mask, (hk, direction))
        for direction in dict.fromkeys(d["direction"]):
            draw_lines(
                ax,
                d[d["direction"] == direction],
                value,
                x_of,
                counts,
                notrun,
                mask,
                direction,
                heads_styles=styles,
            )
        categorical_lengths(ax, lengths)
        # a log axis: the naive kernel's tens of GiB would squash every other line to the floor
        ran = d[d["status"].isin(TIMED)][value].dropna()
        log_axis(ax, ran.tolist())
        no_data_note(ax, d, value)
        finish_axes(ax, ylabel, log=True)
        ax.set_title(mask, fontsize="medium")
    ncols = min(4, len(masks))
    return _finish_lines(fig, axes, ncols, title, subtitle, counts, notrun, heads_handles(styles))


# ----------------------------------------------------------------------------- the kernel family


def figure_makers(df: pd.DataFrame, style, inputs: Inputs | None = None) -> dict:
    """{stem: function drawing that figure}, so a caller can draw any subset (in parallel)."""
    one_row_per_point(df, "kernel figures")
    inputs = inputs or Inputs()
    samples = mine(inputs.samples, df)
    head = describe(df)
    df = df.assign(mem_gib=df["peak_mem_bytes"] / GIB)
    s_bar = bar_length(df, style.get("bar_seqlen"))
    makers = {}
    for d in dict.fromkeys(df["direction"]):
        sub = df[df["direction"] == d]
        at = sub[sub["seqlen"] == s_bar]
        title = f"{direction_label(d).capitalize()} TFLOP/s at S = {seqlen_label(s_bar)}"
        makers[f"tflops_bars_{d}"] = partial(
            bars_at_length, at, title, expected_impls=set(sub["impl"]), subtitle=head
        )
        title = f"Peak memory vs sequence length, {direction_label(d)}"
        makers[f"memory_vs_seqlen_{d}"] = partial(
            memory_lines, sub, "mem_gib", memory_label(sub), title, subtitle=head
        )
    for fam, masks in mask_families(df["mask"]).items():
        title = f"TFLOP/s vs sequence length, {family_title(fam)}"
        makers[f"tflops_vs_seqlen_{fam}"] = partial(
            family_lines,
            df[df["mask"].isin(masks)],
            masks,
            "tflops",
            "TFLOP/s",
            title,
            subtitle=head,
            samples=samples,
        )
    found = answers_once(df, samples)
    makers["winner_map"] = lambda: winner_map(
        found(), MAP_AXES, "Which kernel wins: the paired answers per mask and length", head
    )
    refs = references(inputs.grid_cfg)
    for d in speedup_directions(df):
        title = f"Speedup over {reference_title(refs)}, {direction_words(d)}"
        makers[f"speedup_{d}"] = partial(
            lambda d, title: speedup_figure(found(), d, refs, title, head), d, title
        )
    return makers


def speedup_directions(df: pd.DataFrame) -> list[str]:
    """The directions of the speedup figures: each measured one, and the training step where
    both fwd and bwd are."""
    have = list(dict.fromkeys(df["direction"]))
    return have + ([TRAIN] if {"fwd", "bwd"} <= set(have) else [])


def answers_once(df: pd.DataFrame, samples: pd.DataFrame):
    """The grid's answers, computed on first use and kept (the winner map and every speedup
    figure read the same ones)."""
    memo: list = []

    def get():
        if not memo:
            memo.append(paired_answers(df, samples))
        return memo[0]

    return get


def mine(samples: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """The per-sample rows of these cells."""
    if samples is None or samples.empty or "cell_id" not in df:
        return samples
    return samples[samples["cell_id"].astype(str).isin(set(df["cell_id"].astype(str)))]


def figures(df: pd.DataFrame, out: Path, style, only=None, inputs: Inputs | None = None):
    paths = []
    for stem, draw in figure_makers(df, style, inputs).items():
        if only is None or stem in only:
            paths += save_drawn(draw, out, stem, style)
    return paths


def figure_captions(df: pd.DataFrame, style, inputs: Inputs | None = None) -> dict:
    """What each kernel-family figure shows (the report adds machine, data and software)."""
    s_bar = bar_length(df, style.get("bar_seqlen"))
    want = style.get("bar_seqlen")
    why = (
        "the configured length"
        if want == s_bar
        else f"the longest length in the grid, which lacks the configured {seqlen_label(want or 0)}"
    )
    tflops = (
        "TFLOP/s is the median over all timed repetitions of all sampled masks, with FLOPs from each mask's "
        "exact visible area"
    )
    refs = references((inputs or Inputs()).grid_cfg)
    out = {"winner_map": map_caption(MAP_AXES, ADVICE.what)}
    for d in speedup_directions(df):
        out[f"speedup_{d}"] = (
            f"Speedup of every kernel over the reference ({reference_words(refs)}; the grid's "
            f"reference_kernel), {direction_words(d)}: the reference's "
            "time over the kernel's on the same sampled mask (draw), at every mask and length where "
            "both are ok; the marker is the median over the draws, the bar their min-max (no bar: one "
            "draw), log axis, 1x the reference. A heads setting measured at one length only is left "
            "to the winner map and advice.md."
        )
    for d in dict.fromkeys(df["direction"]):
        out[f"tflops_bars_{d}"] = (
            f"{direction_label(d).capitalize()} throughput of every kernel on every mask at S = {seqlen_label(s_bar)} "
            f"({why}); grouped bars, one group per mask, one panel per heads setting (the paper's "
            f"{'Fig. 3' if d == 'fwd' else 'Fig. 7' if d == 'bwd' else 'Figs. 3 and 7'}). {tflops}. In place of a bar: "
            f"{BAR_MARK['unsupported']} unsupported, OOM out of memory, {BAR_MARK['timeout']} stopped at the time "
            f"budget, {BAR_MARK['crashed']} crashed, n/a unavailable; hatched bars disagree with "
            "the float64 reference. The dashed line: the device's matmul ceiling as measured with the "
            "records (matmul_peak_tflops), where they carry one."
        )
        src = ", ".join(sorted(set(df["mem_source"].dropna()))) or "none recorded"
        out[f"memory_vs_seqlen_{d}"] = (
            f"Peak memory during the timed {direction_label(d)} call vs sequence length on a log axis, one "
            f"panel per mask, one line per kernel, line style per heads setting (the paper's Figs. 16-17). "
            f"Memory source: {src} "
            "(cuda_allocator: peak bytes allocated by PyTorch on the GPU; process_rss: the CPU process's peak "
            "resident set). X on the axis floor: out of memory; T: stopped at the time budget."
        )
    for fam, masks in mask_families(df["mask"]).items():
        out[f"tflops_vs_seqlen_{fam}"] = (
            f"Throughput vs total sequence length for the {', '.join(masks)} mask{'s' * (len(masks) > 1)}: one row "
            "per mask, one column per heads setting and direction, one line per kernel (the paper's Figs. 8-14); "
            "beside each point, a dot per sampled mask (draw) where the cell has several: its own median "
            "TFLOP/s. A heads setting measured at one length only is drawn as bars, one per kernel. "
            f"{tflops}. X on the axis floor: out of memory; T: stopped at the time budget; red ring: disagrees with the float64 reference; kernels "
            "that are unsupported or unavailable are listed under the figure."
        )
    return out
