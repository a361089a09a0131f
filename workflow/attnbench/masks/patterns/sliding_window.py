"""Sliding windows: a band around the diagonal, bidirectional or causal, and the band with global
tokens (figure family sliding_window)."""

from __future__ import annotations

from .. import predicates as P
from ..ranges import Slice, nonempty
from .base import (
    MaskMod,
    NativeForm,
    Pattern,
    band_slices,
    causal_band_slices,
    check_fraction,
    drawn_length,
    fraction_bounds,
)


class SlidingWindow(Pattern):
    figure_family = "sliding_window"
    name = "sliding_window"
    cfg_keys = ("window",)

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


def global_sliding_window_mod(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """|i - j| <= w or i < g or j < g"""
    w, g = aux_scalars
    return ((q - kv <= w) & (kv - q <= w)) | (q < g) | (kv < g)


class GlobalSlidingWindow(Pattern):
    """A band of half-width w, plus g = 2w global tokens that see and are seen by all."""

    figure_family = "sliding_window"
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
