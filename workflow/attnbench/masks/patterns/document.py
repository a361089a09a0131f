"""Masks over packed documents: attention inside each document, bidirectional or causal
(figure family document), and their context-parallel variants with long documents."""

from __future__ import annotations

from .. import lengths as L
from .. import predicates as P
from ..ranges import Slice
from .base import NativeForm, Pattern, doc_bounds, span_kind, span_window, within


class Documents(Pattern):
    """Base for masks over packed documents drawn from the dataset histogram."""

    figure_family = "document"
    sample_class = "document"
    uses_documents = True

    def sample(self, seqlen, cfg, rng, histograms):
        name = L.choose_histogram(seqlen, histograms)
        docs = L.sample_doc_lengths(seqlen, histograms[name]["buckets"], rng)
        return {"doc_lengths": docs, "histogram": name}

    def docs(self, params, device):
        return P.document_tensors(params["doc_lengths"], device)


class FullDocument(Documents):
    name = "full_document"
    causal = False

    def predicate(self, seqlen, params, device):
        return P.in_documents(within(self.causal), *self.docs(params, device))

    def slices(self, seqlen, params):
        return [
            Slice(a, b, a, b, span_kind(self.causal)) for a, b in doc_bounds(params["doc_lengths"])
        ]

    def native_form(self, seqlen, params):
        return NativeForm(tuple(params["doc_lengths"]), self.causal, span_window(self.causal))


class CausalDocument(FullDocument):
    name = "causal_document"
    causal = True


class LongDocuments:
    """CP variants: 40% dataset documents, 60% long uniform ones (docs/masks.md)."""

    figure_family = None  # a figure of its own (the CP masks)

    cfg_keys = ("long_doc_range", "long_fraction")

    def sample(self, seqlen, cfg, rng, histograms):
        name = L.choose_histogram(seqlen, histograms)
        docs = L.sample_long_doc_lengths(
            seqlen,
            histograms[name]["buckets"],
            rng,
            long_range=cfg.get("long_doc_range", (8192, 30720)),
            long_fraction=cfg.get("long_fraction", 0.6),
        )
        return {"doc_lengths": docs, "histogram": name}


class FullDocumentLong(LongDocuments, FullDocument):
    name = "full_document_long"


class CausalDocumentLong(LongDocuments, CausalDocument):
    name = "causal_document_long"
