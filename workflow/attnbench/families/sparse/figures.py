"""Figures of family `sparse` (block-sparse grids), from the tidy table alone: the winner map of its
answers (report.winner_map), TFLOP/s against length per block setting with dense references at
equal area drawn as dashed lines at their own length, TFLOP/s against density at every length
with dense full attention at that length (full_attention.py) as a dashed line, and memory. Files: exactly
outputs.figure_stems for family sparse.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...report.advice import Answer
from ...report.labels import order, seqlen_label
from ...report.plotting import (
    GIB,
    collect_handles,
    describe,
    draw_dots,
    grid_axes,
    kernel_line,
    legend_and_notes,
    legend_below,
    no_data_note,
    note_below,
    panel_notes,
    per_draw,
    save_drawn,
    timed_line,
    title_above,
)
from ...report.style import colour
from ...report.winner_map import MapAxes, family_answers, length_column, winner_map
from ...report.winner_map import caption as map_caption
from ...status import TIMED
from .advice import ADVICE
from .full_attention import full_attention_lines
from .tables import block_order, equal_area_references, main_density, split


def _setting(a: Answer) -> str:
    return f"{a.point['blocks']}, density {a.point['density']:g}"


def _settings(found: list[Answer]) -> list[str]:
    blocks = block_order(a.point["blocks"] for a in found)
    keys = {
        (blocks.index(a.point["blocks"]), float(a.point["density"])): _setting(a) for a in found
    }
    return [keys[k] for k in sorted(keys)]


# A row per block setting and density, a column per length, grouped by heads setting.
MAP_AXES = MapAxes(
    row=_setting,
    rows=_settings,
    column=length_column,
    row_words="block setting and density",
    column_words="sequence length",
    group_words="heads",
)


def _panels(sparse: pd.DataFrame):
    """(blocks, heads, direction) of every panel that has sparse cells, blocks in order."""
    present = set(zip(sparse["blocks"], sparse["heads"], sparse["direction"]))
    combos = list(dict.fromkeys(zip(sparse["heads"], sparse["direction"])))
    return [
        (b, h, d) for b in block_order(sparse["blocks"]) for h, d in combos if (b, h, d) in present
    ]


def _length_tick(value) -> str:
    return seqlen_label(int(value))


def _density_tick(value) -> str:
    return f"{value:.2g}"


def _draw(
    ax, d: pd.DataFrame, x: str, value: str, drawn: dict, dense: pd.DataFrame | None, tick, draws
):
    """One line per kernel, each draw of a cell with several as a dot at its x (`draws`:
    plotting.per_draw); OOM as X on the axis floor; returns the kernels that did not run here,
    by status: a name alone where none of its cells ran, "name (at 96K, 128K)" where some did
    (`tick` names a point as the x axis does)."""
    missing = {"unsupported": [], "unavailable": [], "timeout": [], "crashed": []}
    for impl in order(d["impl"]):
        g = d[d["impl"] == impl]
        points, ooms = timed_line(ax, g, x, value, impl, impl, ms=4, lw=1.3, ring_ms=9)
        drawn["points"] += points
        drawn["oom_markers"] += ooms
        ran = g[g["status"].isin(TIMED) & g[value].notna()]
        if draws and len(ran):
            tag = f"{impl}|{g['blocks'].iloc[0]}"
            drawn["draw_dots"] += draw_dots(
                ax, ran.assign(_x=ran[x].astype(float)), draws, impl, tag
            )
        for st in missing:  # the whole panel, or (named) the points where it did not run
            at = g[g["status"] == st][x]
            if len(g) and len(at) == len(g):
                missing[st].append(impl)
            elif len(at):
                missing[st].append(f"{impl} (at {', '.join(tick(v) for v in sorted(set(at)))})")
    if dense is not None:  # at their own length, labelled with the sparse length they match
        ok = dense[(dense["status"] == "ok") & dense[value].notna()]
        for impl in order(ok["impl"]):
            line = ok[ok["impl"] == impl].sort_values(x)
            label = f"{impl} (dense, full mask, at its own S)"
            kernel_line(ax, line[x], line[value], impl, "--", ms=3, lw=1, label=label)
            drawn["dense_points"] += len(line)
            drawn["dense_x"] += list(line[x])
        # one label per dense length, under its lowest point (the kernels there share it); neighbours
        # alternate between two depths, as two lengths can sit closer than a label is wide
        groups = ok.groupby(x) if "equal_area_seqlen" in ok else ()
        for i, (at, same) in enumerate(groups):
            ax.annotate(
                f"area of {seqlen_label(int(same['equal_area_seqlen'].iloc[0]))}",
                (at, same[value].min()),
                textcoords="offset points",
                xytext=(0, -10 - 8 * (i % 2)),
                ha="center",
                fontsize="xx-small",
                color="dimgray",
            )
    return missing


def _finish(ax, d, x, value, ylabel, xlog, tick, notes):
    """A panel's axes, ticks and notes (`notes`: kernels that did not run, what is missing)."""
    # ticks at the sparse cells' values only: a dense reference's own length is named by its
    # "area of" label, and as a tick it collides with the sparse lengths beside it
    xs = sorted(set(d[x].dropna()))
    if xlog:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (tokens)")
    else:
        ax.set_xlabel("density (fraction of key blocks kept)")
    ax.set_xticks(xs, [tick(s) for s in xs])
    ax.minorticks_off()
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    top = ax.get_ylim()[1]
    ax.set_ylim(0, top * (1 + 0.12 * (len(notes) + 1)))  # headroom for the notes
    if notes:
        panel_notes(ax, notes, wrap=True)
    no_data_note(ax, d, value)


