"""The seeded document-length sampler (docs/masks.md)."""

import numpy as np
import pytest
from attnbench.masks import lengths as L


@pytest.mark.parametrize("total", [1, 2, 7, 100, 4096, 12288, 70000])
def test_lengths_sum_to_total_and_are_positive(total, histograms):
    name = L.choose_histogram(total, histograms)
    for seed in range(20):
        docs = L.sample_doc_lengths(
            total, histograms[name]["buckets"], np.random.default_rng(seed)
        )
        assert sum(docs) == total
        assert min(docs) >= 1


def test_upper_bound_is_exclusive():
    # one bucket [3, 5): only 3 and 4 may be drawn (the reference also drew 5)
    seen = set()
    for seed in range(200):
        docs = L.sample_doc_lengths(1000, [[3, 5, 1.0]], np.random.default_rng(seed))
        seen |= set(docs[:-1])  # the last one is clipped
    assert seen == {3, 4}


def test_zero_length_never_emitted():
    for seed in range(100):
        docs = L.sample_doc_lengths(50, [[0, 2, 1.0]], np.random.default_rng(seed))
        assert min(docs) == 1 and sum(docs) == 50


def test_same_seed_same_lengths(histograms):
    b = histograms["prolong64k"]["buckets"]
    a1 = L.sample_doc_lengths(32768, b, np.random.default_rng(7))
    a2 = L.sample_doc_lengths(32768, b, np.random.default_rng(7))
    a3 = L.sample_doc_lengths(32768, b, np.random.default_rng(8))
    assert a1 == a2 and a1 != a3


def test_histogram_choice_by_length(histograms):
    assert L.choose_histogram(12288, histograms) == "pile"
    assert L.choose_histogram(12289, histograms) == "prolong64k"
    assert L.choose_histogram(65536, histograms) == "prolong64k"
    assert L.choose_histogram(65537, histograms) == "prolong512k"
    assert L.choose_histogram(1 << 20, histograms) == "prolong512k"


def test_histograms_match_the_spec(histograms):
    assert {k: len(v["buckets"]) for k, v in histograms.items()} == {
        "pile": 41,
        "prolong64k": 44,
        "prolong512k": 42,
    }
    for h in histograms.values():
        for (a, b, w), nxt in zip(h["buckets"], h["buckets"][1:] + [None]):
            assert a < b and w > 0
            if nxt:
                assert nxt[0] == b  # contiguous buckets


def test_long_document_mix():
    total = 200_000
    docs = L.sample_long_doc_lengths(total, [[1, 100, 1.0]], np.random.default_rng(0))
    assert sum(docs) == total
    long_docs = [d for d in docs if d >= 100]
    assert sum(long_docs) == round(0.6 * total)
    assert (
        all(d <= 30720 for d in docs) and sum(d >= 8192 for d in long_docs) >= len(long_docs) - 1
    )
    assert docs != sorted(docs, key=lambda d: d >= 100)  # shuffled, not short-then-long


def test_block_documents_are_whole_blocks():
    for seed in range(20):
        docs = L.sample_block_doc_lengths(64 * 37, 64, np.random.default_rng(seed))
        assert sum(docs) == 64 * 37 and all(d % 64 == 0 and 64 <= d <= 8 * 64 for d in docs)
    with pytest.raises(ValueError, match="not a multiple of the block size 64"):
        L.sample_block_doc_lengths(100, 64, np.random.default_rng(0))
