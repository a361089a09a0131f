"""The static mask patterns of docs/masks.md: how each samples its parameters, its one
predicate, its range form, and the forms kernels take where it has them: the native form
(documents, causal, window) of the varlen/window kernels, else FlashAttention-4's mask_mod.
Block-sparse patterns live in sparse.py.

`params` are the realised parameters of one sample (JSON-able); the mask can be rebuilt from
them exactly. `cfg` holds the grid's fixed settings (window, block, long-document mix), the keys
each pattern reads in its `cfg_keys` (the only mask_params a grid may set: grid.expand).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import lengths as L
from . import predicates as P
from .ranges import Slice, check_block_multiple, nonempty


@dataclass(frozen=True)
class NativeForm:
    """What a varlen/window kernel (FlashAttention style) takes: documents, causal, window."""

    doc_lengths: tuple
    causal: bool
    window: tuple  # (left, right); -1 = unbounded


@dataclass(frozen=True)
class MaskMod:
    """A mask as FlashAttention-4's mask_mod (kernels/fa4_mask_mod.py runs it), for masks with no
    native form: `fn(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars)` -> visible, plain
    integer arithmetic (<, <=, ==, !=, &, |, +, -) on the indices, on the run-time scalars and on
    aux entries read through `_at`, so that it also evaluates on CPU index arrays; the scalars;
    and `aux(doc, pos)`: the per-position tensors it reads, made from each position's document
    and offset in it (None: it reads none). Every fn keeps the index on the left of each operator,
    so that the DSL's TensorSSA operators take the scalar operand."""

    fn: Callable
    scalars: tuple = ()
    aux: Callable | None = None


def _at(aux, idx):
    """aux[idx]: elementwise for CPU index arrays. In the CuTe DSL, idx is a one-element TensorSSA
    and aux a cute.Tensor, read as a scalar and made a TensorSSA again (as FA4's own tests do)."""
    import torch

    if isinstance(idx, (torch.Tensor, np.ndarray)):
        return aux[idx]
    import cutlass
    from flash_attn.cute import utils

    return utils.scalar_to_ssa(aux[idx[0]], cutlass.Int32)


def _doc_bounds(doc_lengths):
    bounds = np.concatenate([[0], np.cumsum(doc_lengths)]).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def causal_band_slices(offset, n, w):
    """0 <= i - j <= w on positions [offset, offset + n)."""
    m = min(n, w + 1)
    out = [Slice(offset, offset + m, offset, offset + m, "causal")]
    if n > m:
        out.append(Slice(offset + m, offset + n, offset + m - w, offset + n, "bi_causal"))
    return out


def band_slices(offset, n, w):
    """|i - j| <= w on positions [offset, offset + n): the causal band plus the strict upper band."""
    out = causal_band_slices(offset, n, w)
    if w >= 1 and n > 1:
        n1 = max(0, n - w)
        if n1 > 0:
            out.append(Slice(offset, offset + n1, offset + 1, offset + n1 + w, "bi_causal"))
        out.append(Slice(offset + n1, offset + n, offset + n1 + 1, offset + n, "inv_causal"))
    return out


def fraction_bounds(cfg: dict, key: str) -> tuple[float, float] | None:
    """A grid's bound on a drawn length as a fraction of S: a number fixes it, [lo, hi] draws
    it uniformly between the two; None where the grid sets none (the paper's draw then)."""
    v = cfg.get(key)
    if v is None:
        return None
    lo, hi = (float(v), float(v)) if isinstance(v, int | float) else (float(v[0]), float(v[1]))
    return lo, hi


def check_fraction(name: str, cfg: dict, key: str, most: float = 1.0) -> None:
    """ValueError naming the key where its bound is not 0 < lo <= hi <= most."""
    b = fraction_bounds(cfg, key)
    if b is not None and not 0 < b[0] <= b[1] <= most:
        raise ValueError(
            f"{name}: mask_params.{key} {cfg[key]!r} must be a fraction of the sequence in "
            f"(0, {most:g}], or [lo, hi] with 0 < lo <= hi <= {most:g}"
        )


