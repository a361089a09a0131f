"""The chunks of cp/chunks.py as numbers, for all documents and ring steps at once (numpy).

The model needs, per ring rank and origin shard, only what a chunk's cost and memory depend on:
the rows and keys of each rectangle, its kind, the rows a packed kernel copies and the
rectangles it passes as sequences. Building every `Chunk` (one Python object per document,
origin and rank) took minutes for document masks at 512-1024 GPUs. Here the same zigzag rules
(ShardLayout, ring_step_chunk, allgather_chunks) are evaluated as array expressions over the
documents; tests check them rectangle by rectangle against the real functions.

A ring rank meets R origin shards, and a document's rectangle against origin s depends on s
only through the document's real rows on shard s (full chunks, then one partial, then none,
from either end of the zigzag) and through s < r, s == r, s > r. So over s it is piecewise
constant with at most 7 pieces per document: each rank's chunks are summed from those pieces
(a difference array over s), in O(documents), not O(documents x R).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def causal_area(q, k):
    """Slice.area of causal (bottom-right) rectangles, elementwise."""
    h = np.minimum(q, k)
    return (2 * k - h + 1) * h // 2


class ChunkStats:
    """One chunk (queries of one shard against the keys of one origin) as the model sees it."""

    __slots__ = ("parent", "index", "ql", "kl", "causal", "area", "nseg", "rows_q", "rows_k")

    def __init__(self, parent, index, ql, kl, causal, area, nseg, rows_q, rows_k):
        self.parent, self.index = parent, index
        self.ql, self.kl, self.causal = ql, kl, causal
        self.area, self.nseg, self.rows_q, self.rows_k = area, nseg, rows_q, rows_k

    @property
    def empty(self) -> bool:
        return self.nseg == 0

    @property
    def subset_q(self) -> bool:
        """The kernel runs on part of the query rows (cp/chunks.Varlen.q_rows is not None): its
        results are placed back into full-size tensors."""
        return self.rows_q < self.ql

    @property
    def subset_k(self) -> bool:
        return self.rows_k < self.kl

    @property
    def gathers_q(self) -> bool:
        """Those rows are copied (several rectangles, not one view: ranges or an index)."""
        return self.subset_q and self.nseg > 1

    @property
    def gathers_k(self) -> bool:
        return self.subset_k and self.nseg > 1

    def seconds(self, kt, heads: int, direction: str) -> float:
        """One local-kernel call: the CP framework's per-call terms, and, when the chunk has a
        rectangle, the kernel's own fixed cost and its rectangles' time."""
        call = kt.call_seconds(direction, self.ql, heads, self.nseg > 1)
        if self.empty:
            return call
        return (
            call + kt.call_fixed(direction) + self.parent.seconds(kt, heads, direction)[self.index]
        )


class Pieces:
    """Rectangles given as pieces: piece i is a rectangle of q[i] rows x k[i] keys (causal[i]:
    bottom-right causal, else full) in every chunk from start[i] to end[i] - 1, one per
    document (only live pieces, q and k > 0); pad[i]: the padding rows after its query rows
    that a packed kernel takes in (cp/chunks.py, Chunk._over_padding; 0 for causal ones).
    `ChunkRow` sums them per chunk."""

    def __init__(self, start, end, q, k, causal, doc, pad):
        live = (q > 0) & (k > 0) & (start < end)
        self.start, self.end, self.q, self.k = start[live], end[live], q[live], k[live]
        self.causal, self.doc = causal[live], doc[live]
        self.pad = np.where(self.causal, 0, pad[live])

    def per_chunk(self, values, n: int, dtype=np.int64):
        """Sum of `values` (one per piece) over the pieces of each of the n chunks."""
        diff = np.zeros(n + 1, dtype=dtype)
        np.add.at(diff, self.start, values)
        np.add.at(diff, self.end, -np.asarray(values, dtype))
        return np.cumsum(diff[:n])


class ChunkRow:
    """The n chunks of one rank (a ring rank's R origins, or Ring AllGather's two query chunks),
    from a function that gives their Pieces. Keeps per-chunk numbers and, per kernel fit, heads
    and direction, the kernel seconds; the pieces are rebuilt when asked for (they are cheap)."""

    def __init__(self, pieces, n: int, ql: int, kl, causal):
        self._pieces = pieces  # () -> Pieces
        self.n = n
        p = pieces()
        area = np.where(p.causal, causal_area(p.q, p.k), p.q * p.k)
        kl = np.broadcast_to(np.asarray(kl), (n,)).tolist()
        columns = (
            np.broadcast_to(np.asarray(causal, bool), (n,)).tolist(),
            p.per_chunk(area, n).tolist(),
            p.per_chunk(np.ones_like(p.q), n).tolist(),
            p.per_chunk(p.q + p.pad, n).tolist(),
            p.per_chunk(p.k, n).tolist(),
        )
        self.chunks = [
            ChunkStats(self, i, ql, kl[i], c, a, ns, rq, rk)
            for i, (c, a, ns, rq, rk) in enumerate(zip(*columns))
        ]
        self._seconds = {}

    def seconds(self, kt, heads: int, direction: str) -> np.ndarray:
        """Kernel seconds of every chunk (without the per-call overhead)."""
        key = (kt.uid, heads, direction)
        if key not in self._seconds:
            p = self._pieces()
            per = np.zeros(len(p.q))
            for kind, sel in (("causal", p.causal), ("full", ~p.causal)):
                if sel.any():
                    per[sel] = kt.rect_seconds(p.q[sel], p.k[sel], kind, heads, direction)
            self._seconds[key] = p.per_chunk(per, self.n, float)
        return self._seconds[key]

    def slices(self, i: int) -> list[tuple[int, int, str]]:
        """(rows, keys, kind) of chunk i's rectangles, in document order (for tests)."""
        p = self._pieces()
        at = np.flatnonzero((p.start <= i) & (i < p.end))
        at = at[np.argsort(p.doc[at], kind="stable")]
        return [(int(p.q[j]), int(p.k[j]), "causal" if p.causal[j] else "full") for j in at]


