"""torch.nn.functional.scaled_dot_product_attention, one kernel per forced backend.

full and causal use the native arguments; any other mask goes in as a dense boolean mask,
only where the backend accepts one (a backend that refuses gives `unsupported`, never a
different computation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .base import Kernel


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
