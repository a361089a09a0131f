"""The compute of every rank of a CP world, emulated in one process on one device (GPU or CPU).

No process group: NCCL refuses two ranks on one GPU, and the cost this measures is compute.
Each of the N virtual ranks runs the real code path (the method's sharding, chunk pairs, local
kernel calls, merges, copies: cp/base.py's `load`, the same classes as a distributed cell) with
its own RankContext; only the communicator differs. `Comm` keeps its counting and its
compute-only switch (`enabled`); the emulation replaces its transport (cp/comm.py: group_size,
_p2p, _all_to_all, _all_gather, _reduce_scatter) and its process groups (`VGroup`s, made by
comm.Groups in the same order as torch.distributed's).

How transfers become local buffers (`World`):

1. Lockstep pass. The N ranks run together, one thread each, through `Hub`, an in-process
   communicator: a send deposits a copy of the tensor in the channel (communicator, sender,
   receiver), FIFO like NCCL's point-to-point order, and the receive's `wait()` copies it into
   the receiving rank's persistent buffer; a collective waits until every member has deposited
   its input and then builds each member's output from the deposits (all-to-all parts,
   all-gather concatenation, reduce-scatter sum in group order). So every receive buffer holds
   exactly what its peer sent, with the real shapes, and the outputs are the real run's: this
   pass gives the float64 check (check_method) and its results equal a gloo run's.
   The threads take turns: one baton (the hub's lock) is held by whichever rank runs and is
   given up only while a rank waits for a transfer. Nothing runs concurrently, so no local
   kernel, compiler or autograd state is shared between threads at the same time, and the
   order of the work on one device is a legal interleaving of the ranks' programs.
2. Timing. After a lockstep call has left every buffer as the real run leaves it, each rank
   is timed alone (`time_ranks`, the harness's time_ms) with its communicator switched off
   (`enabled = False`): exactly the compute-only variant of a distributed cell (families/cp/cell.py:
   the same schedule, every transfer a no-op, the buffers holding what the last real transfer
   put there). Ranks are timed one after the other, so each has the device to itself.

Why not record every rank's receives and replay them during timing: a replay would have to copy
the recorded tensors into the buffers inside the timed region (a cost the compute-only cell does
not have), and keeping them costs (N-1) shards of KV and dKV per rank and phase. The lockstep pass
needs only the N ranks' own state on one device.

`contents="synthetic"` (when the N ranks' state does not fit on one device): each rank is built
alone and its receive buffers are filled once with N(0, 1) values of the same shapes (no peers
run); the timing is the same compute-only run. Its outputs are not the real ones and are never
checked; records say which contents the timed buffers held.

An emulated cell is never a distributed measurement: it times no transfer, no overlap, no
contention between ranks; records and tables mark it (`emulated: true`).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np
import torch

from ..grid.spec import EMULATE_CONTENTS
from ..harness.cpu_math import settle_vml
from ..harness.measure import quantiles, synchronize, time_ms
from ..kernels.local_kernel import load as load_kernel
from ..record import status as S
from . import catalog
from .base import RankContext
from .comm import Comm, Groups, Guard, Pending
from .run import (
    MethodRun,
    checked,
    first_failure,
    load_method,
    on_cpu,
    outcome,
    rank_inputs,
    run_counted,
)


class Aborted(RuntimeError):
    """Another virtual rank failed (or a transfer waited past the timeout): stop this one."""


@dataclass(frozen=True)
class VGroup:
    """An in-process communicator: the index at which every rank created it, and its ranks."""

    index: int
    ranks: tuple

    def rank_of(self, global_rank: int) -> int:
        return self.ranks.index(global_rank)


class Hub:
    """The transfers between the virtual ranks of one world (see the module docstring).
    Every method is called with `self.baton` held (by the rank that runs)."""

    def __init__(self, world: int, timeout_s: float = 600.0):
        self.world, self.timeout_s = world, timeout_s
        self.baton = threading.Condition()
        self.mail = defaultdict(deque)  # (group index, src, dst) -> tensors in sending order
        self.slots = {}  # (group index, sequence number) -> {group rank: deposited tensor}
        self.readers = {}  # (group index, sequence number) -> members that have not read yet
        self.failed: BaseException | None = None

    def _wait_for(self, ready, what: str):
        deadline = time.monotonic() + self.timeout_s
        while not ready():
            if self.failed is not None:
                raise Aborted(f"another virtual rank failed while this one waited for {what}")
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail(Aborted(f"waited {self.timeout_s:.0f} s for {what}"))
                raise self.failed
            self.baton.wait(timeout=min(left, 1.0))

    def fail(self, e: BaseException):
        if self.failed is None:
            self.failed = e
        self.baton.notify_all()

    def send(self, group: VGroup, src: int, dst: int, t):
        self.mail[(group.index, src, dst)].append(t.detach().clone())
        self.baton.notify_all()

    def receive(self, group: VGroup, src: int, dst: int):
        box = self.mail[(group.index, src, dst)]
        self._wait_for(lambda: bool(box), f"a tensor from rank {src} (group {group.index})")
        return box.popleft()

    def exchange(self, group: VGroup, seq: int, me: int, t) -> list:
        """Deposit t as this member's input of the group's seq-th collective; every member's
        input, in group order, once all have deposited."""
        key, n = (group.index, seq), len(group.ranks)
        slot = self.slots.setdefault(key, {})
        slot[group.rank_of(me)] = t.detach().clone()
        self.readers.setdefault(key, n)
        self.baton.notify_all()
        self._wait_for(lambda: len(slot) == n, f"collective {seq} of group {group.index}")
        inputs = [slot[i] for i in range(n)]
        self.readers[key] -= 1
        if self.readers[key] == 0:
            del self.slots[key], self.readers[key]
        return inputs


class _Receive:
    def __init__(self, hub, group, src, dst, buf):
        self.hub, self.group, self.src, self.dst, self.buf = hub, group, src, dst, buf

    def wait(self):
        self.buf.copy_(self.hub.receive(self.group, self.src, self.dst))


class LockstepComm(Comm):
    """Comm whose transfers go through the hub (the lockstep pass)."""

    def __init__(self, device, hub: Hub, rank: int):
        super().__init__(device)
        self.stream = None  # every copy on the rank's own stream, in program order
        self.hub, self.rank = hub, rank
        self.seq = defaultdict(int)  # group index -> collectives called so far

    def group_size(self, group) -> int:
        return len(group.ranks)

    def _p2p(self, sends, recvs, group) -> Pending:
        for t, peer in sends:
            self.hub.send(group, self.rank, peer, t)
        return Pending([_Receive(self.hub, group, peer, self.rank, buf) for buf, peer in recvs])

    def _collective(self, group, inp) -> tuple[list, int]:
        seq = self.seq[group.index]
        self.seq[group.index] += 1
        return self.hub.exchange(group, seq, self.rank, inp), group.rank_of(self.rank)

    def _all_to_all(self, out, inp, group):
        # all_to_all_single's equal splits of dim 0: flat parts of the contiguous buffers
        inputs, me = self._collective(group, inp)
        n = len(inputs)
        for part, theirs in zip(out.view(n, -1), inputs):
            part.copy_(theirs.view(n, -1)[me])

    def _all_gather(self, out, inp, group):
        inputs, _ = self._collective(group, inp)
        for part, theirs in zip(out.view(-1, *inp.shape[1:]).chunk(len(inputs)), inputs):
            part.copy_(theirs)

    def _reduce_scatter(self, out, inp, group):
        inputs, me = self._collective(group, inp)
        n = len(inputs)
        total = inputs[0].view(-1, *out.shape[1:]).chunk(n)[me].clone()
        for theirs in inputs[1:]:
            total += theirs.view(-1, *out.shape[1:]).chunk(n)[me]
        out.copy_(total)


class SyntheticComm(Comm):
    """Comm of a rank built alone (contents="synthetic"): sends go nowhere; every receive buffer
    gets N(0, 1) values of its own shape and dtype."""

    def group_size(self, group) -> int:
        return len(group.ranks)

    @staticmethod
    def _fill(t):
        if t.is_floating_point():
            t.normal_()

    def _p2p(self, sends, recvs, group) -> Pending:
        for buf, _ in recvs:
            self._fill(buf)
        return Pending()

    def _all_to_all(self, out, inp, group):
        self._fill(out)

    def _all_gather(self, out, inp, group):
        self._fill(out)

    def _reduce_scatter(self, out, inp, group):
        self._fill(out)


def _group_maker():
    """comm.Groups' new_group for one virtual rank: the k-th group it makes is VGroup(k, ranks),
    the same object (by value) every rank makes k-th, as with torch.distributed."""
    made = []

    def new_group(ranks):
        g = VGroup(len(made), tuple(ranks))
        made.append(g)
        return g

    return new_group


class World:
    """N virtual ranks of one degrees on one device: their contexts, and running them.

    world.load(mask) builds each rank's method; world.run(fn) calls fn(rank, rc) on every rank in
    lockstep (contents="peers") or one rank after the other (contents="synthetic"), returning
    the results in rank order; world.agree(where) is run.agree over the virtual ranks."""

    def __init__(
        self,
        run: MethodRun,
        device,
        contents: str = EMULATE_CONTENTS[0],
        timeout_s: float = 600.0,
    ):
        if contents not in EMULATE_CONTENTS:
            raise ValueError(f"contents {contents!r}: one of {EMULATE_CONTENTS}")
        settle_vml()  # as run.init does for real ranks
        deg = run.degrees
        self.method_run, self.deg, self.device, self.contents = (
            run,
            deg,
            torch.device(device),
            contents,
        )
        self.hub = Hub(deg.world, timeout_s)
        self.rcs = []
        for r in range(deg.world):
            groups = Groups(deg, r, new_group=_group_maker())
            comm = (
                LockstepComm(self.device, self.hub, r)
                if contents == "peers"
                else SyntheticComm(self.device)
            )
            kernel = None
            if run.loads_kernel:
                kernel = load_kernel(
                    catalog.local_kernel(run.kernel), self.device, run.torch_dtype, run.head_dim
                )
            self.rcs.append(
                RankContext(
                    r,
                    self.device,
                    deg,
                    groups,
                    comm,
                    Guard(),
                    kernel,
                    run.kernel,
                    run.dkv_comm_dtype,
                )
            )
        self.methods = [None] * deg.world

    @property
    def size(self) -> int:
        return self.deg.world

    def run(self, fn) -> list:
        """fn(rank, rc) on every virtual rank; the results in rank order. An exception that a
        rank's guard does not keep (a bug, not an oom) stops every rank and is raised here."""
        if self.contents == "synthetic":
            return [fn(r, rc) for r, rc in enumerate(self.rcs)]
        hub, results, grad = self.hub, [None] * self.size, torch.is_grad_enabled()
        hub.failed = None
        cuda = None  # the device index every thread works on (the caller's current one)
        if self.device.type == "cuda":
            cuda = (
                self.device.index if self.device.index is not None else torch.cuda.current_device()
            )

        def body(r):
            if cuda is not None:
                torch.cuda.set_device(cuda)  # the current device is per thread
            torch.set_grad_enabled(grad)  # grad mode is per thread
            with hub.baton:
                try:
                    results[r] = fn(r, self.rcs[r])
                except BaseException as e:  # noqa: BLE001 - handed to the caller below
                    hub.fail(e)

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if hub.failed is not None:
            e, hub.failed = hub.failed, None
            hub.mail.clear()
            hub.slots.clear()
            hub.readers.clear()
            raise e
        return results

    def agree(self, where: str) -> tuple[str | None, str | None]:
        """run.agree over the virtual ranks; every guard's error is cleared."""
        everyone = [outcome(rc.guard, r, where) for r, rc in enumerate(self.rcs)]
        for rc in self.rcs:
            rc.guard.error = None
        return first_failure(everyone)

    def load(self, mask) -> list:
        """Every rank's method for this mask, set up (persistent buffers); a refusal or an oom
        is in that rank's guard (world.agree says it)."""

        def build(r, rc):
            try:
                method = load_method(self.method_run, rc, mask)
            except S.CellOutcome as e:
                rc.guard.error = e
                return None
            if rc.guard.go:
                with rc.guard:
                    method.setup(self.method_run.backward)
            return method

        self.methods = [build(r, rc) for r, rc in enumerate(self.rcs)]
        return self.methods

    def inputs(self, seed: int) -> list:
        """Every rank's q, k, v, dout at its own positions (harness.inputs.local_inputs)."""
        out = []
        for m, rc in zip(self.methods, self.rcs):
            got = None
            if m is not None and rc.guard.go:
                with rc.guard:
                    got = rank_inputs(self.method_run, seed, m.positions, self.device)
            out.append(got)
        return out


