"""Tables and figures of family `sparse` (block-sparse grids), from the tidy table alone.

Rows of block-sparse masks are grouped by their block setting ("B=64", "var A=512"); rows of
other masks in a sparse grid (the dense kernels on the full mask) are dense references:
drawn as dashed lines at their own length and used for the sparse/dense throughput ratio at
equal visible area.
Files: exactly outputs.table_names / figure_stems for family sparse.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...masks import SPARSE_MASKS
from ...report.labels import order, seqlen_label
from ...report.plotting import (
    GIB,
    collect_handles,
    describe,
    draw_dots,
    grid_axes,
    kernel_line,
    legend_below,
    note_below,
    panel_notes,
    per_draw,
    save,
    timed_line,
)
from ...report.tables import (
    MEDIAN_SPREAD,
    WITHIN_NOTE,
    describe_setup,
    fastest,
    fmt_cell,
    fmt_compared,
    heads_text,
    not_measured_table,
    ratio_text,
    spread_text,
    write_table,
)
from ...status import TIMED
from . import paper

MAIN_DENSITY = 0.5
AREA_MATCH = 0.02  # a dense reference counts when its area is within 2% of the sparse cell's


def block_setting(r) -> str:
    if r["mask"] == "block_sparse":
        return f"B={int(r['block_size'])}"
    if r["mask"] == "variable_block_sparse":
        return f"var A={int(r['avg_block'])}"
    return r["mask"]


def split(df: pd.DataFrame):
    """(sparse rows with a `blocks` column, dense reference rows)."""
    sparse = df[df["mask"].isin(SPARSE_MASKS)].copy()
    sparse["blocks"] = [block_setting(r) for _, r in sparse.iterrows()] if len(sparse) else []
    sparse["heads"] = heads_text(sparse)
    dense = df[~df["mask"].isin(SPARSE_MASKS)].copy()
    dense["heads"] = heads_text(dense)
    return sparse, dense


def _block_order(values) -> list:
    def key(b):
        kind, _, n = b.partition("=")
        return (kind.startswith("var"), int(n) if n.isdigit() else 0)

    return sorted(set(values), key=key)


def main_density(sparse: pd.DataFrame) -> float | None:
    """0.5 where the grid has it, otherwise the density closest to it."""
    dens = sorted(set(sparse["density"].dropna()))
    return min(dens, key=lambda d: abs(d - MAIN_DENSITY)) if dens else None


# ----------------------------------------------------------------------------- tables


def _pivot(sparse: pd.DataFrame, value: str, digits: int | None) -> pd.DataFrame:
    """Rows (block setting, heads, S, density), one column per kernel and direction: the value or
    the status that replaced it; the realised density (the same mask for every kernel) beside it."""
    d = sparse.copy()
    d["text"] = [fmt_cell(r, value, digits) for _, r in d.iterrows()]
    d["kernel"] = d["impl"] + " " + d["direction"]
    keys = ["blocks", "heads", "seqlen", "density"]
    t = d.pivot_table(index=keys, columns="kernel", values="text", aggfunc="first")
    cols = [
        f"{k} {dr}"
        for k in order(d["impl"])
        for dr in dict.fromkeys(d["direction"])
        if f"{k} {dr}" in t.columns
    ]
    blocks = _block_order(t.index.get_level_values(0))
    rows = sorted(t.index, key=lambda i: (blocks.index(i[0]), i[1], i[2], i[3]))
    t = t.reindex(index=rows, columns=cols).fillna("")
    realised = d.dropna(subset=["realised_density"]).groupby(keys)["realised_density"].mean()
    t.insert(
        0,
        "realised density",
        [f"{realised[i]:.3f}" if i in realised.index else "" for i in t.index],
    )
    t = t.reset_index()
    t["density"] = t["density"].map(lambda x: f"{x:g}")
    return t.set_index(["blocks", "heads", "seqlen", "density"])


def _flat(t: pd.DataFrame) -> pd.DataFrame:
    """Index levels as plain columns (readable Markdown), the first one as the index."""
    return t.reset_index().set_index("blocks")


def _equal_area(rows: pd.DataFrame, area: float) -> pd.DataFrame:
    return rows[(rows["mask_area_mean"] - area).abs() <= AREA_MATCH * area]


def _median(r) -> str:
    return fmt_compared(r["tflops"]) + spread_text(r, "tflops", fmt_compared)


def dense_ratio(sparse: pd.DataFrame, dense: pd.DataFrame) -> pd.DataFrame:
    """Each measured sparse cell next to the fastest CORRECT dense kernel on the full mask at (about)
    the same visible area, same heads, direction and dtype: TFLOP/s of both (median [p20-p80]) and the
    ratio of their medians. The ratio is '~ ... (within spread)' where the intervals overlap; a sparse
    cell that disagrees with the float64 reference is listed but gets no ratio; where another dense
    kernel's interval overlaps the fastest one's, the dense kernel column says so."""
    rows = []
    ok = dense[(dense["status"] == "ok") & dense["tflops"].notna()]
    for _, r in sparse[
        sparse["status"].isin(["ok", "incorrect"]) & sparse["tflops"].notna()
    ].iterrows():
        ref = ok[
            (ok["heads_q"] == r["heads_q"])
            & (ok["heads_kv"] == r["heads_kv"])
            & (ok["direction"] == r["direction"])
            & (ok["dtype"] == r["dtype"])
        ]
        ref = _equal_area(ref, r["mask_area_mean"])
        if ref.empty:
            continue
        best, ties = fastest(
            ref.assign(name=[f"{d['impl']} (S={int(d['seqlen'])})" for _, d in ref.iterrows()]),
            "name",
        )
        wrong = r["status"] == "incorrect"
        rows.append(
            {
                "kernel": r["impl"],
                "direction": r["direction"],
                "blocks": r["blocks"],
                "heads": r["heads"],
                "seqlen": r["seqlen"],
                "density": r["density"],
                "tflops": _median(r) + (" (wrong)" if wrong else ""),
                "dense kernel": f"{best['impl']} (full, S={int(best['seqlen'])})"
                + (f" ~ {', '.join(ties)} (within spread)" if ties else ""),
                "dense tflops": _median(best),
                "fraction of dense": "none (wrong)"
                if wrong
                else ratio_text(r, best, lambda x: f"{x:.3f}"),
            }
        )
    cols = [
        "kernel",
        "direction",
        "blocks",
        "heads",
        "seqlen",
        "density",
        "tflops",
        "dense kernel",
        "dense tflops",
        "fraction of dense",
    ]
    return pd.DataFrame(rows, columns=cols)


def equal_area_references(dense: pd.DataFrame, sparse: pd.DataFrame) -> pd.DataFrame:
    """Dense reference rows whose visible area matches some sparse cell's (same heads, within
    AREA_MATCH), at their OWN length; `equal_area_seqlen` names the sparse length they match (for
    the figure's note). Rows that match no sparse cell are left out."""
    keys = sparse[["heads", "seqlen", "mask_area_mean"]].dropna().drop_duplicates()
    rows = []
    for _, d in dense.iterrows():
        m = keys[(keys["heads"] == d["heads"])]
        m = m[
            (m["mask_area_mean"] - d["mask_area_mean"]).abs() <= AREA_MATCH * m["mask_area_mean"]
        ]
        if len(m):
            rows.append({**d.to_dict(), "equal_area_seqlen": int(min(m["seqlen"]))})
    return pd.DataFrame(rows, columns=[*dense.columns, "equal_area_seqlen"])


def tables(df: pd.DataFrame, out_dir, samples=None) -> list[Path]:
    out = Path(out_dir)
    sparse, dense = split(df)
    if "peak_mem_gib" not in sparse:
        sparse["peak_mem_gib"] = sparse["peak_mem_bytes"] / GIB
    about = describe_setup(df)
    paths = write_table(
        _flat(_pivot(sparse, "tflops", None)),
        out / "sparse_tflops",
        f"TFLOP/s ({MEDIAN_SPREAD}; FLOPs from the kept blocks) per (block setting, heads, S, density); "
        f"{about}",
    )
    paths += write_table(
        _flat(_pivot(sparse, "peak_mem_gib", 3)),
        out / "sparse_memory",
        f"peak memory (GiB) per (block setting, heads, S, density); {about}",
    )
    ratio = dense_ratio(sparse, dense)
    caption = (
        f"block-sparse TFLOP/s as a fraction of the fastest correct dense kernel (status ok; named per row) "
        f"on the full mask at the same visible area (within {AREA_MATCH:.0%}), same heads and direction; "
        f"TFLOP/s {MEDIAN_SPREAD}, fraction = ratio of the medians; {WITHIN_NOTE}; sparse cells that disagree "
        f"with the float64 reference are listed, marked (wrong), with no fraction; {about}"
    )
    if ratio.empty:
        caption += "; no dense reference cell of equal area in this grid"
    paths += write_table(ratio.set_index("kernel"), out / "sparse_vs_dense", caption)
    paths += write_table(
        not_measured_table(df),
        out / "sparse_not_measured",
        f"the cells without a measurement (not installed, not loadable, unsupported, out of memory, "
        f"disagreeing with float64), per kernel, status and the reason its records give; {about}",
    )
    return paths + paper.write(sparse, out, about)


# ----------------------------------------------------------------------------- figures


def _panels(sparse: pd.DataFrame):
    """(blocks, heads, direction) of every panel that has sparse cells, blocks in order."""
    present = set(zip(sparse["blocks"], sparse["heads"], sparse["direction"]))
    combos = list(dict.fromkeys(zip(sparse["heads"], sparse["direction"])))
    return [
        (b, h, d)
        for b in _block_order(sparse["blocks"])
        for h, d in combos
        if (b, h, d) in present
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
        # ticks at the sparse cells' values only: a dense reference's own length is named by its
        # "area of" label, and as a tick it collides with the sparse lengths beside it
        xs = sorted(set(d[x].dropna()))
        if xlog:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [tick(s) for s in xs])
            ax.set_xlabel("sequence length (tokens)")
        else:
            ax.set_xticks(xs, [tick(s) for s in xs])
            ax.set_xlabel("density (nominal fraction of key blocks kept)")
        ax.minorticks_off()
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        notes = [f"{k}: {', '.join(v)}" for k, v in missing.items() if v]
        top = ax.get_ylim()[1]
        ax.set_ylim(0, top * (1 + 0.12 * (len(notes) + 1)))  # headroom for the notes
        if notes:
            panel_notes(ax, notes, wrap=True)
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


def figures(df: pd.DataFrame, out_dir, style, only=None, inputs=None) -> list[Path]:
    """All three figures at once (`only` is not used: they are drawn together)."""
    out = Path(out_dir)
    sparse, dense = split(df)
    sparse["mem_gib"] = sparse["peak_mem_bytes"] / GIB
    dense["mem_gib"] = dense["peak_mem_bytes"] / GIB
    head = describe(df)
    rho = main_density(sparse)
    at_rho = sparse[sparse["density"] == rho] if rho is not None else sparse
    paths = []
    ref = equal_area_references(dense, at_rho)
    draws = per_draw(inputs.samples if inputs else None)
    fig, _ = _figure(
        at_rho,
        ref,
        "seqlen",
        "tflops",
        "TFLOP/s",
        f"Block-sparse throughput vs sequence length, density {rho} | {head}",
        draws=draws,
    )
    paths += save(fig, out, "sparse_tflops_vs_seqlen", style)
    s_max = (
        sparse.groupby("blocks")["seqlen"].transform("max") if len(sparse) else sparse["seqlen"]
    )
    longest = sparse[sparse["seqlen"] == s_max]
    fig, _ = _figure(
        longest.assign(x=longest["density"]),
        None,
        "x",
        "tflops",
        "TFLOP/s",
        f"Block-sparse throughput vs density at each setting's longest S | {head}",
        xlog=False,
        subtitle=lambda d: f"S={seqlen_label(int(d['seqlen'].max()))}",
        draws=draws,
    )
    paths += save(fig, out, "sparse_tflops_vs_density", style)
    src = set(df["mem_source"].dropna())
    mem_label = "peak memory (GiB)" + (" [process RSS]" if src == {"process_rss"} else "")
    fig, _ = _figure(
        at_rho,
        ref,
        "seqlen",
        "mem_gib",
        mem_label,
        f"Block-sparse peak memory vs sequence length, density {rho} | {head}",
    )
    paths += save(fig, out, "sparse_memory", style)
    return paths


def table_captions(df: pd.DataFrame) -> tuple[dict, dict]:
    """Each table is described by its Markdown caption (the first line of its file)."""
    return {}, {}


def figure_captions(df: pd.DataFrame, style, inputs=None) -> dict:
    """The report's captions of these figures give machine, data and software only."""
    return {}
