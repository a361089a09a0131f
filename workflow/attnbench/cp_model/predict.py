"""Predicted time and per-GPU TFLOP/s of one method on N GPUs: every rank's schedule, timed.

Per phase, a step costs on a rank: its computation (kernel_time) and its transfers (network);
with `overlapped` the two run side by side (max), else one after the other (sum). Ring steps are
taken in lock-step: a step ends when its slowest rank ends it (each rank waits for its neighbour's
KV before the next step), so a phase costs the sum over steps of the slowest rank's step; a
window's `window_transfers` (LoongTrain's outer ring) run through the whole window. Above
`max_ring_ranks` ring ranks, an evenly spaced subset of them is timed (every Ulysses rank of each).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cp import catalog, schedule
from ..cp.chunks import document_lengths, is_causal
from ..harness.flops import attention_flops
from ..masks import sample_mask
from .geometry import geometry
from .kernel_time import KernelTime
from .memory import Sizes, peak_memory
from .network import Network

ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
ACC_BYTES = {
    "bfloat16": 4,
    "float16": 4,
    "float32": 4,
    "float64": 8,
}  # kernels.lse.accumulator_dtype's sizes
# the methods whose catalog entry names a model schedule, in the catalog's order
MODELLED_METHODS = tuple(n for n, m in catalog.METHODS.items() if m.model_schedule)
LOCAL = catalog.BARE_KERNEL  # the bare local kernel on one GPU: the baseline of "% of one GPU"


@dataclass(frozen=True)
class Setting:
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str


@dataclass
class Prediction:
    method: str
    gpus: int
    direction: str
    time_s: float | None
    compute_s: float | None  # the same schedule with every transfer free
    tflops_per_gpu: float | None
    bottleneck: str
    degrees: dict
    ranks_modelled: int = 0
    comm_only_s: float | None = None  # the same schedule with every computation free
    peak_mem_bytes: int | None = None  # per GPU, the worst modelled rank (memory.py)
    # the median ring step of each phase, summed over phases: compute, transfers (seconds)
    ring_step_s: tuple | None = None


def rank_sample(ring: int, max_ring_ranks: int) -> list[int]:
    if ring <= max_ring_ranks:
        return list(range(ring))
    return sorted({int(x) for x in np.linspace(0, ring - 1, max_ring_ranks).round()})


def rank_schedules(
    method: str, deg: catalog.Degrees, mask, s: Setting, direction: str, max_ring_ranks: int
):
    """({global rank: {phase: [Step]}}, Geometry): the methods' own schedules, their chunks
    given by the layout's numbers (geometry.py, the same zigzag rules as cp/chunks.py)."""
    causal = is_causal(mask.name)
    allgather = catalog.method(method).model_schedule == catalog.ALLGATHER_SCHEDULE
    geo = geometry(document_lengths(mask), deg.ring, 1 if allgather else deg.ulysses)
    attn = schedule.Attn(
        s.heads_q, s.heads_kv, s.head_dim, ELEM_BYTES[s.dtype], ACC_BYTES[s.dtype]
    )
    out = {}
    for r in rank_sample(deg.ring, max_ring_ranks):
        if allgather:
            rank = deg.rank(r, 0)
            out[rank] = schedule.allgather_schedule(
                deg.ring,
                rank,
                tuple(geo.allgather_chunks(r, causal)),
                geo.shard_len,
                attn,
                direction,
            )
            continue
        chunks = dict(enumerate(geo.ring_chunks(r, causal)))
        for u in range(deg.ulysses):
            rank = deg.rank(r, u)
            out[rank] = schedule.hybrid_schedule(
                deg,
                rank,
                chunks,
                geo.shard_len,
                geo.piece_len,
                attn,
                direction,
            )
    return out, geo


