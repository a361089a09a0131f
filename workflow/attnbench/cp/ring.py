"""The ring schedule over R ranks split into W windows of w = R/W (a double ring).

Ring rank r = i*w + j (window i, position j). Forward, outer step o = 0..W-1, inner step
t = 0..w-1: the rank holds the KV shard that started on ring rank ((i-o) mod W)*w + (j-t) mod w.
Inner ring: while computing step t, send the current KV to (i, j+1) and receive the next from
(i, j-1). Outer ring: at the start of outer step o, send the window's first KV to (i+1, j) and
receive the next window's from (i-1, j): it arrives while the inner ring computes (prefetch).
W = 1 is the plain ring (Ring P2P): R steps, KV from (r - t) mod R at step t.

Backward mirrors it and carries each KV shard's gradient home, on separate communicators:
inside a window the accumulator of a shard starts at its second visitor and ends at its first
(w-1 hops); the window's total then travels the outer ring the same way (W-1 hops). Volume per
rank: (R-1) KV shards forward; (R-1) KV + (R-1) dKV backward, whatever the mask.
Double buffering everywhere: a buffer is refilled only after the transfer that read it ended.

A ring-local layout (every document whole on one ring rank, layout.ring_local) needs nothing
from the peers: one kernel call over the rank's own documents each way, its output and
gradients straight from the kernel (nothing to merge), and no transfer.
"""

from __future__ import annotations

import torch

from ..kernels.lse import finite_lse, new_accumulator
from .comm import Pending
from .schedule import ring_neighbours, ring_origins