def drawn_length(seqlen: int, bounds, rng, least: int = 1, most: int | None = None) -> int:
    """round(u x S), u uniform in the bounds, kept in [least, most (default S)]."""
    u = bounds[0] if bounds[0] == bounds[1] else float(rng.uniform(bounds[0], bounds[1]))
    return int(min(max(round(u * seqlen), least), seqlen if most is None else most))


class CheckShape:
    """What a float64 check at a shorter length (harness/samples.py) must keep of a pattern: its
    lengths a multiple of the block (`block_key`: the grid setting holding it, or None), and the
    features it must hold to show the pattern at all."""

    block_key = None

    def check_granule(self, cfg) -> int:
        """Check lengths are multiples of this: the block of block masks, else 1."""
        return int(cfg.get(self.block_key) or 1) if self.block_key else 1

    def check_features(self, cfg) -> list[tuple[str, int]]:
        """(feature, the tokens it needs): blocks show only where there are two."""
        b = cfg.get(self.block_key) if self.block_key else None
        return [(f"two blocks (2 x {self.block_key} {b})", 2 * b)] if b else []


class Pattern(CheckShape):
    name = ""
    # how many samples a cell draws: "single" (samples.single: a mask fixed by the grid's
    # settings) or "document" (samples.document: a mask drawn afresh per sample, its documents,
    # prefix, window or question random; every kernel at a point draws the same ones)
    sample_class = "single"
    uses_documents = False
    cfg_keys = ()  # the grid's mask_params this pattern reads

    def sample(self, seqlen, cfg, rng, histograms) -> dict:
        return {}

    def check(self, seqlen, cfg):
        """Raise ValueError when the pattern cannot exist at this length / settings."""

    def predicate(self, seqlen, params, device):
        raise NotImplementedError

    def slices(self, seqlen, params) -> list[Slice]:
        raise NotImplementedError

    def native_form(self, seqlen, params):
        """The (documents, causal, window) form, or None when the mask has none."""
        return None

    # FlashAttention-4's mask_mod function, where the mask has no native form (MaskMod.fn)
    fa4_mod = None

    def fa4_mask_mod(self, seqlen, params) -> MaskMod | None:
        """FlashAttention-4's mask_mod form of one realisation (fa4_mod, with the scalars and
        aux tensors it reads), where the mask has no native form; else None."""
        return None

    @property
    def regular(self) -> bool:
        """Whether the pattern has a native form (it defines native_form): what FlashAttention
        2/3, varlen and cuDNN run (masks.REGULAR_MASKS)."""
        return type(self).native_form is not Pattern.native_form

    @property
    def has_fa4_mask_mod(self) -> bool:
        return self.fa4_mod is not None


def _kind(causal: bool) -> str:
    """The slice kind, the predicate and the native window of attention inside one span (the
    whole sequence, or one document): bidirectional or causal."""
    return "causal" if causal else "full"


def _within(causal: bool):
    return P.causal() if causal else P.full()


def _window(causal: bool) -> tuple:
    return (-1, 0) if causal else (-1, -1)


class Full(Pattern):
    name = "full"
    causal = False

    def predicate(self, seqlen, params, device):
        return _within(self.causal)

    def slices(self, seqlen, params):
        return [Slice(0, seqlen, 0, seqlen, _kind(self.causal))]

    def native_form(self, seqlen, params):
        return NativeForm((seqlen,), self.causal, _window(self.causal))


class Causal(Full):
    name = "causal"
    causal = True


class Documents(Pattern):
    """Base for masks over packed documents drawn from the dataset histogram."""

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
        return P.in_documents(_within(self.causal), *self.docs(params, device))

    def slices(self, seqlen, params):
        return [
            Slice(a, b, a, b, _kind(self.causal)) for a, b in _doc_bounds(params["doc_lengths"])
        ]

    def native_form(self, seqlen, params):
        return NativeForm(tuple(params["doc_lengths"]), self.causal, _window(self.causal))


