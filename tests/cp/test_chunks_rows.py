"""Which local rows a chunk's varlen form names, and the kernels' helpers over them: zigzag chunks
whose rows are a few contiguous ranges come as Ranges (views, no index), and take / place /
add_rows / merge_rows over Ranges give exactly (bitwise) what the index path gives."""

import numpy as np
import pytest
import torch
from attnbench.cp.chunks import (
    MAX_RANGES,
    allgather_chunks,
    ring_step_chunk,
)
from attnbench.cp.layout import ShardLayout
from attnbench.kernels.local_kernel import Ranges, add_rows, merge_rows, place, take
from attnbench.kernels.lse import merge_into

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def named_rows(rows, total):
    """The rows a Varlen form names, as a list (what the index path would gather)."""
    if rows is None:
        return list(range(total))
    if isinstance(rows, slice):
        return list(range(rows.start, rows.stop))
    if isinstance(rows, Ranges):
        return [i for r in rows for i in range(r.start, r.stop)]
    return rows.tolist()


def test_zigzag_chunks_of_a_few_documents_come_as_ranges():
    """Two documents of 5 tokens at R = 2 (each padded to 8, chunks of 2): each rank holds two
    runs of rows with padding after each. The diagonal step (causal) names two query ranges and
    two key ranges, not an index; so do Ring AllGather's causal query chunks and the padded
    global keys they see. Ring step s < r (full rectangles: every real query row, the first key
    chunk of each document) takes in each document's padding row: the whole shard, no copy."""
    lay = ShardLayout([5, 5], ring=2)
    diag = ring_step_chunk(lay, 1, 1, causal=True).varlen("cpu")
    assert diag.q_rows == diag.k_rows == Ranges((slice(0, 3), slice(4, 7))) and not diag.single
    assert diag.cu_q.tolist() == diag.cu_k.tolist() == [0, 3, 6]
    vl = ring_step_chunk(lay, 1, 0, causal=True).varlen("cpu")
    assert vl.q_rows is None and vl.k_rows == Ranges((slice(0, 2), slice(4, 6)))
    assert vl.cu_q.tolist() == [0, 4, 8] and vl.cu_k.tolist() == [0, 2, 4]
    assert vl.lengths == ((4, 2), (4, 2))
    second = allgather_chunks(lay, 1, causal=True)[1].varlen("cpu")
    assert second.q_rows == Ranges((slice(2, 3), slice(6, 7)))
    assert second.k_rows == Ranges((slice(0, 5), slice(8, 13)))


@pytest.mark.parametrize("ring", [2, 3, 4])
def test_every_chunks_rows_are_its_rectangles_rows_in_the_lightest_form(ring):
    """Over random documents: the rows named are the rectangles' rows in packed order; a few
    ranges are Ranges (neighbouring rectangles joined), only more than MAX_RANGES an index."""
    forms = set()
    for c in random_chunks(np.random.default_rng(ring), lambda: ring):
        vl = c.varlen("cpu")
        segs = sorted(c.segments, key=lambda s: s.q0)
        for rows, total, spans in (
            (vl.q_rows, c.ql, query_spans(c, segs)),
            (vl.k_rows, c.kl, [(s.k0, s.k1) for s in segs]),
        ):
            assert named_rows(rows, total) == [i for a, b in spans for i in range(a, b)]
            forms.add(type(rows))
            if isinstance(rows, Ranges):
                assert 1 <= len(rows) <= MAX_RANGES and len(segs) > 1
                assert all(a.stop < b.start or b.stop < a.start for a, b in pairs(rows))
            elif isinstance(rows, torch.Tensor):
                assert len(joined(spans)) > MAX_RANGES
    assert forms == {Ranges, slice, type(None), torch.Tensor}


def random_chunks(rng, ring_of):
    """Every non-empty chunk of Ring P2P's steps and Ring AllGather's query chunks, causal and
    not, over 30 random document sets, each at the ring degree ring_of() draws."""
    for _ in range(30):
        docs = [int(x) for x in rng.integers(1, 40, size=rng.integers(1, 9))]
        ring = ring_of()
        lay = ShardLayout(docs, ring)
        for causal in (True, False):
            chunks = [ring_step_chunk(lay, r, s, causal) for r in range(ring) for s in range(ring)]
            chunks += [c for r in range(ring) for c in allgather_chunks(lay, r, causal)]
            yield from (c for c in chunks if not c.empty)


def query_spans(chunk, segs):
    """The query rows a chunk's varlen form must name: its rectangles' rows, a full rectangle's
    with the padding rows right after it (up to the next rectangle) taken in."""
    pad = chunk.q_pos < 0
    spans = []
    for i, s in enumerate(segs):
        end = segs[i + 1].q0 if i + 1 < len(segs) else chunk.ql
        b = s.q1
        if not chunk.causal:
            while b < end and pad[b]:
                b += 1
        assert chunk.causal or b == end or not pad[b]
        spans.append((s.q0, b))
    return spans


def test_padding_taken_in_is_padding_only_and_only_for_full_rectangles():
    """The rows a full chunk's varlen form adds to its rectangles' are all padding; a causal
    chunk adds none; the cu_seqlens lengths are the named rows'."""
    rng = np.random.default_rng(7)
    added = 0
    for c in random_chunks(rng, lambda: int(rng.integers(2, 5))):
        vl = c.varlen("cpu")
        named = set(named_rows(vl.q_rows, c.ql))
        own = {i for s in c.segments for i in range(s.q0, s.q1)}
        extra = sorted(named - own)
        assert own <= named and all(c.q_pos[i] < 0 for i in extra)
        assert not (c.causal and extra)
        assert sum(q for q, _ in vl.lengths) == len(named) == int(vl.cu_q[-1])
        added += len(extra)
    assert added > 0


