"""FlashAttention 2, 3 and 4: dense calls for one sequence, varlen calls for packed documents.

All three take the FlashAttention form of a mask: documents (cu_seqlens), causal, and a window
(left, right) where -1 (None for FA4) is unbounded. Masks without that form are `unsupported`
for FA2 and FA3; FA4 runs them as mask_mods (fa4_mask_mod.py).

Also FA2's and FA3's CP local kernels (local_kernel.py's protocol). Their LSE, converted to the
protocol's [Hq, rows] natural-log float32 (tests/cp/test_cp_kernels.py checks it against float64):
  fa2  flash_attn's _flash_attn_forward: (1, Hq, s); _flash_attn_varlen_forward: (Hq, total_q);
       natural log, unpadded (flash-attn 2.8); the backwards take the same.
  fa3  FlashAttention-3's flash_attn_func / flash_attn_varlen_func (the full FA3, else fa3-fwd's
       forward-only build): (1, Hq, s) / (Hq, total_q), natural log (the kernel works in log2
       inside and returns ln). Its backward is FA3's own (flash_attn_interface._flash_attn_backward,
       the full build only), given the same LSE: one call per chunk, documents through
       cu_seqlens, as FA2's.
Both have native GQA (K/V with fewer heads go in as they are) and causal bottom-right per
rectangle (FlashAttention's varlen convention).
"""

from __future__ import annotations

import importlib
import inspect
import os

import torch

from .base import Kernel
from .fa4_mask_mod import MASK_MODS, TILE, block_sparse_tensors, mask_mod_for
from .libraries import findable
from .local_kernel import PackedKernel
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
        from .libraries import FA3_FORWARD_ONLY, FA3_FULL

        lib = self.import_library(findable(f"{FA3_FULL}|{FA3_FORWARD_ONLY}") or FA3_FULL)
        return lib.flash_attn_func, lib.flash_attn_varlen_func


class FA4(FlashFamily):
    """The native causal/window/varlen form where a mask has one (the faster path); else the
    mask's mask_mod with its 128 x 128 tile lists (fa4_mask_mod.py), on one batch-1 sequence.
    The record's notes say which ran (`fa4_form`)."""

    unbounded = None
    # FA4 compiles each kernel variant at its first call (CuTe DSL JIT, seconds each); its own disk
    # cache, off by default, lets the next cell's process load it instead (read at its import)
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")

    def functions(self):
        lib = self.import_library("flash_attn.cute")
        return lib.flash_attn_func, lib.flash_attn_varlen_func

    def prepare(self, mask):
        if mask.native_form() is not None or mask.name not in MASK_MODS:
            fn = super().prepare(mask)
            self.load_notes["fa4_form"] = "native"
            return fn
        if self.dtype not in (torch.float16, torch.bfloat16):
            self.unsupported(f"needs float16 or bfloat16, got {self.dtype}")
        dense, _ = self.functions()
        tensors = self.import_library("flash_attn.cute.block_sparsity").BlockSparseTensorsTorch
        kwargs = mask_mod_kwargs(mask, self.device, tensors)
        self.load_notes["fa4_form"] = "mask_mod"
        return lambda q, k, v: _first(dense(q[None], k[None], v[None], **kwargs))[0]


def mask_mod_kwargs(mask, device, tensors) -> dict:
    """FA4's keywords for `mask` as a mask_mod: no causal/window (with a mask_mod FA4's backward
    would still apply them), aux tensors and run-time scalars, and the forward's and backward's
    tile lists as `tensors` (FA4's BlockSparseTensorsTorch) of TILE x TILE blocks."""
    fwd, bwd = block_sparse_tensors(mask, device, TILE)
    return {
        "causal": False,
        **mask_mod_for(mask, device).fa4_kwargs(),
        "block_sparse_tensors": tensors(**fwd, block_size=(TILE, TILE)),
        "block_sparse_tensors_bwd": tensors(**bwd, block_size=(TILE, TILE)),
    }


# ---------------------------------------------------------------- the CP local kernels


