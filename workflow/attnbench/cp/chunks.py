"""The chunk description a local kernel receives: which local query rows see which local key rows.

A Chunk is a set of rectangles (masks.ranges.Slice, in LOCAL row coordinates) that are all
`full` or all `causal` (bottom-right aligned, the FlashAttention varlen convention), with
pairwise disjoint query ranges and pairwise disjoint key ranges: exactly what a varlen kernel
takes as cu_seqlens (after gathering the rows when the ranges leave gaps). Rows in no
rectangle see nothing (output 0, LSE -inf), except that the varlen form lets a full rectangle
take in the padding rows after it (Chunk._over_padding: fewer gathers, same real results).

The rectangles come from the zigzag structure (Ring P2P's rules in docs/context-parallelism.md),
trimmed to real tokens so padding never counts; tests check every chunk against the mask's
predicate over global positions (`visible` vs `predicate_visible`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..kernels.local_kernel import Ranges
from ..masks.ranges import Slice
from .catalog import CAUSAL_MASKS
from .layout import ShardLayout

MAX_RANGES = 4  # more ranges than this: one index gather instead of a copy per range


@dataclass(frozen=True)
class Varlen:
    """cu_seqlens form of a chunk. q_rows / k_rows say which local rows its rectangles use, in
    order: None (all of them, no copy), a slice (one rectangle: a view, no copy), Ranges (a few
    contiguous ranges: copied range by range) or an index tensor (rows to gather, and to scatter
    results back to). `single`: one rectangle, so a library's dense (batch 1) form can run it.
    `lengths`: (query rows, key rows) of each rectangle in packed order, as Python ints (what a
    mask built on the host needs, with no device sync)."""

    q_rows: object
    k_rows: object
    cu_q: object
    cu_k: object
    max_q: int
    max_k: int
    single: bool
    lengths: tuple = ()


class Chunk:
    def __init__(self, ql: int, kl: int, segments, causal: bool, q_pos=None, k_pos=None):
        self.ql, self.kl, self.causal = int(ql), int(kl), bool(causal)
        self.segments = tuple(s for s in segments if s.ql > 0 and s.kl > 0)
        kind = "causal" if causal else "full"
        for s in self.segments:
            if s.kind != kind or not (0 <= s.q0 < s.q1 <= ql and 0 <= s.k0 < s.k1 <= kl):
                raise ValueError(f"bad segment {s} for a {kind} chunk of {ql} x {kl}")
        for a, b in zip(
            sorted(self.segments, key=lambda s: s.q0)[:-1],
            sorted(self.segments, key=lambda s: s.q0)[1:],
        ):
            if b.q0 < a.q1:
                raise ValueError(f"segments {a} and {b} share query rows")
        self.q_pos, self.k_pos = q_pos, k_pos  # global positions (numpy, -1 = padding), for checks
        self._varlen = {}

    @property
    def empty(self) -> bool:
        return not self.segments

    @cached_property
    def area(self) -> int:
        """Visible (query, key) pairs per head."""
        return sum(s.area() for s in self.segments)

    def visible(self, device="cpu"):
        """Bool [ql, kl] painted from the rectangles."""
        import torch

        out = torch.zeros(self.ql, self.kl, dtype=torch.bool, device=device)
        for s in self.segments:
            if self.causal:
                r = torch.arange(s.ql, device=device).unsqueeze(1)
                c = torch.arange(s.kl, device=device).unsqueeze(0)
                out[s.q0 : s.q1, s.k0 : s.k1] = c <= r + (s.kl - s.ql)
            else:
                out[s.q0 : s.q1, s.k0 : s.k1] = True
        return out

    def rows_with_keys(self, device="cpu"):
        """Bool [ql]: query rows that see at least one key here."""
        import torch

        out = torch.zeros(self.ql, dtype=torch.bool, device=device)
        for s in self.segments:
            out[s.q0 : s.q1] = (
                True  # full: every row; causal bottom-right with kl >= ql: every row too
            )
        return out

    def predicate_visible(self, mask, device="cpu"):
        """The same matrix from the mask's predicate over the rows' global positions."""
        import torch

        q = torch.as_tensor(self.q_pos, device=device).view(-1, 1)
        k = torch.as_tensor(self.k_pos, device=device).view(1, -1)
        vis = mask.predicate(device)(None, q.clamp(min=0), k.clamp(min=0))
        return vis.expand(self.ql, self.kl) & (q >= 0) & (k >= 0)

    def varlen(self, device):
        key = str(device)
        if key not in self._varlen:
            self._varlen[key] = self._make_varlen(device)
        return self._varlen[key]

    def _make_varlen(self, device):
        import torch

        segs = sorted(self.segments, key=lambda s: s.q0)

        def rows(ranges, total):
            if len(ranges) == 1:
                a, b = ranges[0]
                return None if (a, b) == (0, total) else slice(a, b)
            runs = []  # neighbouring rectangles' rows joined (documents with no padding between)
            for a, b in ranges:
                if runs and runs[-1][1] == a:
                    runs[-1] = (runs[-1][0], b)
                else:
                    runs.append((a, b))
            if runs == [(0, total)]:
                return None
            if len(runs) <= MAX_RANGES:  # even one run: copied, as cp_model's geometry counts it
                return Ranges(slice(a, b) for a, b in runs)
            return torch.as_tensor(
                np.concatenate([np.arange(a, b) for a, b in ranges]), device=device
            )

        q_ranges = [(s.q0, s.q1) for s in segs]
        if not self.causal and self.q_pos is not None:
            q_ranges = self._over_padding(q_ranges)
        lq = [b - a for a, b in q_ranges]
        lk = [s.kl for s in segs]

        def cu(lengths):
            return torch.as_tensor(
                np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device
            )

        return Varlen(
            rows(q_ranges, self.ql),
            rows([(s.k0, s.k1) for s in segs], self.kl),
            cu(lq),
            cu(lk),
            max(lq),
            max(lk),
            len(segs) == 1,
            tuple(zip(lq, lk)),
        )

    def _over_padding(self, q_ranges):
        """The query ranges of full rectangles, each taking in the padding rows right after it
        (up to the next range): zigzag pads every document, so the real rows of a shard are
        many short runs, and a kernel call over them needs an index gather and scatter of
        [rows, Hq, D] tensors; with the padding taken in, they are a few ranges or the whole
        shard (views). Exact: a padding row's q and dout are zero (layout.py), so it adds
        nothing to any gradient, and its output (finite: it sees real keys) is dropped. Only for
        full rectangles: a bottom-right causal one would shift its diagonal. Keys are never
        widened (a real query must not see a padding key)."""
        pad = np.asarray(self.q_pos) < 0
        out = []
        for i, (a, b) in enumerate(q_ranges):
            end = q_ranges[i + 1][0] if i + 1 < len(q_ranges) else self.ql
            while b < end and pad[b]:
                b += 1
            out.append((a, b))
        return out


def is_causal(mask_name: str) -> bool:
    return mask_name in CAUSAL_MASKS


def document_lengths(mask) -> list[int]:
    """Documents of a CP mask: its own, or the whole sequence as one document."""
    return list(mask.params["doc_lengths"]) if mask.pattern.uses_documents else [mask.seqlen]


def ring_step_chunk(layout: ShardLayout, r: int, s: int, causal: bool) -> Chunk:
    """Queries of ring shard r against the keys that started on ring shard s (zigzag rules):
    s == r: the diagonal, causal inside each document's run; s < r: every query row against
    the FIRST key chunk, no mask; s > r: the SECOND query chunk against every key row, no mask.
    Non-causal masks: every real query row against every real key row of the same document.
    A document kept whole (layout.holder) is one rectangle of the diagonal on its holder."""
    segs = []
    for d in layout.cut:
        o = layout.doc_offsets[d]
        nq, nk = layout.real_rows(d, r), layout.real_rows(d, s)
        first = layout.pair(d, s)[0].length
        if not causal:
            segs.append(Slice(o, o + nq, o, o + nk, "full"))
        elif s == r:
            segs.append(Slice(o, o + nq, o, o + nq, "causal"))
        elif s < r:
            segs.append(Slice(o, o + nq, o, o + min(first, nk), "full"))
        else:
            segs.append(Slice(o + first, o + max(first, nq), o, o + nk, "full"))
    if s == r:
        segs += whole_squares(layout, r, causal)
    ql, kl = layout.rows(r), layout.rows(s)
    return Chunk(ql, kl, segs, causal and s == r, layout.positions(r), layout.positions(s))


def whole_squares(layout: ShardLayout, r: int, causal: bool, key_at=None) -> list[Slice]:
    """Each document ring rank r holds whole, against its own rows (`key_at(d)`: where its keys
    start, the rank's own rows by default)."""
    kind = "causal" if causal else "full"
    out = []
    for d in layout.whole(r):
        o, n = layout.doc_offsets[d], layout.doc_lengths[d]
        k = o if key_at is None else key_at(d)
        out.append(Slice(o, o + n, k, k + n, kind))
    return out


def allgather_chunks(layout: ShardLayout, r: int, causal: bool) -> tuple[Chunk, Chunk]:
    """Ring AllGather: the first and the second query chunk of ring shard r (each document's
    chunk r and chunk 2R-1-r) against the keys of the padded global order that they can see:
    the document's prefix up to the chunk's end (causal), or the whole document. A document
    kept whole is in the first, against its own keys in the global order."""
    out = []
    for which in (0, 1):
        segs = []
        for d in layout.cut:
            a, b = layout.pair(d, r)
            p = (a, b)[which]
            q0 = layout.doc_offsets[d] + (0 if which == 0 else a.length)
            k0 = layout.padded_doc_starts[d]
            if causal:
                segs.append(Slice(q0, q0 + p.real, k0, k0 + p.offset_in_doc + p.real, "causal"))
            else:
                segs.append(Slice(q0, q0 + p.real, k0, k0 + layout.doc_lengths[d], "full"))
        if which == 0:
            segs += whole_squares(layout, r, causal, lambda d: layout.padded_doc_starts[d])
        out.append(
            Chunk(
                layout.shard_len,
                layout.padded_len,
                segs,
                causal,
                layout.positions(r),
                layout.padded_positions,
            )
        )
    return out[0], out[1]
