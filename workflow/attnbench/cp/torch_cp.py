"""PyTorch's own context parallelism (torch.distributed.tensor.experimental.context_parallel)
as a peer baseline: a ring over SDPA (flash / efficient / cuDNN) with all-gather or all-to-all
KV rotation. GPU only; full and causal masks only (SDPA's own arguments). `torch_cp`: SDPA runs
under the backend named by the cell's local kernel (sdpa_flash or sdpa_cudnn), so that it is
compared over the same kernel as our methods; `torch_cp_auto`: SDPA chooses (PyTorch at its best;
the record names the backend SDPA picks for the rank's shapes, torch._fused_sdp_choice).

Its pitfalls (docs/context-parallelism.md): buffers handed to the context are resharded in place,
so here each rank passes its own rows (already in torch's layout: head-tail load balancing,
chunks r and 2N-1-r, for causal; contiguous for full, with load balancing off, which its
non-causal path requires) and sets requires_grad inside the context; the context only carries a
1-D marker of the global length from which it derives its sharding decision. Its transfers are
torch's own: bytes are not counted (recorded as such), its LSE is not returned, and an exception
inside its collectives cannot be drained, so only the process-group timeout bounds a failure.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..kernels.base import bhsd_view, from_thd, to_thd
from ..record.status import Unavailable, Unsupported
from .base import CPMethod
from .catalog import torch_cp_reason

BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}


class TorchCP(CPMethod):
    def __init__(self, info, rc, mask, heads_q, heads_kv, head_dim, dtype):
        super().__init__(info, rc, mask, heads_q, heads_kv, head_dim, dtype)
        if rc.device.type != "cuda":
            raise Unavailable(
                "torch_cp runs only on cuda (context_parallel dispatches SDPA's GPU kernels)"
            )
        from torch.distributed.tensor.experimental import _attention as cp_attention  # noqa: F401

        why = torch_cp_reason(info.name, rc.kernel_name)
        if why:
            raise Unsupported(why)
        self.backend = BACKENDS.get(rc.kernel_name)  # None: SDPA's own choice (torch_cp_auto)
        self.sdpa_choice = None

        n, s = rc.deg.world, mask.seqlen
        self.causal = mask.name == "causal"
        need = 2 * n if self.causal else n
        if s % need:
            raise Unsupported(
                f"torch_cp shards without padding: seqlen {s} must be a multiple of {need}"
            )
        r = rc.rank
        if self.causal:
            c = s // (2 * n)
            self.positions = np.concatenate(
                [np.arange(r * c, (r + 1) * c), np.arange((2 * n - 1 - r) * c, (2 * n - r) * c)]
            )
        else:
            c = s // n
            self.positions = np.arange(r * c, (r + 1) * c)
        self.saved = None

    def _mesh(self):
        groups = self.rc.groups
        if not hasattr(groups, "torch_cp_mesh"):
            from torch.distributed.device_mesh import init_device_mesh

            groups.torch_cp_mesh = init_device_mesh("cuda", (self.rc.deg.world,))
        return groups.torch_cp_mesh

    def _context(self):
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import _cp_options

        marker = torch.zeros(self.mask.seqlen, device=self.device)
        _cp_options.enable_load_balance = self.causal  # the context derives its balancer from this
        return context_parallel(
            self._mesh(), buffers=[marker], buffer_seq_dims=[0], no_restore_buffers={marker}
        )

    def setup(self, backward: bool):
        self._mesh()

    def _backend(self):
        return sdpa_kernel(self.backend) if self.backend is not None else contextlib.nullcontext()

    def forward(self, q, k, v):
        if self.sdpa_choice is None:
            views = [bhsd_view(x) for x in (q, k, v)]
            self.sdpa_choice = SDPBackend(
                torch._fused_sdp_choice(
                    *views, is_causal=self.causal, enable_gqa=self.hq != self.hkv
                )
            ).name
        with self._context(), self._backend():
            leaves = [from_thd(x, "bhsd").requires_grad_(True) for x in (q, k, v)]
            with torch.enable_grad():
                out = F.scaled_dot_product_attention(
                    *leaves, is_causal=self.causal, enable_gqa=self.hq != self.hkv
                )
        self.saved = (leaves, out)
        return to_thd(out.detach(), "bhsd"), None

    def backward(self, dout):
        leaves, out = self.saved
        with self._context(), self._backend():
            grads = torch.autograd.grad(out, leaves, bhsd_view(dout), retain_graph=True)
        return tuple(to_thd(g, "bhsd") for g in grads)

    def volume(self, direction: str) -> dict:
        return {
            "sent": None,
            "received": None,
            "by_kind": {},
            "note": "torch's own transfers are not counted",
        }

    def work(self) -> int:
        s = self.mask.seqlen
        pos = self.positions
        if not self.causal:
            return len(pos) * s * self.hq
        return int(sum(p + 1 for p in pos)) * self.hq

    def describe(self) -> dict:
        return {
            "load_balance": "head-tail" if self.causal else "none",
            "rows": len(self.positions),
            "sdpa_backend": self.backend.name if self.backend is not None else "SDPA's choice",
            # what SDPA picks for this rank's shapes with every backend allowed
            "sdpa_choice": self.sdpa_choice,
        }
