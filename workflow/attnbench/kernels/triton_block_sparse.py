"""The project's Triton block-sparse kernel (triton_bsa) on a realised block_sparse mask.

The kept block indices (and their transpose for the backward) are built once in prepare,
outside the timed region, from the mask's layout: O(kept blocks), never S x S. The backward's
mode and tiles at the block size (tuned per GPU, triton_bsa.TUNED) go into the record's notes.
"""

from __future__ import annotations

import math

from .base import Kernel


class TritonBlockSparse(Kernel):
    layout = "bhsd"

    def version(self) -> str:
        import triton

        return f"triton {triton.__version__}"

    def prepare(self, mask):
        from .triton_bsa import BlockIndex, block_sparse_attention, describe_backward

        if mask.name != "block_sparse":
            self.unsupported(f"runs uniform block_sparse masks only, not {mask.name}")
        index = BlockIndex.from_layout(mask.layout(), mask.params["block_size"], self.device)
        scale = 1.0 / math.sqrt(self.head_dim)
        self.load_notes["backward_settings"] = describe_backward(index.block)
        return lambda q, k, v: block_sparse_attention(q, k, v, index, scale)
