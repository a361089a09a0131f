"""Prefix-LM masks: a bidirectional prefix, causal after it, over the sequence or per document
(figure family prefix_lm)."""

from __future__ import annotations

from .. import predicates as P
from ..ranges import Slice, nonempty
from .base import MaskMod, Pattern, at, check_fraction, doc_bounds, drawn_length, fraction_bounds
from .document import Documents


def prefix_lm_causal_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """j < P or j <= i"""
    return (kv < aux_scalars[0]) | (kv <= q)


class PrefixLMCausal(Pattern):
    figure_family = "prefix_lm"
    name = "prefix_lm_causal"
    fa4_mod = staticmethod(prefix_lm_causal_mod)
    sample_class = "document"  # a prefix drawn per sample
    cfg_keys = ("prefix_fraction",)

    def check(self, seqlen, cfg):
        check_fraction(self.name, cfg, "prefix_fraction")

    def sample(self, seqlen, cfg, rng, histograms):
        bounds = fraction_bounds(cfg, "prefix_fraction")
        if bounds is None:  # the paper's: uniform in 1..S
            return {"prefix": int(rng.integers(1, seqlen + 1))}
        return {"prefix": drawn_length(seqlen, bounds, rng)}

    def predicate(self, seqlen, params, device):
        return P.prefix(P.scalar(params["prefix"], device))

    def slices(self, seqlen, params):
        p = params["prefix"]
        return nonempty([Slice(0, p, 0, p, "full"), Slice(p, seqlen, 0, seqlen, "causal")])

    def fa4_mask_mod(self, seqlen, params):
        return MaskMod(self.fa4_mod, (params["prefix"],))


def prefix_lm_document_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """doc(i) == doc(j) and (pos(j) < P or j <= i). pos(j) < len(doc), so pos(j) < P is
    pos(j) < min(P, len(doc))."""
    doc, pos = aux_tensors
    return (at(doc, q) == at(doc, kv)) & ((at(pos, kv) < aux_scalars[0]) | (kv <= q))


class PrefixLMDocument(Documents):
    """Per document, a bidirectional prefix of min(P, len(doc)) tokens, causal after it."""

    figure_family = "prefix_lm"
    name = "prefix_lm_document"
    fa4_mod = staticmethod(prefix_lm_document_mod)
    cfg_keys = ("prefix_fraction",)

    def check(self, seqlen, cfg):
        check_fraction(self.name, cfg, "prefix_fraction")

    def sample(self, seqlen, cfg, rng, histograms):
        params = super().sample(seqlen, cfg, rng, histograms)
        first = params["doc_lengths"][0]
        bounds = fraction_bounds(cfg, "prefix_fraction")  # of the first document's length
        if bounds is None:
            params["prefix"] = int(rng.integers(1, first + 1))
        else:
            params["prefix"] = drawn_length(first, bounds, rng)
        return params

    def predicate(self, seqlen, params, device):
        base = P.prefix(P.scalar(params["prefix"], device))
        return P.in_documents(base, *self.docs(params, device))

    def slices(self, seqlen, params):
        out = []
        for a, b in doc_bounds(params["doc_lengths"]):
            p = min(params["prefix"], b - a)
            out += [Slice(a, a + p, a, a + p, "full"), Slice(a + p, b, a, b, "causal")]
        return nonempty(out)

    def fa4_mask_mod(self, seqlen, params):
        return MaskMod(self.fa4_mod, (params["prefix"],), lambda doc, pos: (doc, pos))
