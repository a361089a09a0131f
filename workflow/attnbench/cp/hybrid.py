"""Ulysses all-to-all inside groups of U around a (double) ring over R: the engine of four methods.

    Ulysses = (U = N, R = 1)   Ring P2P = (U = 1, R = N)   USP = (U, R)   LoongTrain = (U, R, W windows)

Forward on global rank (r, u), which holds piece u of ring shard r (all heads):
  1. all-to-all q, k, v inside the Ulysses group: sequence-sharded -> head-sharded; the rank now
     holds the whole ring shard r for Hq/U query heads and the matching KV heads (KV heads are
     replicated U/Hkv times first when U > Hkv; the extra volume is recorded);
  2. the ring over R (ring.py) merges that shard's attention against every ring shard;
  3. all-to-all the output (and its LSE) back to sequence sharding.
Backward: all-to-all dout; the ring backward; all-to-all dq, dk, dv back (replicas summed).
"""

from __future__ import annotations

import torch

from ..record.status import Unsupported
from . import schedule
from .base import ScheduledMethod
from .catalog import head_split_reason, kv_replication
from .chunks import document_lengths, is_causal, ring_step_chunk
from .layout import ShardLayout
from .ring import DoubleRing


def heads_by_group(x, groups: int, rep: int):
    """[rows, H, D] -> [rows, groups, H*rep/groups, D]: the heads each Ulysses rank gets
    (each head repeated `rep` times first when there are fewer heads than ranks)."""
    rows, h, d = x.shape
    if rep > 1:
        x = x.unsqueeze(2).expand(rows, h, rep, d).reshape(rows, h * rep, d)
    return x.view(rows, groups, -1, d)