def _figure(sparse, dense, x, value, ylabel, title, xlog=True, subtitle=None, draws=None):
    panels = _panels(sparse)
    tick = (
        _length_tick if xlog else _density_tick
    )  # a point of the x axis, as named in ticks and notes
    combos = len(set((h, d) for _, h, d in panels))
    fig, axes = grid_axes(len(panels), ncols=combos if combos > 1 else min(4, len(panels)))
    drawn = {
        "panels": len(panels),
        "points": 0,
        "oom_markers": 0,
        "draw_dots": 0,
        "dense_points": 0,
        "dense_x": [],
        "missing": {},
    }
    for ax, (blocks, heads, direction) in zip(axes, panels):
        d = sparse[
            (sparse["blocks"] == blocks)
            & (sparse["heads"] == heads)
            & (sparse["direction"] == direction)
        ]
        ref = None
        if dense is not None and len(dense):
            ref = dense[(dense["heads"] == heads) & (dense["direction"] == direction)]
        missing = _draw(ax, d, x, value, drawn, ref, tick, draws)
        drawn["missing"][(blocks, heads, direction)] = missing
        extra = f" | {subtitle(d)}" if subtitle and len(d) else ""
        ax.set_title(f"{blocks} | {heads} | {direction}{extra}", fontsize="medium")
        _finish(
            ax,
            d,
            x,
            value,
            ylabel,
            xlog,
            tick,
            [f"{k}: {', '.join(v)}" for k, v in missing.items() if v],
        )
    handles = collect_handles(axes)
    legend_below(fig, handles, min(6, max(1, len(handles))), loc="lower center", y=-0.02)
    fig.suptitle(title, y=1.0)
    note = (
        "X on the axis: out of memory; red ring: disagrees with the float64 reference; "
        "panel text: kernels unsupported / not installed there"
        + ("; dots: each sampled layout (draw) of a cell" if drawn["draw_dots"] else "")
    )
    if drawn["dense_points"]:
        note += (
            "\ndashed: a dense kernel on the full mask at its own length S', whose visible area S'^2 equals "
            "the sparse masks' at the length named under its points"
        )
    note_below(fig, note, -0.06, bottom=0.06)
    return fig, drawn


