"""`local`: the bare local kernel over the whole sequence on one device, the baseline of cp_vs_single_gpu.

No CP framework around the kernel: no padding, no sharding, no float32 accumulator, no LSE merge,
no copies into communication buffers. One call of the same local kernel the methods call
(kernels/local_kernel.py, with one rectangle per document), on the same rows, heads, mask and direction,
so that a method's share of it is what context parallelism costs. One rank only
(catalog.degrees refuses more).
"""

from __future__ import annotations

import numpy as np

from ..masks.ranges import Slice
from .base import CPMethod
from .chunks import Chunk, document_lengths, is_causal


def whole_sequence_chunk(mask) -> Chunk:
    """Every document's rows against its own rows (causal or full), in place: the rectangles tile
    the sequence, so a varlen kernel gathers nothing."""
    causal = is_causal(mask.name)
    kind = "causal" if causal else "full"
    segs, o = [], 0
    for n in document_lengths(mask):
        segs.append(Slice(o, o + n, o, o + n, kind))
        o += n
    pos = np.arange(mask.seqlen)
    return Chunk(mask.seqlen, mask.seqlen, segs, causal, pos, pos)


class BareKernel(CPMethod):
    def __init__(self, info, rc, mask, heads_q, heads_kv, head_dim, dtype):
        super().__init__(info, rc, mask, heads_q, heads_kv, head_dim, dtype)
        if rc.deg.world != 1:
            raise ValueError(f"{info.name} runs on one rank, not {rc.deg.world}")
        self.chunk = whole_sequence_chunk(mask)
        self.positions = np.arange(mask.seqlen)
        self.saved = None

    def setup(self, backward: bool):
        pass  # nothing persistent: no transfers

    def forward(self, q, k, v):
        out = lse = None
        if self.guard.go:
            with self.guard:
                out, lse = self.rc.kernel.forward(q, k, v, self.chunk)
        self.saved = (q, k, v, out, lse)
        return out, lse

    def backward(self, dout):
        q, k, v, out, lse = self.saved
        if self.guard.go:
            with self.guard:
                # no finite_lse() here (the methods need it for rows that see nothing): every row
                # sees at least its own key, so no LSE is -inf
                grads = self.rc.kernel.backward(dout, q, k, v, out, lse, self.chunk)
                # the math kernel gives float32 gradients; the others the input dtype (no copy)
                return tuple(g.to(self.dtype) for g in grads)
        return None

    def volume(self, direction: str) -> dict:
        return {"sent": 0, "received": 0, "by_kind": {}}

    def work(self) -> int:
        return self.chunk.area * self.hq

    def describe(self) -> dict:
        return {"documents": len(self.chunk.segments)}
