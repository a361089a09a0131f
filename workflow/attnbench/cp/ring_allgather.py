"""Ring AllGather (Llama-3 style context parallelism).

Forward: all-gather K and V of the R zigzag shards once, reorder them into the global (padded)
order, and compute the rank's two query chunks of every document against the keys they can see:
the document's prefix up to the chunk's end (causal masks) or the whole document. The two
partial results are merged with their LSEs, and the real LSE is returned (the reference returned
an uninitialised one). Backward: all-gather K and V again, compute dq and this rank's
contributions to every dK, dV, and reduce-scatter those (float32) back to their shards.
Volume: (R-1) KV shards forward; (R-1) KV + (R-1) dKV shards backward.
A ring-local layout (every document whole on one rank, layout.ring_local) gathers nothing: one
kernel call over the rank's own documents each way, as DoubleRing does.
"""

from __future__ import annotations

import torch

from ..kernels.lse import finite_lse, new_accumulator
from . import schedule
from .base import ScheduledMethod
from .chunks import allgather_chunks, document_lengths, is_causal, ring_step_chunk
from .layout import ShardLayout


class RingAllGather(ScheduledMethod):
    def __init__(self, info, rc, mask, heads_q, heads_kv, head_dim, dtype):
        super().__init__(info, rc, mask, heads_q, heads_kv, head_dim, dtype)
        self.R = rc.deg.ring
        self.r, _ = rc.deg.coords(rc.rank)
        self.layout = ShardLayout(document_lengths(mask), self.R, 1, rc.deg.split_documents)
        causal = is_causal(mask.name)
        self.local = self.layout.ring_local
        self.chunks = (
            (ring_step_chunk(self.layout, self.r, self.r, causal),)
            if self.local
            else allgather_chunks(self.layout, self.r, causal)
        )
        if not self.local:
            M = self.layout.shard_len
            g = torch.as_tensor(self.layout.gathered_index, device=self.device)
            # rows of K (and V) in the gathered [R, 2, M, ...] buffer, in the padded global order
            self.k_rows = (g // M) * 2 * M + g % M
            self.v_rows = self.k_rows + M
        self.positions = self.layout.piece_positions(self.r, 0)
        self.saved = None

    def setup(self, backward: bool):
        if self.local:
            return
        M, R, h, D = self.layout.shard_len, self.R, self.hkv, self.d
        self.kv0 = self.empty(2, M, h, D)
        self.gathered = self.empty(R, 2, M, h, D)
        if backward:
            self.dkv_shards = self.empty(R, 2, M, h, D, dtype=self.acc)
            self.dkv_local = self.empty(2, M, h, D, dtype=self.acc)

    def _global_kv(self):
        flat = self.gathered.view(-1, self.hkv, self.d)
        return flat.index_select(0, self.k_rows), flat.index_select(0, self.v_rows)

    def forward(self, q, k, v):
        g = self.guard
        if self.local:
            out = lse = None
            if g.go:
                with g:
                    out, lse = self.rc.kernel.forward(q, k, v, self.chunks[0])
            self.saved = (q, k, v, out, lse)
            return out, lse
        if g.go:
            with g:
                self.kv0[0].copy_(k)
                self.kv0[1].copy_(v)
        self.comm.all_gather(self.gathered, self.kv0, self.rc.groups.ring, "all_gather")
        out = lse = None
        if g.go:
            with g:
                kg, vg = self._global_kv()
                acc = new_accumulator(q.shape[0], self.hq, self.d, self.dtype, self.device)
                merged = False
                for ch in self.chunks:
                    wrote = self.rc.kernel.forward_into(*acc, q, kg, vg, ch, first=not merged)
                    merged = merged or wrote
                out, lse = acc[0].to(self.dtype), acc[1]
        self.saved = (q, out, lse)
        return out, lse

    def backward(self, dout):
        if self.local:
            return self._local_backward(dout)
        g, (q, out, lse) = self.guard, self.saved
        self.comm.all_gather(self.gathered, self.kv0, self.rc.groups.ring, "all_gather")
        dq = None
        if g.go:
            with g:
                kg, vg = self._global_kv()
                lse_f = finite_lse(lse)
                dq = torch.zeros(q.shape, dtype=self.acc, device=self.device)
                dk = torch.zeros(kg.shape, dtype=self.acc, device=self.device)
                dv = torch.zeros(vg.shape, dtype=self.acc, device=self.device)
                for ch in self.chunks:
                    res = self.rc.kernel.backward_share(dout, q, kg, vg, out, lse_f, ch)
                    if res is not None:
                        res.add_q(dq)
                        res.add_kv(dk, dv)
                flat = self.dkv_shards.view(-1, self.hkv, self.d)
                flat.zero_()
                flat.index_copy_(0, self.k_rows, dk)
                flat.index_copy_(0, self.v_rows, dv)
        self.comm.reduce_scatter(
            self.dkv_local, self.dkv_shards, self.rc.groups.ring, "reduce_scatter"
        )
        if g.go:
            with g:
                return (
                    dq.to(self.dtype),
                    self.dkv_local[0].to(self.dtype),
                    self.dkv_local[1].to(self.dtype),
                )
        return None

    def _local_backward(self, dout):
        g, (q, k, v, out, lse) = self.guard, self.saved
        if g.go:
            with g:
                grads = self.rc.kernel.backward_whole(dout, q, k, v, out, lse, self.chunks[0])
                return tuple(x.to(self.dtype) for x in grads)
        return None

    def schedule(self, direction: str) -> dict:
        """This rank's steps (cp/schedule.py): chunks computed and bytes moved, per phase."""
        return schedule.allgather_schedule(
            self.R,
            self.rc.rank,
            self.chunks,
            self.layout.shard_len,
            schedule.Attn(
                self.hq,
                self.hkv,
                self.d,
                self.elem,
                torch.empty((), dtype=self.acc).element_size(),
            ),
            direction,
            self.local,
        )

    def describe(self) -> dict:
        return {
            "layout": self.layout.to_json(),
            "ring_rank": self.r,
            "gathered_rows": self.layout.padded_len,
        }
