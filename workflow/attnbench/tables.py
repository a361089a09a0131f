"""Markdown and LaTeX tables from the tidy table alone (rows per length, columns per kernel)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .collect import read_cells
from .style import STATUS_LABEL, order

GIB = 2**30


def _fmt_cell(r, value, digits):
    if r["status"] in ("ok", "incorrect") and pd.notna(r[value]):
        v = f"{r[value]:.{digits}f}"
        return v + " (wrong)" if r["status"] == "incorrect" else v
    return STATUS_LABEL.get(r["status"], r["status"])


def status_pivot(df: pd.DataFrame, value: str, digits: int, columns="impl") -> pd.DataFrame:
    """Rows (mask, heads, seqlen), one column per kernel: the value, or the status that replaced it."""
    df = df.copy()
    df["heads"] = df["heads_q"].astype(str) + ":" + df["heads_kv"].astype(str)
    df["text"] = [_fmt_cell(r, value, digits) for _, r in df.iterrows()]
    table = df.pivot_table(index=["mask", "heads", "seqlen"], columns=columns, values="text", aggfunc="first")
    return table.reindex(columns=order(table.columns)).fillna("")


def support_table(df: pd.DataFrame) -> pd.DataFrame:
    """Kernel x mask: the directions each kernel ran (from recorded statuses, not typed in)."""
    ran = df[df["status"].isin(["ok", "incorrect", "oom"])]
    cells = {}
    for (impl, mask), g in df.groupby(["impl", "mask"]):
        dirs = sorted(set(ran[(ran["impl"] == impl) & (ran["mask"] == mask)]["direction"]))
        if dirs:
            cells[(impl, mask)] = "+".join(dirs)
        elif (g["status"] == "unavailable").all():
            cells[(impl, mask)] = "n/a"
        else:
            cells[(impl, mask)] = "unsup."
    s = pd.Series(cells).unstack()
    masks = [m for m in dict.fromkeys(df["mask"]) if m in s.columns]
    return s.reindex(index=order(s.index), columns=masks).fillna("")


def _write(table: pd.DataFrame, stem: Path, caption: str) -> list[Path]:
    md, tex = stem.with_suffix(".md"), stem.with_suffix(".tex")
    md.write_text(f"{caption}\n\n{table.to_markdown()}\n")
    latex = table.to_latex(escape=True, caption=caption, label=f"tab:{stem.parent.name}-{stem.name}")
    tex.write_text(latex)
    return [md, tex]


def _describe(df) -> str:
    dev = ", ".join(sorted({str(x) for x in df["device_name"].dropna()})) or ", ".join(sorted(set(df["device"])))
    return f"device: {dev}; dtype: {', '.join(sorted(set(df['dtype'])))}"


def kernel_tables(df: pd.DataFrame, out: Path) -> list[Path]:
    paths = []
    for value, digits, stem, what in (("tflops", 3, "tflops", "TFLOP/s (median)"),
                                      ("peak_mem_gib", 3, "memory", "peak memory (GiB)")):
        parts = []
        for d in dict.fromkeys(df["direction"]):
            t = status_pivot(df[df["direction"] == d], value, digits)
            t.columns = [f"{c} {d}" for c in t.columns]
            parts.append(t)
        table = pd.concat(parts, axis=1).fillna("")
        paths += _write(table, out / stem, f"{what}, {_describe(df)}")
    paths += _write(support_table(df), out / "support", f"directions each kernel ran, per mask; {_describe(df)}")
    return paths


def write_tables(cells_csv, out_dir, grid: str | None = None, family: str | None = None) -> list[Path]:
    df = read_cells(cells_csv)
    if grid:
        df = df[df["grid"] == grid]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = df.assign(peak_mem_gib=df["peak_mem_bytes"] / GIB)
    family = family or (df["family"].iloc[0] if len(df) else "kernel")
    if family == "kernel":
        return kernel_tables(df, out)
    from importlib import import_module

    return import_module(f".{family}_report", __package__).tables(df, out)
