"""The kernel family's tables: TFLOP/s and peak memory in the paper's layout (rows per length, one
column per kernel, one table per mask, heads setting and direction) and the kernel support table
(the paper's Table 1) derived from the recorded statuses."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...record.status import TIMED
from ...report.collect import one_row_per_point
from ...report.labels import (
    DIRECTION_LABEL,
    STATUS_LABEL,
    STATUS_MEANING,
    STATUS_NOTE,
    heads_label,
    mask_families,
    order,
    seqlen_label,
)
from ...report.tables import (
    MEDIAN_SPREAD,
    SUPPORTED,
    UNSUPPORTED,
    describe_setup,
    fmt_cell,
    write_sections,
    write_table,
)


def length_tables(df: pd.DataFrame, value: str) -> list[tuple[str, pd.DataFrame]]:
    """(title, table) per mask, heads setting and direction: rows S, one column per kernel."""
    out = []
    impls_all = order(df["impl"])
    for mask in (m for ms in mask_families(df["mask"]).values() for m in ms):
        dm = df[df["mask"] == mask]
        for hq, hkv in dict.fromkeys(zip(dm["heads_q"], dm["heads_kv"])):
            for d in (d for d in DIRECTION_LABEL if d in set(dm["direction"])):
                g = dm[
                    (dm["heads_q"] == hq) & (dm["heads_kv"] == hkv) & (dm["direction"] == d)
                ].copy()
                g["text"] = [fmt_cell(r, value) for _, r in g.iterrows()]
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
        ran = [
            d
            for d in directions
            if g[g["direction"] == d]["status"].isin([*TIMED, "oom", "timeout"]).any()
        ]
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


def memory_source(df: pd.DataFrame) -> str:
    src = set(df["mem_source"].dropna()) if "mem_source" in df else set()
    return ", process RSS" if src == {"process_rss"} else ""


def tables(df: pd.DataFrame, out: Path, samples=None) -> list[Path]:
    one_row_per_point(df, "kernel tables")
    about = describe_setup(df)
    paths = write_sections(
        length_tables(df, "tflops"),
        out / "tflops",
        f"TFLOP/s ({MEDIAN_SPREAD}) per sequence length and kernel; {STATUS_NOTE}; {about}",
    )
    paths += write_sections(
        length_tables(df, "peak_mem_gib"),
        out / "memory",
        f"Peak memory (GiB{memory_source(df)}) per sequence length and kernel; {STATUS_NOTE}; "
        f"{about}",
    )
    support = (
        f"Kernel support per mask, from the recorded statuses: {SUPPORTED} ran in every direction, "
        f"fwd/bwd: only those, {UNSUPPORTED}: unsupported, n/a: unavailable here, blank: no cell; {about}"
    )
    paths += write_table(support_table(df), out / "support", support)
    if (df["device"] == "cuda").any():  # the family's table_stems: a GPU grid's
        paths += write_sections(
            length_tables(df, "host_overhead_ms"),
            out / "host",
            f"Host overhead (ms: a caller's median time over the device's median, per call; not part "
            f"of any verdict or TFLOP/s) per sequence length and kernel; {STATUS_NOTE}; {about}",
        )
    return paths


def table_captions(df: pd.DataFrame) -> tuple[dict, dict]:
    """What each kernel-family table holds, and the support table itself for its caption."""
    from tabulate import tabulate

    sources = ", ".join(sorted(set(df["mem_source"].dropna()))) or "none recorded"
    whats = {
        "tflops": (
            "TFLOP/s (median over all timed repetitions of all sampled masks, in brackets their p20-p80: "
            "kernels whose intervals overlap are not told apart by this measurement) per sequence length "
            "(rows) and kernel (columns), one table per mask, heads setting and direction; a status word "
            f"replaces the number where there is none ({STATUS_NOTE}). Markdown and LaTeX."
        ),
        "memory": (
            "Peak memory (GiB) of the timed call per sequence length (rows) and kernel (columns), one table per "
            f"mask, heads setting and direction ({STATUS_NOTE}). Memory source: {sources} (cuda_allocator: "
            "peak bytes PyTorch allocated on the GPU; process_rss: the CPU process's peak resident set). "
            "Markdown and LaTeX."
        ),
        "host": (
            "Host overhead per sequence length (rows) and kernel (columns), one table per mask, heads "
            "setting and direction: a caller's median time of the call (synchronised before and after) "
            "minus the median device time of the same call queued back to back (docs/measurement.md, "
            "'Timing'), in ms: the launch and Python work a short call pays, never part of a verdict "
            "or TFLOP/s; a status word where a record has no number (one made before the harness measured it). Markdown and LaTeX."
        ),
        "support": (
            "Kernel support per mask (the paper's Table 1), derived from the recorded statuses: "
            f"{SUPPORTED} a cell ran (ok, incorrect, out of memory or timeout) in every direction, a direction list "
            f"when only those ran, {UNSUPPORTED} unsupported, n/a unavailable ("
            f"{STATUS_MEANING['unavailable']}), blank: the grid has no cell there."
        ),
    }
    t = support_table(df)
    rst = tabulate(
        t.reset_index().values.tolist(), headers=["kernel", *t.columns], tablefmt="grid"
    )
    return whats, {"support": rst}
