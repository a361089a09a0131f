"""What every static mask pattern shares: the Pattern protocol (how a pattern samples its
parameters, its one predicate, its range form, the forms kernels take where it has them), the
native and FlashAttention-4 forms, and the helpers the pattern modules of this package use.

`params` are the realised parameters of one sample (JSON-able); the mask can be rebuilt from
them exactly. `cfg` holds the grid's fixed settings (window, block, long-document mix), the keys
each pattern reads in its `cfg_keys` (the only mask_params a grid may set: grid.expand).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import predicates as P
from ..ranges import Slice


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


def at(aux, idx):
    """aux[idx]: elementwise for CPU index arrays. In the CuTe DSL, idx is a one-element TensorSSA
    and aux a cute.Tensor, read as a scalar and made a TensorSSA again (as FA4's own tests do)."""
    import torch

    if isinstance(idx, (torch.Tensor, np.ndarray)):
        return aux[idx]
    import cutlass
    from flash_attn.cute import utils

    return utils.scalar_to_ssa(aux[idx[0]], cutlass.Int32)


def doc_bounds(doc_lengths):
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


def token_count(key: str, cfg: dict) -> bool:
    """Whether the grid setting `key` holds a number of tokens: a positive integer, not a
    fraction of the length (`*_fraction`, drawn at the check's own length, so it always fits)."""
    v = cfg.get(key)
    return (
        isinstance(v, int) and not isinstance(v, bool) and v > 0 and not key.endswith("_fraction")
    )


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
    # The figure its lengths are drawn in with related masks (report.labels.MASK_FAMILIES, in the
    # order of FAMILY_TITLES in this package); None: a figure of its own
    figure_family: str | None = None

    def check_features(self, cfg) -> list[tuple[str, int]]:
        """(feature, the tokens it needs), from the pattern's own settings by default: blocks
        show only where there are two (CheckShape), and every other setting holding a number of
        tokens (an integer among its cfg_keys, its block and the fractions `*_fraction` aside:
        a window, a sink, a chunk) shows only where a row sees its tokens on both sides and one
        more: 2 x (their sum) + 1. A window one key too wide, say, shows only where a row sees
        more than 2w + 1 keys, and a sink beside a window of w only past w + sink tokens. A
        pattern whose feature needs another length overrides this."""
        out = super().check_features(cfg)
        spans = {k: cfg[k] for k in self.cfg_keys if k != self.block_key and token_count(k, cfg)}
        if spans:
            terms = " + ".join(f"{k} {v}" for k, v in spans.items())
            what = f"two {next(iter(spans))}s" if len(spans) == 1 else "its spans twice"
            terms = terms if len(spans) == 1 else f"({terms})"
            out.append((f"{what} plus one (2 x {terms} + 1)", 2 * sum(spans.values()) + 1))
        return out

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


def span_kind(causal: bool) -> str:
    """The slice kind, the predicate and the native window of attention inside one span (the
    whole sequence, or one document): bidirectional or causal."""
    return "causal" if causal else "full"


def within(causal: bool):
    return P.causal() if causal else P.full()


def span_window(causal: bool) -> tuple:
    return (-1, 0) if causal else (-1, -1)