class CausalDocument(FullDocument):
    name = "causal_document"
    causal = True


class LongDocuments:
    """CP variants: 40% dataset documents, 60% long uniform ones (docs/masks.md)."""

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


class SlidingWindow(Pattern):
    name = "sliding_window"
    cfg_keys = ("window",)

    def check_features(self, cfg):
        """A window one key too wide shows only where a row sees more than 2w + 1 keys."""
        w = cfg["window"]
        return [(f"two windows plus one (2 x window {w} + 1)", 2 * w + 1)]

    def sample(self, seqlen, cfg, rng, histograms):
        return {"window": int(cfg["window"])}

    def check(self, seqlen, cfg):
        if int(cfg.get("window", -1)) < 0:
            raise ValueError(
                f"{self.name} needs mask_params.window >= 0, got {cfg.get('window')!r}"
            )

    def predicate(self, seqlen, params, device):
        return P.band(P.scalar(params["window"], device))

    def slices(self, seqlen, params):
        return band_slices(0, seqlen, params["window"])

    def native_form(self, seqlen, params):
        w = params["window"]
        return NativeForm((seqlen,), False, (w, w))


class SlidingWindowCausal(SlidingWindow):
    name = "sliding_window_causal"

    def predicate(self, seqlen, params, device):
        return P.causal_band(P.scalar(params["window"], device))

    def slices(self, seqlen, params):
        return causal_band_slices(0, seqlen, params["window"])

    def native_form(self, seqlen, params):
        return NativeForm((seqlen,), True, (params["window"], 0))


def share_question_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars=None):
    """(doc(j) == 0 and doc(i) != 0) or (doc(i) == doc(j) and j <= i)"""
    dq, dk = _at(aux_tensors[0], q), _at(aux_tensors[0], kv)
    return ((dk == 0) & (dq != 0)) | ((dq == dk) & (kv <= q))


class ShareQuestion(Documents):
    """Document 0 is a question every later answer sees; causal inside each document."""

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
        bounds = _doc_bounds(params["doc_lengths"])
        c1 = bounds[0][1]
        out = [Slice(a, b, a, b, "causal") for a, b in bounds]
        out.append(Slice(c1, seqlen, 0, c1, "full"))
        return nonempty(out)

    def fa4_mask_mod(self, seqlen, params):
        return MaskMod(self.fa4_mod, aux=lambda doc, pos: (doc,))


def causal_blockwise_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """(doc(i) == n-1 and j < c) or (doc(i) == doc(j) and j <= i), where c is the last
    document's start. doc(i) == n-1 is i >= c for i < S."""
    c = aux_scalars[0]
    same = _at(aux_tensors[0], q) == _at(aux_tensors[0], kv)
    return ((q >= c) & (kv < c)) | (same & (kv <= q))


class CausalBlockwise(Documents):
    """The last document (the test example) sees everything; the others are causal in themselves."""

    name = "causal_blockwise"
    fa4_mod = staticmethod(causal_blockwise_mod)

    def predicate(self, seqlen, params, device):
        doc_id, doc_start = self.docs(params, device)
        last = len(params["doc_lengths"]) - 1
        last_start = seqlen - params["doc_lengths"][-1]
        sees_all = lambda q, k: (doc_id[q] == last) & (k < last_start)  # noqa: E731
        return P.any_of(sees_all, P.in_documents(P.causal(), doc_id, doc_start))

    def slices(self, seqlen, params):
        bounds = _doc_bounds(params["doc_lengths"])
        last_start = bounds[-1][0]
        out = [Slice(a, b, a, b, "causal") for a, b in bounds]
        out.append(Slice(last_start, seqlen, 0, last_start, "full"))
        return nonempty(out)

    def fa4_mask_mod(self, seqlen, params):
        last_start = seqlen - params["doc_lengths"][-1]
        return MaskMod(self.fa4_mod, (last_start,), lambda doc, pos: (doc,))


