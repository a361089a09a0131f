"""The paper's H100 block-sparse numbers (paper_h100.csv) beside this run's: one row per cell the
paper reports, its TFLOP/s and ours where this grid measured the same cell (same kernel,
direction, length, block size, density, heads), empty where it did not."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...report.tables import MEDIAN_SPREAD, fmt_cell, write_table

PAPER_FILE = Path(__file__).with_name("paper_h100.csv")
KEYS = ["direction", "seqlen", "block_size", "density", "heads", "impl"]


def paper_numbers(path=PAPER_FILE) -> pd.DataFrame:
    df = pd.read_csv(path, comment="#", dtype={"heads": str, "paper_table": str})
    missing = set(KEYS + ["tflops", "source"]) - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}; expected {KEYS}")
    return df


def comparison(sparse: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Rows (direction, S, B, density); per (kernel, heads) the paper has: 'H100 (paper)' and
    'H200 (here)': the median [p20-p80], or the status that replaced it, or '' if not run."""
    ours = sparse[sparse["mask"] == "block_sparse"].copy()
    ours["heads"] = (
        ours["heads_q"].astype(int).astype(str) + ":" + ours["heads_kv"].astype(int).astype(str)
    )
    rows = {}
    for _, p in paper.iterrows():
        match = ours[
            (ours["impl"] == p["impl"])
            & (ours["direction"] == p["direction"])
            & (ours["seqlen"] == p["seqlen"])
            & (ours["block_size"] == p["block_size"])
            & ((ours["density"] - p["density"]).abs() < 1e-9)
            & (ours["heads"] == p["heads"])
        ]
        key = (p["direction"], int(p["seqlen"]), int(p["block_size"]), f"{p['density']:g}")
        row = rows.setdefault(key, {})
        label = f"{p['impl']} {p['heads']}"
        row[f"{label} H100 (paper)"] = f"{p['tflops']:g}"
        row[f"{label} H200 (here)"] = fmt_cell(match.iloc[0], "tflops") if len(match) else ""
    index = pd.MultiIndex.from_tuples(rows, names=["direction", "seqlen", "blocks", "density"])
    table = pd.DataFrame(list(rows.values()), index=index).fillna("")
    return table.sort_index()


def write(sparse: pd.DataFrame, out_dir, about: str) -> list[Path]:
    """sparse_vs_paper.md/.tex."""
    paper = paper_numbers()
    caption = (
        f"the paper's H100 TFLOP/s ({PAPER_FILE.name}: only the cells quoted so far; sources in the "
        f"file) beside this grid's ({MEDIAN_SPREAD}) for the same kernel, direction, S, block size, "
        f"density and heads; empty: not measured in this grid; {about}"
    )
    return write_table(comparison(sparse, paper), Path(out_dir) / "sparse_vs_paper", caption)
