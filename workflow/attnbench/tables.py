"""Markdown and LaTeX tables from the tidy table alone, and a report caption per table.

Family `kernel` is written here: TFLOP/s and peak memory in the paper's layout (rows per length,
one column per kernel, one table per mask, heads setting and direction) and the kernel support
table (the paper's Table 1) derived from the recorded statuses. Family X is written by
`attnbench.X_report.tables(df, out_dir)`, which may offer `table_captions(df) -> {stem: text}`.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

import pandas as pd

from . import captions
from .collect import one_row_per_point, read_cells
from .labels import (GIB, DIRECTION_LABEL, STATUS_LABEL, STATUS_MEANING, TIMED, heads_label, mask_families, order,
                     seqlen_label)

SUPPORTED, UNSUPPORTED = "\u2713", "\u2717"  # check mark, ballot x
LATEX_SYMBOLS = {SUPPORTED: r"$\checkmark$", UNSUPPORTED: r"$\times$"}


def fmt_number(v: float) -> str:
    """Three significant digits without exponents for the magnitudes seen here (0.00123 .. 987)."""
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


# The p20 and p80 columns of a value that is a median over timed repetitions.
SPREAD = {"tflops": ("tflops_p20", "tflops_p80"), "time_ms_median": ("time_ms_p20", "time_ms_p80")}
MEDIAN_SPREAD = "median [p20-p80 over all timed repetitions]"
WITHIN_NOTE = "'~ ... (within spread)': the two p20-p80 intervals overlap, so the difference is not resolved"


def fmt_compared(v: float) -> str:
    """Four significant digits: where two numbers are compared, three would hide differences of
    0.1-0.5% that the p20-p80 intervals still resolve (321 vs 321 [321-321])."""
    return f"{v:.4g}"


def spread(r, value: str) -> tuple[float, float] | None:
    """(p20, p80) of a median value where the row records both, else None."""
    cols = SPREAD.get(value)
    if cols is None:
        return None
    lo, hi = (r.get(c) for c in cols)
    return (float(lo), float(hi)) if pd.notna(lo) and pd.notna(hi) else None


def spread_text(r, value: str, fmt=fmt_number) -> str:
    """' [p20-p80]' of a median value, '' where the row has no spread."""
    s = spread(r, value)
    return "" if s is None else f" [{fmt(s[0])}-{fmt(s[1])}]"


def within_spread(a, b, value: str = "tflops") -> bool:
    """Whether two rows' p20-p80 intervals overlap: their difference is inside the measurement's own
    spread. Rows without a spread are compared by their medians alone (never 'within')."""
    sa, sb = spread(a, value), spread(b, value)
    return sa is not None and sb is not None and sa[0] <= sb[1] and sb[0] <= sa[1]


def ratio_text(a, b, fmt, value: str = "tflops") -> str:
    """a's median over b's, formatted; '~ ratio (within spread)' where their intervals overlap."""
    text = fmt(a[value] / b[value])
    return f"~ {text} (within spread)" if within_spread(a, b, value) else text


def fastest(rows: pd.DataFrame, name: str = "impl", value: str = "tflops") -> tuple[pd.Series, list[str]]:
    """The row with the highest median, and the names of the others whose p20-p80 interval overlaps
    its own (not resolved from it: a ranking must not separate them)."""
    best = rows.loc[rows[value].idxmax()]
    ties = [r[name] for i, r in rows.iterrows() if i != best.name and within_spread(best, r, value)]
    return best, ties


def fastest_text(rows: pd.DataFrame, name: str = "impl", value: str = "tflops") -> str:
    """The fastest row's name and its ties; '' where fewer than two rows compete."""
    if len(rows) < 2:
        return ""
    best, ties = fastest(rows, name, value)
    return best[name] + (f" ~ {', '.join(ties)} (within spread)" if ties else "")


def _fmt_cell(r, value, digits=None):
    """The value where the cell has one, with its p20-p80 where it is a median (flagged when
    incorrect), else its status word."""
    if r["status"] in TIMED and pd.notna(r[value]):
        fmt = fmt_number if digits is None else (lambda x: f"{x:.{digits}f}")
        v = fmt(r[value]) + spread_text(r, value, fmt)
        return v + " (wrong)" if r["status"] == "incorrect" else v
    return STATUS_LABEL.get(r["status"], r["status"])


