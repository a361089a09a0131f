"""Tables of family `sparse` (block-sparse grids), from the tidy table alone, and the row helpers
its figures share.

Rows of block-sparse masks are grouped by their block setting ("B=64", "var A=512"); rows of
other masks in a sparse grid (the dense kernels on the full mask) are dense references, used for
the sparse/dense throughput ratio at equal visible area.
Files: exactly outputs.table_names for family sparse.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...masks import SPARSE_MASKS
from ...report.labels import order
from ...report.plotting import (
    GIB,
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
from . import paper

MAIN_DENSITY = 0.5
AREA_MATCH = 0.02  # a dense reference counts when its area is within 2% of the sparse cell's


def block_setting(r) -> str:
    """A sparse row's block setting: 'B=64' (uniform blocks), 'var A=512' (variable, by average)."""
    if r["mask"] == "variable_block_sparse" and pd.notna(r.get("avg_block")):
        return f"var A={int(r['avg_block'])}"
    if pd.notna(r.get("block_size")):
        return f"B={int(r['block_size'])}"
    return r["mask"]


def split(df: pd.DataFrame):
    """(sparse rows with a `blocks` column, dense reference rows)."""
    sparse = df[df["mask"].isin(SPARSE_MASKS)].copy()
    sparse["blocks"] = [block_setting(r) for _, r in sparse.iterrows()] if len(sparse) else []
    sparse["heads"] = heads_text(sparse)
    dense = df[~df["mask"].isin(SPARSE_MASKS)].copy()
    dense["heads"] = heads_text(dense)
    return sparse, dense


def block_order(values) -> list:
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
    blocks = block_order(t.index.get_level_values(0))
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


def table_captions(df: pd.DataFrame) -> tuple[dict, dict]:
    """Each table is described by its Markdown caption (the first line of its file)."""
    return {}, {}