class FA2Local(PackedKernel):
    """flash_attn.flash_attn_interface: _flash_attn_forward / _flash_attn_backward for one
    rectangle (batch 1), _flash_attn_varlen_forward / _backward (int32 cu_seqlens) for several."""

    _fa2 = None

    def fa2(self):
        """flash_attn's interface module, imported at first use (fa3's forward does not need it)."""
        if self._fa2 is None:
            self._fa2 = importlib.import_module("flash_attn.flash_attn_interface")
        return self._fa2

    def packed_forward(self, q, k, v, vl, causal):
        fa, common = self.fa2(), self._common(causal)
        if vl.single:
            out, lse, _, _ = fa._flash_attn_forward(
                q[None], k[None], v[None], **common, return_softmax=False
            )
            return out[0], lse
        out, lse, _, _ = fa._flash_attn_varlen_forward(
            q, k, v, vl.cu_q, vl.cu_k, vl.max_q, vl.max_k, **common, return_softmax=False
        )
        return out, lse

    def packed_backward(self, dout, q, k, v, out, lse, vl, causal):
        fa, common = self.fa2(), self._common(causal)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        extra = {"deterministic": False, "rng_state": None}
        if vl.single:
            args = (x[None] for x in (dout, q, k, v, out, lse, dq, dk, dv))
            fa._flash_attn_backward(*args, **common, **extra)
        else:
            fa._flash_attn_varlen_backward(
                dout,
                q,
                k,
                v,
                out,
                lse,
                dq,
                dk,
                dv,
                vl.cu_q,
                vl.cu_k,
                vl.max_q,
                vl.max_k,
                **common,
                **extra,
            )
        return dq, dk, dv

    def _common(self, causal) -> dict:
        """The keywords every FA2 entry point takes: no dropout, no window, no softcap, no ALiBi."""
        return {
            "dropout_p": 0.0,
            "softmax_scale": self.scale,
            "causal": causal,
            "window_size_left": -1,
            "window_size_right": -1,
            "softcap": 0.0,
            "alibi_slopes": None,
        }


class FA3Local(FA2Local):
    """FlashAttention-3's forward with the LSE (flash_attn_interface, else fa3_fwd_interface) and
    the full build's own backward (module docstring)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        module = findable(self.info.modules[0])
        if module is None:
            raise ImportError(f"{self.name}: none of {self.info.modules[0]} is installed")
        self.fa3 = importlib.import_module(module)

    def packed_forward(self, q, k, v, vl, causal):
        if vl.single:
            out, lse = self._with_lse(
                self.fa3.flash_attn_func, q[None], k[None], v[None], causal=causal
            )
            return out[0], lse
        return self._with_lse(
            self.fa3.flash_attn_varlen_func,
            q,
            k,
            v,
            vl.cu_q,
            vl.cu_k,
            vl.max_q,
            vl.max_k,
            causal=causal,
        )

    def packed_backward(self, dout, q, k, v, out, lse, vl, causal):
        """_flash_attn_backward(dout, q, k, v, out, lse, cu_q, cu_k, seqused_q, seqused_k,
        max_q, max_k, dq, dk, dv, ...): batch-1 tensors for one rectangle, packed rows with
        cu_seqlens for several; it writes dq, dk, dv."""
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        kw = {"softmax_scale": self.scale, "is_causal": causal}
        if vl.single:
            args = [x[None] for x in (dout, q, k, v, out)] + [lse]
            bufs = [x[None] for x in (dq, dk, dv)]
            self.fa3._flash_attn_backward(*args, None, None, None, None, None, None, *bufs, **kw)
        else:
            self.fa3._flash_attn_backward(
                dout, q, k, v, out, lse, vl.cu_q, vl.cu_k, None, None, vl.max_q, vl.max_k,
                dq, dk, dv, **kw,
            )  # fmt: skip
        return dq, dk, dv

    def _with_lse(self, fn, *args, causal):
        """(out, lse): releases return them as a tuple, or only out unless asked (return_attn_probs)."""
        kw = {"softmax_scale": self.scale, "causal": causal}
        if "return_attn_probs" in inspect.signature(fn).parameters:
            kw["return_attn_probs"] = True
        res = fn(*args, **kw)
        if not isinstance(res, (tuple, list)) or len(res) < 2:
            raise RuntimeError(
                f"{self.name}: {fn.__module__}.{fn.__name__} returned no LSE (got {type(res).__name__})"
            )
        return res[0], res[1]
