"""What a method does on one rank, step by step: the chunks it computes and the bytes it moves.

A pure description (no torch, no process group) shared by the real methods and the throughput
model (cp_model/): the methods' `volume()` and `work()` are sums over it, so the tests that check
counted bytes and computed pairs of real runs against `volume()` / `work()` check it too.

A phase (fwd, bwd) is a list of Steps run in order. A Step computes its `compute` (chunk, heads)
pairs and runs its `transfers`; `overlapped` says whether the transfers run alongside the
computation (the ring's double-buffered isend/irecv) or block before it (collectives);
`window_transfers` run through every step of the step's window (LoongTrain's outer ring).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..grid.spec import Degrees
from .catalog import kv_replication

PATTERNS = ("p2p", "all_to_all", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Transfer:
    """Bytes this rank sends (and receives: every pattern here is symmetric) in one call.
    `peers`: the global ranks it exchanges with (p2p: the send and receive peers; collectives:
    the whole group), which decides whether the transfer crosses nodes."""

    kind: str  # the counter it goes to in comm.Comm (ring_kv, ring_dkv, ulysses, all_gather, ...)
    pattern: str
    nbytes: int
    peers: tuple

    def __post_init__(self):
        if self.pattern not in PATTERNS:
            raise ValueError(
                f"unknown transfer pattern {self.pattern!r}; valid: {', '.join(PATTERNS)}"
            )


@dataclass(frozen=True)
class Step:
    name: str
    compute: tuple = ()  # (Chunk, query heads) pairs
    transfers: tuple = ()
    overlapped: bool = False
    window: int | None = None  # ring steps: the outer step (window) they belong to
    window_transfers: tuple = ()  # transfers that run through the whole window (LoongTrain's outer ring)


def ring_origins(r: int, ring: int, windows: int) -> list[tuple[int, int, int]]:
    """(outer step o, inner step t, origin ring rank) in the order ring rank r computes them:
    window i = r // w, position j = r % w, origin ((i - o) mod W) * w + (j - t) mod w."""
    w = ring // windows
    i, j = divmod(r, w)
    return [
        (o, t, ((i - o) % windows) * w + (j - t) % w) for o in range(windows) for t in range(w)
    ]


def ring_neighbours(r: int, ring: int, windows: int) -> dict:
    """Ring ranks r sends to and receives from: inner ring (inside the window) and outer ring."""
    w = ring // windows
    i, j = divmod(r, w)
    return {
        "inner_next": i * w + (j + 1) % w,
        "inner_prev": i * w + (j - 1) % w,
        "outer_next": ((i + 1) % windows) * w + j,
        "outer_prev": ((i - 1) % windows) * w + j,
    }


def alltoall_bytes(buffer_bytes: int, n: int) -> int:
    """What one rank sends in an all-to-all of its `buffer_bytes` over n ranks (comm.Comm's count)."""
    return buffer_bytes * (n - 1) // n if n > 1 else 0


@dataclass(frozen=True)
class Attn:
    """What a schedule needs of the attention: heads, head dim, bytes per element of the inputs
    and of the float32 accumulators (dq, dK/dV partial sums)."""

    heads_q: int
    heads_kv: int
    head_dim: int
    elem: int
    acc_elem: int

    def fields(self) -> tuple:
        return self.heads_q, self.heads_kv, self.head_dim, self.elem, self.acc_elem


