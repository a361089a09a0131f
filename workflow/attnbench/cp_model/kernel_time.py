"""Local-kernel time of a chunk, from kernel records measured on the device.

What is fitted, per direction: the kernel's own fixed cost of a call (`fixed`: its launches and
set-up, whatever the chunk), and per (direction, rectangle kind full|causal) the time per visible
(query, key) pair per query head beyond it, c(S) = (time - fixed) / (area x Hq), at each measured
length S of the full or causal mask (median over records of the same point). A chunk is a varlen
batch of rectangles (cp/chunks.py): one call costs `fixed` once and each rectangle of area A
A x heads x c(S_eq), S_eq the length of the square mask of the same kind and area (sqrt(A) full,
sqrt(2A) causal), c interpolated linearly in log S between measured lengths and held at the end
values outside them (so very small rectangles are charged the per-pair cost of the shortest
measured length: optimistic for them). Where one rectangle kind was measured, its per-pair cost
serves both; where only forward+backward was measured, a phase gets its FLOPs share of it. The
fit's error is the leave-one-out error at interior lengths (`loo_errors`).

The fixed part is what tells a call over many small rectangles from one over a large one: the
full and causal records alone cannot tell it from the per-pair cost (each length has its own c).
It is fitted on the kernel's records of document masks (full_document, causal_document and their
_long forms, the bare kernel over many documents at 1K-64K tokens): the value that minimises the
sum of |log(predicted / measured)| over their samples, each predicted from its own documents
(`fixed_fit` says on how many and with what error). Without document records it is 0.

`overhead` (direction -> (seconds, seconds per query row and head, seconds per query row and
head more on a call over several rectangles)) is charged once per local-kernel call of a CP
schedule: what the CP framework adds to a call. A part proportional to the rows x heads of the
accumulator the method updates around the call (merging a partial output into it, adding a
gradient to it: memory-bound elementwise work), more of it where the call is over several
rectangles (their rows copied into a packed buffer and the results back: documents), and a fixed
part (Python, the launches of that work). They are fitted on compute-only and emulated
measurements of CP cells (cp_model/overhead.py), 0 until then.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..harness.flops import DIRECTION_FACTOR
from .geometry import causal_area

KINDS = ("full", "causal")
# (query rows, keys) of one tile of a GPU kernel's work at head dim 128: FlashAttention-3's forward
# tiles are 128 x 128 (causal) to 128 x 176 (hopper/tile_size.h), FlashAttention-2's 128 x 64 on
# Hopper; both backwards 64 x 128. A rectangle costs at least its tiles whole: the floor of short
# pieces (a CPU kernel's records are costed per pair: no tile)
GPU_TILES = {"fwd": (128, 128), "bwd": (64, 128), "fwdbwd": (64, 128)}
DOCUMENT_MASKS = ("full_document", "causal_document", "full_document_long", "causal_document_long")
_IDS = itertools.count()


@dataclass
class KernelTime:
    kernel: str
    points: dict = field(
        default_factory=dict
    )  # (direction, kind) -> ([S], [c seconds per pair-head])
    # direction -> (s, s per row x head, s per row x head more on several rectangles) per call
    overhead: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)  # direction -> the kernel's own seconds per call
    fixed_fit: dict = field(default_factory=dict)  # direction -> what `fixed` was fitted on (text)
    tiles: dict = field(default_factory=dict)  # direction -> (rows, keys) of a tile ({}: none)
    # names this fit in caches of kernel seconds (geometry.ChunkRow); ids of objects are reused
    uid: int = field(default_factory=lambda: next(_IDS), compare=False)
    _axis: dict = field(default_factory=dict, compare=False, repr=False)  # axis()'s cache

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
        gpu = "device" in ok and (ok["device"] == "cuda").all()
        model = cls(kernel, tiles=dict(GPU_TILES) if gpu else {})
        for (direction, kind), g in ok.groupby(["direction", "mask"]):
            per = (g["time_ms_median"] * 1e-3 / g["heads_q"]).groupby(g["seqlen"]).median()
            s = per.index.to_numpy(float)
            pairs = model.pairs(s, s, kind, direction)  # the whole mask's (tile-padded) pairs
            model.points[(direction, kind)] = (s, per.to_numpy(float) / pairs)
        docs = df[
            (df["status"] == "ok")
            & (df["family"] == "kernel")
            & (df["impl"] == kernel)
            & (df["heads_q"] == heads_q)
            & (df["heads_kv"] == heads_kv)
            & (df["head_dim"] == head_dim)
            & (df["dtype"] == dtype)
            & df["mask"].isin(DOCUMENT_MASKS)
        ]
        return model.with_fixed_part(document_samples(docs), heads_q)

    def with_overhead(self, overhead: dict) -> KernelTime:
        """The same fit, charging `overhead` (direction -> (seconds, seconds per row x head))
        on every call."""
        return KernelTime(
            self.kernel, self.points, dict(overhead), self.fixed, self.fixed_fit, self.tiles
        )

    def with_fixed_part(self, samples: list, heads: int) -> KernelTime:
        """The kernel's fixed seconds per call fitted per direction on `samples` ((direction,
        kind, document lengths, measured seconds): the bare kernel over documents), the per-pair
        costs taken net of it; the same fit where a direction has no sample."""
        points, fixed, said = dict(self.points), {}, {}
        for d in sorted({x[0] for x in samples}):
            mine = [x for x in samples if x[0] == d]
            keys = [k for k in self.points if k[0] == d]
            if not keys:
                continue
            # at most 90% of the shortest record's time: a fixed part cannot be all of a call
            top = 0.9 * min(
                self.seconds(d, k, int(self.points[(d, k)][0][0]), heads) for _, k in keys
            )
            grid = np.concatenate([[0.0], np.geomspace(1e-7, top, 80)])
            meas = np.array([x[3] for x in mine])

            # each sample's tile-padded pairs do not depend on the fixed part: counted once
            padded = [(kind, *self.padded(n, n, kind, d)) for _, kind, n, _ in mine]

            def loss(a, padded=padded, meas=meas, d=d):
                kt = self.net_of(d, a, heads)
                pred = [
                    a + np.sum(pairs * heads * kt.per_pair(d, kind, s_eq))
                    for kind, pairs, s_eq in padded
                ]
                return np.sum(np.abs(np.log(np.asarray(pred) / meas))), np.asarray(pred)

            best = min(grid, key=lambda a: loss(a)[0])
            lo, hi = best / 1.1, min(top, best * 1.1) if best else grid[1]
            best = min(np.concatenate([[best], np.linspace(lo, hi, 41)]), key=lambda a: loss(a)[0])
            e = loss(best)[1] / meas - 1
            fixed[d] = float(best)
            points.update(self.net_of(d, best, heads).points)
            said[d] = (
                f"{1e6 * best:.0f} us per call ({d}), fitted on {len(mine)} samples of document-"
                f"mask records: median |error| {100 * np.median(np.abs(e)):.1f}%, worst "
                f"{100 * e[np.argmax(np.abs(e))]:+.0f}%"
            )
        return KernelTime(self.kernel, points, dict(self.overhead), fixed, said, self.tiles)

    def net_of(self, direction: str, fixed: float, heads: int) -> KernelTime:
        """The per-pair costs of `direction` with a fixed part of `fixed` seconds taken out of
        every record (heads: the records' query heads)."""
        points = {}
        for (d, kind), (s, c) in self.points.items():
            if d != direction:
                continue
            pairs = self.square_pairs(d, kind)
            points[(d, kind)] = (s, np.maximum(c - fixed / (pairs * heads), 0.0))
        out = KernelTime(self.kernel, points, tiles=self.tiles)
        out._axis = self._axis  # the same lengths and tiles: the same squares (a cache)
        return out

    def call_fixed(self, direction: str) -> float:
        """The kernel's own fixed seconds of one call (a forward+backward fit's for either phase)."""
        return self.fixed.get(direction, self.fixed.get("fwdbwd", 0.0))

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
        return np.interp(np.log(np.asarray(s_eq, float)), np.log(self.axis(direction, kind)), c)

    def square_pairs(self, direction: str, kind: str) -> np.ndarray:
        """The tile-padded pairs of the records' own square masks (kept: fits ask often)."""
        key = ("pairs", direction, kind)
        if key not in self._axis:
            s = self.points[(direction, kind)][0]
            self._axis[key] = self.pairs(s, s, kind, direction)
        return self._axis[key]

    def axis(self, direction: str, kind: str) -> np.ndarray:
        """The records' lengths as rect_seconds sees a square of them: the length of the square
        of as many (tile-padded) pairs, so that a record's own mask costs its measured time."""
        key = (direction, kind)
        if key not in self._axis:
            self._axis[key] = np.sqrt(
                self.square_pairs(direction, kind) * (2.0 if kind == "causal" else 1.0)
            )
        return self._axis[key]

    def call_seconds(self, direction: str, rows: int, heads: int, several: bool = False) -> float:
        """The CP framework's cost of one local-kernel call of a phase whose method updates an
        accumulator of `rows` x `heads`; `several`: the call is over several rectangles, whose
        rows it copies into a packed buffer and back (a forward+backward fit serves either
        phase's calls where only forward+backward cells calibrated it)."""
        fixed, per, *more = self.overhead.get(direction, self.overhead.get("fwdbwd", (0.0, 0.0)))
        per += more[0] if more and several else 0.0
        return fixed + per * rows * heads

    def pairs(self, q, k, kind: str, direction: str):
        """The pairs a kernel computes for rectangles of q rows x k keys (arrays): every tile a
        rectangle touches, whole (the visible pairs where the kernel has no tile)."""
        q, k = np.asarray(q, float), np.asarray(k, float)
        if direction not in self.tiles:
            return causal_area(q, k) if kind == "causal" else q * k
        return tile_pairs(q, k, kind == "causal", *self.tiles[direction])

    def rect_seconds(self, q, k, kind: str, heads: int, direction: str):
        """Kernel seconds of rectangles of q rows x k keys of one kind (arrays, elementwise): their
        tile-padded pairs at the per-pair cost of the square of as many pairs (a piece shorter
        than the shortest record: that record's cost per tile-padded pair, a floor)."""
        pairs, s_eq = self.padded(q, k, kind, direction)
        return pairs * heads * self.per_pair(direction, kind, s_eq)

    def padded(self, q, k, kind: str, direction: str):
        """(tile-padded pairs of rectangles of q rows x k keys, the length of the square mask of
        the same kind with as many pairs)."""
        pairs = self.pairs(q, k, kind, direction)
        return pairs, np.sqrt(pairs * (2.0 if kind == "causal" else 1.0))

    def chunk_seconds(self, chunk, heads: int, direction: str) -> float:
        """Time of one local-kernel call on a real cp.chunks.Chunk (sum over its rectangles)."""
        call = self.call_seconds(direction, chunk.ql, heads)
        if chunk.empty:
            return call
        kind = "causal" if chunk.causal else "full"
        q = [seg.ql for seg in chunk.segments]
        k = [seg.kl for seg in chunk.segments]
        rects = float(np.sum(self.rect_seconds(q, k, kind, heads, direction)))
        return call + self.call_fixed(direction) + rects

    def seconds(self, direction: str, kind: str, seqlen: int, heads: int) -> float:
        """Time of one call over the whole square mask of one kind at `seqlen` (checks, tables)."""
        return self.call_fixed(direction) + float(
            self.rect_seconds(seqlen, seqlen, kind, heads, direction)
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


def document_samples(docs) -> list[tuple]:
    """(direction, kind, document lengths, measured seconds) per sample of kernel records of
    document masks (a tidy table's rows): the bare kernel over the sample's own documents."""
    out = []
    for _, r in docs.iterrows():
        rec = json.loads(Path(r["record"]).read_text())
        kind = "causal" if rec["cell"]["mask"].startswith("causal") else "full"
        for smp in rec["samples"]:
            lengths = smp.get("mask_params", {}).get("doc_lengths")
            if lengths and smp.get("time_ms_median"):
                n = np.asarray(lengths, float)
                out.append((rec["cell"]["direction"], kind, n, smp["time_ms_median"] * 1e-3))
    return out


def tile_pairs(q, k, causal: bool, rows: int, keys: int):
    """Pairs of the tiles (rows x keys) that rectangles of q rows x k keys touch; a causal one is
    bottom-right aligned (query row r sees keys up to k - q + r), each of its row blocks computing
    every key tile up to its last row's last key. Exact: row block i of every rectangle that has
    one, i = 0, 1, ... (as many operations as row blocks in all)."""
    q, k = np.broadcast_arrays(np.asarray(q, float), np.asarray(k, float))
    nm = np.ceil(q / rows)
    if not causal:
        return nm * np.ceil(k / keys) * rows * keys
    flat = nm.ravel()
    order = np.argsort(-flat, kind="stable")
    desc = flat[order]
    qs, skew = q.ravel()[order], (k - q).ravel()[order]
    tiles = np.zeros(len(flat))
    for i in range(int(desc[0]) if len(desc) else 0):
        n = int(np.searchsorted(-desc, -i, side="left"))  # the rectangles with a block i
        last = skew[:n] + np.minimum(qs[:n], (i + 1) * rows)  # keys its last row sees
        tiles[:n] += np.ceil(np.maximum(last, 0) / keys)
    out = np.empty(len(flat))
    out[order] = tiles
    return out.reshape(q.shape) * rows * keys