class Hybrid(ScheduledMethod):
    def __init__(self, info, rc, mask, heads_q, heads_kv, head_dim, dtype):
        super().__init__(info, rc, mask, heads_q, heads_kv, head_dim, dtype)
        deg = rc.deg
        self.U, self.R, self.W = deg.ulysses, deg.ring, deg.windows
        if self.U > 1:
            why = head_split_reason(self.U, heads_q, heads_kv)
            if why:
                raise Unsupported(f"{info.name}: {why}")
        self.r, self.u = deg.coords(rc.rank)
        self.layout = ShardLayout(document_lengths(mask), self.R, self.U, deg.split_documents)
        self.rep = kv_replication(self.U, heads_kv)
        self.hq_l, self.hkv_l = heads_q // self.U, heads_kv * self.rep // self.U
        causal = is_causal(mask.name)
        self.chunks = {s: ring_step_chunk(self.layout, self.r, s, causal) for s in range(self.R)}
        self.ring = DoubleRing(self, self.r, self.R, self.W, self.chunks, self.layout.ring_local)
        self.positions = self.layout.piece_positions(self.r, self.u)
        self.M = self.layout.rows(self.r)  # this ring shard's rows
        self.m = self.M // self.U  # this rank's input rows (a piece of the shard)
        self.saved = None

    # ------------------------------------------------------------ buffers

    def setup(self, backward: bool):
        M, m, D, U = self.M, self.m, self.d, self.U
        kv_shape = (2, M, self.hkv_l, D)
        # the ring's send buffer (and where Ulysses' all-to-all lands): none for U = 1 ring-local
        self.kv0 = self.empty(*kv_shape) if U > 1 or not self.ring.local else None
        self.ring.setup(kv_shape, backward)
        if U > 1:
            e = self.empty
            self.q_send, self.q_h = e(U, m, self.hq_l, D), e(M, self.hq_l, D)
            self.kv_send, self.kv_recv = e(U, 2, m, self.hkv_l, D), e(U, 2, m, self.hkv_l, D)
            self.out_h, self.out_recv = e(M, self.hq_l, D), e(U, m, self.hq_l, D)
            self.lse_send = e(U, self.hq_l, m, dtype=self.acc)
            self.lse_recv = e(U, self.hq_l, m, dtype=self.acc)
            if backward:
                self.dout_send, self.dout_h = e(U, m, self.hq_l, D), e(M, self.hq_l, D)
                self.dq_send, self.dq_recv = e(M, self.hq_l, D), e(U, m, self.hq_l, D)
                self.dkv_send, self.dkv_recv = e(U, 2, m, self.hkv_l, D), e(U, 2, m, self.hkv_l, D)

    # ------------------------------------------------------------ forward / backward

    def forward(self, q, k, v):
        g, comm, U, m = self.guard, self.comm, self.U, self.m
        if U == 1:
            kv = (k, v) if self.ring.local else self.kv0  # a local ring sends nothing: no copy
            if g.go and not self.ring.local:
                with g:
                    self.kv0[0].copy_(k)
                    self.kv0[1].copy_(v)
            acc = self.ring.forward(q, kv)
            out = lse = None
            if g.go:
                with g:
                    out, lse = acc[0].to(self.dtype), acc[1]
            self.saved = (q, out, lse, kv)
            return out, lse
        ulysses = self.rc.groups.ulysses
        if g.go:
            with g:
                self.q_send.copy_(heads_by_group(q, U, 1).transpose(0, 1))
                self.kv_send[:, 0].copy_(heads_by_group(k, U, self.rep).transpose(0, 1))
                self.kv_send[:, 1].copy_(heads_by_group(v, U, self.rep).transpose(0, 1))
        comm.all_to_all(self.q_h, self.q_send, ulysses, "ulysses")
        comm.all_to_all(self.kv_recv, self.kv_send, ulysses, "ulysses")
        if g.go:
            with g:
                self.kv0.copy_(self.kv_recv.transpose(0, 1).reshape(self.kv0.shape))
        acc = self.ring.forward(self.q_h, self.kv0)
        lse_h = None
        if g.go:
            with g:
                self.out_h.copy_(acc[0])
                lse_h = acc[1]
                self.lse_send.copy_(lse_h.view(self.hq_l, U, m).transpose(0, 1))
        comm.all_to_all(self.out_recv, self.out_h, ulysses, "ulysses")
        comm.all_to_all(self.lse_recv, self.lse_send, ulysses, "ulysses")
        out = lse = None
        if g.go:
            with g:
                out = self.out_recv.transpose(0, 1).reshape(m, self.hq, self.d)
                lse = self.lse_recv.reshape(self.hq, m).clone()
        self.saved = (self.q_h, self.out_h, lse_h, self.kv0)
        return out, lse

    def backward(self, dout):
        g, comm, U, m = self.guard, self.comm, self.U, self.m
        q, out, lse, kv = self.saved
        if U == 1:
            grads = self.ring.backward(dout, q, kv, out, lse)
            if g.go:
                with g:
                    return tuple(x.to(self.dtype) for x in grads)
            return None
        ulysses = self.rc.groups.ulysses
        if g.go:
            with g:
                self.dout_send.copy_(heads_by_group(dout, U, 1).transpose(0, 1))
        comm.all_to_all(self.dout_h, self.dout_send, ulysses, "ulysses")
        dq, dk, dv = self.ring.backward(self.dout_h, q, kv, out, lse)
        if g.go:
            with g:
                self.dq_send.copy_(dq)
                self.dkv_send[:, 0].copy_(dk.reshape(U, m, self.hkv_l, self.d))
                self.dkv_send[:, 1].copy_(dv.reshape(U, m, self.hkv_l, self.d))
        comm.all_to_all(self.dq_recv, self.dq_send, ulysses, "ulysses")
        comm.all_to_all(self.dkv_recv, self.dkv_send, ulysses, "ulysses")
        if g.go:
            with g:
                dq = self.dq_recv.transpose(0, 1).reshape(m, self.hq, self.d)
                dkv = self.dkv_recv.permute(1, 2, 0, 3, 4).reshape(
                    2, m, self.hkv * self.rep, self.d
                )
                if self.rep > 1:
                    dkv = dkv.float().view(2, m, self.hkv, self.rep, self.d).sum(3).to(self.dtype)
                return dq, dkv[0], dkv[1]
        return None

    # ------------------------------------------------------------ accounting

    def schedule(self, direction: str) -> dict:
        """This rank's steps (cp/schedule.py): chunks computed and bytes moved, per phase."""
        return schedule.hybrid_schedule(
            self.rc.deg,
            self.rc.rank,
            self.chunks,
            self.M,
            self.m,
            schedule.Attn(self.hq, self.hkv, self.d, self.elem, self.acc_elem),
            direction,
            torch.empty((), dtype=self.dkv_dtype).element_size(),
            self.layout.ring_local,
        )

    @property
    def acc_elem(self) -> int:
        return torch.empty((), dtype=self.acc).element_size()

    def replication_bytes(self, direction: str) -> int:
        """Extra bytes this rank sends because KV heads are replicated (U > Hkv)."""
        if self.rep == 1:
            return 0
        per = (self.U - 1) * 2 * self.m * self.hkv * (self.rep - 1) * self.d * self.elem // self.U
        return per * (("fwd" in direction) + ("bwd" in direction))

    def describe(self) -> dict:
        return {
            "layout": self.layout.to_json(),
            "dkv_comm_dtype": str(self.dkv_dtype).removeprefix("torch."),
            "kv_replication": self.rep,
            "heads_q_local": self.hq_l,
            "heads_kv_local": self.hkv_l,
            "ring_rank": self.r,
            "ulysses_rank": self.u,
            "window": self.ring.i,
            "window_position": self.ring.j,
        }
