"""Tiny visibility predicates over integer index tensors, and ways to combine them.

A predicate takes broadcastable index tensors (q, k) and returns a bool tensor. The same
predicate builds the dense matrix (q = arange(S)[:, None], k = arange(S)[None, :]) and serves
as a FlexAttention mask_mod (scalar tensors under vmap), so the two forms cannot drift apart.
Numeric parameters are 0-d tensors so a compiled mask_mod is reused across samples.
"""

from __future__ import annotations


def full():
    return lambda q, k: (q >= 0) & (k >= 0)


def causal():
    return lambda q, k: k <= q


def band(w):
    """Two-sided window: |i - j| <= w."""
    return lambda q, k: (q - k).abs() <= w


def causal_band(w):
    """One-sided window: 0 <= i - j <= w."""
    return lambda q, k: (k <= q) & (q - k <= w)


def prefix(p):
    """A bidirectional prefix of p tokens, causal after it."""
    return lambda q, k: (k < p) | (k <= q)


def block_causal(b):
    """Bidirectional inside blocks of b tokens, causal across blocks."""
    import torch

    return lambda q, k: (
        torch.div(k, b, rounding_mode="floor") <= torch.div(q, b, rounding_mode="floor")
    )


def in_documents(base, doc_id, doc_start):
    """`base` applied in each document's local coordinates; nothing crosses documents."""
    return lambda q, k: (doc_id[q] == doc_id[k]) & base(q - doc_start[q], k - doc_start[k])


def any_of(*preds):
    def pred(q, k):
        out = preds[0](q, k)
        for p in preds[1:]:
            out = out | p(q, k)
        return out

    return pred


def all_of(*preds):
    def pred(q, k):
        out = preds[0](q, k)
        for p in preds[1:]:
            out = out & p(q, k)
        return out

    return pred


# Index tensors are padded to a multiple of this: FlexAttention may call a mask_mod with indices
# past the sequence end in its last, partial tile (pytorch/pytorch#137801) and masks them afterwards.
INDEX_PAD = 256


def padded_length(n: int) -> int:
    return -(-n // INDEX_PAD) * INDEX_PAD


def document_tensors(doc_lengths, device):
    """doc_id[i] and doc_start[i] for every position i (padding: one extra document)."""
    import torch

    lengths = list(doc_lengths)
    total = sum(lengths)
    lengths.append(padded_length(total) - total)
    lengths = torch.as_tensor(lengths, dtype=torch.long, device=device)
    starts = torch.cumsum(lengths, 0) - lengths
    doc_id = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    return doc_id, starts[doc_id]


def scalar(x, device):
    import torch

    return torch.tensor(int(x), dtype=torch.long, device=device)
