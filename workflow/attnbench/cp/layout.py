"""Where every token of one packed sequence lives when it is split over N = U x R ranks.

Ring family (docs/context-parallelism.md): per-document zigzag. Each document is padded to a
multiple of 2R and cut into 2R equal chunks; ring rank r holds chunks r and 2R-1-r of every
document, in document order: [doc0 chunk r, doc0 chunk 2R-1-r, doc1 chunk r, ...]. A document
on one rank is thus a run of rows whose real tokens come first and padding last (if chunk r
holds padding, chunk 2R-1-r is all padding). With R = 1 there is nothing to balance: a
document stays whole and unpadded (its two "chunks" are its halves).

Documents kept whole (`split_documents: as_needed`, grid.spec.SPLIT_DOCUMENTS): only as many
documents are cut as the load balance needs (`documents_to_split`); every other document lives
whole on one ring rank, so no chunk of it meets another rank's keys and its attention is one
rectangle in the diagonal step, the bare kernel's. The cut documents come first on every rank,
at the same offsets, as above; then the rank's whole documents in document order; then padding
up to the longest rank's rows (a ring sends equal shards). With every document whole
(`ring_local`) a rank needs nothing from its peers, and its shard is its own rows (`rows(r)`).

Ulysses: the ring shard (the whole sequence when R = 1) is padded at its tail to a multiple
of U and split into U contiguous pieces; piece u goes to Ulysses rank u.

Padding rows are zero on input (q, k, v and the output's gradient), are seen by no query, and
are dropped on output. A packed kernel may compute a padding query row inside a full rectangle
(cp/chunks.py, Chunk._over_padding): its output is dropped and, its q and gradient being zero, it
adds nothing to any gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..grid.spec import SPLIT_DOCUMENTS


@dataclass(frozen=True)
class Piece:
    """One chunk of one document: `length` rows from global position `start`; the first
    `real` of them are tokens, the rest padding."""

    index: int  # chunk index j in 0..2R-1
    start: int  # global position of its first row (positions past the document are padding)
    length: int
    real: int
    offset_in_doc: int  # rows of the padded document before it


# `as_needed` keeps documents whole while the busiest ring rank's cost stays within this fraction
# over the mean. Not tighter: each document cut brings back the ring's merges and its passes over
# the whole shard (10-30% of a shard of short documents' time on the H200, measured in
# results/h200/cp_emulate/target.md), which costs more than the imbalance it would remove.
BALANCE_TOLERANCE = 0.05
# A document's cost, in tokens squared: n^2 + this. Each document is a fixed cost to a varlen kernel
# beside its n^2 (FA3 on the H200, world 4 over 431 documents kept whole: about 21 us forward and
# 94 us backward per document, as much as the attention of a 1,000-token square).
DOCUMENT_COST = 1000**2


def documents_to_split(lengths, ring: int, tolerance: float = BALANCE_TOLERANCE):
    """(which documents to cut, the ring rank holding each document kept whole: None if cut).
    The longest documents are cut first (the zigzag spreads each evenly), the rest placed whole,
    longest first, each on the rank with the least cost so far among those it leaves within
    `tolerance` of the mean rows (padding to the longest shard costs memory and passes over
    it), else on the rank with the fewest rows; the first count of cut documents whose busiest
    rank is within `tolerance` of the mean cost wins. Cost: n^2 + DOCUMENT_COST per document
    (causal is half of n^2 for every document alike); a cut one costs each rank 1/R of n^2 and
    the whole DOCUMENT_COST (each rank calls the kernel on its pieces)."""
    n = len(lengths)
    order = sorted(range(n), key=lambda d: -lengths[d])
    area = [float(x) ** 2 for x in lengths]
    work = [a + DOCUMENT_COST for a in area]
    for cut in range(n + 1):
        load, rows, holder = [0.0] * ring, [0] * ring, [None] * n
        row_cap = (1 + tolerance) * sum(lengths[d] for d in order[cut:]) / ring
        for d in order[cut:]:
            fits = [r for r in range(ring) if rows[r] + lengths[d] <= row_cap]
            r = min(fits, key=load.__getitem__) if fits else min(range(ring), key=rows.__getitem__)
            load[r] += work[d]
            rows[r] += lengths[d]
            holder[d] = r
        # every rank: 1/R of each cut document's area and its whole call cost
        shared = sum(area[d] for d in order[:cut]) / ring + cut * DOCUMENT_COST
        mean = (sum(work) + cut * DOCUMENT_COST * (ring - 1)) / ring
        if max(load) + shared <= (1 + tolerance) * mean:
            return [holder[d] is None for d in range(n)], holder
    raise AssertionError("cutting every document balances the ring")  # cut = n: load all 0


class ShardLayout:
    def __init__(
        self, doc_lengths, ring: int, ulysses: int = 1, split_documents: str = SPLIT_DOCUMENTS[0]
    ):
        if ring < 1 or ulysses < 1:
            raise ValueError(f"ring and Ulysses degrees must be >= 1, got R={ring}, U={ulysses}")
        lengths = [int(x) for x in doc_lengths]
        if not lengths or min(lengths) < 1:
            raise ValueError(f"document lengths must be >= 1, got {lengths[:10]}")
        self.ring, self.ulysses = ring, ulysses
        self.doc_lengths = lengths
        self.doc_starts = [int(x) for x in np.concatenate([[0], np.cumsum(lengths)[:-1]])]
        self.seqlen = int(sum(lengths))
        if split_documents not in SPLIT_DOCUMENTS:
            raise ValueError(
                f"unknown split_documents {split_documents!r}; valid: {', '.join(SPLIT_DOCUMENTS)}"
            )
        if split_documents == "all" or ring == 1:
            self.holder = [None] * len(lengths)  # ring rank of a document kept whole
        else:
            self.holder = documents_to_split(lengths, ring)[1]
        self.split_documents = split_documents
        self.cut = [d for d, h in enumerate(self.holder) if h is None]
        self.chunks = [
            self._doc_chunks(s, n) if h is None else [Piece(0, s, n, n, 0)]
            for s, n, h in zip(self.doc_starts, lengths, self.holder)
        ]
        # rows before each document on the ranks holding it: the cut ones first (the same on
        # every ring rank), then each rank's whole ones
        self.doc_offsets = [0] * len(lengths)
        at = 0
        for d in self.cut:
            self.doc_offsets[d] = at
            at += self.pair_rows(d)
        cut_rows, ends = at, []
        for r in range(ring):
            at = cut_rows
            for d in self.whole(r):
                self.doc_offsets[d] = at
                at += lengths[d]
            ends.append(at)
        body = max(ends)
        self.shard_len = (
            body + (-body) % ulysses
        )  # rows of one ring shard, tail-padded for Ulysses
        self.piece_len = self.shard_len // ulysses
        # a ring-local shard sends nothing to its ring peers: its own rows, tail-padded for Ulysses
        self._rows = [e + (-e) % ulysses for e in ends] if self.ring_local else None
        padded = [sum(p.length for p in ch) for ch in self.chunks]
        self.padded_doc_starts = [int(x) for x in np.concatenate([[0], np.cumsum(padded)[:-1]])]
        self.padded_len = int(sum(padded))

    def _doc_chunks(self, start, n) -> list[Piece]:
        r2 = 2 * self.ring
        if self.ring == 1:
            h = (n + 1) // 2
            return [Piece(0, start, h, h, 0), Piece(1, start + h, n - h, n - h, h)]
        c = -(-n // r2)
        return [Piece(j, start + j * c, c, max(0, min(c, n - j * c)), j * c) for j in range(r2)]

    # ------------------------------------------------------------ one ring rank's shard

    @property
    def ring_local(self) -> bool:
        """Every document whole on one ring rank (and more than one ring rank): no rank's
        queries see another rank's keys, so the ring moves nothing."""
        return self.ring > 1 and not self.cut

    def rows(self, r: int) -> int:
        """Rows of ring shard r: shard_len, or its own when the ring is local (no padding to the
        longest: nothing has to travel in equal shapes)."""
        return self._rows[r] if self._rows else self.shard_len

    def whole(self, r: int) -> list[int]:
        """The documents ring rank r holds whole, in document order."""
        return [d for d, h in enumerate(self.holder) if h == r]

    def pair(self, d: int, r: int) -> tuple[Piece, Piece]:
        """The two chunks of a cut document d that ring rank r holds, in local order."""
        ch = self.chunks[d]
        return ch[r], ch[2 * self.ring - 1 - r]

    def pair_rows(self, d: int) -> int:
        """Rows of a cut document on every ring rank."""
        a, b = self.pair(d, 0)
        return a.length + b.length

    def real_rows(self, d: int, r: int) -> int:
        """Real tokens of document d on ring rank r: they are the first rows of its run."""
        if self.holder[d] is not None:
            return self.doc_lengths[d] if self.holder[d] == r else 0
        a, b = self.pair(d, r)
        return a.real + b.real

    def positions(self, r: int):
        """Global position of every row of ring shard r (-1: padding), numpy int64 [rows(r)]."""
        cache = self.__dict__.setdefault("_positions_cache", {})
        if r not in cache:
            cache[r] = self._positions(r)
        return cache[r]

    def _positions(self, r: int):
        out = np.full(self.rows(r), -1, dtype=np.int64)
        for d in self.cut:
            row = self.doc_offsets[d]
            for p in self.pair(d, r):
                out[row : row + p.real] = np.arange(p.start, p.start + p.real)
                row += p.length
        for d in self.whole(r):
            o, s = self.doc_offsets[d], self.doc_starts[d]
            out[o : o + self.doc_lengths[d]] = np.arange(s, s + self.doc_lengths[d])
        return out

    def piece_positions(self, r: int, u: int):
        """Rows of Ulysses piece u of ring shard r: what global rank (r, u) holds on input."""
        m = self.rows(r) // self.ulysses
        return self.positions(r)[u * m : (u + 1) * m]

    # ------------------------------------------------------------ the gathered (all-gather) order

    @cached_property
    def padded_positions(self):
        """Global position of every row of the padded sequence (documents in order, each
        followed by its padding): the order Ring AllGather reorders K and V into."""
        out = np.full(self.padded_len, -1, dtype=np.int64)
        for d, ch in enumerate(self.chunks):
            p0 = self.padded_doc_starts[d]
            out[p0 : p0 + self.doc_lengths[d]] = np.arange(
                self.doc_starts[d], self.doc_starts[d] + self.doc_lengths[d]
            )
        return out

    @cached_property
    def gathered_index(self):
        """For each row of the padded order, its row in the all-gathered ring shards
        ([R x shard_len], shard s at rows s*shard_len...). numpy int64 [padded_len]."""
        out = np.empty(self.padded_len, dtype=np.int64)
        r2 = 2 * self.ring
        for d, ch in enumerate(self.chunks):
            if self.holder[d] is not None:  # whole on its holder
                dst, n = self.padded_doc_starts[d], self.doc_lengths[d]
                row = self.holder[d] * self.shard_len + self.doc_offsets[d]
                out[dst : dst + n] = row + np.arange(n)
                continue
            for p in ch:
                holder = p.index if p.index < self.ring else r2 - 1 - p.index
                a, _ = self.pair(d, holder)
                local = self.doc_offsets[d] + (0 if p.index == a.index else a.length)
                dst = self.padded_doc_starts[d] + p.offset_in_doc
                out[dst : dst + p.length] = holder * self.shard_len + local + np.arange(p.length)
        return out

    # ------------------------------------------------------------ moving rows

    def rank_rows(self, x, r: int, u: int):
        """Rows of a global [S, ...] tensor that rank (r, u) holds; zero rows for padding."""
        import torch

        pos = torch.as_tensor(self.piece_positions(r, u), device=x.device)
        out = x.new_zeros((len(pos), *x.shape[1:]))
        keep = pos >= 0
        out[keep] = x[pos[keep]]
        return out

    def to_json(self) -> dict:
        return {
            "ring": self.ring,
            "ulysses": self.ulysses,
            "split_documents": self.split_documents,
            "documents_cut": len(self.cut) if self.ring > 1 else 0,
            "shard_len": self.shard_len,
            "piece_len": self.piece_len,
            "padding_rows": self.ring * self.shard_len - self.seqlen,
        }