def density_figure(sparse, full: dict, title, subtitle="", draws=None):
    """TFLOP/s against density: a row of panels per block setting, heads and direction, a column
    per length measured, and in each panel dense full attention at that length (full_attention:
    the fastest dense kernel on the full mask there, `advise`'s baseline) as a dashed line in its
    kernel's colour; a panel whose length has none says so."""
    rows = _panels(sparse)
    lengths = sorted(set(int(s) for s in sparse["seqlen"]))
    fig, axes = grid_axes(len(rows) * len(lengths), ncols=len(lengths), w=3.2, h=2.5)
    drawn = {
        "panels": 0,
        "points": 0,
        "oom_markers": 0,
        "draw_dots": 0,
        "full_lines": [],
        "no_full": [],
        "missing": {},
    }
    for i, (blocks, heads, direction) in enumerate(rows):
        for j, s in enumerate(lengths):
            ax = axes[i * len(lengths) + j]
            d = sparse[
                (sparse["blocks"] == blocks)
                & (sparse["heads"] == heads)
                & (sparse["direction"] == direction)
                & (sparse["seqlen"] == s)
            ]
            if d.empty:
                ax.set_visible(False)
                continue
            drawn["panels"] += 1
            d = d.assign(x=d["density"])
            missing = _draw(ax, d, "x", "tflops", drawn, None, _density_tick, draws)
            drawn["missing"][(blocks, heads, direction, s)] = missing
            notes = [f"{k}: {', '.join(v)}" for k, v in missing.items() if v]
            line = full.get((heads, direction, s))
            if line is not None:
                ax.axhline(
                    line.tflops,
                    color=colour(line.impl),
                    ls="--",
                    lw=1.2,
                    label=f"{line.impl} (dense full attention at the panel's S)",
                    gid=f"dense_full|{blocks}|{heads}|{direction}|{seqlen_label(s)}|{line.impl}",
                )
                drawn["full_lines"].append((blocks, heads, direction, s, line.impl, line.tflops))
            else:
                notes.append(f"no dense full attention at {seqlen_label(s)} in the tidy table")
                drawn["no_full"].append((blocks, heads, direction, s))
            ax.set_title(
                f"{blocks} | {heads} | {direction} | S={seqlen_label(s)}", fontsize="medium"
            )
            _finish(ax, d, "x", "tflops", "TFLOP/s", False, _density_tick, notes)
    fig.tight_layout()
    title_above(fig, title, subtitle)
    grids = sorted({g.grid for g in full.values()})
    notes = [
        "X on the axis: out of memory; red ring: disagrees with the float64 reference; panel "
        "text: kernels unsupported / not installed there, and a length without dense full "
        "attention"
        + ("; dots: each sampled layout (draw) of a cell" if drawn["draw_dots"] else ""),
        "Dashed: the fastest dense kernel on the full mask at the panel's length, heads and "
        f"direction ({', '.join(grids) or 'no kernel grid has one'}; the baseline python -m "
        "attnbench advise sets a block-sparse answer against). Block-sparse TFLOP/s counts the "
        "kept blocks only, so a kernel takes less time than dense full attention where its "
        "TFLOP/s is above the dashed line times the realised density.",
    ]
    legend_and_notes(fig, collect_handles(axes), notes)
    return fig, drawn


def figures(df: pd.DataFrame, out_dir, style, only=None, inputs=None) -> list[Path]:
    """Every figure at once (`only` is not used: they are drawn together)."""
    out = Path(out_dir)
    sparse, dense = split(df)
    sparse["mem_gib"] = sparse["peak_mem_bytes"] / GIB
    dense["mem_gib"] = dense["peak_mem_bytes"] / GIB
    head = describe(df)
    rho = main_density(sparse)
    at_rho = sparse[sparse["density"] == rho] if rho is not None else sparse
    ref = equal_area_references(dense, at_rho)
    samples = inputs.samples if inputs else None
    draws = per_draw(samples)
    src = set(df["mem_source"].dropna())
    mem_label = "peak memory (GiB)" + (" [process RSS]" if src == {"process_rss"} else "")
    makers = {
        "winner_map": lambda: winner_map(
            family_answers(df, ADVICE, inputs.samples if inputs else None),
            MAP_AXES,
            "Which block-sparse kernel wins: the paired answers per block setting and length",
            head,
        ),
        "sparse_tflops_vs_seqlen": lambda: _figure(
            at_rho,
            ref,
            "seqlen",
            "tflops",
            "TFLOP/s",
            f"Block-sparse throughput vs sequence length, density {rho} | {head}",
            draws=draws,
        ),
        "sparse_tflops_vs_density": lambda: density_figure(
            sparse,
            full_attention_lines(sparse, inputs.cells if inputs else None, samples),
            "Block-sparse throughput vs density at each length, dense full attention dashed",
            head,
            draws=draws,
        ),
        "sparse_memory": lambda: _figure(
            at_rho,
            ref,
            "seqlen",
            "mem_gib",
            mem_label,
            f"Block-sparse peak memory vs sequence length, density {rho} | {head}",
        ),
    }
    return [p for stem, draw in makers.items() for p in save_drawn(draw, out, stem, style)]


def figure_captions(df: pd.DataFrame, style, inputs=None) -> dict:
    """The winner map's words; the report's captions of the others give machine, data and
    software only."""
    return {"winner_map": map_caption(MAP_AXES, ADVICE.what)}