def pairs(rows):
    return zip(rows[:-1], rows[1:])


def joined(spans):
    out = []
    for a, b in spans:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


# ---------------------------------------------------------------- the helpers, Ranges vs index

TOTAL, H, D = 40, 3, 4
RANGE_SETS = [
    ((0, 5), (9, 17)),
    ((3, 4), (20, 21), (22, 30), (39, 40)),
    ((30, 38), (2, 10)),  # not in increasing order (key ranges need not be)
    ((0, 6), (6, 6), (12, 12), (15, 20)),  # ranges of length 0 (chunks.py makes none)
    ((7, 19),),
]


def as_ranges(spans):
    return Ranges(slice(a, b) for a, b in spans)


def as_index(spans, device):
    return torch.as_tensor([i for a, b in spans for i in range(a, b)], device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spans", RANGE_SETS)
def test_take_place_add_rows_over_ranges_are_the_index_paths(spans, device):
    g = torch.Generator().manual_seed(len(spans))
    x = torch.randn(TOTAL, H, D, generator=g).to(device)
    lse = torch.randn(H, TOTAL, generator=g).to(device)
    ranges, index = as_ranges(spans), as_index(spans, device)
    n = len(index)
    assert torch.equal(take(x, ranges), take(x, index))
    assert torch.equal(take(lse, ranges, dim=1), take(lse, index, dim=1))
    part = torch.randn(n, H, D, generator=g).to(device, torch.bfloat16)
    part_lse = torch.randn(H, n, generator=g).to(device)
    assert torch.equal(place(part, ranges, TOTAL, 0.0), place(part, index, TOTAL, 0.0))
    assert torch.equal(
        place(part_lse, ranges, TOTAL, float("-inf"), dim=1),
        place(part_lse, index, TOTAL, float("-inf"), dim=1),
    )
    # gradients: narrower parts into float32 (as the methods add them), and a wider one
    for part_dtype, dst_dtype in (
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float32, torch.float64),
        (torch.float64, torch.float32),
    ):
        p = part.to(part_dtype) * 1.37
        dst = torch.randn(TOTAL, H, D, generator=g).to(device, dst_dtype)
        by_ranges, by_index = dst.clone(), dst.clone()
        add_rows(by_ranges, p, ranges)
        add_rows(by_index, p, index)
        assert torch.equal(by_ranges, by_index), (part_dtype, dst_dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spans", RANGE_SETS)
def test_merging_into_ranges_is_the_index_paths(spans, device):
    """forward_into's merge-write (merge_rows), first or not, with rows that saw nothing."""
    g = torch.Generator().manual_seed(7 + len(spans))
    ranges, index = as_ranges(spans), as_index(spans, device)
    n = len(index)
    out = torch.randn(TOTAL, H, D, generator=g).to(device)
    lse = (torch.randn(H, TOTAL, generator=g) * 3).to(device)
    lse[:, ::5] = float("-inf")
    out_t = torch.randn(n, H, D, generator=g).to(device, torch.bfloat16)
    lse_t = (torch.randn(H, n, generator=g) * 3).to(device)
    lse_t[:, ::3] = float("-inf")
    for first in (True, False):
        got = [out.clone(), lse.clone()]
        want = [out.clone(), lse.clone()]
        merge_rows(*got, out_t, lse_t, ranges, first)
        merge_rows(*want, out_t, lse_t, index, first)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), first
    # and the merge itself: every named row merged, the others untouched
    acc = [out.clone(), lse.clone()]
    merge_rows(*acc, out_t, lse_t, ranges, False)
    ref = [out[index].clone(), lse[:, index].clone()]
    merge_into(*ref, out_t, lse_t)
    rest = torch.ones(TOTAL, dtype=torch.bool, device=device)
    rest[index] = False
    assert torch.equal(acc[0][index], ref[0]) and torch.equal(acc[1][:, index], ref[1])
    assert torch.equal(acc[0][rest], out[rest]) and torch.equal(acc[1][:, rest], lse[:, rest])


def test_the_merge_of_a_bf16_partial_into_the_float32_accumulator_is_the_float64_one():
    """merge_into against the LSE-weighted sum in float64: rows either side saw nothing keep the
    other side's numbers, rows neither saw are 0 with LSE -inf."""
    g = torch.Generator().manual_seed(3)
    rows = 40
    out = torch.randn(rows, H, D, generator=g)
    lse = torch.randn(H, rows, generator=g) * 3
    out_t = torch.randn(rows, H, D, generator=g).to(torch.bfloat16)
    lse_t = torch.randn(H, rows, generator=g) * 3
    lse[:, :10], out[:10] = float("-inf"), 0.0  # the accumulator saw nothing on these rows
    lse_t[:, 5:15] = float("-inf")  # the partial saw nothing on these (5-9: neither did)
    new = torch.logaddexp(lse.double(), lse_t.double())
    safe = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
    want = out.double() * torch.exp(lse.double() - safe).T[..., None]
    want += out_t.double() * torch.exp(lse_t.double() - safe).T[..., None]
    merge_into(out, lse, out_t, lse_t)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse.double(), new)
    assert torch.equal(out[5:10], torch.zeros_like(out[5:10]))
