"""A kernel from outside the package, as a user writes one (docs/extending.md, "Your own kernel"): attention
computed in blocks of query rows, each block one SDPA call on its rows of the mask. A grid names it
as `tests.custom_kernel:RowBlockSDPA`."""

import torch
import torch.nn.functional as F
from attnbench.kernels.base import Kernel
from attnbench.kernels.catalog import KernelInfo


class RowBlockSDPA(Kernel):
    info = KernelInfo(
        name="row_block_sdpa",
        family="dense",
        summary="SDPA over blocks of 64 query rows",
        impl="tests.custom_kernel:RowBlockSDPA",
        masks=("full", "causal", "causal_document"),
        directions={"cpu": ("fwd", "bwd"), "cuda": ("fwd", "bwd")},
        colour="#b15928",
        marker="o",
    )
    layout = "bhsd"  # q, k, v arrive as [1, heads, S, D]
    rows = 64

    def prepare(self, mask):
        visible = mask.dense(self.device)  # bool [S, S]: may query i see key j

        def attention(q, k, v):
            blocks = [
                F.scaled_dot_product_attention(
                    q[:, :, a : a + self.rows],
                    k,
                    v,
                    enable_gqa=self.gqa,
                    attn_mask=visible[a : a + self.rows],
                )
                for a in range(0, q.shape[2], self.rows)
            ]
            return torch.cat(blocks, dim=2)

        return attention


class _FreesItsGraph(torch.autograd.Function):
    """Attention whose backward drops what the forward saved, as TransformerEngine's fused
    attention does: a second backward of the same forward fails."""

    @staticmethod
    def forward(ctx, q, k, v, visible, gqa):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        with torch.enable_grad():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=gqa)
        ctx.saved = (q, k, v, out)
        return out.detach()

    @staticmethod
    def backward(ctx, dout):
        if ctx.saved is None:
            raise RuntimeError("backward of this forward ran already")
        q, k, v, out = ctx.saved
        ctx.saved = None
        return (*torch.autograd.grad(out, (q, k, v), dout), None, None)


class BackwardOnceSDPA(Kernel):
    info = KernelInfo(
        name="backward_once_sdpa",
        family="dense",
        summary="SDPA whose graph can be differentiated once",
        impl="tests.custom_kernel:BackwardOnceSDPA",
        masks=("causal",),
        directions={"cpu": ("fwd", "bwd"), "cuda": ("fwd", "bwd")},
    )
    layout = "bhsd"
    backward_once = True

    def prepare(self, mask):
        visible = mask.dense(self.device)
        return lambda q, k, v: _FreesItsGraph.apply(q, k, v, visible, self.gqa)
