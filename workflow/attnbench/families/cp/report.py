"""Tables and figures of `family: cp` grids, from the tidy table alone (attnbench.families calls these).

Tables: per-GPU TFLOP/s (median [p20-p80]) of every method per (mask, direction, tokens per GPU,
GPUs) and the advice's verdict (cp_tflops), its share of the bare local kernel on one GPU
(`local`) over the same documents (cp_vs_single_gpu), and the
communication/computation breakdown with bytes, load balance, degrees and memory (cp_breakdown).
Figures: per-GPU TFLOP/s vs number of GPUs, one panel per mask and direction (and tokens per GPU
where the grid has several) (cp_tflops_vs_gpus), and the compute-only / communication-only /
measured times per method and GPU count (cp_breakdown).

Emulated cells (`cp.emulate`: the compute of every rank emulated on one device, no transfer;
families/cp/emulated.py) are never read as distributed measurements: their method is named
`METHOD [emulated]` everywhere, they are never the fastest of a row, their lines are dashed and
their breakdown marks are hollow diamonds ("emulated compute"), and every caption says so.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...cp.catalog import BARE_KERNEL, method_label
from ...report import plotting
from ...report.collect import emulated
from ...report.labels import GIB, STATUS_LABEL, order, seqlen_label
from ...report.style import colour
from ...report.tables import (
    MEDIAN_SPREAD,
    describe_setup,
    fmt_compared,
    fmt_number,
    spread_text,
    write_table,
)
from ...status import TIMED

MIB = 2**20


def _column(df, name, default):
    """A tidy-table column that older records may lack (their rows take `default`)."""
    if name not in df:
        return pd.Series([default] * len(df), index=df.index, dtype=object)
    return df[name].astype(object).where(df[name].notna(), default)


EMULATED_TAG = "emulated"
EMULATED_NOTE = (
    f"[{EMULATED_TAG}]: the compute of every rank emulated on one device with its transfers off "
    "(cp.emulate), not a distributed measurement: no transfer, overlap or contention is in it"
)


def with_variants(df: pd.DataFrame) -> pd.DataFrame:
    """Methods that a grid runs in several variants (local-kernel settings, dK/dV dtypes, documents
    split) get one
    name per variant in tables and figures, e.g. `ring_p2p [dkv input]`; the bare kernel keeps
    its name (it is the baseline, matched by its local kernel: _baseline). An emulated cell's
    method is always `METHOD [emulated]` (EMULATED_NOTE)."""
    if df.empty:
        return df
    emu = emulated(df)
    setting = _column(df, "local_kernel_setting", None)
    setting = setting.where(setting.notna(), _column(df, "local_kernel", ""))
    dkv = _column(df, "dkv_comm_dtype", "accumulator")
    split = _column(df, "split_documents", "all")
    names = []
    for i, impl in df["impl"].items():
        mine = df["impl"] == impl
        parts = []
        if impl != BARE_KERNEL and setting[mine].nunique() > 1:
            parts.append(str(setting[i]))
        if dkv[mine].nunique() > 1:
            parts.append(f"dkv {dkv[i]}")
        if split[mine].nunique() > 1:
            parts.append(f"split {split[i]}")
        if emu[i]:
            parts.append(EMULATED_TAG)
        names.append(impl + "".join(f" [{p}]" for p in parts))
    return df.assign(impl=names, _emulated=emu)


def _is_emulated(name: str) -> bool:
    return name.endswith(f"[{EMULATED_TAG}]")


def _emulated_note(df: pd.DataFrame) -> str:
    return f"; {EMULATED_NOTE}" if "_emulated" in df and df["_emulated"].any() else ""


def _tokens(df) -> list[int]:
    return sorted(set(df["tokens_per_gpu"].dropna().astype(int))) if "tokens_per_gpu" in df else []


def _panels(df):
    """(mask, direction, tokens per GPU) of each panel; the length is None where the grid has one."""
    tpg = df["tokens_per_gpu"] if len(_tokens(df)) > 1 else [None] * len(df)
    panels = list(dict.fromkeys(zip(df["mask"], df["direction"], tpg)))
    masks, dirs = list(dict.fromkeys(df["mask"])), ["fwd", "bwd", "fwdbwd"]
    return sorted(
        panels,
        key=lambda p: (masks.index(p[0]), dirs.index(p[1]) if p[1] in dirs else 9, p[2] or 0),
    )


def _panel_rows(df, mask, direction, tpg):
    d = df[(df["mask"] == mask) & (df["direction"] == direction)]
    return d if tpg is None else d[d["tokens_per_gpu"] == tpg]


def _panel_title(mask, direction, tpg) -> str:
    return f"{mask} | {direction}" + ("" if tpg is None else f" | {int(tpg)} tokens/GPU")


def _degrees(r) -> str:
    if pd.isna(r.get("ulysses_degree")):
        return ""
    s = f"U{int(r['ulysses_degree'])}xR{int(r['ring_degree'])}"
    if r.get("windows", 1) and int(r["windows"]) > 1:
        s += f"/W{int(r['windows'])}"
    return s + (
        f" {r['placement']}" if int(r["ulysses_degree"]) > 1 and int(r["ring_degree"]) > 1 else ""
    )


# ---------------------------------------------------------------- tables


def _name(m: str) -> str:
    """A method's name in tables and legends, with its label where it has one."""
    label = method_label(m)
    return m if label == m else f"{m} ({label})"


