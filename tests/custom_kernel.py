"""A kernel from outside the package, as a user writes one (README, "Your own kernel"): attention
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
        colour="#17becf",
        marker="X",
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