class DoubleRing:
    def __init__(self, method, r: int, ring: int, windows: int, chunks: dict, local=False):
        self.m = method
        self.local = local
        self.R, self.W = ring, windows
        self.w = ring // windows
        self.i, self.j = divmod(r, self.w)
        self.chunks = (
            chunks  # origin ring rank -> Chunk (queries of this shard vs that shard's keys)
        )
        peer = method.rc.groups.peer
        nb = ring_neighbours(r, ring, windows)
        self.inner_next, self.inner_prev = peer(nb["inner_next"]), peer(nb["inner_prev"])
        self.outer_next, self.outer_prev = peer(nb["outer_next"]), peer(nb["outer_prev"])
        self.order = ring_origins(r, ring, windows)

    def origin(self, o: int, t: int) -> int:
        return self.order[o * self.w + t][2]

    def schedule(self):
        """(outer step, inner step, origin ring rank) in the order they are computed."""
        return self.order

    def setup(self, kv_shape, backward: bool):
        if self.local:
            self.inner = self.outer = self.dkv_inner = self.dkv_outer = []
            return
        e = self.m.empty
        self.inner = [e(*kv_shape) for _ in range(2)] if self.w > 1 else []
        self.outer = [e(*kv_shape) for _ in range(2)] if self.W > 1 else []
        # [send, receive] accumulators of dK, dV travelling home: float32 or better, or the
        # inputs' dtype (cp.dkv_comm_dtype: input), each hop adding in float32 and rounding once
        dkv = self.m.dkv_dtype
        self.dkv_inner = (
            [e(*kv_shape, dtype=dkv) for _ in range(2)] if backward and self.w > 1 else []
        )
        self.dkv_outer = (
            [e(*kv_shape, dtype=dkv) for _ in range(2)] if backward and self.W > 1 else []
        )

    def _level(self, outer: bool):
        """(next rank, previous rank, KV group, dK/dV group) of the outer or the inner ring."""
        grp = self.m.rc.groups
        if outer:
            return self.outer_next, self.outer_prev, grp.kv_outer, grp.dkv_outer
        return self.inner_next, self.inner_prev, grp.kv_inner, grp.dkv_inner

    def _prefetch(self, kv, step: int, outer: bool):
        """Send kv on and receive the next step's KV while kv is used (the last step of the ring
        moves nothing): (the transfer, the KV of the next step)."""
        steps, bufs = (self.W, self.outer) if outer else (self.w, self.inner)
        if step == steps - 1:
            return Pending(), kv
        nxt, prv, group, _ = self._level(outer)
        buf = bufs[step % 2]
        return self.m.comm.p2p([(kv, nxt)], [(buf, prv)], group, "ring_kv"), buf

    def _dkv_hop(self, pending, first: bool, add, outer: bool):
        """One hop of a dK/dV ring: wait for the previous one (send buffer free, receive buffer
        full), pass on what arrived with this rank's part added (`add`), send it."""
        pending.wait()
        send, recv = self.dkv_outer if outer else self.dkv_inner
        g = self.m.guard
        if g.go:
            with g:
                _pass_on(send, recv, first, add)
        nxt, prv, _, group = self._level(outer)
        return self.m.comm.p2p([(send, nxt)], [(recv, prv)], group, "ring_dkv")

    def forward(self, q, kv0):
        """Merged (out, lse) of q [rows, Hq_local, D] against every KV shard of the ring (out in
        the accumulation dtype, or q's when ring-local); kv0: this shard's K and V ([2, rows,
        Hkv_local, D], the ring's send buffer; ring-local: any pair)."""
        m, g = self.m, self.m.guard
        if self.local:
            if g.go:
                with g:
                    return m.rc.kernel.forward(q, kv0[0], kv0[1], self.chunks[self.origin(0, 0)])
            return None
        acc = None
        if g.go:
            with g:
                acc = new_accumulator(q.shape[0], q.shape[1], q.shape[2], m.dtype, m.device)
        head, merged = kv0, False
        for o in range(self.W):
            outer, next_head = self._prefetch(head, o, outer=True)
            cur = head
            for t in range(self.w):
                inner, next_cur = self._prefetch(cur, t, outer=False)
                if g.go:
                    with g:
                        chunk = self.chunks[self.origin(o, t)]
                        wrote = m.rc.kernel.forward_into(
                            *acc, q, cur[0], cur[1], chunk, first=not merged
                        )
                        merged = merged or wrote
                inner.wait()
                cur = next_cur
            outer.wait()
            head = next_head
        return acc

    def backward(self, dout, q, kv0, out, lse):
        """(dq [rows, Hq_local, D], dk, dv [rows, Hkv_local, D]) in the accumulation dtype (the
        local kernel's when ring-local)."""
        m, g = self.m, self.m.guard
        if self.local:
            if g.go:
                with g:
                    args = (dout, q, kv0[0], kv0[1], out, lse)
                    return m.rc.kernel.backward_whole(*args, self.chunks[self.origin(0, 0)])
            return None, None, None
        dq = dkv_home = None
        if g.go:
            with g:
                lse = finite_lse(lse)
                dq = torch.zeros(q.shape, dtype=m.acc, device=m.device)
                dkv_home = torch.zeros(kv0.shape, dtype=m.acc, device=m.device)
        head, outer_dkv = kv0, Pending()
        for o in range(self.W):
            outer, next_head = self._prefetch(head, o, outer=True)
            cur, window_total, inner_dkv = head, None, Pending()
            for t in range(self.w):
                inner, next_cur = self._prefetch(cur, t, outer=False)
                res = None
                if g.go:
                    with g:
                        res = m.rc.kernel.backward_share(
                            dout, q, cur[0], cur[1], out, lse, self.chunks[self.origin(o, t)]
                        )
                        if res is not None:
                            res.add_q(dq)
                if t == 0:  # the shard this window started with: its total collects here
                    if g.go:
                        with g:
                            window_total = torch.zeros(kv0.shape, dtype=m.acc, device=m.device)
                            _add_dkv(window_total, res)
                else:
                    inner_dkv = self._dkv_hop(
                        inner_dkv, t == 1, lambda buf: _add_dkv(buf, res), outer=False
                    )
                inner.wait()
                cur = next_cur
            if self.w > 1:
                _add_last_hop(inner_dkv, g, window_total, self.dkv_inner[1])
            if o == 0:
                if g.go:
                    with g:
                        dkv_home += window_total
            else:
                outer_dkv = self._dkv_hop(
                    outer_dkv, o == 1, lambda buf: buf.add_(window_total), outer=True
                )
            outer.wait()
            head = next_head
        if self.W > 1:
            _add_last_hop(outer_dkv, g, dkv_home, self.dkv_outer[1])
        return dq, *(dkv_home if dkv_home is not None else (None, None))


def _pass_on(send, recv, first: bool, add):
    """One hop of a dK/dV ring: send = what arrived (nothing on the first hop) plus this rank's
    contribution (`add(buffer)` adds it in place). A send buffer in a narrower dtype than the
    accumulator (cp.dkv_comm_dtype: input) gets the sum made in the accumulator's dtype and
    rounded once."""
    if send.dtype == torch.float32 or send.dtype == torch.float64:
        if first:
            send.zero_()
        else:
            send.copy_(recv)
        add(send)
        return
    total = torch.zeros(send.shape, dtype=torch.float32, device=send.device)
    if not first:
        total += recv
    add(total)
    send.copy_(total)


def _add_last_hop(pending, g, total, recv):
    """The last hop of a dK/dV ring: wait for it, then add what arrived into `total` (in place)."""
    pending.wait()
    if g.go:
        with g:
            total += recv


def _add_dkv(dst, res):
    if res is not None:
        res.add_kv(dst[0], dst[1])
