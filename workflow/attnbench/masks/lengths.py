"""Document lengths drawn from a histogram of real pre-training data (docs/masks.md).

A histogram is a list of buckets [low, high, weight], low inclusive, high exclusive.
The histograms themselves are data beside this module (doc_length_histograms.yaml); a config may
give its own `doc_length_histograms` instead.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import numpy as np

HISTOGRAMS_PATH = Path(__file__).with_name("doc_length_histograms.yaml")


@functools.cache
def _read_packaged() -> dict:
    import yaml

    return yaml.safe_load(HISTOGRAMS_PATH.read_text())["doc_length_histograms"]


def packaged_histograms() -> dict:
    """The document-length histograms shipped with the package (a copy: callers may change it)."""
    return copy.deepcopy(_read_packaged())


def choose_histogram(seqlen: int, histograms: dict) -> str:
    """The histogram for a total length: the first (by `use_up_to`) whose bound admits it."""
    ordered = sorted(histograms.items(), key=lambda kv: kv[1].get("use_up_to") or float("inf"))
    for name, h in ordered:
        bound = h.get("use_up_to")
        if bound is None or seqlen <= bound:
            return name
    raise ValueError(
        f"no document-length histogram admits seqlen={seqlen}; histograms: "
        + ", ".join(f"{n} (use_up_to={h.get('use_up_to')})" for n, h in histograms.items())
    )


def _draw_one(buckets, weights, rng: np.random.Generator) -> int:
    while True:
        low, high = buckets[rng.choice(len(buckets), p=weights)]
        length = int(rng.integers(low, high))  # high is exclusive
        if length > 0:
            return length


def sample_doc_lengths(total: int, buckets, rng: np.random.Generator) -> list[int]:
    """Fill `total` tokens with documents; the last one is clipped; no length is 0."""
    if total < 1:
        raise ValueError(f"total length must be >= 1, got {total}")
    bounds = [(int(b[0]), int(b[1])) for b in buckets]
    weights = np.asarray([float(b[2]) for b in buckets])
    weights = weights / weights.sum()
    lengths, free = [], total
    while free > 0:
        length = min(_draw_one(bounds, weights, rng), free)
        lengths.append(length)
        free -= length
    return lengths


def sample_long_doc_lengths(
    total: int, buckets, rng: np.random.Generator, long_range=(8192, 30720), long_fraction=0.6
) -> list[int]:
    """The CP `*_long` mix: (1 - long_fraction) of the tokens from the dataset histogram,
    the rest from documents of uniform length in long_range (both ends inclusive), shuffled."""
    long_tokens = int(round(total * long_fraction))
    short_tokens = total - long_tokens
    lengths = sample_doc_lengths(short_tokens, buckets, rng) if short_tokens else []
    lo, hi = int(long_range[0]), int(long_range[1])
    free = long_tokens
    while free > 0:
        length = min(int(rng.integers(lo, hi + 1)), free)
        lengths.append(length)
        free -= length
    order = rng.permutation(len(lengths))
    return [lengths[i] for i in order]


def sample_block_doc_lengths(total: int, block: int, rng: np.random.Generator, max_blocks=8):
    """Documents of 1..max_blocks whole blocks (uniform); `total` must be a multiple of `block`."""
    if total % block:
        raise ValueError(f"seqlen {total} is not a multiple of the block size {block}")
    lengths, free = [], total // block
    while free > 0:
        n = min(int(rng.integers(1, max_blocks + 1)), free)
        lengths.append(n * block)
        free -= n
    return lengths
