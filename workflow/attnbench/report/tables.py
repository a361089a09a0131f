"""What every family's tables share: numbers with their spread, status words in place of numbers,
comparisons within the spread, and the Markdown, LaTeX and HTML writers (each family's own tables are
in attnbench.families.<family>)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..status import TIMED
from . import captions
from .collect import grid_rows, read_samples
from .html import markdown_page
from .labels import GIB, STATUS_LABEL, order, seqlen_label

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
WITHIN_NOTE = (
    "'~ ... (within spread)': the two p20-p80 intervals overlap, so the difference is not resolved"
)


def fmt_compared(v: float) -> str:
    """Four significant digits: where two numbers are compared, three would hide differences of
    0.1-0.5% that the p20-p80 intervals still resolve (321 vs 321 [321-321])."""
    return f"{v:.4g}"


def fmt_ms(v: float) -> str:
    """A time in ms as the answers write it: four significant digits (fmt_compared), whole
    milliseconds from 1 s on (no exponents)."""
    return f"{v:.0f}" if abs(v) >= 1000 else fmt_compared(v)


def fmt_ratio(x: float) -> str:
    """A ratio of times: two decimals below 10, one below 100, none above."""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


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


def fastest(
    rows: pd.DataFrame, name: str = "impl", value: str = "tflops"
) -> tuple[pd.Series, list[str]]:
    """The row with the highest median, and the names of the others whose p20-p80 interval overlaps
    its own (not resolved from it: a ranking must not separate them)."""
    best = rows.loc[rows[value].idxmax()]
    ties = [
        r[name] for i, r in rows.iterrows() if i != best.name and within_spread(best, r, value)
    ]
    return best, ties


def fmt_cell(r, value, digits=None):
    """The value where the cell has one, with its p20-p80 where it is a median (flagged when
    incorrect), else its status word."""
    if r["status"] in TIMED and pd.notna(r[value]):
        fmt = fmt_number if digits is None else (lambda x: f"{x:.{digits}f}")
        v = fmt(r[value]) + spread_text(r, value, fmt)
        return v + " (wrong)" if r["status"] == "incorrect" else v
    return STATUS_LABEL.get(r["status"], r["status"])


def heads_text(df: pd.DataFrame) -> pd.Series:
    """'64:8' per row, from heads_q and heads_kv."""
    return df["heads_q"].astype(str) + ":" + df["heads_kv"].astype(str)


def status_pivot(
    df: pd.DataFrame, value: str, digits: int | None = None, columns="impl"
) -> pd.DataFrame:
    """Rows (mask, heads, seqlen), one column per kernel: the value, or the status that replaced it."""
    df = df.copy()
    df["heads"] = heads_text(df)
    df["text"] = [fmt_cell(r, value, digits) for _, r in df.iterrows()]
    table = df.pivot_table(
        index=["mask", "heads", "seqlen"], columns=columns, values="text", aggfunc="first"
    )
    return table.reindex(columns=order(table.columns)).fillna("")


def not_measured_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell without a measurement, grouped by (kernel, status, reason): how many, at which
    lengths and heads. A reason never recorded reads '(none recorded)'."""
    rows = df[df["status"] != "ok"].copy()
    reasons = rows["status_reason"] if "status_reason" in rows else pd.Series(None, rows.index)
    # object first: a column with no reason at all reads as float NaN, which takes no text
    rows["reason"] = reasons.astype(object).fillna("(none recorded)")
    rows["heads"] = heads_text(rows)
    columns = ["kernel", "status", "cells", "lengths", "heads", "reason"]
    if rows.empty:
        return pd.DataFrame(columns=columns).set_index("kernel")
    table = (
        rows.groupby(["impl", "status", "reason"])
        .agg(
            cells=("seqlen", "size"),
            lengths=("seqlen", lambda s: ", ".join(seqlen_label(x) for x in sorted(set(s)))),
            heads=("heads", lambda h: ", ".join(sorted(set(h)))),
        )
        .reset_index()
        .rename(columns={"impl": "kernel"})
    )
    table["rank"] = table["kernel"].map({k: i for i, k in enumerate(order(table["kernel"]))})
    return table.sort_values(["rank", "status", "reason"])[columns].set_index("kernel")


