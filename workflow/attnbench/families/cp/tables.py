"""Tables of `family: cp` grids, from the tidy tables alone (attnbench.families calls these), and
what the CP figures (figures.py) share with them: the variants' names, the panels, the share rule.

Tables: per-GPU TFLOP/s (median [p20-p80]) of every method per (mask, direction, tokens per GPU,
GPUs) and the advice's verdict (cp_tflops), its share of the bare local kernel on one GPU
(`local`) over the same documents (cp_vs_single_gpu; share_of), and the
communication/computation breakdown with bytes, load balance, degrees and memory (cp_breakdown).

Emulated cells (`cp.emulate`: the compute of every rank emulated on one device, no transfer;
families/cp/emulated.py) are never read as distributed measurements: their method is named
`METHOD [emulated]` in the tables, they are never the fastest of a row, the figures draw them as
hollow diamonds, and every caption says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ...cp.catalog import BARE_KERNEL, method_label
from ...record.status import TIMED
from ...report.collect import emulated
from ...report.labels import GIB, STATUS_LABEL, order, seqlen_label
from ...report.tables import (
    MEDIAN_SPREAD,
    describe_setup,
    fmt_compared,
    fmt_number,
    spread_text,
    write_table,
)

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
    its name (it is the baseline, matched by its local kernel: baseline_of). An emulated cell's
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


def is_emulated_name(name: str) -> bool:
    return name.endswith(f"[{EMULATED_TAG}]")


def emulated_note(df: pd.DataFrame) -> str:
    return f"; {EMULATED_NOTE}" if "_emulated" in df and df["_emulated"].any() else ""


def _tokens(df) -> list[int]:
    return sorted(set(df["tokens_per_gpu"].dropna().astype(int))) if "tokens_per_gpu" in df else []


def cp_panels(df):
    """(mask, direction, tokens per GPU) of each panel; the length is None where the grid has one."""
    tpg = df["tokens_per_gpu"] if len(_tokens(df)) > 1 else [None] * len(df)
    panels = list(dict.fromkeys(zip(df["mask"], df["direction"], tpg)))
    masks, dirs = list(dict.fromkeys(df["mask"])), ["fwd", "bwd", "fwdbwd"]
    return sorted(
        panels,
        key=lambda p: (masks.index(p[0]), dirs.index(p[1]) if p[1] in dirs else 9, p[2] or 0),
    )


def panel_rows(df, mask, direction, tpg):
    d = df[(df["mask"] == mask) & (df["direction"] == direction)]
    return d if tpg is None else d[d["tokens_per_gpu"] == tpg]


def panel_title(mask, direction, tpg) -> str:
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


def method_name(m: str) -> str:
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
    return t.rename(columns=method_name)


# A CP cell and its baseline share all of these: the same whole sequence (the bare kernel runs
# all of the CP cell's tokens on one GPU), so the same data seed and the same documents.
BASELINE_KEY = ["mask", "direction", "seqlen", "heads_q", "heads_kv", "head_dim", "dtype"]


def baselines(df: pd.DataFrame) -> dict:
    """The `local` cells (bare kernel, 1 GPU) of each BASELINE_KEY, whatever their status."""
    bare = df[(df["impl"] == BARE_KERNEL) & (df["gpus"] == 1)]
    out = {}
    for _, r in bare.iterrows():
        out.setdefault(tuple(r.get(k) for k in BASELINE_KEY), []).append(r)
    return out


def baseline_of(refs: dict, r):
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


@dataclass(frozen=True)
class Share:
    """A CP cell's per-GPU TFLOP/s over the bare kernel's over the same documents, draw by draw:
    one GPU's time over GPUs x the CP time on each draw (the same FLOPs)."""

    median: float | None  # None: no share (`why` says why)
    lo: float | None = None  # min and max over the draws
    hi: float | None = None
    draws: int = 0
    apart: bool = False  # on every draw the two p20-p80 intervals (of g x CP time) are apart
    why: str = ""

    def text(self) -> str:
        if self.median is None:
            return f"none ({self.why})"
        text = f"{self.median:.0%}"
        if self.draws > 1:
            text += f" [{self.lo:.0%}-{self.hi:.0%}]"
        return text if self.apart else f"~ {text} (within spread)"


def share_of(r, ref, draws: dict) -> Share | None:
    """The cell's share of its baseline `ref` (None: the cell has no number, so no share either;
    a Share without a median says why there is none)."""
    if r["status"] not in TIMED or pd.isna(r["tflops"]):
        return None
    if ref is None:
        return Share(None, why="no 1-GPU cell over the same documents")
    if "incorrect" in (r["status"], ref["status"]):
        return Share(None, why="wrong")
    if ref["status"] != "ok" or pd.isna(ref["tflops"]):
        return Share(None, why=f"baseline {STATUS_LABEL.get(ref['status'], ref['status'])}")
    mine, base = _draws(r, draws), _draws(ref, draws)
    if [d.key for d in mine] != [d.key for d in base]:
        return Share(None, why="other documents")
    g = int(r["gpus"])
    shares = [b.median / (g * c.median) for c, b in zip(mine, base)]
    # resolved where, on every draw, the two p20-p80 intervals (of g x CP time) are apart
    apart = all(b.p80 < g * c.p20 or g * c.p80 < b.p20 for c, b in zip(mine, base))
    median = float(pd.Series(shares).median())
    return Share(median, min(shares), max(shares), len(shares), apart)


def _share(r, ref, draws: dict) -> str:
    """The share's text in cp_vs_single_gpu, or why there is none ('' where the cell has no number)."""
    share = share_of(r, ref, draws)
    return "" if share is None else share.text()


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

    refs, draws = baselines(df), draws_by_cell(samples)
    rows = []
    for _, r in df[df["impl"] != BARE_KERNEL].iterrows():
        ref = baseline_of(refs, r)
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
        f"apart, else 'A ~ B'); emulated cells are never the fastest{emulated_note(df)}; "
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
        f"reference, no share is computed{emulated_note(df)}; {describe_setup(df)}",
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
        f"median over the mean of all ranks'{emulated_note(df)}; {describe_setup(df)}",
    )
    return paths


def table_captions(df: pd.DataFrame) -> tuple[dict, dict]:
    """Each table is described by its Markdown caption (the first line of its file)."""
    return {}, {}
