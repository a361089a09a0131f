"""What the block-sparse family's answers are about: per block setting, density, length, heads and
direction, the fastest block-sparse kernel (report.advice), set against dense attention
(report.against): the dense kernels given the same blocks (FlexAttention's BlockMask) at the
point, and dense full attention at the same length from the kernel grids. The grid's dense
references (dense kernels on the full mask at equal visible area) answer another question:
sparse_vs_dense."""

from __future__ import annotations

import pandas as pd

from ...kernels.catalog import KERNELS
from ...masks import SPARSE_MASKS
from ...report.advice import HEADS_ETC, AdviceFamily
from ...report.against import AtPoint, OnSameMask
from ...report.labels import seqlen_label
from ..kernel.advice import named_by_impl
from .tables import block_setting


def sparse_rows(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The block-sparse cells, with their block setting; the dense references left out."""
    dense = ~df["mask"].isin(SPARSE_MASKS)
    left = ""
    if dense.any():
        masks = ", ".join(dict.fromkeys(df.loc[dense, "mask"]))
        left = (
            f"{int(dense.sum())} dense reference cells (mask {masks}) are compared in "
            "sparse_vs_dense, not here"
        )
    rows, _ = named_by_impl(df[~dense])
    return rows.assign(blocks=[block_setting(r) for _, r in rows.iterrows()]), left


def leading(p: dict) -> dict:
    return {"blocks": p["blocks"], "density": f"{p['density']:g}", "S": seqlen_label(p["seqlen"])}


def where(p: dict) -> list[str]:
    return [
        p["mask"],
        f"{p['blocks']}, density {p['density']:g}",
        f"S={seqlen_label(p['seqlen'])} ({int(p['seqlen'])})",
    ]


def short(p: dict) -> str:
    return f"{p['blocks']} density {p['density']:g} {seqlen_label(p['seqlen'])}"


def dense(name: str) -> bool:
    """A dense kernel of the catalog (one that takes any mask, the block mask among them); a
    kernel of your own (module:Class) counts as block-sparse."""
    info = KERNELS.get(name)
    return info is not None and info.family == "dense"


def block_sparse(name: str) -> bool:
    return not dense(name)


def full_attention(p: dict) -> dict:
    """The dense kernels' point of full attention at the block-sparse point's length."""
    return {"mask": "full", "seqlen": p["seqlen"], **{k: p[k] for k in HEADS_ETC}}


# dense full attention at the block-sparse point's length, from the kernel grids (its figures
# draw the same: full_attention.py)
FULL_ATTENTION = AtPoint(
    "dense_full",
    "dense full attention at the same length",
    "dense full",
    family="kernel",
    point=full_attention,
    mine=block_sparse,
)
AGAINST = (
    OnSameMask(
        "dense_same_blocks",
        "the dense kernels given the same blocks",
        "dense, same blocks",
        theirs=dense,
        mine=block_sparse,
    ),
    FULL_ATTENTION,
)

ADVICE = AdviceFamily(
    name="sparse",
    what="block-sparse kernel",
    per="block size, density, length, heads",
    point_keys=("mask", "blocks", "density", "seqlen", *HEADS_ETC),
    contenders=sparse_rows,
    leading=leading,
    where=where,
    short=short,
    against=AGAINST,
)
