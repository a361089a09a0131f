"""Where every token of one packed sequence lives when it is split over N = U x R ranks.

Ring family (docs/context-parallelism.md): per-document zigzag. Each document is padded to a
multiple of 2R and cut into 2R equal chunks; ring rank r holds chunks r and 2R-1-r of every
document, in document order: [doc0 chunk r, doc0 chunk 2R-1-r, doc1 chunk r, ...]. A document
on one rank is thus a run of rows whose real tokens come first and padding last (if chunk r
holds padding, chunk 2R-1-r is all padding). With R = 1 there is nothing to balance: a
document stays whole and unpadded (its two "chunks" are its halves).

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


@dataclass(frozen=True)
class Piece:
    """One chunk of one document: `length` rows from global position `start`; the first
    `real` of them are tokens, the rest padding."""

    index: int  # chunk index j in 0..2R-1
    start: int  # global position of its first row (positions past the document are padding)
    length: int
    real: int
    offset_in_doc: int  # rows of the padded document before it


class ShardLayout:
    def __init__(self, doc_lengths, ring: int, ulysses: int = 1):
        if ring < 1 or ulysses < 1:
            raise ValueError(f"ring and Ulysses degrees must be >= 1, got R={ring}, U={ulysses}")
        lengths = [int(x) for x in doc_lengths]
        if not lengths or min(lengths) < 1:
            raise ValueError(f"document lengths must be >= 1, got {lengths[:10]}")
        self.ring, self.ulysses = ring, ulysses
        self.doc_lengths = lengths
        self.doc_starts = [int(x) for x in np.concatenate([[0], np.cumsum(lengths)[:-1]])]
        self.seqlen = int(sum(lengths))
        self.chunks = [self._doc_chunks(s, n) for s, n in zip(self.doc_starts, lengths)]
        pair = [self.pair_rows(d) for d in range(len(lengths))]
        self.doc_offsets = [
            int(x) for x in np.concatenate([[0], np.cumsum(pair)[:-1]])
        ]  # same on every ring rank
        body = int(sum(pair))
        self.shard_len = (
            body + (-body) % ulysses
        )  # rows of one ring shard, tail-padded for Ulysses
        self.piece_len = self.shard_len // ulysses
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

    def pair(self, d: int, r: int) -> tuple[Piece, Piece]:
        """The two chunks of document d that ring rank r holds, in local order."""
        ch = self.chunks[d]
        return ch[r], ch[2 * self.ring - 1 - r]

    def pair_rows(self, d: int) -> int:
        a, b = self.pair(d, 0)
        return a.length + b.length

    def real_rows(self, d: int, r: int) -> int:
        """Real tokens of document d on ring rank r: they are the first rows of its run."""
        a, b = self.pair(d, r)
        return a.real + b.real

    def positions(self, r: int):
        """Global position of every row of ring shard r (-1: padding), numpy int64 [shard_len]."""
        cache = self.__dict__.setdefault("_positions_cache", {})
        if r not in cache:
            cache[r] = self._positions(r)
        return cache[r]

    def _positions(self, r: int):
        out = np.full(self.shard_len, -1, dtype=np.int64)
        for d in range(len(self.doc_lengths)):
            row = self.doc_offsets[d]
            for p in self.pair(d, r):
                out[row : row + p.real] = np.arange(p.start, p.start + p.real)
                row += p.length
        return out

    def piece_positions(self, r: int, u: int):
        """Rows of Ulysses piece u of ring shard r: what global rank (r, u) holds on input."""
        return self.positions(r)[u * self.piece_len : (u + 1) * self.piece_len]

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
            "shard_len": self.shard_len,
            "piece_len": self.piece_len,
            "padding_rows": self.ring * self.shard_len - self.seqlen,
        }