def status_pivot(df: pd.DataFrame, value: str, digits: int | None = None, columns="impl") -> pd.DataFrame:
    """Rows (mask, heads, seqlen), one column per kernel: the value, or the status that replaced it."""
    df = df.copy()
    df["heads"] = df["heads_q"].astype(str) + ":" + df["heads_kv"].astype(str)
    df["text"] = [_fmt_cell(r, value, digits) for _, r in df.iterrows()]
    table = df.pivot_table(index=["mask", "heads", "seqlen"], columns=columns, values="text", aggfunc="first")
    return table.reindex(columns=order(table.columns)).fillna("")


def length_tables(df: pd.DataFrame, value: str) -> list[tuple[str, pd.DataFrame]]:
    """(title, table) per mask, heads setting and direction: rows S, one column per kernel."""
    out = []
    impls_all = order(df["impl"])
    for mask in (m for ms in mask_families(df["mask"]).values() for m in ms):
        dm = df[df["mask"] == mask]
        for hq, hkv in dict.fromkeys(zip(dm["heads_q"], dm["heads_kv"])):
            for d in (d for d in DIRECTION_LABEL if d in set(dm["direction"])):
                g = dm[(dm["heads_q"] == hq) & (dm["heads_kv"] == hkv) & (dm["direction"] == d)].copy()
                g["text"] = [_fmt_cell(r, value) for _, r in g.iterrows()]
                t = g.pivot_table(index="seqlen", columns="impl", values="text", aggfunc="first")
                t = t.reindex(columns=[i for i in impls_all if i in t.columns]).fillna("")
                t.index = [seqlen_label(s) for s in t.index]
                t.index.name = "S"
                t.columns.name = None
                out.append((f"{mask}, {heads_label(hq, hkv)}, {DIRECTION_LABEL[d]}", t))
    return out


def support_table(df: pd.DataFrame) -> pd.DataFrame:
    """Kernel x mask (the paper's Table 1), from the recorded statuses, not typed in.

    A kernel supports a mask in a direction when a cell of it ran there (ok, incorrect, out of
    memory, or stopped at the time budget). Cell: the check mark when it ran in every direction of the grid, else the directions
    it ran; the cross when it ran in none and some cell says unsupported; n/a when every cell was
    unavailable (not measured on this machine); '(wrong)' when a cell disagreed with the reference.
    """
    directions = [d for d in DIRECTION_LABEL if d in set(df["direction"])]
    cells = {}
    for (impl, mask), g in df.groupby(["impl", "mask"]):
        ran = [d for d in directions if g[g["direction"] == d]["status"].isin([*TIMED, "oom", "timeout"]).any()]
        if ran:
            text = SUPPORTED if ran == directions else "+".join(ran)
        elif (g["status"] == "unsupported").any():
            text = UNSUPPORTED
        else:
            text = STATUS_LABEL["unavailable"]
        if (g["status"] == "incorrect").any():
            text += " (wrong)"
        cells[(impl, mask)] = text
    s = pd.Series(cells, dtype=object).unstack()
    masks = [m for ms in mask_families(df["mask"]).values() for m in ms if m in s.columns]
    t = s.reindex(index=order(s.index), columns=masks).fillna("")
    t.index.name, t.columns.name = "kernel", None
    return t


def _latex(table: pd.DataFrame, caption: str, label: str) -> str:
    if table.index.name:  # a named index (kernel, S) as the first column: one header row, not two
        table = table.reset_index()
    tex = table.to_latex(escape=True, caption=caption, label=label, index=False)
    for sym, cmd in LATEX_SYMBOLS.items():
        tex = tex.replace(sym, cmd)
    return tex


def _write(table: pd.DataFrame, stem: Path, caption: str) -> list[Path]:
    md, tex = stem.with_suffix(".md"), stem.with_suffix(".tex")
    flat = isinstance(table.index, pd.MultiIndex)
    if flat:  # one column per level, not a column of tuples
        table = table.reset_index()
    md.write_text(f"{caption}\n\n{table.to_markdown(index=not flat)}\n")
    tex.write_text(_latex(table, caption, f"tab:{stem.parent.name}-{stem.name}"))
    return [md, tex]


def _write_sections(sections, stem: Path, caption: str) -> list[Path]:
    """Several tables in one file each: Markdown headings, one LaTeX table environment apiece."""
    md, tex = stem.with_suffix(".md"), stem.with_suffix(".tex")
    md_parts, tex_parts = [caption, ""], [f"% {caption}", ""]
    for i, (title, t) in enumerate(sections):
        md_parts += [f"### {title}", "", t.to_markdown(), ""]
        tex_parts += [_latex(t, f"{caption.split(';')[0]}: {title}", f"tab:{stem.parent.name}-{stem.name}-{i}")]
    md.write_text("\n".join(md_parts))
    tex.write_text("\n".join(tex_parts))
    return [md, tex]


