"""A shared question every later answer sees (figure family share_question)."""

from __future__ import annotations

from .. import lengths as L
from .. import predicates as P
from ..ranges import Slice, nonempty
from .base import MaskMod, at, check_fraction, doc_bounds, drawn_length, fraction_bounds
from .document import Documents


def share_question_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars=None):
    """(doc(j) == 0 and doc(i) != 0) or (doc(i) == doc(j) and j <= i)"""
    dq, dk = at(aux_tensors[0], q), at(aux_tensors[0], kv)
    return ((dk == 0) & (dq != 0)) | ((dq == dk) & (kv <= q))


class ShareQuestion(Documents):
    """Document 0 is a question every later answer sees; causal inside each document."""

    figure_family = "share_question"
    name = "share_question"
    fa4_mod = staticmethod(share_question_mod)
    cfg_keys = ("question_fraction",)

    def check(self, seqlen, cfg):
        check_fraction(self.name, cfg, "question_fraction")

    def sample(self, seqlen, cfg, rng, histograms):
        bounds = fraction_bounds(cfg, "question_fraction")
        if bounds is None:  # the question is the first document drawn from the histogram
            return super().sample(seqlen, cfg, rng, histograms)
        question = drawn_length(seqlen, bounds, rng)
        name = L.choose_histogram(seqlen, histograms)
        answers = seqlen - question
        docs = L.sample_doc_lengths(answers, histograms[name]["buckets"], rng) if answers else []
        return {"doc_lengths": [question, *docs], "histogram": name}

    def predicate(self, seqlen, params, device):
        doc_id, doc_start = self.docs(params, device)
        shared = lambda q, k: (doc_id[k] == 0) & (doc_id[q] != 0)  # noqa: E731
        return P.any_of(shared, P.in_documents(P.causal(), doc_id, doc_start))

    def slices(self, seqlen, params):
        bounds = doc_bounds(params["doc_lengths"])
        c1 = bounds[0][1]
        out = [Slice(a, b, a, b, "causal") for a, b in bounds]
        out.append(Slice(c1, seqlen, 0, c1, "full"))
        return nonempty(out)

    def fa4_mask_mod(self, seqlen, params):
        return MaskMod(self.fa4_mod, aux=lambda doc, pos: (doc,))
