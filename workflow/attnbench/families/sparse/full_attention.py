"""Dense full attention at each length of a block-sparse grid, for its figures: the fastest dense
kernel on the full mask at the same length, heads, head dim, dtype and direction, on the same
device, from the kernel grids of the tidy table; the same answer `advise` sets a block-sparse
answer against (report.against.answer_at, advice.FULL_ATTENTION), so figure and answer agree."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ...report.advice import HEADS_ETC, Answer, grid_answers
from ...report.against import answer_at
from ..kernel.advice import ADVICE as KERNEL_ADVICE
from .advice import FULL_ATTENTION

FAMILY = FULL_ATTENTION.family  # whose answers hold it


@dataclass(frozen=True)
class FullLine:
    """Dense full attention at one length: its fastest kernel, that kernel's TFLOP/s (median over
    its repetitions, the tidy table's), the grid it comes from and that grid's verdict there."""

    impl: str
    tflops: float
    grid: str
    verdict: str


def dense_answers(cells: pd.DataFrame, samples, lengths) -> list[Answer]:
    """The kernel grids' answers on the full mask at these lengths."""
    if cells is None or cells.empty:
        return []
    rows = cells[
        (cells["family"] == FAMILY)
        & (cells["mask"] == "full")
        & cells["seqlen"].isin(list(lengths))
    ]
    found = []
    for grid, g in rows.groupby("grid", sort=False):
        found += grid_answers(g, str(grid), KERNEL_ADVICE, samples)[0]
    return found


def full_attention_lines(sparse: pd.DataFrame, cells: pd.DataFrame, samples) -> dict:
    """{(heads, direction, seqlen): FullLine} at each point of the sparse rows (`heads` as the
    sparse tables write it, '64:8'); a point without an ok dense answer is left out."""
    if sparse.empty:
        return {}
    found = dense_answers(cells, samples, set(sparse["seqlen"]))
    tflops = {} if cells is None or cells.empty else dict(zip(cells["cell_id"], cells["tflops"]))
    keys = ["heads", "direction", "seqlen", *HEADS_ETC, "device_name"]
    out = {}
    for values, _ in sparse.groupby(keys, dropna=False, sort=False):
        p = dict(zip(keys, values))
        want = FULL_ATTENTION.point(p)
        b = answer_at(found, FAMILY, want, p["direction"], {str(p["device_name"])})
        if b is None or not b.ok:
            continue
        value = tflops.get(b.fastest.records[0].cell_id)
        if value is not None and pd.notna(value):
            key = (p["heads"], p["direction"], int(p["seqlen"]))
            out[key] = FullLine(b.fastest.name, float(value), b.grid, b.verdict())
    return out
