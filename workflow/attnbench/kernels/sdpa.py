"""torch.nn.functional.scaled_dot_product_attention, one kernel per forced backend.

full and causal use the native arguments; any other mask goes in as a dense boolean mask,
only where the backend accepts one (a backend that refuses gives `unsupported`, never a
different computation).

Also the CP local kernels over the same aten entry points (local_kernel.py), each one's LSE
converted to the protocol's [Hq, rows] natural-log form (tests/cp/test_cp_kernels.py checks them
against float64):
  cpu_flash   aten._scaled_dot_product_flash_attention_for_cpu with a dense mask: (1, Hq, s).
  sdpa_flash  aten._flash_attention_forward, varlen: (Hq, total_q), natural log; its backward
              takes the same.
  sdpa_cudnn  aten._scaled_dot_product_cudnn_attention: (1, Hq, s, 1), natural log; its backward
              takes that shape (and any out/lse, not only its forward's). Causal is top-left
              aligned, so a bottom-right rectangle with more keys than queries is two calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .base import Kernel, bhsd_view, to_thd
from .local_kernel import LocalKernel, PackedKernel, RectangleKernel


class SDPA(Kernel):
    layout = "bhsd"
    backend: SDPBackend | None = None
    dense_masks = True

    def prepare(self, mask):
        kwargs = {"enable_gqa": True} if self.gqa else {}
        if mask.name == "causal":
            kwargs["is_causal"] = True
        elif mask.name != "full":
            if not self.dense_masks:
                self.unsupported(f"takes no attention mask, so it cannot run {mask.name}")
            visible = mask.dense(self.device)
            kwargs["attn_mask"] = visible if visible.dim() == 2 else visible.unsqueeze(0)

        def fn(q, k, v):
            if "sdpa_backend" not in self.load_notes:  # once, at the untimed first call
                self.load_notes["sdpa_backend"] = self.backend_chosen(q, k, v, kwargs)
            try:
                if self.backend is None:
                    return F.scaled_dot_product_attention(q, k, v, **kwargs)
                with sdpa_kernel(self.backend):
                    return F.scaled_dot_product_attention(q, k, v, **kwargs)
            except RuntimeError as e:
                if "No available kernel" in str(e):
                    self.unsupported(
                        f"backend {self.backend} refused this call: {str(e).splitlines()[0]}"
                    )
                raise

        return fn

    def backend_chosen(self, q, k, v, kwargs) -> str:
        """The backend this call runs: the forced one, or the one SDPA picks for these inputs
        (torch._fused_sdp_choice, what F.scaled_dot_product_attention dispatches on)."""
        if self.backend is not None:
            return self.backend.name
        choice = torch._fused_sdp_choice(
            q,
            k,
            v,
            kwargs.get("attn_mask"),
            0.0,
            kwargs.get("is_causal", False),
            enable_gqa=kwargs.get("enable_gqa", False),
        )
        return f"{SDPBackend(choice).name} (SDPA's choice on {q.device.type})"


class SDPADefault(SDPA):
    backend = None


class SDPAMath(SDPA):
    backend = SDPBackend.MATH


class SDPAFlash(SDPA):
    backend = SDPBackend.FLASH_ATTENTION
    dense_masks = False


class SDPAEfficient(SDPA):
    backend = SDPBackend.EFFICIENT_ATTENTION


class SDPACudnn(SDPA):
    backend = SDPBackend.CUDNN_ATTENTION


# ---------------------------------------------------------------- the CP local kernels


class CpuFlashLocal(LocalKernel):
    """aten._scaled_dot_product_flash_attention_for_cpu: a real CPU flash kernel that returns the
    logsumexp; the chunk goes in as an additive mask (0 / -inf). The kernel reports lse 0 (not
    -inf) for a row with every key masked, so such rows are set to -inf from the chunk."""

    def _mask(self, chunk, dtype, device):
        cache = chunk.__dict__.setdefault("_cpu_flash_mask", {})
        if dtype not in cache:
            vis = chunk.visible(device)
            cache[dtype] = torch.zeros(vis.shape, dtype=dtype, device=device).masked_fill_(
                ~vis, float("-inf")
            )
        return cache[dtype]

    def _forward(self, q, k, v, chunk):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            bhsd_view(q),
            bhsd_view(k),
            bhsd_view(v),
            attn_mask=self._mask(chunk, q.dtype, q.device),
            scale=self.scale,
        )
        lse = lse[0].to(self.acc).masked_fill(~chunk.rows_with_keys(q.device), float("-inf"))
        return to_thd(out, "bhsd"), lse

    def _backward(self, dout, q, k, v, out, lse, chunk):
        lse_k = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32).unsqueeze(0)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            bhsd_view(dout),
            bhsd_view(q),
            bhsd_view(k),
            bhsd_view(v),
            bhsd_view(out),
            lse_k,
            0.0,
            False,
            attn_mask=self._mask(chunk, q.dtype, q.device),
            scale=self.scale,
        )
        return to_thd(dq, "bhsd"), to_thd(dk, "bhsd"), to_thd(dv, "bhsd")


class SdpaFlashLocal(PackedKernel):
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


class SdpaCudnnLocal(RectangleKernel):
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