def _describe(df) -> str:
    dev = ", ".join(sorted({str(x) for x in df["device_name"].dropna()})) or ", ".join(sorted(set(df["device"])))
    return f"device: {dev}; dtype: {', '.join(sorted(set(df['dtype'])))}"


STATUS_NOTE = ("OOM: out of memory; unsup.: unsupported; n/a: unavailable (not measured on this machine); "
               "timeout: stopped at the time budget; (wrong): disagrees with the float64 reference")


def memory_source(df: pd.DataFrame) -> str:
    src = set(df["mem_source"].dropna()) if "mem_source" in df else set()
    return ", process RSS" if src == {"process_rss"} else ""


def kernel_tables(df: pd.DataFrame, out: Path) -> list[Path]:
    one_row_per_point(df, "kernel tables")
    about = _describe(df)
    paths = _write_sections(length_tables(df, "tflops"), out / "tflops",
                            f"TFLOP/s ({MEDIAN_SPREAD}) per sequence length and kernel; {STATUS_NOTE}; "
                            f"{about}")
    paths += _write_sections(length_tables(df, "peak_mem_gib"), out / "memory",
                             f"Peak memory (GiB{memory_source(df)}) per sequence length and kernel; {STATUS_NOTE}; "
                             f"{about}")
    support = (f"Kernel support per mask, from the recorded statuses: {SUPPORTED} ran in every direction, "
               f"fwd/bwd: only those, {UNSUPPORTED}: unsupported, n/a: unavailable here, blank: no cell; {about}")
    paths += _write(support_table(df), out / "support", support)
    return paths


def kernel_table_captions(df: pd.DataFrame) -> tuple[dict, dict]:
    """What each kernel-family table holds, and the support table itself for its caption."""
    from tabulate import tabulate

    sources = ", ".join(sorted(set(df["mem_source"].dropna()))) or "none recorded"
    whats = {
        "tflops": ("TFLOP/s (median over all timed repetitions of all sampled masks, in brackets their p20-p80: "
                   "kernels whose intervals overlap are not told apart by this measurement) per sequence length "
                   "(rows) and kernel (columns), one table per mask, heads setting and direction; a status word "
                   f"replaces the number where there is none ({STATUS_NOTE}). Markdown and LaTeX."),
        "memory": ("Peak memory (GiB) of the timed call per sequence length (rows) and kernel (columns), one table per "
                   f"mask, heads setting and direction ({STATUS_NOTE}). Memory source: {sources} (cuda_allocator: "
                   "peak bytes PyTorch allocated on the GPU; process_rss: the CPU process's peak resident set). "
                   "Markdown and LaTeX."),
        "support": ("Kernel support per mask (the paper's Table 1), derived from the recorded statuses: "
                    f"{SUPPORTED} a cell ran (ok, incorrect, out of memory or timeout) in every direction, a direction list "
                    f"when only those ran, {UNSUPPORTED} unsupported, n/a unavailable ("
                    f"{STATUS_MEANING['unavailable']}), blank: the grid has no cell there."),
    }
    t = support_table(df)
    rst = tabulate(t.reset_index().values.tolist(), headers=["kernel", *t.columns], tablefmt="grid")
    return whats, {"support": rst}


def write_tables(cells_csv, out_dir, grid: str | None = None, family: str | None = None,
                 grid_cfg: dict | None = None) -> list[Path]:
    df = read_cells(cells_csv)
    if grid:
        df = df[df["grid"] == grid]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = df.assign(peak_mem_gib=df["peak_mem_bytes"] / GIB)
    family = family or (grid_cfg or {}).get("family") or (df["family"].iloc[0] if len(df) else "kernel")
    extras = {}
    if family == "kernel":
        paths = kernel_tables(df, out)
        whats, extras = kernel_table_captions(df)
    else:
        mod = import_module(f".{family}_report", __package__)
        paths = mod.tables(df, out)
        whats = mod.table_captions(df) if hasattr(mod, "table_captions") else {}
    stems = list(dict.fromkeys(Path(p).stem for p in paths))
    for stem in stems:  # default description: the first line of the Markdown file (its caption)
        md = out / f"{stem}.md"
        if stem not in whats and md.exists():
            whats[stem] = md.read_text().split("\n", 1)[0]
    return paths + captions.write_captions(out, stems, whats, df, kind="table", grid=grid, grid_cfg=grid_cfg,
                                           extras=extras)