def results(run: MethodRun, mask, seed: int, device="cpu") -> tuple:
    """One lockstep run of every rank, as run.check_method runs them: (status, reason, every
    rank's results on the CPU: positions, out, lse, dq, dk, dv, bytes); status None when all ran."""
    world = World(run, device)
    world.load(mask)
    inputs = world.inputs(seed)

    def once(r, rc):
        method = world.methods[r]
        if method is None:
            return None
        return on_cpu(run_counted(method, rc, inputs[r], run.backward))

    gathered = world.run(once)
    st, reason = world.agree("the correctness run")
    return st, reason, (gathered if st is None else None)


def check_method(run: MethodRun, mask, seed: int, factor: float, device="cpu") -> dict:
    """run.check_method on N virtual ranks: every rank's rows of one lockstep run (results())
    against float64 (run.compare, the gate), on `device`."""
    st, reason, gathered = results(run, mask, seed, device)
    if st is not None:
        return {"status": st, "reason": reason}
    return checked(gathered, mask, seed, run, factor, device)


# ---------------------------------------------------------------- timing


def calls(world: World, inputs, direction: str) -> list:
    """Each rank's timed call (the distributed cell's: forward, backward, or both)."""
    out = []
    for m, (q, k, v, dout) in zip(world.methods, inputs):
        if direction == "fwd":
            out.append(lambda m=m, q=q, k=k, v=v: m.forward(q, k, v))
        elif direction == "bwd":
            out.append(lambda m=m, dout=dout: m.backward(dout))
        else:

            def both(m=m, q=q, k=k, v=v, dout=dout):
                m.forward(q, k, v)
                return m.backward(dout)

            out.append(both)
    return out


