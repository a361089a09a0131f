"""Each mask as FlexAttention's mask_mod, in the form the flex adapter runs, and why.

A mask_mod runs only in the BlockMask's partial tiles (full tiles skip it), once per score there,
in the forward and in the backward. Two ways to write the same visible(i, j):

  predicate  the mask's own predicate (masks/patterns/): document masks apply their base term in
             document-local coordinates, so every index is gathered twice more (doc_start[q],
             doc_start[kv]) and shifted before the causal/prefix/block test.
  direct     global positions, as FlexAttention's documentation and attention-gym write packed
             documents: a per-token document id compared directly (doc[q] == doc[kv]) and the
             causal/prefix/block term on the global indices, which inside one document says the
             same; a document-id test that is a position test (doc(i) == 0 is i < c_1) is the
             position test, on a run-time scalar.

CHOSEN says which form each mask runs. On an H100 a direct formulation was 1.09-1.10x faster than
the predicate (share_question 32K backward, causal_document 8K forward) and 0.91x on
global_sliding_window 8K, whose predicate is already on global positions with scalars only: it keeps
its predicate. Its `direct` entry here is attention-gym's Longformer form (a per-token is_global
table), kept only to be measured (benchmarks/flex_mask_mod_forms.py). Masks whose predicate already
is the direct form (full, causal, the windows, prefix_lm_causal) and the block-sparse masks (a
kept-block table per head) keep theirs. On the CPU the two forms time alike within the machine's
noise (docs/kernels.md).

Every tensor a mask_mod reads is built here, once per draw, and every parameter is a 0-d tensor, not
a Python int: Dynamo guards on a closure's Python ints, so an int would recompile flex per draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..masks.predicates import padded_length

PREDICATE, DIRECT = "predicate", "direct"
FORMS = (PREDICATE, DIRECT)


@dataclass(frozen=True)
class MaskModForm:
    """How one mask is written as a mask_mod: the form, its formula (for the record's notes), and
    the builder of the mask_mod for one realised mask (None: the mask's own predicate)."""

    form: str
    formula: str
    build: Callable | None = None

    def note(self) -> str:
        return f"{self.form}: {self.formula}"


@dataclass(frozen=True)
class DocumentTokens:
    """Per-token int32 tables of packed documents, over the padded length (masks/predicates.py:
    flex may call a mask_mod past the sequence end in its last, partial tile). The padding is one
    more document, so it matches no real one."""

    doc: torch.Tensor  # doc[i]: the document holding position i
    pos: torch.Tensor  # pos[i]: i's offset in its document

    @classmethod
    def of(cls, doc_lengths, device) -> DocumentTokens:
        lengths = [int(n) for n in doc_lengths]
        total = sum(lengths)
        lengths.append(padded_length(total) - total)
        n = torch.tensor(lengths, dtype=torch.int32, device=device)
        doc = torch.repeat_interleave(
            torch.arange(len(lengths), dtype=torch.int32, device=device), n
        )
        start = (torch.cumsum(n, 0, dtype=torch.int32) - n)[doc]
        return cls(doc, torch.arange(len(doc), dtype=torch.int32, device=device) - start)


def _scalar(x, device) -> torch.Tensor:
    return torch.tensor(int(x), dtype=torch.int32, device=device)


# ---------------------------------------------------------------- the direct forms


def _full_document(mask, device):
    doc = DocumentTokens.of(mask.doc_lengths, device).doc
    return lambda b, h, q, kv: doc[q] == doc[kv]


def _causal_document(mask, device):
    doc = DocumentTokens.of(mask.doc_lengths, device).doc
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & (kv <= q)


def _share_question(mask, device):
    # doc(j) == 0 and doc(i) != 0 is j < c_1 <= i: the question's end, a scalar
    doc = DocumentTokens.of(mask.doc_lengths, device).doc
    c1 = _scalar(mask.doc_lengths[0], device)
    return lambda b, h, q, kv: ((kv < c1) & (q >= c1)) | ((doc[q] == doc[kv]) & (kv <= q))


def _causal_blockwise(mask, device):
    # doc(i) == n-1 is i >= c_{n-1}, the last document's start (rows past S are never kept)
    doc = DocumentTokens.of(mask.doc_lengths, device).doc
    c = _scalar(mask.seqlen - mask.doc_lengths[-1], device)
    return lambda b, h, q, kv: ((q >= c) & (kv < c)) | ((doc[q] == doc[kv]) & (kv <= q))


def _prefix_lm_document(mask, device):
    # inside one document j - s(j) <= i - s(i) is j <= i; pos(j) < P is pos(j) < min(P, len)
    tokens = DocumentTokens.of(mask.doc_lengths, device)
    doc, pos, p = tokens.doc, tokens.pos, _scalar(mask.params["prefix"], device)
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & ((pos[kv] < p) | (kv <= q))


def _block_causal_document(mask, device):
    # Documents are whole blocks (lengths.sample_block_doc_lengths), so document-local blocks are
    # global ones: (j - s(j)) // b <= (i - s(i)) // b is j // b <= i // b. A draw whose documents
    # do not start on a block keeps the predicate.
    block = int(mask.params["block"])
    if any(n % block for n in mask.doc_lengths[:-1]):
        return mask.mask_mod(device)
    doc = DocumentTokens.of(mask.doc_lengths, device).doc
    b_ = _scalar(block, device)
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & (kv // b_ <= q // b_)


def _global_sliding_window_table(mask, device):
    """attention-gym's Longformer form (a per-token is_global table), kept only to be measured."""
    s, g = mask.seqlen, int(mask.params["global_tokens"])
    is_global = torch.arange(padded_length(s), device=device) < g
    w = _scalar(mask.params["window"], device)
    return lambda b, h, q, kv: ((q - kv).abs() <= w) | is_global[q] | is_global[kv]


DOCUMENT_LOCAL = "document-local: doc[q] == doc[kv] & base(q - start[q], kv - start[kv])"
DIRECT_FORMS = {
    "full_document": MaskModForm(DIRECT, "doc[q] == doc[kv]", _full_document),
    "causal_document": MaskModForm(DIRECT, "doc[q] == doc[kv] & kv <= q", _causal_document),
    "share_question": MaskModForm(
        DIRECT, "(kv < c1 & q >= c1) | (doc[q] == doc[kv] & kv <= q)", _share_question
    ),
    "causal_blockwise": MaskModForm(
        DIRECT, "(q >= c_last & kv < c_last) | (doc[q] == doc[kv] & kv <= q)", _causal_blockwise
    ),
    "prefix_lm_document": MaskModForm(
        DIRECT, "doc[q] == doc[kv] & (pos[kv] < P | kv <= q)", _prefix_lm_document
    ),
    "block_causal_document": MaskModForm(
        DIRECT, "doc[q] == doc[kv] & kv // b <= q // b", _block_causal_document
    ),
    "global_sliding_window": MaskModForm(
        DIRECT, "|q - kv| <= w | is_global[q] | is_global[kv]", _global_sliding_window_table
    ),
}
DIRECT_FORMS["full_document_long"] = DIRECT_FORMS["full_document"]
DIRECT_FORMS["causal_document_long"] = DIRECT_FORMS["causal_document"]

# The predicate's formula where it is not document-local
PREDICATE_FORMULAS = {
    "full": "q >= 0 & kv >= 0 (every tile full but a cut last one)",
    "causal": "kv <= q",
    "sliding_window": "|q - kv| <= w",
    "sliding_window_causal": "kv <= q & q - kv <= w",
    "prefix_lm_causal": "kv < P | kv <= q",
    "global_sliding_window": "|q - kv| <= w | q < g | kv < g",
    "block_sparse": "keep[h, q // B, kv // B]",
    "variable_block_sparse": "keep[h, rowblock[h, q], colblock[h, kv]]",
}

# Which form each mask runs (module docstring): direct where it has one, except
# global_sliding_window (its predicate, already direct, measured faster than a per-token form).
CHOSEN = {name: DIRECT for name in DIRECT_FORMS} | {"global_sliding_window": PREDICATE}


def form_of(name: str, form: str | None = None) -> MaskModForm:
    """The mask_mod form of mask `name`: `form` where given and the mask has it, else CHOSEN's."""
    form = form or CHOSEN.get(name, PREDICATE)
    if form == DIRECT and name in DIRECT_FORMS:
        return DIRECT_FORMS[name]
    return MaskModForm(PREDICATE, PREDICATE_FORMULAS.get(name, DOCUMENT_LOCAL))


def mask_mod_for(mask, device, form: str | None = None) -> tuple[Callable, MaskModForm]:
    """(mask_mod, its form) for one realised mask."""
    chosen = form_of(mask.name, form)
    if chosen.build is None:
        return mask.mask_mod(device), chosen
    return chosen.build(mask, device), chosen