def _tflops_text(r) -> str:
    """Median [p20-p80], flagged when incorrect; else the status word."""
    if r["status"] in TIMED and pd.notna(r["tflops"]):
        return (
            fmt_compared(r["tflops"])
            + spread_text(r, "tflops", fmt_compared)
            + (" (wrong)" if r["status"] == "incorrect" else "")
        )
    return STATUS_LABEL.get(r["status"], r["status"])


def _sorted(t: pd.DataFrame, keys: list[str], index: list[str]) -> pd.DataFrame:
    """Rows sorted by `keys`, methods in the report's order rather than by name; indexed by `index`."""
    if t.empty:
        return t
    t = t.assign(_o=[order(t["method"]).index(m) for m in t["method"]])
    return (
        t.sort_values(["_o" if k == "method" else k for k in keys])
        .drop(columns="_o")
        .set_index(index)
    )


POINT = ["mask", "direction", "tokens_per_gpu", "gpus"]


def _point(r) -> dict:
    """A table row's first columns: the method and its point (POINT)."""
    names = {k: r[k] for k in ("mask", "direction")}
    counts = {k: int(r[k]) for k in ("tokens_per_gpu", "gpus")}
    return {"method": r["impl"], **names, **counts}


def tflops_table(df: pd.DataFrame, samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-GPU TFLOP/s, median [p20-p80], one column per method, and the answer of each row: the
    advice's verdict (report.advice: methods compared draw by draw; the bare kernel is the
    baseline, not a contender; emulated cells are no contender of measured ones)."""
    from ...report.advice import grid_answers
    from .advice import ADVICE

    d = df.copy()
    d["text"] = [_tflops_text(r) for _, r in d.iterrows()]
    d["tokens_per_gpu"] = d["tokens_per_gpu"].astype(int)
    t = d.pivot_table(index=POINT, columns="impl", values="text", aggfunc="first")
    t = t.reindex(columns=order(t.columns)).fillna("")
    measured = df[~emulated(df)] if len(df) else df
    found, _ = grid_answers(measured, "", ADVICE, samples) if len(measured) else ([], "")
    best = {
        (a.point["mask"], a.direction, int(a.point["tokens_per_gpu"]), int(a.point["gpus"])): (
            a.verdict()
        )
        for a in found
    }
    t["fastest (advice)"] = [best.get(k, "") for k in t.index]
    return t.rename(columns=_name)


# A CP cell and its baseline share all of these: the same whole sequence (the bare kernel runs
# all of the CP cell's tokens on one GPU), so the same data seed and the same documents.
BASELINE_KEY = ["mask", "direction", "seqlen", "heads_q", "heads_kv", "head_dim", "dtype"]


def _baselines(df: pd.DataFrame) -> dict:
    """The `local` cells (bare kernel, 1 GPU) of each BASELINE_KEY, whatever their status."""
    bare = df[(df["impl"] == BARE_KERNEL) & (df["gpus"] == 1)]
    out = {}
    for _, r in bare.iterrows():
        out.setdefault(tuple(r.get(k) for k in BASELINE_KEY), []).append(r)
    return out


def _baseline(refs: dict, r):
    """The CP cell's baseline: the bare cell over the same documents (its key) that ran the same
    local kernel, else the one of the same local-kernel setting; None without one."""
    cands = refs.get(tuple(r.get(k) for k in BASELINE_KEY), [])
    for key in ("local_kernel", "local_kernel_setting"):
        same = [b for b in cands if pd.notna(r.get(key)) and b.get(key) == r.get(key)]
        if same:
            return same[0]
    # a row that does not say which local kernel it ran: the one bare cell of its documents
    unknown = pd.isna(r.get("local_kernel")) and pd.isna(r.get("local_kernel_setting"))
    return cands[0] if unknown and len(cands) == 1 else None


def _kernel_text(r) -> str:
    """The local kernel that ran, with `(auto)` where the cell chose it."""
    ran = r.get("local_kernel")
    if ran is None or pd.isna(ran):
        return ""
    setting = r.get("local_kernel_setting")
    return f"{ran} (auto)" if setting == "auto" and ran != "auto" else str(ran)


def _share(r, ref, draws: dict) -> str:
    """The cell's per-GPU TFLOP/s over the bare kernel's over the same documents, draw by draw
    (one GPU's time over GPUs x the CP time: the same FLOPs), or why there is none."""
    if r["status"] not in TIMED or pd.isna(r["tflops"]):
        return ""
    if ref is None:
        return "none (no 1-GPU cell over the same documents)"
    if "incorrect" in (r["status"], ref["status"]):
        return "none (wrong)"
    if ref["status"] != "ok" or pd.isna(ref["tflops"]):
        return f"none (baseline {STATUS_LABEL.get(ref['status'], ref['status'])})"
    mine, base = _draws(r, draws), _draws(ref, draws)
    if [d.key for d in mine] != [d.key for d in base]:
        return "none (other documents)"
    g = int(r["gpus"])
    shares = [b.median / (g * c.median) for c, b in zip(mine, base)]
    # resolved where, on every draw, the two p20-p80 intervals (of g x CP time) are apart
    apart = all(b.p80 < g * c.p20 or g * c.p80 < b.p20 for c, b in zip(mine, base))
    text = f"{pd.Series(shares).median():.0%}"
    if len(shares) > 1:
        text += f" [{min(shares):.0%}-{max(shares):.0%}]"
    return text if apart else f"~ {text} (within spread)"


def _draws(r, draws: dict):
    """The row's draws from the per-sample table, else the cell read as one draw."""
    from ...report.paired import NO_FINGERPRINT, Draw

    found = draws.get(str(r.get("cell_id")))
    if found:
        return found
    return (Draw(0, NO_FINGERPRINT, r["time_ms_median"], r["time_ms_p20"], r["time_ms_p80"]),)


def vs_single_gpu_table(df: pd.DataFrame, samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-GPU TFLOP/s of every CP cell against the bare local kernel on one GPU (`local`) over the
    same documents: the same mask, direction, whole sequence (the same draw), heads, head dim,
    dtype and local kernel: what context parallelism costs. Only a `local` cell that is ok is a
    baseline; without one the share says so (a CP method at 1 GPU, e.g. Ulysses, is NOT used
    instead: it runs the CP framework around the kernel)."""
    from ...report.advice import draws_by_cell

    refs, draws = _baselines(df), draws_by_cell(samples)
    rows = []
    for _, r in df[df["impl"] != BARE_KERNEL].iterrows():
        ref = _baseline(refs, r)
        rows.append(
            {
                **_point(r),
                "local kernel": _kernel_text(r),
                "TFLOP/s per GPU": _tflops_text(r),
                f"{method_label(BARE_KERNEL)} (TFLOP/s)": "" if ref is None else _tflops_text(ref),
                f"{method_label(BARE_KERNEL)}: local kernel": ""
                if ref is None
                else _kernel_text(ref),
                "tokens (both)": seqlen_label(int(r["seqlen"])),
                "share of 1 GPU": _share(r, ref, draws),
            }
        )
    index = POINT + ["method"]
    return _sorted(pd.DataFrame(rows), index, index)


# Below this share of the compute-only time, communication is too small for the overlap ratio to
# mean anything: timing noise of the compute alone would swing it far outside [0, 1].
MIN_COMM_SHARE = 0.05


def _overlap_text(r) -> str:
    comp, comm, ratio = r.get("compute_only_ms"), r.get("comm_only_ms"), r.get("overlap_ratio")
    if pd.isna(comp) or pd.isna(comm) or pd.isna(ratio):
        return ""
    return f"{ratio:.2g}" if comm >= MIN_COMM_SHARE * comp else f"(comm {comm / comp:.1%})"


def _ratio_text(r) -> str:
    comp = r.get("compute_only_ms")
    return f"{r['time_ms_median'] / comp:.3f}" if pd.notna(comp) and comp > 0 else ""


def breakdown_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in df.iterrows():
        ran = r["status"] in TIMED

        def num(key, scale=1.0, digits=3, r=r, ran=ran):
            return f"{r[key] / scale:.{digits}g}" if ran and key in r and pd.notna(r[key]) else ""

        rows.append(
            {
                **_point(r),
                "degrees": _degrees(r),
                "local kernel": _kernel_text(r),
                "status": STATUS_LABEL.get(r["status"], r["status"]),
                "time (ms)": (
                    fmt_number(r["time_ms_median"]) + spread_text(r, "time_ms_median")
                    if ran and pd.notna(r.get("time_ms_median"))
                    else ""
                ),
                "compute-only (ms)": num("compute_only_ms"),
                "comm-only (ms)": num("comm_only_ms"),
                "overlap": _overlap_text(r) if ran else "",
                "measured / compute-only": _ratio_text(r) if ran else "",
                "load max/mean": num("load_balance", digits=3),
                "sent/rank (MiB)": num("bytes_sent_max", MIB),
                "= analytic": (
                    "yes"
                    if r.get("bytes_match_analytic") in (True, "True")
                    else "no"
                    if r.get("bytes_match_analytic") in (False, "False")
                    else ""
                )
                if ran
                else "",
                "peak mem (GiB)": num("peak_mem_bytes", GIB),
                "emulated (rank spread)": (
                    f"yes ({r['rank_spread']:.3g})"
                    if r.get("_emulated") and pd.notna(r.get("rank_spread"))
                    else "yes"
                    if r.get("_emulated")
                    else ""
                ),
            }
        )
    return _sorted(
        pd.DataFrame(rows),
        ["mask", "direction", "tokens_per_gpu", "method", "gpus"],
        ["method", "mask", "direction", "tokens_per_gpu", "gpus"],
    )


def tables(df: pd.DataFrame, out: Path, samples: pd.DataFrame | None = None) -> list[Path]:
    df = with_variants(df)
    paths = write_table(
        tflops_table(df, samples),
        out / "cp_tflops",
        f"context parallelism: TFLOP/s per GPU ({MEDIAN_SPREAD}; global FLOPs / (slowest rank's time x "
        "GPUs)); fastest (advice): the advice's verdict at the point (advice.md: methods compared "
        "draw by draw, a winner only where every other method is slower on every draw, p20-p80 "
        f"apart, else 'A ~ B'); emulated cells are never the fastest{_emulated_note(df)}; "
        f"{describe_setup(df)}",
    )
    paths += write_table(
        vs_single_gpu_table(df, samples),
        out / "cp_vs_single_gpu",
        f"context parallelism against one GPU: per-GPU TFLOP/s ({MEDIAN_SPREAD}) of each CP cell and "
        f"its share of the bare local kernel on one GPU (`{BARE_KERNEL}`: the same kernel call over the "
        "whole sequence, no CP framework) over the same documents: the same mask, direction and whole "
        "sequence ('tokens (both)'), so the same sampled documents, checked draw by draw, and the "
        "same local kernel; the share is the one-GPU time over GPUs x the CP time on each draw "
        "(their median, [min-max] over several draws); '~ ... (within spread)': on some draw the "
        "two p20-p80 intervals overlap; 'none (no 1-GPU cell over the same documents)': the grid "
        f"lacks that baseline (add `methods: [{BARE_KERNEL}]` with `gpus: [1]` at the CP cell's "
        "whole length as its tokens_per_gpu; a CP method at 1 GPU is never used instead, nor a "
        "one-GPU cell of other documents); 'none (wrong)': either cell disagrees with the float64 "
        f"reference, no share is computed{_emulated_note(df)}; {describe_setup(df)}",
    )
    paths += write_table(
        breakdown_table(df),
        out / "cp_breakdown",
        "context parallelism: measured time, compute-only and communication-only variants of the same "
        "schedule (slowest rank, median; the measured time with its p20-p80), "
        "overlap = (compute + comm - measured) / min(compute, comm), "
        f"shown only where communication is at least {MIN_COMM_SHARE:.0%} of compute (else the share, "
        "in brackets), measured / compute-only (above 1: what transfers cost the real schedule), "
        f"bytes sent per rank (max) and whether they equal the schedule's formula; an emulated "
        "cell's time is its compute only (the slowest rank), its rank spread the slowest rank's "
        f"median over the mean of all ranks'{_emulated_note(df)}; {describe_setup(df)}",
    )
    return paths


# ---------------------------------------------------------------- figures


TFLOPS_NOTE = (
    "per-GPU TFLOP/s = global FLOPs of the exact mask area / (slowest rank's time x GPUs); "
    "X on the axis: out of memory; red ring: disagrees with the float64 reference"
)
BREAKDOWN_NOTE = (
    "solid: the schedule with transfers disabled; hatched: with computation disabled; "
    "dot: the real schedule (a dot below the bar's top means communication overlapped computation)"
)


def tflops_vs_gpus(df: pd.DataFrame):
    """One panel per (mask, direction); a line per method; OOM as X on the floor. Returns the
    figure and what was drawn (for tests)."""
    panels = _panels(df)
    fig, axes = plotting.grid_axes(len(panels), ncols=min(4, max(1, len(panels))))
    drawn = {"lines": 0, "points": 0, "oom_markers": 0, "not_run": {}}
    for ax, (mask, direction, tpg) in zip(axes, panels):
        d = _panel_rows(df, mask, direction, tpg)
        not_run = []
        for m in order(d["impl"]):
            g = d[d["impl"] == m]
            points, ooms = plotting.timed_line(
                ax,
                g,
                "gpus",
                "tflops",
                m,
                _name(m),
                ms=5,
                lw=1.4,
                ring_ms=10,
                ls="--" if _is_emulated(m) else "-",
            )
            drawn["lines"] += int(points > 0)
            drawn["points"] += points
            drawn["oom_markers"] += ooms
            for st in ("unsupported", "unavailable", "timeout", "crashed"):
                gpus = sorted(g[g["status"] == st]["gpus"])
                if gpus:
                    not_run.append(f"{m} {STATUS_LABEL[st]} at {','.join(map(str, gpus))}")
        drawn["not_run"][(mask, direction) if tpg is None else (mask, direction, tpg)] = not_run
        xs = sorted(set(d["gpus"]))
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylim(bottom=0)
        ax.set_title(_panel_title(mask, direction, tpg), fontsize="medium")
        ax.set_xlabel("GPUs (ranks)")
        ax.set_ylabel("TFLOP/s per GPU")
        ax.grid(alpha=0.3)
        if not_run:
            plotting.panel_notes(ax, not_run)
    _legend(fig, axes)
    fig.suptitle(
        f"Context parallelism: throughput vs GPUs ({', '.join(map(str, _tokens(df)))} tokens per GPU) | "
        f"{plotting.describe(df)}",
        y=1.0,
    )
    plotting.note_below(
        fig, TFLOPS_NOTE + _emulated_note(df).replace("; ", "; dashed, ", 1), -0.12
    )
    return fig, drawn


def breakdown(df: pd.DataFrame):
    """Per (mask, direction) panel, for each GPU count a group of stacked bars per method:
    compute-only time and, above it, communication-only time; a black dot marks the measured
    time (below the bar's top: the schedule overlapped the two)."""
    panels = _panels(df)
    fig, axes = plotting.grid_axes(len(panels), ncols=min(3, max(1, len(panels))), w=4.6, h=3.0)
    drawn = {"bars": 0}
    for ax, (mask, direction, tpg) in zip(axes, panels):
        d = _panel_rows(df, mask, direction, tpg)
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
                    ax.bar(x, comp, width * 0.9, color=colour(m), label=_name(m))
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
                if _is_emulated(m):  # its time is compute only: never the measured dot
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
        ax.set_title(_panel_title(mask, direction, tpg), fontsize="medium")
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
    plotting.note_below(fig, BREAKDOWN_NOTE + _emulated_note(df), -0.16)
    return fig, drawn


def _legend(fig, axes, ncol=6, extra=()):
    handles = plotting.collect_handles(axes)
    for h in extra:
        handles[h.get_label()] = h
    if handles:
        plotting.legend_below(fig, handles, min(ncol, len(handles)))


def figures(df: pd.DataFrame, out: Path, style, only=None) -> list[Path]:
    """Both figures at once (`only` is not used: they share no costly part worth splitting)."""
    df = with_variants(df)
    fig, _ = tflops_vs_gpus(df)
    paths = plotting.save(fig, out, "cp_tflops_vs_gpus", style)
    fig, _ = breakdown(df)
    return paths + plotting.save(fig, out, "cp_breakdown", style)


def table_captions(df: pd.DataFrame) -> tuple[dict, dict]:
    """Each table is described by its Markdown caption (the first line of its file)."""
    return {}, {}


def figure_captions(df: pd.DataFrame, style) -> dict:
    """The report's captions of these figures give machine, data and software only."""
    return {}