def prime(world: World, inputs, direction: str):
    """One call of every rank with its transfers (lockstep, or the synthetic fills), leaving the
    buffers as the real run leaves them; backward needs a forward first, as in the cell."""

    def body(r, rc):
        m, g = world.methods[r], rc.guard
        q, k, v, dout = inputs[r]
        m.forward(q, k, v)
        if direction != "fwd":
            m.backward(dout)
        return g.go

    world.run(body)


def time_ranks(
    world: World, inputs, direction: str, warmup: int, reps: int, ranks=None
) -> dict[int, list[float]]:
    """Milliseconds of each rank's call alone, its communicator off (the compute-only variant),
    after prime(). `ranks`: only these (default: all)."""
    fns = calls(world, inputs, direction)
    times = {}
    dev = world.device
    for r in ranks if ranks is not None else range(world.size):
        rc = world.rcs[r]
        rc.comm.enabled = False
        try:
            with rc.guard:
                times[r] = time_ms(fns[r], warmup, reps, dev, before=lambda: synchronize(dev))
        finally:
            rc.comm.enabled = True
        if rc.guard.error is not None:
            break
    return times


def summary(times: dict[int, list[float]]) -> dict:
    """The slowest rank and the spread over ranks (load balance) of per-rank median times; the
    per-repetition maximum over ranks (what the slowest rank takes, as a cell's max over ranks)."""
    med = {r: quantiles(t)["median"] for r, t in times.items()}
    values = np.array(list(med.values()))
    slowest = max(med, key=med.get)
    reps = min(len(t) for t in times.values())
    return {
        "rank_ms_median": [med[r] for r in sorted(med)],
        "slowest_rank": int(slowest),
        "slowest_rank_ms": float(med[slowest]),
        "fastest_rank_ms": float(values.min()),
        # the time load balance: slowest / mean over ranks (1: perfect)
        "rank_spread": float(values.max() / values.mean()) if values.mean() > 0 else None,
        "max_over_ranks_ms": [max(times[r][i] for r in times) for i in range(reps)],
    }
