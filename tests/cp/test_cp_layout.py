"""Sharding and chunk descriptions, single process: every chunk against the mask's predicate."""

import numpy as np
import pytest
import torch
from attnbench.cp.chunks import (
    Chunk,
    allgather_chunks,
    document_lengths,
    ring_step_chunk,
)
from attnbench.cp.layout import BALANCE_TOLERANCE, ShardLayout, documents_to_split
from attnbench.harness.reference import reference_attention
from attnbench.kernels.local_kernel import Ranges, take
from attnbench.kernels.lse import merge_into, new_accumulator
from attnbench.masks import CP_MASKS, Mask
from attnbench.masks.ranges import Slice


def random_docs(rng, total, longest=30):
    out = []
    while total > 0:
        n = min(int(rng.integers(1, longest)), total)
        out.append(n)
        total -= n
    return out


def masks(seqlen, docs):
    return [Mask(m, seqlen, {"doc_lengths": docs} if "document" in m else {}) for m in CP_MASKS]


SPLITS = ("all", "as_needed")


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("ring,ulysses", [(1, 1), (1, 3), (2, 1), (3, 2), (4, 1), (4, 3)])
def test_every_token_lives_on_exactly_one_rank(ring, ulysses, split, rng):
    for _ in range(20):
        docs = random_docs(rng, int(rng.integers(1, 120)))
        lay = ShardLayout(docs, ring, ulysses, split)
        pos = np.concatenate(
            [lay.piece_positions(r, u) for r in range(ring) for u in range(ulysses)]
        )
        assert sorted(pos[pos >= 0]) == list(range(sum(docs)))
        assert lay.shard_len % ulysses == 0
        assert len(pos) == sum(lay.rows(r) for r in range(ring))  # shard_len each, unless local
        assert all(
            lay.rows(r) % ulysses == 0 and lay.rows(r) <= lay.shard_len for r in range(ring)
        )
        if not lay.ring_local:
            assert len(pos) == ring * lay.shard_len
        if ring > 1:  # each cut document padded to a multiple of 2R, split in 2R equal chunks
            for d, ch in ((d, lay.chunks[d]) for d in lay.cut):
                assert len(ch) == 2 * ring and len({p.length for p in ch}) == 1
                assert (
                    sum(p.length for p in ch) % (2 * ring) == 0
                    and sum(p.real for p in ch) == docs[d]
                )
        # real tokens of a document come first in its run on every rank (padding last)
        for r in range(ring):
            p = lay.positions(r)
            for d in lay.cut:
                o, n = lay.doc_offsets[d], lay.real_rows(d, r)
                assert (p[o : o + n] >= 0).all() and (p[o + n : o + lay.pair_rows(d)] < 0).all()
            for d in lay.whole(r):  # a whole document: its tokens in order, on its holder only
                o, n = lay.doc_offsets[d], docs[d]
                assert list(p[o : o + n]) == list(range(lay.doc_starts[d], lay.doc_starts[d] + n))
                assert all(lay.real_rows(d, x) == 0 for x in range(ring) if x != r)


def test_zigzag_owns_chunks_r_and_2r_minus_1_minus_r():
    lay = ShardLayout([16], ring=4)  # one document of 16 = 8 chunks of 2
    assert list(lay.positions(0)) == [0, 1, 14, 15]
    assert list(lay.positions(3)) == [6, 7, 8, 9]
    lay = ShardLayout([5], ring=2)  # padded to 8: chunks of 2, the last 3 slots padding
    assert [list(lay.positions(r)) for r in (0, 1)] == [[0, 1, -1, -1], [2, 3, 4, -1]]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("ring,ulysses", [(1, 1), (1, 2), (2, 1), (2, 3), (3, 1), (4, 2)])
def test_ring_step_chunks_are_the_mask_predicate(ring, ulysses, split, rng):
    for trial in range(8):
        s = int(rng.integers(1, 90)) if trial else 1
        docs = random_docs(rng, s, longest=30 if trial % 2 else 5)  # short ones: kept whole
        for mask in masks(s, docs):
            lay = ShardLayout(document_lengths(mask), ring, ulysses, split)  # full / causal: one
            total = 0
            causal = "causal" in mask.name
            for r in range(ring):
                for src in range(ring):
                    ch = ring_step_chunk(lay, r, src, causal)
                    assert torch.equal(ch.visible(), ch.predicate_visible(mask)), (
                        mask.name,
                        docs,
                        r,
                        src,
                    )
                    total += ch.area
            assert total == mask.area  # padding never counts, nothing twice


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("ring", [1, 2, 3, 4])
def test_allgather_chunks_are_the_mask_predicate(ring, split, rng):
    for trial in range(8):
        s = int(rng.integers(1, 90))
        docs = random_docs(rng, s, longest=30 if trial % 2 else 5)
        for mask in masks(s, docs):
            lay = ShardLayout(document_lengths(mask), ring, 1, split)
            if lay.ring_local:  # nothing gathered: each rank's diagonal (RingAllGather.local)
                total = sum(
                    ring_step_chunk(lay, r, r, "causal" in mask.name).area for r in range(ring)
                )
                assert total == mask.area
                continue
            # the gathered shards, reordered, are the padded global order
            gathered = np.concatenate([lay.positions(r) for r in range(ring)])
            assert (gathered[lay.gathered_index] == lay.padded_positions).all()
            total = 0
            for r in range(ring):
                first, second = allgather_chunks(lay, r, "causal" in mask.name)
                assert not (
                    first.rows_with_keys() & second.rows_with_keys()
                ).any()  # the two query chunks
                union = first.visible() | second.visible()
                assert torch.equal(union, first.predicate_visible(mask)), (mask.name, docs, r)
                total += first.area + second.area
            assert total == mask.area