class Geometry:
    """ShardLayout's numbers for documents `doc_lengths` over R ring ranks and Ulysses degree U:
    per-document chunk length, the real rows of each (document, ring rank), the shard length."""

    def __init__(self, doc_lengths, ring: int, ulysses: int = 1):
        n = np.asarray(doc_lengths, np.int64)
        if ring < 1 or ulysses < 1 or n.size == 0 or n.min() < 1:
            raise ValueError(f"bad layout: R={ring}, U={ulysses}, document lengths {list(n[:10])}")
        self.n, self.ring, self.ulysses = n, ring, ulysses
        if ring == 1:  # a document stays whole; its two "chunks" are its halves
            self.first = (n + 1) // 2
            self.pair_rows = n
            self.padded = n
        else:
            self.first = -(-n // (2 * ring))  # every chunk has this length
            self.pair_rows = 2 * self.first
            self.padded = 2 * ring * self.first
        body = int(self.pair_rows.sum())
        self.shard_len = body + (-body) % ulysses
        self.piece_len = self.shard_len // ulysses
        self.padded_len = int(self.padded.sum())
        self._rank_chunks = {}

    def piece_real(self, j):
        """Real rows of chunk j of each document: j is [D, m] (or broadcasts to it)."""
        n, c = self.n[:, None], self.first[:, None]
        if self.ring == 1:
            return np.where(j == 0, c, n - c)
        return np.clip(n - j * c, 0, c)

    def piece_offset(self, j):
        """Rows of the padded document before chunk j, like piece_real."""
        c = self.first[:, None]
        return np.where(j == 0, 0, c) if self.ring == 1 else j * c

    def real_rows(self, s):
        """Real tokens of each document on ring rank(s) s: [D, m] like piece_real."""
        return self.piece_real(s) + self.piece_real(2 * self.ring - 1 - s)

    def padding_after(self, r: int):
        """Per document, the padding rows after its real rows on ring rank r, up to the next
        real row of the shard (or its end): what a full rectangle ending there takes in."""
        nq = self.real_rows(np.full((len(self.n), 1), r))[:, 0]
        offsets = np.concatenate([[0], np.cumsum(self.pair_rows)[:-1]])
        starts = np.where(nq > 0, offsets, self.shard_len)
        after = np.minimum.accumulate(starts[::-1])[::-1]  # the first real row at or after d
        return np.concatenate([after[1:], [self.shard_len]]) - (offsets + nq)

    def _chunks(self, key, pieces, n: int, kl: int, causal) -> list[ChunkStats]:
        """A rank's chunks (ChunkRow), made once per layout."""
        if key not in self._rank_chunks:
            self._rank_chunks[key] = ChunkRow(pieces, n, self.shard_len, kl, causal)
        return self._rank_chunks[key].chunks

    def ring_chunks(self, r: int, causal: bool) -> list[ChunkStats]:
        """ring_step_chunk(layout, r, s, causal) for every origin s, as ChunkStats (index s)."""
        return self._chunks(
            ("ring", r, causal),
            lambda: self._ring_pieces(r, causal),
            self.ring,
            self.shard_len,
            causal & (np.arange(self.ring) == r),
        )

    def _ring_pieces(self, r: int, causal: bool) -> Pieces:
        R, D = self.ring, len(self.n)
        # where a document's real rows on shard s change: its partial chunk counted from the
        # front (s = b) and from the back of the zigzag (s = 2R-1-b), and the rank itself
        b = self.n // self.first if R > 1 else np.zeros(D, np.int64)
        cuts = [np.zeros(D, np.int64), b, b + 1, 2 * R - 1 - b, 2 * R - b]
        cuts += [np.full(D, r), np.full(D, r + 1), np.full(D, R)]
        cuts = np.sort(np.clip(np.stack(cuts, axis=1), 0, R), axis=1)
        start, end = cuts[:, :-1], cuts[:, 1:]
        nk = self.real_rows(start)  # constant on [start, end)
        nq = self.real_rows(np.full((D, 1), r))
        diag = np.broadcast_to(causal & (start == r), start.shape)
        if not causal:
            q, k = np.broadcast_to(nq, nk.shape), nk
        else:
            first = self.first[:, None]
            below, above = start < r, start > r
            q = np.where(above, np.maximum(first, nq) - first, nq)  # s > r: the second chunk
            k = np.where(below, np.minimum(first, nk), np.where(above, nk, nq))
        doc = np.broadcast_to(np.arange(D)[:, None], start.shape)
        pad = np.broadcast_to(self.padding_after(r)[:, None], start.shape)
        return Pieces(*(np.ravel(x) for x in (start, end, q, k, diag, doc, pad)))

    def allgather_chunks(self, r: int, causal: bool) -> list[ChunkStats]:
        """allgather_chunks(layout, r, causal): the first and the second query chunk of ring
        shard r against the padded global order."""
        return self._chunks(
            ("allgather", r, causal),
            lambda: self._allgather_pieces(r, causal),
            2,
            self.padded_len,
            np.array([causal, causal]),
        )

    def _allgather_pieces(self, r: int, causal: bool) -> Pieces:
        D = len(self.n)
        j = np.array([[r, 2 * self.ring - 1 - r]])
        q = self.piece_real(j)  # [D, 2]
        k = self.piece_offset(j) + q if causal else np.broadcast_to(self.n[:, None], q.shape)
        which = np.broadcast_to(np.arange(2), q.shape)
        doc = np.broadcast_to(np.arange(D)[:, None], q.shape)
        kind = np.full(q.shape, causal)
        # the first query chunk's rows end at the document's real rows only when the second has none
        pad = self.padding_after(r)[:, None] * np.stack([q[:, 1] == 0, np.ones(D, bool)], axis=1)
        return Pieces(*(np.ravel(x) for x in (which, which + 1, q, k, kind, doc, pad)))


@lru_cache(maxsize=8)
def _geometry(doc_lengths: tuple, ring: int, ulysses: int) -> Geometry:
    return Geometry(doc_lengths, ring, ulysses)


def geometry(doc_lengths, ring: int, ulysses: int = 1) -> Geometry:
    """The Geometry of a layout, shared by every method, direction and call on the same mask
    (a few recent ones are kept: their chunks' numbers and kernel seconds are cached)."""
    return _geometry(tuple(int(x) for x in doc_lengths), ring, ulysses)


def slices_of(chunk: ChunkStats) -> list[tuple[int, int, str]]:
    """(rows, keys, kind) of each rectangle of a chunk, in document order (for tests)."""
    return chunk.parent.slices(chunk.index)


def real_slices(chunk) -> list[tuple[int, int, str]]:
    """The same for a real cp.chunks.Chunk."""
    return [(s.ql, s.kl, s.kind) for s in chunk.segments]