def hybrid_schedule(
    deg: Degrees,
    rank: int,
    chunks: dict,
    shard_len: int,
    piece_len: int,
    attn: Attn,
    direction: str,
    dkv_elem: int | None = None,
    ring_local: bool = False,
) -> dict:
    """Ulysses all-to-all inside groups of U around a double ring over R (cp/hybrid.py):
    {"fwd": [Step], "bwd": [Step]} (the phases `direction` includes) for global rank `rank`.
    `chunks`: origin ring rank -> the Chunk of this rank's queries against that shard's keys.
    dK/dV travel the ring with `dkv_elem` bytes per element (default: the accumulator's).
    `ring_local` (every document whole on one ring rank): the ring is one step on the rank's
    own shard, with no transfer."""
    heads_q, heads_kv, head_dim, elem, acc_elem = attn.fields()
    dkv_elem = acc_elem if dkv_elem is None else dkv_elem
    U, R, W = deg.ulysses, deg.ring, deg.windows
    r, u = deg.coords(rank)
    rep = kv_replication(U, heads_kv)
    hq_l, hkv_l = heads_q // U, heads_kv * rep // U
    M, m, D = shard_len, piece_len, head_dim
    kv = 2 * M * hkv_l * D
    group = tuple(deg.rank(r, x) for x in range(U))
    nb = ring_neighbours(r, R, W)
    ring_peer = {k: deg.rank(v, u) for k, v in nb.items()}

    def a2a(*buffers):
        return (
            tuple(Transfer("ulysses", "all_to_all", alltoall_bytes(b, U), group) for b in buffers)
            if U > 1
            else ()
        )

    def kv_hop(where, size):
        return Transfer(*size, (ring_peer[f"{where}_next"], ring_peer[f"{where}_prev"]))

    w = R // W
    phases = {}
    for phase in ("fwd", "bwd"):
        if phase not in direction:
            continue
        steps = []
        if phase == "fwd":
            steps.append(
                Step(
                    "ulysses in",
                    transfers=a2a(U * m * hq_l * D * elem, U * 2 * m * hkv_l * D * elem),
                )
            )
        else:
            steps.append(Step("ulysses in", transfers=a2a(U * m * hq_l * D * elem)))
        if ring_local:
            steps.append(Step("ring local", ((chunks[r], hq_l),)))
        for o, t, origin in [] if ring_local else ring_origins(r, R, W):
            moves, window_moves = [], []
            if t == 0 and o < W - 1:  # prefetch of the next window's KV: runs through this window
                window_moves.append(kv_hop("outer", ("ring_kv", "p2p", kv * elem)))
            if (
                t == 0 and phase == "bwd" and o >= 2
            ):  # the previous window's dKV total, through this window
                window_moves.append(kv_hop("outer", ("ring_dkv", "p2p", kv * dkv_elem)))
            if t < w - 1:
                moves.append(kv_hop("inner", ("ring_kv", "p2p", kv * elem)))
            if phase == "bwd" and t >= 2:  # dKV accumulated up to step t-1 travels during step t
                moves.append(kv_hop("inner", ("ring_dkv", "p2p", kv * dkv_elem)))
            steps.append(
                Step(
                    f"ring o{o} t{t}",
                    ((chunks[origin], hq_l),),
                    tuple(moves),
                    overlapped=True,
                    window=o,
                    window_transfers=tuple(window_moves),
                )
            )
            if (
                phase == "bwd" and t == w - 1 and w > 1
            ):  # the window's last inner dKV hop: waited at once
                steps.append(
                    Step(
                        f"dkv inner home o{o}",
                        transfers=(kv_hop("inner", ("ring_dkv", "p2p", kv * dkv_elem)),),
                    )
                )
        if (
            phase == "bwd" and W > 1 and not ring_local
        ):  # the last outer dKV hop, nothing left to hide it behind
            steps.append(
                Step(
                    "dkv outer home",
                    transfers=(kv_hop("outer", ("ring_dkv", "p2p", kv * dkv_elem)),),
                )
            )
        if phase == "fwd":
            steps.append(
                Step("ulysses out", transfers=a2a(M * hq_l * D * elem, U * hq_l * m * acc_elem))
            )
        else:
            steps.append(
                Step(
                    "ulysses out", transfers=a2a(M * hq_l * D * elem, U * 2 * m * hkv_l * D * elem)
                )
            )
        phases[phase] = steps
    return phases


def allgather_schedule(
    ring: int,
    rank: int,
    chunks: tuple,
    shard_len: int,
    attn: Attn,
    direction: str,
    ring_local: bool = False,
) -> dict:
    """Ring AllGather (cp/ring_allgather.py): gather K, V; compute both query chunks; backward
    gathers again and reduce-scatters dK, dV (float32). Nothing overlaps. `ring_local` (every
    document whole on one rank): the attention step alone, with no transfer."""
    heads_q, heads_kv, head_dim, elem, acc_elem = attn.fields()
    group = tuple(range(ring))
    kv = 2 * shard_len * heads_kv * head_dim
    gather = Transfer("all_gather", "all_gather", (ring - 1) * kv * elem, group)
    work = tuple((c, heads_q) for c in chunks)
    if ring_local:
        return {p: [Step("attention", work)] for p in ("fwd", "bwd") if p in direction}
    phases = {}
    if "fwd" in direction:
        phases["fwd"] = [Step("all_gather kv", transfers=(gather,)), Step("attention", work)]
    if "bwd" in direction:
        phases["bwd"] = [
            Step("all_gather kv", transfers=(gather,)),
            Step("attention", work),
            Step(
                "reduce_scatter dkv",
                transfers=(
                    Transfer(
                        "reduce_scatter", "reduce_scatter", (ring - 1) * kv * acc_elem, group
                    ),
                ),
            ),
        ]
    return phases


def volume(phases: dict) -> dict:
    """Bytes one rank sends and receives over the phases, by counter kind (as comm.Comm counts)."""
    parts = {}
    for steps in phases.values():
        for s in steps:
            for t in s.transfers + s.window_transfers:
                parts[t.kind] = parts.get(t.kind, 0) + t.nbytes
    parts = {k: v for k, v in parts.items() if v}
    return {"sent": sum(parts.values()), "received": sum(parts.values()), "by_kind": parts}


def work(steps) -> int:
    """Visible (query, key) pairs one phase computes, summed over query heads."""
    return sum(c.area * h for s in steps for c, h in s.compute)
