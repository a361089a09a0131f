"""Blockwise masks: a last document that sees every earlier one, and bidirectional blocks causal
across blocks inside each document (figure family blockwise)."""

from __future__ import annotations

from .. import lengths as L
from .. import predicates as P
from ..ranges import Slice, check_block_multiple, nonempty
from .base import MaskMod, at, doc_bounds
from .document import Documents


def causal_blockwise_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """(doc(i) == n-1 and j < c) or (doc(i) == doc(j) and j <= i), where c is the last
    document's start. doc(i) == n-1 is i >= c for i < S."""
    c = aux_scalars[0]
    same = at(aux_tensors[0], q) == at(aux_tensors[0], kv)
    return ((q >= c) & (kv < c)) | (same & (kv <= q))


class CausalBlockwise(Documents):
    """The last document (the test example) sees everything; the others are causal in themselves."""

    figure_family = "blockwise"
    name = "causal_blockwise"
    fa4_mod = staticmethod(causal_blockwise_mod)

    def predicate(self, seqlen, params, device):
        doc_id, doc_start = self.docs(params, device)
        last = len(params["doc_lengths"]) - 1
        last_start = seqlen - params["doc_lengths"][-1]
        sees_all = lambda q, k: (doc_id[q] == last) & (k < last_start)  # noqa: E731
        return P.any_of(sees_all, P.in_documents(P.causal(), doc_id, doc_start))

    def slices(self, seqlen, params):
        bounds = doc_bounds(params["doc_lengths"])
        last_start = bounds[-1][0]
        out = [Slice(a, b, a, b, "causal") for a, b in bounds]
        out.append(Slice(last_start, seqlen, 0, last_start, "full"))
        return nonempty(out)

    def fa4_mask_mod(self, seqlen, params):
        last_start = seqlen - params["doc_lengths"][-1]
        return MaskMod(self.fa4_mod, (last_start,), lambda doc, pos: (doc,))


def block_causal_document_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars=None):
    """doc(i) == doc(j) and blk(j) <= blk(i), where blk = pos // b."""
    doc, blk = aux_tensors
    return (at(doc, q) == at(doc, kv)) & (at(blk, kv) <= at(blk, q))


class BlockCausalDocument(Documents):
    """Per document: bidirectional inside blocks of b tokens, causal across blocks."""

    figure_family = "blockwise"
    name = "block_causal_document"
    fa4_mod = staticmethod(block_causal_document_mod)
    cfg_keys = ("block",)
    block_key = "block"

    def check(self, seqlen, cfg):
        check_block_multiple(self.name, cfg, "block", seqlen)

    def sample(self, seqlen, cfg, rng, histograms):
        self.check(seqlen, cfg)
        b = int(cfg["block"])
        return {"block": b, "doc_lengths": L.sample_block_doc_lengths(seqlen, b, rng)}

    def predicate(self, seqlen, params, device):
        base = P.block_causal(P.scalar(params["block"], device))
        return P.in_documents(base, *self.docs(params, device))

    def slices(self, seqlen, params):
        b, out = params["block"], []
        for a, e in doc_bounds(params["doc_lengths"]):
            for q0 in range(a, e, b):
                q1 = min(q0 + b, e)
                out.append(Slice(q0, q1, a, q1, "full"))
        return out

    def fa4_mask_mod(self, seqlen, params):
        # blk = pos // b, precomputed so that the kernel needs no division
        return MaskMod(self.fa4_mod, aux=lambda doc, pos: (doc, pos // params["block"]))
