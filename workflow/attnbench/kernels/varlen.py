"""PyTorch's own varlen attention (torch.nn.attention.varlen.varlen_attn, FA2 code, cu_seqlens).

Its keywords change between releases (2.11 rejected `is_causal`; 2.13 takes causal as
window_size=(-1, 0) and has enable_gqa), so the call is built from the installed signature and
anything the installed version cannot express is `unsupported`, never approximated.
"""

from __future__ import annotations

import inspect

import torch

from .base import Kernel


def cu_seqlens(doc_lengths, device):
    lengths = torch.tensor([0, *doc_lengths], dtype=torch.int32)
    return torch.cumsum(lengths, 0, dtype=torch.int32).to(device)


def varlen_kwargs(params, form, gqa: bool) -> tuple[dict, str | None]:
    """Keyword arguments for the installed varlen_attn, or (.., reason) when it cannot express `form`."""
    kw = {}
    if gqa:
        if "enable_gqa" not in params:
            return kw, "this varlen_attn has no enable_gqa (GQA)"
        kw["enable_gqa"] = True
    if "window_size" in params:
        left, right = form.window
        kw["window_size"] = (left, 0 if form.causal else right)
    elif form.window not in ((-1, -1), (-1, 0)):
        return kw, "this varlen_attn has no window_size (sliding windows)"
    elif "is_causal" in params:
        kw["is_causal"] = form.causal
    elif form.causal:
        return kw, "this varlen_attn has neither window_size nor is_causal (causal masks)"
    return kw, None


class Varlen(Kernel):
    layout = "thd"

    def prepare(self, mask):
        from torch.nn.attention.varlen import varlen_attn

        form = self.half_precision_form(mask)
        params = inspect.signature(varlen_attn).parameters
        kw, why = varlen_kwargs(params, form, self.gqa)
        if why:
            self.unsupported(why)
        cu = cu_seqlens(form.doc_lengths, self.device)
        longest = max(form.doc_lengths)
        return lambda q, k, v: varlen_attn(q, k, v, cu, cu, longest, longest, **kw)
