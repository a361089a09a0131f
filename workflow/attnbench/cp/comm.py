"""Communication of one rank: process groups, counted transfers, and the compute guard.

Every transfer goes through `Comm`, which counts the bytes that leave and reach this rank:
point-to-point sends and receives in full; all-to-all: the (n-1)/n of the buffer that goes to
or comes from the other ranks; all-gather and reduce-scatter: (n-1) shards each way (the ring
algorithm's volume). `Comm.enabled = False` turns every transfer into a no-op: the
compute-only variant of a schedule, timed to split communication from computation.

`Guard` runs the compute sections of a schedule. An out-of-memory error (or an Unsupported
refusal) inside one ends computation for the rest of the phase but NOT communication, so a
failing rank still serves its peers' transfers (persistent buffers) and reaches the status
agreement at the end of the phase instead of leaving them waiting.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from ..grid.spec import Degrees
from ..record.status import CellOutcome, is_oom


def nbytes(t) -> int:
    return t.numel() * t.element_size()


class Pending:
    def __init__(self, works=()):
        self.works = list(works)

    def wait(self):
        for w in self.works:
            w.wait()
        self.works = []


class Groups:
    """The process groups a method uses, created once per degrees (every rank creates every
    group, in the same order, as torch.distributed requires). `new_group(ranks)` makes one
    (default: torch.distributed's, with the job's timeout; cp/emulate.py: in-process ones)."""

    def __init__(self, deg: Degrees, rank: int, timeout=None, new_group=None):
        self.deg, self.rank = deg, rank
        self.r, self.u = deg.coords(rank)
        world = list(range(deg.world))
        # the job's timeout, not 30 min
        new = new_group or (lambda ranks: dist.new_group(ranks, timeout=timeout))
        self.ulysses = self.ring = None
        for r in range(deg.ring):
            g = new([deg.rank(r, u) for u in range(deg.ulysses)])
            if r == self.r:
                self.ulysses = g
        for u in range(deg.ulysses):
            g = new([deg.rank(r, u) for r in range(deg.ring)])
            if u == self.u:
                self.ring = g
        # Separate communicators for the inner and outer ring, forward KV and backward dKV, so
        # that their transfers do not queue behind each other.
        self.kv_inner, self.kv_outer, self.dkv_inner, self.dkv_outer = (
            new(world) for _ in range(4)
        )

    def peer(self, ring_rank: int) -> int:
        """Global rank of ring rank `ring_rank` in this rank's ring (same Ulysses rank)."""
        return self.deg.rank(ring_rank, self.u)


class Comm:
    def __init__(self, device):
        self.device = torch.device(device)
        self.enabled = True
        self.sent = defaultdict(int)
        self.received = defaultdict(int)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def reset(self):
        self.sent.clear()
        self.received.clear()

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def total_received(self) -> int:
        return sum(self.received.values())

    def _count(self, kind, sent, received):
        self.sent[kind] += int(sent)
        self.received[kind] += int(received)

    def p2p(self, sends, recvs, group, kind="p2p") -> Pending:
        """Batched isend/irecv: sends [(tensor, global peer)], recvs [(tensor, global peer)].
        On GPU issued from a side stream (after the compute stream's pending work) so the
        transfer overlaps the computation that follows; wait() joins it back."""
        if not self.enabled or not (sends or recvs):
            return Pending()
        self._count(kind, sum(nbytes(t) for t, _ in sends), sum(nbytes(t) for t, _ in recvs))
        return self._p2p(sends, recvs, group)

    # The transports: torch.distributed here; cp/emulate.py's in-process communicator replaces
    # these and group_size, keeping the counting and the compute-only switch above.

    def group_size(self, group) -> int:
        return dist.get_world_size(group)

    def _p2p(self, sends, recvs, group) -> Pending:
        ops = [dist.P2POp(dist.isend, t, p, group) for t, p in sends]
        ops += [dist.P2POp(dist.irecv, t, p, group) for t, p in recvs]
        if self.stream is None:
            return Pending(dist.batch_isend_irecv(ops))
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            works = dist.batch_isend_irecv(ops)
        return Pending(works)

    def _all_to_all(self, out, inp, group):
        dist.all_to_all_single(out, inp, group=group)

    def _all_gather(self, out, inp, group):
        # the concatenated form (gloo takes no stacked output)
        dist.all_gather_into_tensor(out.view(-1, *inp.shape[1:]), inp, group=group)

    def _reduce_scatter(self, out, inp, group):
        dist.reduce_scatter_tensor(out, inp.view(-1, *out.shape[1:]), group=group)

    # The transfers a method calls

    def all_to_all(self, out, inp, group, kind="all_to_all"):
        """Equal splits along dim 0: part i of `inp` goes to group rank i; part i of `out` comes from it."""
        n = self.group_size(group)
        if not self.enabled or n == 1:
            if n == 1 and self.enabled:
                out.copy_(inp)
            return
        self._count(kind, nbytes(inp) * (n - 1) // n, nbytes(out) * (n - 1) // n)
        self._all_to_all(out, inp, group)

    def all_gather(self, out, inp, group, kind="all_gather"):
        n = self.group_size(group)
        if not self.enabled:
            return
        self._count(kind, nbytes(inp) * (n - 1), nbytes(inp) * (n - 1))
        self._all_gather(out, inp, group)

    def reduce_scatter(self, out, inp, group, kind="reduce_scatter"):
        n = self.group_size(group)
        if not self.enabled:
            return
        self._count(kind, nbytes(out) * (n - 1), nbytes(out) * (n - 1))
        self._reduce_scatter(out, inp, group)


class Guard:
    """`if g.go: with g: ...` runs a compute section; see the module docstring."""

    def __init__(self):
        self.compute = True
        self.error: BaseException | None = None

    @property
    def go(self) -> bool:
        return self.compute and self.error is None

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        if exc is not None and (is_oom(exc) or isinstance(exc, CellOutcome)):
            self.error = exc
            return True
        return False
