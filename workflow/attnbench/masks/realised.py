"""What a mask's draws turned out to be, in words: an answer names the realised parameters it
rests on (the window, the global tokens, the prefix, how many documents, the density a block
layout kept), not only the mask's name."""

from __future__ import annotations

from collections.abc import Iterable

# The drawn parameters worth naming, in the order an answer names them: key -> words. A list is
# named by its length (doc_lengths: how many documents), a number by its range over the draws.
TERMS = {
    "window": "window",
    "global_tokens": "global tokens",
    "prefix": "prefix",
    "doc_lengths": "documents",
    "block": "block",
    "block_size": "block",
    "avg_block": "mean block",
    "realised_density": "density",
}


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:.3g}"


def describe(draws: Iterable[dict]) -> str:
    """'window 1,024; 8-25 documents' over the draws' mask parameters; '' where none is named."""
    values: dict[str, list[float]] = {}
    for params in draws:
        for key in TERMS:
            v = params.get(key)
            if isinstance(v, (list, tuple)):
                v = len(v)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                values.setdefault(key, []).append(float(v))
    parts = []
    for key, xs in values.items():
        lo, hi = min(xs), max(xs)
        span = _fmt(lo) if lo == hi else f"{_fmt(lo)}-{_fmt(hi)}"
        words = TERMS[key]
        parts.append(f"{span} {words}" if key == "doc_lengths" else f"{words} {span}")
    return "; ".join(parts)