@dataclass
class PhaseTime:
    time: float  # lock-step, transfers as scheduled
    compute: float  # every transfer free
    comm_only: float  # every computation free (what a cell's comm-only variant times)
    exposed: dict  # link -> what transfers add to the compute time
    # the median ring step (overlapped steps): its slowest rank's compute and transfers
    ring_step: tuple | None = None


def _links(net: Network, transfers, rank) -> tuple[float, bool]:
    """Seconds of a rank's transfers and whether one of them crosses nodes."""
    return (
        sum(net.seconds(t, rank) for t in transfers),
        any(net.link(t, rank) == "inter-node" for t in transfers),
    )


def phase_times(per_rank: dict, phase: str, kt: KernelTime, net: Network) -> PhaseTime:
    """One phase on every modelled rank: [step, rank] arrays of computation and transfer time,
    then each step's slowest rank, and a window's outer transfers against its steps."""
    ranks = sorted(per_rank)
    steps0 = per_rank[ranks[0]][phase]
    shape = (len(steps0), len(ranks))
    comp, comm, window_comm = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    has_comm, inter = np.zeros(len(steps0), bool), np.zeros(len(steps0), bool)
    window_inter = np.zeros(len(steps0), bool)
    for i, r in enumerate(ranks):
        for j, st in enumerate(per_rank[r][phase]):
            if st.compute:
                comp[j, i] = sum(c.seconds(kt, h, phase) for c, h in st.compute)
            if st.transfers:
                comm[j, i], x = _links(net, st.transfers, r)
                has_comm[j], inter[j] = True, inter[j] | x
            if st.window_transfers:
                window_comm[j, i], x = _links(net, st.window_transfers, r)
                window_inter[j] |= x
    comp *= net.compute_scale
    overlapped = np.array([st.overlapped for st in steps0])[:, None]
    step = np.where(overlapped, np.maximum(comp, comm), comp + comm).max(axis=1)
    comp_max, comm_max = comp.max(axis=1), comm.max(axis=1)
    exposed = {"intra-node": 0.0, "inter-node": 0.0}
    extra = step - comp_max
    for j in np.flatnonzero((extra > 1e-12) & has_comm):
        exposed["inter-node" if inter[j] else "intra-node"] += extra[j]
    # steps grouped by window (None: a step of its own); a window ends when its steps and its
    # outer transfers (which run through it) have both ended
    windows = [st.window for st in steps0]
    total = comm_only = 0.0
    j = 0
    while j < len(steps0):
        k = j + 1
        if windows[j] is not None:
            while k < len(steps0) and windows[k] == windows[j]:
                k += 1
        t, c = step[j:k].sum(), comm_max[j:k].sum()
        outer = window_comm[j].max()
        if outer > t:
            exposed["inter-node" if window_inter[j] else "intra-node"] += outer - t
        total += max(t, outer)
        comm_only += max(c, outer)
        j = k
    ring = overlapped[:, 0]
    median_step = (
        (float(np.median(comp_max[ring])), float(np.median(comm_max[ring])))
        if ring.any()
        else None
    )
    return PhaseTime(total, float(comp_max.sum()), comm_only, exposed, median_step)


def load_balance(per_rank: dict, phase: str) -> float:
    work = [schedule.work(p[phase]) for p in per_rank.values()]
    return max(work) / np.mean(work) if np.mean(work) > 0 else 1.0


