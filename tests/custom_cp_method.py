"""A context-parallel method from outside the package, as a user writes one (docs/extending.md, "Your own CP
method"): all-gather K and V over contiguous shards. Rank r holds the r-th contiguous M = ceil(S/N)
tokens (the last rank's tail is padding); the forward all-gathers every rank's K and V once and
computes the rank's queries against the keys they see, one local-kernel call; the backward
computes dq and the rank's share of every dK, dV from the gathered K and V, and reduce-scatters
those (in the accumulator's dtype) back to their shards. No load balancing: under a causal mask
the last rank does most of the work (its record's load_balance says how much). A grid names it
as `tests.custom_cp_method:ContiguousAllGather`."""

import numpy as np
import torch
from attnbench.cp.base import CPMethod
from attnbench.cp.catalog import RING, MethodInfo
from attnbench.cp.chunks import Chunk, document_lengths, is_causal
from attnbench.masks.ranges import Slice


def contiguous_chunk(mask, rank: int, shard: int, world: int) -> Chunk:
    """The rank's rows [rank x shard, (rank + 1) x shard) against the gathered keys (every rank's
    shard in rank order, so local key row = global position): one rectangle per document that
    the rows meet, causal (bottom-right aligned) or full."""
    causal = is_causal(mask.name)
    lo, hi = rank * shard, min((rank + 1) * shard, mask.seqlen)
    segments, start = [], 0
    for n in document_lengths(mask):
        a, b = max(start, lo), min(start + n, hi)  # the document's rows held here
        if a < b:
            keys = (start, b) if causal else (start, start + n)
            segments.append(Slice(a - lo, b - lo, *keys, "causal" if causal else "full"))
        start += n
    q_pos = np.arange(lo, lo + shard)
    k_pos = np.arange(shard * world)
    q_pos[q_pos >= mask.seqlen] = -1
    k_pos[k_pos >= mask.seqlen] = -1
    return Chunk(shard, shard * world, segments, causal, q_pos, k_pos)


class ContiguousAllGather(CPMethod):
    info = MethodInfo(
        name="allgather_contiguous",
        summary="all-gather K and V over contiguous shards, one local call, dK/dV reduce-scattered",
        impl="tests.custom_cp_method:ContiguousAllGather",
        devices=("cpu", "cuda"),
        label="AllGather, contiguous shards",
        colour="#a6761d",
        marker="p",
        layout=RING,  # U = 1, R = N: every rank holds one contiguous shard
    )

    def __init__(self, info, rc, mask, heads_q, heads_kv, head_dim, dtype):
        super().__init__(info, rc, mask, heads_q, heads_kv, head_dim, dtype)
        self.N = rc.deg.ring
        self.r, _ = rc.deg.coords(rc.rank)
        self.M = -(-mask.seqlen // self.N)
        self.chunk = contiguous_chunk(mask, self.r, self.M, self.N)
        self.positions = self.chunk.q_pos
        self.saved = None

    def setup(self, backward: bool):
        M, h, D = self.M, self.hkv, self.d
        self.kv0 = self.empty(2, M, h, D)
        self.gathered = self.empty(self.N, 2, M, h, D)
        if backward:
            self.dkv_shards = self.empty(self.N, 2, M, h, D, dtype=self.acc)
            self.dkv_local = self.empty(2, M, h, D, dtype=self.acc)

    def _global_kv(self):
        return (
            self.gathered[:, 0].reshape(-1, self.hkv, self.d),
            self.gathered[:, 1].reshape(-1, self.hkv, self.d),
        )

    def forward(self, q, k, v):
        g = self.guard
        if g.go:
            with g:
                self.kv0[0].copy_(k)
                self.kv0[1].copy_(v)
        self.comm.all_gather(self.gathered, self.kv0, self.rc.groups.ring, "all_gather")
        out = lse = None
        if g.go:
            with g:
                out, lse = self.rc.kernel.forward(q, *self._global_kv(), self.chunk)
        self.saved = (q, out, lse)
        return out, lse

    def backward(self, dout):
        g, (q, out, lse) = self.guard, self.saved
        grads = None
        if g.go:
            with g:  # the K and V gathered by the forward: nothing travels again
                kg, vg = self._global_kv()
                grads = self.rc.kernel.backward_whole(dout, q, kg, vg, out, lse, self.chunk)
                shards = self.dkv_shards.view(self.N, 2, self.M * self.hkv * self.d)
                shards[:, 0] = grads[1].to(self.acc).reshape(self.N, -1)
                shards[:, 1] = grads[2].to(self.acc).reshape(self.N, -1)
        self.comm.reduce_scatter(
            self.dkv_local, self.dkv_shards, self.rc.groups.ring, "reduce_scatter"
        )
        if g.go:
            with g:
                dk, dv = self.dkv_local.to(self.dtype)
                return grads[0].to(self.dtype), dk, dv
        return None

    def volume(self, direction: str) -> dict:
        """The ring algorithm's volume (comm.Comm counts it so): N - 1 shards of K and V in the
        forward's all-gather, N - 1 shards of dK and dV (accumulator dtype) in the backward's
        reduce-scatter."""
        shard = 2 * self.M * self.hkv * self.d * (self.N - 1)
        acc = torch.empty((), dtype=self.acc).element_size()
        parts = {}
        if direction in ("fwd", "fwdbwd"):
            parts["all_gather"] = shard * self.elem
        if direction in ("bwd", "fwdbwd"):
            parts["reduce_scatter"] = shard * acc
        parts = {k: v for k, v in parts.items() if v}
        return {"sent": sum(parts.values()), "received": sum(parts.values()), "by_kind": parts}

    def work(self) -> int:
        return self.chunk.area * self.hq

    def describe(self) -> dict:
        return {"shard_len": self.M, "shard_rank": self.r}