@pytest.mark.parametrize("ring", [2, 4, 8])
def test_as_needed_cuts_the_fewest_longest_documents_that_balance_the_ring(ring, rng):
    for _ in range(10):
        docs = [int(x) for x in rng.integers(1, 400, size=int(rng.integers(1, 200)))]
        if rng.random() < 0.5:
            docs[int(rng.integers(len(docs)))] = 20000  # one long document: it must be cut
        cut, holder = documents_to_split(docs, ring)
        work = [0.0] * ring
        for d, h in enumerate(holder):
            for r in [h] if h is not None else range(ring):
                work[r] += docs[d] ** 2 / (1 if h is not None else ring)
        assert max(work) <= (1 + BALANCE_TOLERANCE) * sum(work) / ring
        if cut.count(True):  # the cut ones are the longest
            assert min(n for n, c in zip(docs, cut) if c) >= max(
                (n for n, c in zip(docs, cut) if not c), default=0
            )
        if 20000 in docs and len(docs) > 1:
            assert cut[docs.index(20000)]


def test_short_documents_stay_whole_and_the_ring_is_local():
    lay = ShardLayout([4] * 40 + [1, 1, 1], ring=4, split_documents="as_needed")
    assert lay.ring_local and not lay.cut
    for r in range(4):  # each rank's documents: one rectangle each in the diagonal step only
        assert all(ring_step_chunk(lay, r, s, True).empty for s in range(4) if s != r)
        assert len(ring_step_chunk(lay, r, r, True).segments) == len(lay.whole(r))
    # rows balanced too: 163 tokens over 4 ranks, no zigzag padding, none to the longest shard
    assert lay.shard_len <= 43 and sum(lay.rows(r) for r in range(4)) == 163
    assert not ShardLayout([4] * 40 + [1, 1, 1], ring=4).ring_local  # all: every one cut


def test_unknown_split_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="valid: all, as_needed"):
        ShardLayout([8], 2, 1, "some")


def test_zigzag_balances_causal_work():
    lay = ShardLayout([4096], ring=4)
    work = [sum(ring_step_chunk(lay, r, s, True).area for s in range(4)) for r in range(4)]
    assert max(work) / (sum(work) / 4) < 1.01


def test_one_rectangle_reaches_a_library_as_a_view():
    """A chunk of one rectangle is a slice of the rows (no gather) and `single` (a dense call)."""
    vl = Chunk(10, 12, [Slice(2, 7, 4, 12, "causal")], True).varlen("cpu")
    assert vl.q_rows == slice(2, 7) and vl.k_rows == slice(4, 12) and vl.single
    assert vl.cu_q.tolist() == [0, 5] and vl.cu_k.dtype == torch.int32


def test_varlen_form_is_the_chunk():
    """Gathering the rows named by the varlen form and painting its sequences block by block
    gives the chunk's matrix back (what a cu_seqlens kernel computes)."""
    ch = Chunk(10, 12, [Slice(0, 3, 2, 5, "causal"), Slice(6, 9, 7, 12, "causal")], True)
    vl = ch.varlen("cpu")
    assert vl.q_rows == Ranges((slice(0, 3), slice(6, 9)))
    assert vl.k_rows == Ranges((slice(2, 5), slice(7, 12)))
    assert (
        vl.cu_q.tolist() == [0, 3, 6]
        and vl.cu_k.tolist() == [0, 3, 8]
        and (vl.max_q, vl.max_k) == (3, 5)
    )
    packed = torch.zeros(6, 8, dtype=torch.bool)
    for i in range(2):
        q0, q1, k0, k1 = vl.cu_q[i], vl.cu_q[i + 1], vl.cu_k[i], vl.cu_k[i + 1]
        r = torch.arange(q1 - q0).unsqueeze(1)
        c = torch.arange(k1 - k0).unsqueeze(0)
        packed[q0:q1, k0:k1] = c <= r + (k1 - k0) - (q1 - q0)
    assert torch.equal(take(take(ch.visible(), vl.q_rows), vl.k_rows, dim=1), packed)
    tiled = Chunk(4, 4, [Slice(0, 2, 0, 3, "full"), Slice(2, 4, 3, 4, "full")], False).varlen(
        "cpu"
    )
    assert tiled.q_rows is None and tiled.k_rows is None and not tiled.single


def test_chunk_rejects_overlapping_queries_and_mixed_kinds():
    with pytest.raises(ValueError, match="share query rows"):
        Chunk(4, 4, [Slice(0, 3, 0, 2, "full"), Slice(2, 4, 2, 4, "full")], False)
    with pytest.raises(ValueError, match="bad segment"):
        Chunk(4, 4, [Slice(0, 2, 0, 2, "causal")], False)


def test_lse_merge_is_attention_over_the_union_and_empty_rows_stay_clean():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))
    vis = torch.ones(6, 6, dtype=torch.bool)
    vis[0] = False  # a row that sees nothing at all
    full_out, full_lse, _ = reference_attention(q, k, v, visible=vis)
    out, lse = new_accumulator(6, 2, 4, torch.float64, "cpu")
    for cols in (slice(0, 2), slice(2, 6)):
        part = torch.zeros_like(vis)
        part[:, cols] = vis[:, cols]
        o, part_lse, _ = reference_attention(q, k, v, visible=part)
        merge_into(out, lse, o, part_lse)
    assert torch.allclose(out, full_out) and torch.allclose(lse[:, 1:], full_lse[:, 1:])
    assert torch.isneginf(lse[:, 0]).all() and (out[0] == 0).all() and not out.isnan().any()
