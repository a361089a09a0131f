"""Local-kernel time of a chunk, interpolated from kernel records measured on the device.

What is fitted, per (direction, rectangle kind full|causal): the measured time per visible
(query, key) pair per query head, c(S) = time / (area x Hq), at each measured length S of the
full or causal mask (median over records of the same point). A chunk is a varlen batch of
rectangles (cp/chunks.py); each rectangle of area A costs A x heads x c(S_eq), S_eq the length of
the square mask of the same kind and area (sqrt(A) full, sqrt(2A) causal), c interpolated
linearly in log S between measured lengths and held at the end values outside them (so very
small rectangles are charged the per-pair cost of the shortest measured length: optimistic for
them). Where one rectangle kind was measured, its per-pair cost serves both;
where only forward+backward was measured, a phase gets its FLOPs share of it. The fit's error is
the leave-one-out error at interior lengths (`loo_errors`).

`overhead` (direction -> (seconds, seconds per query row and head)) is charged once per
local-kernel call of a CP schedule: what a call costs beyond the kernel records' per-pair time.
A fixed part (Python, launches, the fixed cost of a call on a chunk far smaller than any record)
and a part proportional to the rows x heads of the accumulator the method updates around the
call (merging a partial output into it, adding a gradient to it: memory-bound elementwise work).
Both are fitted on the grid's own compute-only measurements (model/overhead.py), 0 until then.
A 1-GPU cell pays them once per phase on top of records that already hold one call.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ..harness.flops import DIRECTION_FACTOR
from .geometry import causal_area

KINDS = ("full", "causal")
_IDS = itertools.count()


@dataclass
class KernelTime:
    kernel: str
    points: dict = field(
        default_factory=dict
    )  # (direction, kind) -> ([S], [c seconds per pair-head])
    overhead: dict = field(default_factory=dict)  # direction -> (s, s per row x head) per call
    # names this fit in caches of kernel seconds (geometry.ChunkRow); ids of objects are reused
    uid: int = field(default_factory=lambda: next(_IDS), compare=False)

    @classmethod
    def from_table(
        cls, df, kernel: str, heads_q: int, heads_kv: int, head_dim: int, dtype: str
    ) -> KernelTime:
        """Fit from a tidy table (collect.collect) of kernel records (family kernel, impl == kernel)
        and of 1-GPU CP records whose local kernel is `kernel` (the bare kernel or 1-rank Ulysses)."""
        ok = df[
            (df["status"] == "ok")
            & (df["heads_q"] == heads_q)
            & (df["heads_kv"] == heads_kv)
            & (df["head_dim"] == head_dim)
            & (df["dtype"] == dtype)
            & (df["gpus"] == 1)
            & df["mask"].isin(KINDS)
        ]
        is_kernel = (ok["family"] == "kernel") & (ok["impl"] == kernel)
        is_cp = (
            (ok["family"] == "cp") & (ok.get("local_kernel") == kernel)
            if "local_kernel" in ok
            else False
        )
        ok = ok[is_kernel | is_cp]
        if ok.empty:
            raise ValueError(
                f"no ok records of local kernel {kernel!r} at {heads_q}:{heads_kv} heads, D {head_dim}, "
                f"{dtype}, on the full or causal mask, to fit its time from"
            )
        model = cls(kernel)
        for (direction, kind), g in ok.groupby(["direction", "mask"]):
            per = (
                (g["time_ms_median"] * 1e-3 / (g["mask_area_mean"] * g["heads_q"]))
                .groupby(g["seqlen"])
                .median()
            )
            model.points[(direction, kind)] = (per.index.to_numpy(float), per.to_numpy(float))
        return model

    def with_overhead(self, overhead: dict) -> KernelTime:
        """The same fit, charging `overhead` (direction -> (seconds, seconds per row x head))
        on every call."""
        return KernelTime(self.kernel, self.points, dict(overhead))

    def per_pair(self, direction: str, kind: str, s_eq):
        kinds = {k for _, k in self.points}
        if kind not in kinds and len(kinds) == 1:
            kind = next(
                iter(kinds)
            )  # one mask kind measured (the CPU smoke cells): its per-pair cost serves both
        if (
            (direction, kind) not in self.points
            and ("fwdbwd", kind) in self.points
            and direction in ("fwd", "bwd")
        ):
            # only forward+backward measured (the CPU smoke cells): split it as the FLOPs split (1 : 2.5)
            return (
                self.per_pair("fwdbwd", kind, s_eq)
                * DIRECTION_FACTOR[direction]
                / DIRECTION_FACTOR["fwdbwd"]
            )
        try:
            s, c = self.points[(direction, kind)]
        except KeyError:
            have = ", ".join(f"{d}/{k}" for d, k in sorted(self.points))
            raise ValueError(
                f"no kernel records of {self.kernel} for {direction} on the {kind} mask "
                f"(have: {have or 'none'})"
            ) from None
        if len(s) == 1:
            return np.full_like(np.asarray(s_eq, float), c[0])
        return np.interp(np.log(np.asarray(s_eq, float)), np.log(s), c)

    def call_seconds(self, direction: str, rows: int, heads: int) -> float:
        """The overhead of one local-kernel call of a phase whose method updates an accumulator
        of `rows` x `heads` (a forward+backward fit serves either phase's calls where only
        forward+backward cells calibrated it)."""
        fixed, per = self.overhead.get(direction, self.overhead.get("fwdbwd", (0.0, 0.0)))
        return fixed + per * rows * heads

    def rect_seconds(self, q, k, kind: str, heads: int, direction: str):
        """Kernel seconds of rectangles of q rows x k keys of one kind (arrays, elementwise)."""
        q, k = np.asarray(q, float), np.asarray(k, float)
        causal = kind == "causal"
        areas = causal_area(q, k) if causal else q * k
        s_eq = np.sqrt(areas * (2.0 if causal else 1.0))
        return areas * heads * self.per_pair(direction, kind, s_eq)

    def chunk_seconds(self, chunk, heads: int, direction: str) -> float:
        """Time of one local-kernel call on a real cp.chunks.Chunk (sum over its rectangles)."""
        call = self.call_seconds(direction, chunk.ql, heads)
        if chunk.empty:
            return call
        kind = "causal" if chunk.causal else "full"
        q = [seg.ql for seg in chunk.segments]
        k = [seg.kl for seg in chunk.segments]
        return call + float(np.sum(self.rect_seconds(q, k, kind, heads, direction)))

    def seconds(self, direction: str, kind: str, seqlen: int, heads: int) -> float:
        """Time of the whole square mask of one kind at `seqlen` (for checks and tables)."""
        area = seqlen * seqlen if kind == "full" else seqlen * (seqlen + 1) / 2
        return float(
            area
            * heads
            * self.per_pair(direction, kind, math.sqrt(area * (2.0 if kind == "causal" else 1.0)))
        )

    def loo_errors(self) -> dict:
        """(direction, kind) -> relative errors of predicting each interior measured length from
        the others (the interpolation's error where it interpolates)."""
        out = {}
        for key, (s, c) in self.points.items():
            errs = []
            for i in range(1, len(s) - 1):
                keep = np.arange(len(s)) != i
                pred = np.interp(np.log(s[i]), np.log(s[keep]), c[keep])
                errs.append(float(pred / c[i] - 1))
            out[key] = errs
        return out
