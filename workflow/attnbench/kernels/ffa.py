"""MagiAttention's Flex-Flash-Attention (FFA): any mask as (query range, key range, type) slices.

`flex_flash_attn_func(q, k, v, q_ranges, k_ranges, attn_type_map)` on [tokens, heads, D] tensors
(native GQA) takes a mask as slices whose types are exactly the four kinds of masks/ranges.py:
0 full, 1 causal (bottom-right aligned), 2 inverse causal (top-left), 3 bidirectional causal
(both). Every static mask's own slices (mask.slices(), which tests check against its predicate)
go in as they are; their pairs are disjoint, so each visible pair is computed once. The record's
notes carry the number of slices (`ffa_slices`).

FFA loads a kernel variant from its package's lib/ folder when the wheel holds it (envs/
build_magi_attention.sh compiles the bf16 head-dim-128 ones there), else compiles it at first use
(sm90a) into MagiAttention's own cache, kept between cells. Block-sparse masks differ per head, which one slice list does not say: unsupported.
"""

from __future__ import annotations

import torch

from ..masks.ranges import nonempty
from .base import Kernel

FFA_TYPES = {"full": 0, "causal": 1, "inv_causal": 2, "bi_causal": 3}


def ffa_ranges(mask, device="cpu"):
    """(q_ranges [n, 2], k_ranges [n, 2], attn_type_map [n]) int32 of the mask's slices."""
    slices = nonempty(mask.slices())
    q = torch.tensor([[s.q0, s.q1] for s in slices], dtype=torch.int32, device=device)
    k = torch.tensor([[s.k0, s.k1] for s in slices], dtype=torch.int32, device=device)
    kinds = torch.tensor([FFA_TYPES[s.kind] for s in slices], dtype=torch.int32, device=device)
    return q.view(-1, 2), k.view(-1, 2), kinds


def decode_ffa(q_ranges, k_ranges, types, seqlen):
    """The dense visible matrix FFA's documented semantics give these slices (for tests)."""
    vis = torch.zeros(seqlen, seqlen, dtype=torch.bool)
    for (q0, q1), (k0, k1), t in zip(q_ranges.tolist(), k_ranges.tolist(), types.tolist()):
        r = torch.arange(q1 - q0).view(-1, 1)
        c = torch.arange(k1 - k0).view(1, -1)
        causal = c <= r + (k1 - k0) - (q1 - q0)
        inverse = c >= r
        block = {0: torch.ones_like(causal), 1: causal, 2: inverse, 3: causal & inverse}[t]
        vis[q0:q1, k0:k1] |= block
    return vis


class FFA(Kernel):
    layout = "thd"

    def prepare(self, mask):
        if mask.sparse:
            self.unsupported("block-sparse masks differ per head; one slice list holds one mask")
        if self.dtype not in (torch.float16, torch.bfloat16):
            self.unsupported(f"needs float16 or bfloat16, got {self.dtype}")
        lib = self.import_library("magi_attention.functional.flex_flash_attn")
        q_ranges, k_ranges, types = ffa_ranges(mask, self.device)
        self.load_notes["ffa_slices"] = int(types.numel())
        longest = int((q_ranges[:, 1] - q_ranges[:, 0]).max())
        return lambda q, k, v: lib.flex_flash_attn_func(
            q, k, v, q_ranges, k_ranges, types, max_seqlen_q=longest
        )[0]
