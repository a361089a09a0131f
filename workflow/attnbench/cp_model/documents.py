"""Documents of a question: a list the user gives (lengths or cu_seqlens), or packs drawn by a
sampler with a cap and a packing rule.

PackSampler draws as MagiAttention's CP benchmark does (its DatasetSampler): every document of a
length distribution (bins of [low, high] with a document count; each document at its bin's midpoint,
the integer mean of the bounds), documents longer than `cap` x the pack length cut into pieces of
that length and the rest, all shuffled, laid end to end and cut into packs of the pack length (a
document that does not fit is cut, its rest opens the next pack), the packs shuffled; the first n
are the masks. Laid end to end, pack k is exactly tokens [k L, (k + 1) L) of the shuffled stream,
which is how packs() finds them (the same packs as packing document by document, without the loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import yaml

PUBLISHED = Path(__file__).parent / "data" / "published_cp.yaml"


def published() -> dict:
    """The published CP benchmarks and document distributions (data/published_cp.yaml)."""
    return yaml.safe_load(PUBLISHED.read_text())


def parse_documents(text: str) -> tuple[int, ...]:
    """Document lengths from "256,7392,544" (lengths) or "0,256,7648,8192" (cu_seqlens: starts
    at 0 and increases); ValueError names what is wrong."""
    try:
        values = [int(x) for x in str(text).replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise ValueError(
            f"documents {text!r}: give lengths (256,7392,544) or cu_seqlens (0,256,7648,8192)"
        ) from None
    if values and values[0] == 0:  # cu_seqlens
        lengths = np.diff(values)
        if len(values) < 2 or (lengths <= 0).any():
            raise ValueError(f"cu_seqlens {text!r} must increase from 0, e.g. 0,256,7648,8192")
        return tuple(int(x) for x in lengths)
    if not values or min(values) < 1:
        raise ValueError(f"documents {text!r}: every length must be at least 1")
    return tuple(values)


@dataclass(frozen=True)
class PackSampler:
    name: str
    bins: tuple  # ((low, high inclusive, documents), ...)
    cap: float = 0.25  # documents longer than cap x the pack length are cut into such pieces
    seed: int = 42
    source: str = ""

    @classmethod
    def from_config(cls, name: str, cfg: dict, distributions: dict) -> PackSampler:
        dist = cfg.get("distribution", name)
        if dist not in distributions:
            raise ValueError(
                f"sampler {name}: unknown distribution {dist!r}; known: {', '.join(distributions)}"
            )
        bins = tuple(tuple(int(x) for x in b) for b in distributions[dist]["bins"])
        cap = float(cfg.get("cap", 0.25))
        if not 0 < cap <= 1:
            raise ValueError(f"sampler {name}: cap {cap} must be in (0, 1]")
        src = distributions[dist].get("source", "")
        return cls(name, bins, cap, int(cfg.get("seed", 42)), src)

    @cached_property
    def _lengths(self) -> tuple[np.ndarray, np.ndarray]:
        b = np.array(self.bins, np.int64)
        return (b[:, 0] + b[:, 1]) // 2, b[:, 2]

    def packs(self, pack_len: int, n: int) -> list[tuple[int, ...]]:
        """The first n packs of pack_len tokens (each a tuple of document lengths)."""
        lengths, counts = self._lengths
        rng = np.random.default_rng(self.seed)
        piece = pack_len * self.cap
        whole = (lengths // piece).astype(np.int64) * counts  # pieces of the cap's length
        rest = lengths % piece
        pieces = np.concatenate(
            [
                np.full(int(whole.sum()), piece, np.int64),
                np.repeat(rest[rest > 0], counts[rest > 0]).astype(np.int64),
            ]
        )
        rng.shuffle(pieces)
        ends = np.cumsum(pieces)
        total = int(ends[-1]) // pack_len
        if total < n:
            raise ValueError(
                f"sampler {self.name}: its documents fill {total} packs of {pack_len} tokens, "
                f"fewer than the {n} asked for"
            )
        order = np.arange(total)
        rng.shuffle(order)
        out = []
        for k in order[:n]:
            lo, hi = int(k) * pack_len, (int(k) + 1) * pack_len
            first = int(np.searchsorted(ends, lo, side="right"))
            last = int(np.searchsorted(ends, hi, side="left"))
            cuts = np.concatenate([[lo], ends[first:last], [hi]])
            out.append(tuple(int(x) for x in np.diff(cuts) if x > 0))
        return out

    def text(self) -> str:
        return (
            f"sampler {self.name}: every document of its distribution ({self.source or 'no source'}), "
            f"cut at {self.cap:g} of the total, shuffled and packed (seed {self.seed})"
        )
