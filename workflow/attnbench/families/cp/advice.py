"""What the CP family's answers are about: per mask, tokens per GPU, GPUs, heads and direction,
the fastest context-parallel method (report.advice). Each local-kernel setting, dK/dV dtype,
degree factorisation or document split a method runs in is its own contender; one-GPU cells (the
bare kernel, the baseline of cp_vs_single_gpu, and a method on one rank) are not advice."""

from __future__ import annotations

import pandas as pd

from ...cp.catalog import BARE_KERNEL
from ...grid.spec import DKV_COMM_DTYPES, SPLIT_DOCUMENTS
from ...report.advice import HEADS_ETC, AdviceFamily
from ...report.collect import emulated
from ...report.labels import seqlen_label


def _text(df: pd.DataFrame, col: str, default: str) -> pd.Series:
    if col not in df:
        return pd.Series(default, index=df.index, dtype=object)
    return df[col].astype(object).where(df[col].notna(), default).astype(str)


def _degrees(r) -> str:
    if pd.isna(r.get("ulysses_degree")) or pd.isna(r.get("ring_degree")):
        return ""
    w = r.get("windows")
    windows = f"/W{int(w)}" if pd.notna(w) and int(w) > 1 else ""
    return f"U{int(r['ulysses_degree'])}xR{int(r['ring_degree'])}{windows}"


def cp_names(df: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(base, name, ran) of each CP row. base: the method with the local-kernel setting, the
    degrees and the documents split where the method runs several (and `emulated` where it also
    has measured cells); name: base with the dK/dV dtype where the method's backward runs several
    (it changes only the backward, so a fwd row is named by its base); ran: the local kernel that
    ran."""
    setting = _text(df, "local_kernel_setting", "")
    ran = _text(df, "local_kernel", "")
    setting = setting.where(setting != "", ran)
    dkv = _text(df, "dkv_comm_dtype", DKV_COMM_DTYPES[0])
    degrees = pd.Series([_degrees(r) for _, r in df.iterrows()], index=df.index, dtype=object)
    split = _text(df, "split_documents", SPLIT_DOCUMENTS[0])
    emu = emulated(df)
    base = []
    for i, impl in df["impl"].items():
        mine = df["impl"] == impl
        same_gpus = mine & (df["gpus"] == df.at[i, "gpus"])
        tags = []
        if setting[mine].nunique() > 1:
            tags.append(setting[i])
        if degrees[same_gpus].nunique() > 1:
            tags.append(degrees[i])
        if split[mine].nunique() > 1:
            tags.append(f"split {split[i]}")
        if emu[mine].nunique() > 1 and emu[i]:  # beside the same method measured
            tags.append("emulated")
        base.append(impl + "".join(f" [{t}]" for t in tags))
    base = pd.Series(base, index=df.index)
    name = [
        b + (f" [dkv {dkv[i]}]" if dkv[(base == b) & (df["direction"] == d)].nunique() > 1 else "")
        for (i, b), d in zip(base.items(), df["direction"])
    ]
    return base, pd.Series(name, index=df.index), ran.where(ran != setting, "")


def cp_rows(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The multi-GPU method cells, named; the one-GPU cells left out (baselines, not advice)."""
    one = (df["gpus"] == 1) | (df["impl"] == BARE_KERNEL)
    left = ""
    if one.any():
        left = (
            f"{int(one.sum())} one-GPU cells (the bare kernel {BARE_KERNEL}, methods on one "
            "rank) are baselines, not advice"
        )
    df = df[~one].copy()
    per_gpu = df["seqlen"] // df["gpus"]  # the CP cell's own split, where a row lacks it
    tokens = df["tokens_per_gpu"] if "tokens_per_gpu" in df else per_gpu
    df["tokens_per_gpu"] = tokens.fillna(per_gpu).astype(int)
    if len(df):
        df["_base"], df["_name"], df["_ran"] = cp_names(df)
    else:
        df["_base"] = df["_name"] = df["_ran"] = pd.Series(dtype=object)
    return df, left


def leading(p: dict) -> dict:
    return {
        "mask": p["mask"],
        "tokens/GPU": int(p["tokens_per_gpu"]),
        "GPUs": int(p["gpus"]),
        "S": seqlen_label(p["seqlen"]),
    }


def where(p: dict) -> list[str]:
    return [
        p["mask"],
        f"S={seqlen_label(p['seqlen'])} ({int(p['seqlen'])})",
        f"{int(p['tokens_per_gpu'])} tokens/GPU x {int(p['gpus'])} GPUs",
    ]


def short(p: dict) -> str:
    tokens = seqlen_label(int(p["tokens_per_gpu"]))
    return f"{p['mask']} {tokens}/GPU x {int(p['gpus'])} GPUs"


ADVICE = AdviceFamily(
    name="cp",
    what="context-parallel method",
    per="mask, tokens per GPU, GPUs, heads",
    point_keys=("mask", "tokens_per_gpu", "gpus", "seqlen", *HEADS_ETC),
    contenders=cp_rows,
    leading=leading,
    where=where,
    short=short,
)
