"""FlashAttention 2, 3 and 4: dense calls for one sequence, varlen calls for packed documents.

All three take the FlashAttention form of a mask: documents (cu_seqlens), causal, and a window
(left, right) where -1 (None for FA4) is unbounded. Masks without that form are `unsupported`.
"""

from __future__ import annotations

import os

from .base import Kernel
from .varlen import cu_seqlens

# by name: FA4's varlen function takes `qv` where FA2/FA3 take cu_seqlens_q
VARLEN_KEYWORDS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def _first(out):
    """FA3/FA4 return (out, lse) in some releases and out in others."""
    return out[0] if isinstance(out, (tuple, list)) else out


def flash_call_args(form, device, unbounded=-1):
    """(dense kwargs, varlen positional args or None) for a NativeForm."""
    left, right = form.window
    window = (unbounded if left < 0 else left, unbounded if right < 0 else right)
    if form.causal:
        window = (window[0], 0)
    kwargs = {"causal": form.causal, "window_size": window}
    if len(form.doc_lengths) == 1:
        return kwargs, None
    cu = cu_seqlens(form.doc_lengths, device)
    longest = max(form.doc_lengths)
    return kwargs, (cu, cu, longest, longest)


class FlashFamily(Kernel):
    layout = "thd"
    unbounded = -1

    def functions(self):
        """(dense function, varlen function) of the library."""
        raise NotImplementedError

    def prepare(self, mask):
        form = self.half_precision_form(mask)
        dense, varlen = self.functions()
        kwargs, var_args = flash_call_args(form, self.device, self.unbounded)
        if var_args is None:
            return lambda q, k, v: _first(
                dense(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), **kwargs)
            )[0]
        named = dict(zip(VARLEN_KEYWORDS, var_args))
        return lambda q, k, v: _first(varlen(q, k, v, **named, **kwargs))


class FA2(FlashFamily):
    def functions(self):
        lib = self.import_library("flash_attn")
        return lib.flash_attn_func, lib.flash_attn_varlen_func


class FA3(FlashFamily):
    def functions(self):
        """The full FA3 where installed, else fa3-fwd's forward-only build (same call signatures;
        the catalog's build limits have already refused what that build lacks)."""
        from .catalog import FA3_FORWARD_ONLY, FA3_FULL, findable

        lib = self.import_library(findable(f"{FA3_FULL}|{FA3_FORWARD_ONLY}") or FA3_FULL)
        return lib.flash_attn_func, lib.flash_attn_varlen_func


class FA4(FlashFamily):
    unbounded = None
    # FA4 compiles each kernel variant at its first call (CuTe DSL JIT, seconds each); its own disk
    # cache, off by default, lets the next cell's process load it instead (read at its import)
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")

    def functions(self):
        lib = self.import_library("flash_attn.cute")
        return lib.flash_attn_func, lib.flash_attn_varlen_func
