"""MIT Han Lab Block-Sparse-Attention (module `block_sparse_attn`, FlashAttention-2 based).

block_sparse_attn_func(q, k, v, cu_seqlens_q, cu_seqlens_k, head_mask_type, streaming_info,
base_blockmask, max_seqlen_q, max_seqlen_k, p_dropout, ...) with packed q [S, Hq, D] and
k/v [S, Hkv, D] (GQA native), 128-token blocks, one block mask per query head
(head_mask_type 1 = block-sparse). The library converts the block mask to its row-index form
inside each call: that work is part of its timing (the backward converts the transposed mask the
same way). Its backward is autograd through the library's own function; the paper measured the
forward only. Not on PyPI: envs/build_block_sparse_attn.sh builds the wheel.
"""

from __future__ import annotations

from .base import Kernel

FA2_SPARSE_BLOCK = 128


def call_arguments(mask, heads_q: int, device="cpu") -> dict:
    """Keyword arguments (after q, k, v) of block_sparse_attn_func for this mask."""
    import torch

    lay = mask.layout()
    per = heads_q // lay.groups
    s = mask.seqlen
    cu = torch.tensor([0, s], dtype=torch.int32, device=device)
    return {
        "cu_seqlens_q": cu,
        "cu_seqlens_k": cu.clone(),
        "head_mask_type": torch.ones(
            heads_q, dtype=torch.int32, device=device
        ),  # every head block-sparse
        "streaming_info": torch.zeros(
            2 * heads_q, dtype=torch.int32, device=device
        ),  # unused by sparse heads
        "base_blockmask": lay.keep.repeat_interleave(per, dim=0)
        .unsqueeze(0)
        .to(device),  # [1, Hq, nrb, ncb]
        "max_seqlen_q_": s,
        "max_seqlen_k_": s,
        "p_dropout": 0.0,
        "deterministic": False,
        "softmax_scale": None,  # the library's default, 1 / sqrt(D)
        "is_causal": False,
        "exact_streaming": False,
        "return_attn_probs": False,
    }


class FA2BlockSparse(Kernel):
    layout = "thd"

    def prepare(self, mask):
        self.require_blocks(mask, FA2_SPARSE_BLOCK)
        block_sparse_attn_func = self.import_library("block_sparse_attn").block_sparse_attn_func
        args = call_arguments(mask, self.heads_q, self.device)
        return lambda q, k, v: block_sparse_attn_func(q, k, v, **args)
