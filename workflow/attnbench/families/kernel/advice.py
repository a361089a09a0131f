"""What the kernel family's answers are about: per mask, length, heads (head dim, dtype) and
direction, the fastest kernel (report.advice)."""

from __future__ import annotations

import pandas as pd

from ...report.advice import HEADS_ETC, AdviceFamily
from ...report.labels import seqlen_label


def named_by_impl(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Every row competes, named by its kernel."""
    return df.assign(_name=df["impl"].astype(str), _base=df["impl"].astype(str), _ran=""), ""


def leading(p: dict) -> dict:
    return {"mask": p["mask"], "S": seqlen_label(p["seqlen"])}


def where(p: dict) -> list[str]:
    return [p["mask"], f"S={seqlen_label(p['seqlen'])} ({int(p['seqlen'])})"]


def short(p: dict) -> str:
    return f"{p['mask']} {seqlen_label(p['seqlen'])}"


ADVICE = AdviceFamily(
    name="kernel",
    what="kernel",
    per="mask, length, heads",
    point_keys=("mask", "seqlen", *HEADS_ETC, "gpus"),
    contenders=named_by_impl,
    leading=leading,
    where=where,
    short=short,
    # a kernel the grid measures for a mask and heads setting is expected at every length
    same_contenders=("mask", *HEADS_ETC),
)
