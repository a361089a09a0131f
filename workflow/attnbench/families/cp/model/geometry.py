"""The chunks of cp/chunks.py as numbers, for all documents and ring steps at once (numpy).

The model needs, per ring rank and origin shard, only what a chunk's cost and memory depend on:
the rows and keys of each rectangle, its kind, the rows a varlen kernel gathers and the
rectangles it passes as sequences. Building every `Chunk` (one Python object per document,
origin and rank) took minutes for document masks at 512-1024 GPUs. Here the same zigzag rules
(ShardLayout, ring_step_chunk, allgather_chunks) are evaluated as array expressions over the
documents; tests check them rectangle by rectangle against the real functions.
"""

from __future__ import annotations

from functools import cached_property, lru_cache

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
        """Those rows are copied (several rectangles with gaps: an index, not a slice)."""
        return self.subset_q and self.nseg > 1

    @property
    def gathers_k(self) -> bool:
        return self.subset_k and self.nseg > 1

    def seconds(self, kt, heads: int, direction: str) -> float:
        call = kt.call_seconds(direction, self.ql, heads)
        return call + self.parent.seconds(kt, heads, direction)[self.index]


class ChunkRow:
    """A set of chunks given by [chunks, documents] arrays of rectangle rows and keys (0: no
    rectangle) and a causal flag per chunk. Keeps per-chunk numbers; large arrays are rebuilt
    when kernel seconds are asked for again, so thousands of ranks' chunks fit in memory."""

    KEEP = 1 << 16  # arrays of at most this many rectangles are kept

    def __init__(self, build, ql: int, kl, causal):
        self._build = build  # () -> (q [C, D], k [C, D]) int arrays
        self.causal = np.asarray(causal, bool)
        q, k = self._held = self._arrays()
        area = (q * k).sum(axis=1)
        for i in np.flatnonzero(self.causal):
            area[i] = causal_area(q[i], k[i]).sum()
        kl = np.broadcast_to(np.asarray(kl), self.causal.shape).tolist()
        self.chunks = [
            ChunkStats(self, i, ql, kl[i], c, a, n, rq, rk)
            for i, (c, a, n, rq, rk) in enumerate(
                zip(
                    self.causal.tolist(),
                    area.tolist(),
                    (q > 0).sum(axis=1).tolist(),
                    q.sum(axis=1).tolist(),
                    k.sum(axis=1).tolist(),
                )
            )
        ]
        self._seconds = {}

    def _arrays(self):
        q, k = self._build()
        live = (q > 0) & (k > 0)
        return q * live, k * live

    def seconds(self, kt, heads: int, direction: str) -> np.ndarray:
        """Kernel seconds of every chunk (without the per-call overhead)."""
        key = (kt.uid, heads, direction)
        if key not in self._seconds:
            q, k = self._held or self._arrays()
            if q.size > self.KEEP:
                self._held = None
            out = np.zeros(len(self.causal))
            for kind, rows in (("causal", self.causal), ("full", ~self.causal)):
                qr, kr = q[rows], k[rows]
                live = qr > 0
                per = np.zeros(qr.shape)
                per[live] = kt.rect_seconds(qr[live], kr[live], kind, heads, direction)
                out[rows] = per.sum(axis=1)
            self._seconds[key] = out
        return self._seconds[key]


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
        """Real rows of chunk j of every document: [len(j), D] for an array of chunk indices."""
        j = np.asarray(j)[:, None]
        if self.ring == 1:
            return np.where(j == 0, self.first, self.n - self.first)
        return np.clip(self.n - j * self.first, 0, self.first)

    def piece_offset(self, j):
        """Rows of the padded document before chunk j: [len(j), D]."""
        j = np.asarray(j)[:, None]
        if self.ring == 1:
            return np.where(j == 0, 0, self.first)
        return j * self.first

    @cached_property
    def real_rows(self):
        """Real tokens of each document on each ring rank: [R, D]."""
        r = np.arange(self.ring)
        return self.piece_real(r) + self.piece_real(2 * self.ring - 1 - r)

    def ring_chunks(self, r: int, causal: bool) -> list[ChunkStats]:
        """ring_step_chunk(layout, r, s, causal) for every origin s, as ChunkStats (index s)."""
        key = ("ring", r, causal)
        if key not in self._rank_chunks:
            R = self.ring
            s = np.arange(R)

            def build():
                nk = (
                    self.real_rows
                )  # [R, D]: origins s in order, so s < r, s == r, s > r are blocks
                nq = nk[r]
                if not causal:
                    return np.broadcast_to(nq, nk.shape), nk
                q, k = np.empty_like(nk), np.empty_like(nk)
                q[: r + 1] = nq  # s <= r: every query row
                q[r + 1 :] = np.maximum(self.first, nq) - self.first  # s > r: the second chunk
                np.minimum(self.first, nk[:r], out=k[:r])  # s < r: the first key chunk
                k[r] = nq  # the diagonal
                k[r + 1 :] = nk[r + 1 :]
                return q, k

            self._rank_chunks[key] = ChunkRow(
                build, self.shard_len, self.shard_len, causal & (s == r)
            )
        return self._rank_chunks[key].chunks

    def allgather_chunks(self, r: int, causal: bool) -> list[ChunkStats]:
        """allgather_chunks(layout, r, causal): the first and the second query chunk of ring
        shard r against the padded global order."""
        key = ("allgather", r, causal)
        if key not in self._rank_chunks:
            j = np.array([r, 2 * self.ring - 1 - r])

            def build():
                q = self.piece_real(j)
                k = self.piece_offset(j) + q if causal else np.broadcast_to(self.n, q.shape)
                return q, k

            self._rank_chunks[key] = ChunkRow(
                build, self.shard_len, self.padded_len, np.array([causal, causal])
            )
        return self._rank_chunks[key].chunks


@lru_cache(maxsize=8)
def _geometry(doc_lengths: tuple, ring: int, ulysses: int) -> Geometry:
    return Geometry(doc_lengths, ring, ulysses)


def geometry(doc_lengths, ring: int, ulysses: int = 1) -> Geometry:
    """The Geometry of a layout, shared by every method, direction and call on the same mask
    (a few recent ones are kept: their chunks' numbers and kernel seconds are cached)."""
    return _geometry(tuple(int(x) for x in doc_lengths), ring, ulysses)


def slices_of(chunk: ChunkStats) -> list[tuple[int, int, str]]:
    """(rows, keys, kind) of each rectangle of a chunk, in document order (for tests)."""
    q, k = chunk.parent._build()
    i = chunk.index
    kind = "causal" if chunk.causal else "full"
    return [(int(a), int(b), kind) for a, b in zip(q[i], k[i]) if a > 0 and b > 0]


def real_slices(chunk) -> list[tuple[int, int, str]]:
    """The same for a real cp.chunks.Chunk."""
    return [(s.ql, s.kl, s.kind) for s in chunk.segments]
