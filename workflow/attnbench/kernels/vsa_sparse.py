"""VSA's block-sparse attention (FastVideo, PyPI `vsa`): `vsa.block_sparse_attn(q, k, v,
block_map, variable_block_sizes) -> (out, lse)`, q/k/v [B, H, S, D], 64-token blocks, as many
KV heads as query heads; ThunderKittens kernels on Hopper (bf16), its Triton port elsewhere.

`import vsa` queries the CUDA device at import time, so it happens in prepare, on the GPU only.
The library turns block_map into index lists inside each call: that work is part of its timing.
"""

from __future__ import annotations

from .base import Kernel

VSA_BLOCK = 64


def vsa_arguments(mask, device="cpu"):
    """(block_map [1, H, nqb, nkb] bool, variable_block_sizes [nb] int32) for this mask: the same
    kept blocks every other kernel of the grid point receives, one map per query head."""
    import torch

    lay = mask.layout()
    per = mask.heads_q // lay.groups
    block_map = lay.keep.repeat_interleave(per, dim=0).unsqueeze(0).to(device)
    sizes = (
        lay.row_bounds[0].diff().to(device=device, dtype=torch.int32)
    )  # tokens per block (all full)
    return block_map, sizes


class VSA(Kernel):
    layout = "bhsd"

    def prepare(self, mask):
        import torch

        self.require_blocks(mask, VSA_BLOCK)
        if self.gqa:
            self.unsupported(
                f"needs as many KV heads as query heads, got {self.heads_q}:{self.heads_kv}"
            )
        if self.dtype != torch.bfloat16:
            self.unsupported(f"its Hopper kernels take bfloat16 only, got {self.dtype}")
        vsa = self.import_library("vsa")
        block_map, sizes = vsa_arguments(mask, self.device)

        def fn(q, k, v):
            out, _lse = vsa.block_sparse_attn(q, k, v, block_map, sizes)
            return out

        return fn