def prefix_lm_causal_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """j < P or j <= i"""
    return (kv < aux_scalars[0]) | (kv <= q)


class PrefixLMCausal(Pattern):
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
    return (_at(doc, q) == _at(doc, kv)) & ((_at(pos, kv) < aux_scalars[0]) | (kv <= q))


class PrefixLMDocument(Documents):
    """Per document, a bidirectional prefix of min(P, len(doc)) tokens, causal after it."""

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
        for a, b in _doc_bounds(params["doc_lengths"]):
            p = min(params["prefix"], b - a)
            out += [Slice(a, a + p, a, a + p, "full"), Slice(a + p, b, a, b, "causal")]
        return nonempty(out)

    def fa4_mask_mod(self, seqlen, params):
        return MaskMod(self.fa4_mod, (params["prefix"],), lambda doc, pos: (doc, pos))


def global_sliding_window_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """|i - j| <= w or i < g or j < g"""
    w, g = aux_scalars
    return ((q - kv <= w) & (kv - q <= w)) | (q < g) | (kv < g)


class GlobalSlidingWindow(Pattern):
    """A band of half-width w, plus g = 2w global tokens that see and are seen by all."""

    name = "global_sliding_window"
    fa4_mod = staticmethod(global_sliding_window_mod)
    sample_class = "document"  # a window drawn per sample
    cfg_keys = ("window_fraction",)

    def check(self, seqlen, cfg):
        check_fraction(self.name, cfg, "window_fraction", most=1 / 3)

    def sample(self, seqlen, cfg, rng, histograms):
        bounds = fraction_bounds(cfg, "window_fraction")
        if bounds is None:
            # Paper: w uniform in 1..floor(S/3)-1; below S = 6 that range is empty, so w = 1.
            w = int(rng.integers(1, max(1, seqlen // 3 - 1) + 1))
        else:
            w = drawn_length(seqlen, bounds, rng, most=max(1, seqlen // 3 - 1))
        return {"window": w, "global_tokens": 2 * w}

    def predicate(self, seqlen, params, device):
        g = P.scalar(params["global_tokens"], device)
        return P.any_of(
            P.band(P.scalar(params["window"], device)),
            lambda q, k: q < g,
            lambda q, k: k < g,
        )

    def slices(self, seqlen, params):
        g = min(params["global_tokens"], seqlen)
        out = [Slice(0, g, 0, seqlen, "full"), Slice(g, seqlen, 0, g, "full")]
        out += band_slices(g, seqlen - g, params["window"])
        return nonempty(out)

    def fa4_mask_mod(self, seqlen, params):
        return MaskMod(self.fa4_mod, (params["window"], params["global_tokens"]))


def block_causal_document_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars=None):
    """doc(i) == doc(j) and blk(j) <= blk(i), where blk = pos // b."""
    doc, blk = aux_tensors
    return (_at(doc, q) == _at(doc, kv)) & (_at(blk, kv) <= _at(blk, q))


class BlockCausalDocument(Documents):
    """Per document: bidirectional inside blocks of b tokens, causal across blocks."""

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
        for a, e in _doc_bounds(params["doc_lengths"]):
            for q0 in range(a, e, b):
                q1 = min(q0 + b, e)
                out.append(Slice(q0, q1, a, q1, "full"))
        return out

    def fa4_mask_mod(self, seqlen, params):
        # blk = pos // b, precomputed so that the kernel needs no division
        return MaskMod(self.fa4_mod, aux=lambda doc, pos: (doc, pos // params["block"]))


STATIC_PATTERNS = {
    p.name: p
    for p in (
        Full(),
        Causal(),
        FullDocument(),
        CausalDocument(),
        SlidingWindow(),
        SlidingWindowCausal(),
        ShareQuestion(),
        CausalBlockwise(),
        PrefixLMCausal(),
        PrefixLMDocument(),
        GlobalSlidingWindow(),
        BlockCausalDocument(),
    )
}
CP_PATTERNS = {p.name: p for p in (FullDocumentLong(), CausalDocumentLong())}