def predict(
    method: str,
    gpus: int,
    mask,
    s: Setting,
    direction: str,
    kt: KernelTime,
    net: Network,
    max_ring_ranks: int = 64,
    ulysses_degree="auto",
    windows="auto",
    previous_output: bool = False,
) -> Prediction:
    """One method on `gpus` GPUs for one realised mask (seqlen = tokens per GPU x gpus).
    `previous_output`: memory as a cell measures it when no compute-only / comm-only run
    preceded (1 GPU): the previous forward's saved output is still held (memory.py)."""
    if method not in MODELLED_METHODS:
        raise ValueError(
            f"the model has no schedule for {method!r}; modelled methods: {', '.join(MODELLED_METHODS)}"
        )
    deg = catalog.degrees(method, gpus, ulysses_degree, windows, "contiguous", net.gpus_per_node)
    why = (
        catalog.head_split_reason(deg.ulysses, s.heads_q, s.heads_kv) if deg.ulysses > 1 else None
    )
    if why:
        return Prediction(
            method, gpus, direction, None, None, None, f"unsupported: {why}", deg.to_json()
        )
    per_rank, geo = rank_schedules(method, deg, mask, s, direction, max_ring_ranks)
    phases = [p for p in ("fwd", "bwd") if p in direction]
    time = compute = comm_only = 0.0
    exposed = {"intra-node": 0.0, "inter-node": 0.0}
    ring_step = None
    for p in phases:
        pt = phase_times(per_rank, p, kt, net)
        time, compute, comm_only = time + pt.time, compute + pt.compute, comm_only + pt.comm_only
        exposed = {k: exposed[k] + pt.exposed[k] for k in exposed}
        if pt.ring_step:
            ring_step = tuple(a + b for a, b in zip(ring_step or (0.0, 0.0), pt.ring_step))
    sizes = Sizes(s.heads_q, s.heads_kv, s.head_dim, ELEM_BYTES[s.dtype], ACC_BYTES[s.dtype])
    mem = peak_memory(method, deg, geo, per_rank, sizes, direction, previous_output)
    flops = attention_flops(
        float(sum(mask.area_per_head)), s.head_dim, direction
    )  # all query heads
    return Prediction(
        method,
        gpus,
        direction,
        time,
        compute,
        flops / time / gpus / 1e12,
        bottleneck(time, compute, exposed, load_balance(per_rank, phases[0])),
        deg.to_json(),
        len(per_rank),
        comm_only,
        mem.peak_bytes,
        ring_step,
    )


def predict_local(mask, s: Setting, direction: str, kt: KernelTime, net: Network) -> Prediction:
    """The bare local kernel on one GPU over the whole mask: one call over its documents, none of
    a CP method's work around it (no per-call term), at the network preset's compute scale. Peak
    memory is not modelled for it."""
    chunk = geometry(document_lengths(mask), 1, 1).ring_chunks(0, is_causal(mask.name))[0]
    bare = kt.with_overhead({})
    phases = [p for p in ("fwd", "bwd") if p in direction]
    t = sum(chunk.seconds(bare, s.heads_q, p) for p in phases) * net.compute_scale
    flops = attention_flops(float(sum(mask.area_per_head)), s.head_dim, direction)
    deg = {"ulysses": 1, "ring": 1, "windows": 1, "placement": "contiguous"}
    return Prediction(LOCAL, 1, direction, t, t, flops / t / 1e12, "compute", deg, 1, 0.0)


def bottleneck(time: float, compute: float, exposed: dict, balance: float) -> str:
    """What the time goes to beyond balanced computation: the larger of exposed communication
    (by link) and load imbalance, when it is at least 5% of the time; else compute."""
    imbalance = compute * (1 - 1 / balance)
    causes = {
        "inter-node comm": exposed["inter-node"],
        "intra-node comm": exposed["intra-node"],
        "load imbalance": imbalance,
    }
    name, worst = max(causes.items(), key=lambda kv: kv[1])
    return name if worst >= 0.05 * time else "compute"


def realised_masks(
    mask_name: str,
    seqlen: int,
    samples: int,
    seed: int,
    mask_params: dict,
    histograms: dict,
    heads_q: int,
    heads_kv: int,
) -> list:
    """The realised masks the model averages over: sampled exactly as the cells sample theirs
    (masks.sample_mask with the grid's histograms), one draw for masks without documents."""
    rng = np.random.default_rng(seed)
    n = samples if mask_name not in ("full", "causal") else 1
    return [
        sample_mask(mask_name, seqlen, mask_params, rng, histograms, heads_q, heads_kv)
        for _ in range(n)
    ]