def _latex(table: pd.DataFrame, caption: str, label: str) -> str:
    if table.index.name:  # a named index (kernel, S) as the first column: one header row, not two
        table = table.reset_index()
    tex = table.to_latex(escape=True, caption=caption, label=label, index=False)
    for sym, cmd in LATEX_SYMBOLS.items():
        tex = tex.replace(sym, cmd)
    return tex


def write_table(table: pd.DataFrame, stem: Path, caption: str) -> list[Path]:
    md, tex = stem.with_suffix(".md"), stem.with_suffix(".tex")
    flat = isinstance(table.index, pd.MultiIndex)
    if flat:  # one column per level, not a column of tuples
        table = table.reset_index()
    md.write_text(f"{caption}\n\n{table.to_markdown(index=not flat)}\n")
    tex.write_text(_latex(table, caption, f"tab:{stem.parent.name}-{stem.name}"))
    return [md, tex]


def write_sections(sections, stem: Path, caption: str) -> list[Path]:
    """Several tables in one file each: Markdown headings, one LaTeX table environment apiece."""
    md, tex = stem.with_suffix(".md"), stem.with_suffix(".tex")
    md_parts, tex_parts = [caption, ""], [f"% {caption}", ""]
    for i, (title, t) in enumerate(sections):
        md_parts += [f"### {title}", "", t.to_markdown(), ""]
        tex_parts += [
            _latex(
                t, f"{caption.split(';')[0]}: {title}", f"tab:{stem.parent.name}-{stem.name}-{i}"
            )
        ]
    md.write_text("\n".join(md_parts))
    tex.write_text("\n".join(tex_parts))
    return [md, tex]


def describe_setup(df) -> str:
    dev = ", ".join(sorted({str(x) for x in df["device_name"].dropna()})) or ", ".join(
        sorted(set(df["device"]))
    )
    return f"device: {dev}; dtype: {', '.join(sorted(set(df['dtype'])))}"


def html_page(md: Path, grid: str | None) -> Path:
    """The table's page for the report (report.html), beside its Markdown."""
    page = md.with_suffix(".html")
    title = f"{grid}: {md.stem}" if grid else md.stem
    page.write_text(markdown_page(md.read_text(), title))
    return page


def write_tables(
    cells_csv,
    out_dir,
    part_of,
    grid: str | None = None,
    family: str | None = None,
    grid_cfg: dict | None = None,
    every_grid=None,
    missing=(),
    source=None,
) -> list[Path]:
    """A grid's tables as its family's module (`part_of(family)`: its tables(df, out, samples) and
    table_captions(df)) writes them, those every grid gets (`every_grid(df, out, grid, family)`:
    the advice, which uses this module's formatting), each table's page for the report (its
    Markdown as HTML: html_page) and a report caption per table (naming `source` as the
    tidy table drawn from; default: cells_csv)."""
    df, name = grid_rows(cells_csv, grid, family, grid_cfg)
    part = part_of(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = df.assign(peak_mem_gib=df["peak_mem_bytes"] / GIB)
    samples = read_samples(cells_csv)
    samples = samples[samples["cell_id"].isin(set(df["cell_id"].astype(str)))]
    paths = part.tables(df, out, samples) + (every_grid(df, out, grid, name) if every_grid else [])
    whats, extras = part.table_captions(df)
    stems = list(dict.fromkeys(Path(p).stem for p in paths))
    paths += [
        html_page(out / f"{stem}.md", grid) for stem in stems if (out / f"{stem}.md").exists()
    ]
    for stem in stems:  # default description: the first line of the Markdown file (its caption)
        md = out / f"{stem}.md"
        if stem not in whats and md.exists():
            whats[stem] = md.read_text().split("\n", 1)[0]
    return paths + captions.write_captions(
        out,
        stems,
        whats,
        df,
        kind="table",
        grid=grid,
        grid_cfg=grid_cfg,
        extras=extras,
        source=source or cells_csv,
        missing=missing,
    )
