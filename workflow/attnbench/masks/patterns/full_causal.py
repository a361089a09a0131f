"""Full and causal attention over the whole sequence (figure family full_causal)."""

from __future__ import annotations

from ..ranges import Slice
from .base import NativeForm, Pattern, span_kind, span_window, within


class Full(Pattern):
    figure_family = "full_causal"
    name = "full"
    causal = False

    def predicate(self, seqlen, params, device):
        return within(self.causal)

    def slices(self, seqlen, params):
        return [Slice(0, seqlen, 0, seqlen, span_kind(self.causal))]

    def native_form(self, seqlen, params):
        return NativeForm((seqlen,), self.causal, span_window(self.causal))


class Causal(Full):
    name = "causal"
    causal = True
