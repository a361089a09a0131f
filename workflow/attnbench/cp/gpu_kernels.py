"""The GPU libraries as local kernels (the protocol and the packing are in kernels.py).

LSE conventions, converted here to the protocol's [Hq, rows] natural-log float32 (the GPU tests,
tests/cp/test_cp_kernels.py, check every one's LSE against float64):
  sdpa_flash  aten._flash_attention_forward, varlen: (Hq, total_q), natural log; its backward
              takes the same.
  sdpa_cudnn  aten._scaled_dot_product_cudnn_attention: (1, Hq, s, 1), natural log; its backward
              takes that shape (and any out/lse, not only its forward's). Causal is top-left
              aligned, so a bottom-right rectangle with more keys than queries is two calls.
  fa2         flash_attn's _flash_attn_forward: (1, Hq, s); _flash_attn_varlen_forward:
              (Hq, total_q); natural log, unpadded (flash-attn 2.8); the backwards take the same.
  fa3         FlashAttention-3's flash_attn_func / flash_attn_varlen_func (the full FA3, else
              fa3-fwd's forward-only build): (1, Hq, s) / (Hq, total_q), natural log (the kernel
              works in log2 inside and returns ln). Its backward is FA3's own
              (flash_attn_interface._flash_attn_backward, the full build only), given the same
              LSE: one call per chunk, documents through cu_seqlens, as FA2's.
Every call here has native GQA (K/V with fewer heads go in as they are) and causal bottom-right
per rectangle (FlashAttention's varlen convention), except cuDNN as said.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from ..kernels.base import bhsd_view, to_thd
from ..kernels.catalog import findable
from .kernels import PackedKernel, RectangleKernel


class SdpaFlash(PackedKernel):
    """torch.ops.aten._flash_attention_forward / _backward (PyTorch's FlashAttention-2 code) with
    cu_seqlens; causal is bottom-right aligned per sequence; GQA native."""

    def packed_forward(self, q, k, v, vl, causal):
        out, lse, _, _, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, vl.cu_q, vl.cu_k, vl.max_q, vl.max_k, 0.0, causal, False, scale=self.scale
        )
        return out, lse

    def packed_backward(self, dout, q, k, v, out, lse, vl, causal):
        rng_state = torch.zeros(2, dtype=torch.uint64, device=q.device)  # dropout is 0: unused
        unused = torch.empty(0, device=q.device)
        return torch.ops.aten._flash_attention_backward(
            dout,
            q,
            k,
            v,
            out,
            lse,
            vl.cu_q,
            vl.cu_k,
            vl.max_q,
            vl.max_k,
            0.0,
            causal,
            rng_state,
            unused,
            scale=self.scale,
        )


class SdpaCudnn(RectangleKernel):
    """aten._scaled_dot_product_cudnn_attention(compute_log_sumexp=True) and its backward, on
    bhsd views of the thd rows (no copy); `None` for the attention bias (Python's None is the
    undefined tensor the op wants; an empty tensor fails)."""

    philox = None  # (seed, offset) of a forward call: dropout is 0, so their values are unused

    def rect_forward(self, q, k, v, causal):
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(
            bhsd_view(q),
            bhsd_view(k),
            bhsd_view(v),
            None,
            True,
            0.0,
            causal,
            False,
            scale=self.scale,
        )
        self.philox = (res[6], res[7])
        return to_thd(res[0], "bhsd"), res[1]

    def rect_backward(self, dout, q, k, v, out, lse, causal):
        if self.philox is None:
            zero = torch.zeros(1, dtype=torch.int64, device=q.device)
            self.philox = (zero, zero)
        grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            bhsd_view(dout),
            bhsd_view(q),
            bhsd_view(k),
            bhsd_view(v),
            bhsd_view(out),
            lse.reshape(1, q.shape[1], q.shape[0], 1),
            *self.philox,
            None,  # attention bias
            None,  # cum_seq_q, cum_seq_k: dense, not ragged
            None,
            q.shape[0],
            k.shape[0],
            0.0,
            causal,
            scale=self.scale,
        )
        return tuple(to_thd(g, "bhsd") for g in grads)


class FA2(PackedKernel):
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


class FA3(FA2):
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
