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

from ....cp import catalog, schedule
from ....cp.chunks import allgather_chunks, document_lengths, is_causal, ring_step_chunk
from ....cp.layout import ShardLayout
from ....harness.flops import attention_flops
from ....masks import sample_mask
from .kernel_time import KernelTime
from .network import Network

ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
ACC_BYTES = {
    "bfloat16": 4,
    "float16": 4,
    "float32": 4,
    "float64": 8,
}  # cp.merge.accumulator_dtype's sizes
MODELLED_METHODS = ("ulysses", "ring_p2p", "ring_allgather", "usp", "loongtrain")


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


def rank_sample(ring: int, max_ring_ranks: int) -> list[int]:
    if ring <= max_ring_ranks:
        return list(range(ring))
    return sorted({int(x) for x in np.linspace(0, ring - 1, max_ring_ranks).round()})


def rank_schedules(
    method: str, deg: catalog.Degrees, mask, s: Setting, direction: str, max_ring_ranks: int
):
    """{global rank: {phase: [Step]}} from the methods' own layout, chunks and schedule."""
    causal = is_causal(mask.name)
    layout = ShardLayout(
        document_lengths(mask), deg.ring, 1 if method == "ring_allgather" else deg.ulysses
    )
    e, a = ELEM_BYTES[s.dtype], ACC_BYTES[s.dtype]
    out = {}
    for r in rank_sample(deg.ring, max_ring_ranks):
        if method == "ring_allgather":
            rank = deg.rank(r, 0)
            out[rank] = schedule.allgather_schedule(
                deg.ring,
                rank,
                allgather_chunks(layout, r, causal),
                layout.shard_len,
                s.heads_q,
                s.heads_kv,
                s.head_dim,
                e,
                a,
                direction,
            )
            continue
        chunks = {o: ring_step_chunk(layout, r, o, causal) for o in range(deg.ring)}
        for u in range(deg.ulysses):
            rank = deg.rank(r, u)
            out[rank] = schedule.hybrid_schedule(
                deg,
                rank,
                chunks,
                layout.shard_len,
                layout.piece_len,
                s.heads_q,
                s.heads_kv,
                s.head_dim,
                e,
                a,
                direction,
            )
    return out


def phase_seconds(
    per_rank: dict,
    phase: str,
    kt: KernelTime,
    net: Network,
    kernel_direction: str,
    with_comm: bool = True,
) -> tuple[float, dict]:
    """Lock-step time of one phase, and the exposed time by link (what transfers add)."""
    ranks = sorted(per_rank)
    steps0 = per_rank[ranks[0]][phase]
    total, exposed = 0.0, {"intra-node": 0.0, "inter-node": 0.0}
    k = 0
    while k < len(steps0):
        window = steps0[k].window
        group = [k]
        if window is not None:
            while k + len(group) < len(steps0) and steps0[k + len(group)].window == window:
                group.append(k + len(group))
        window_time = 0.0
        slowest_window = np.zeros(len(ranks))
        for j in group:
            comp = np.zeros(len(ranks))
            comm = np.zeros(len(ranks))
            links = {}
            for i, r in enumerate(ranks):
                st = per_rank[r][phase][j]
                comp[i] = (
                    sum(kt.chunk_seconds(c, h, kernel_direction) for c, h in st.compute)
                    * net.compute_scale
                )
                if with_comm:
                    for t in st.transfers:
                        comm[i] += net.seconds(t, r)
                        links[net.link(t, r)] = True
            step = np.maximum(comp, comm) if steps0[j].overlapped else comp + comm
            window_time += step.max()
            extra = step.max() - comp.max()
            if extra > 1e-12 and links:
                exposed["inter-node" if "inter-node" in links else "intra-node"] += extra
        if window is not None and with_comm:
            for i, r in enumerate(ranks):
                st = per_rank[r][phase][group[0]]
                slowest_window[i] = sum(net.seconds(t, r) for t in st.window_transfers)
            if slowest_window.max() > window_time:
                links = {
                    net.link(t, r)
                    for r in ranks
                    for t in per_rank[r][phase][group[0]].window_transfers
                }
                exposed["inter-node" if "inter-node" in links else "intra-node"] += (
                    slowest_window.max() - window_time
                )
                window_time = slowest_window.max()
        total += window_time
        k += len(group)
    return total, exposed


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
) -> Prediction:
    """One method on `gpus` GPUs for one realised mask (seqlen = tokens per GPU x gpus)."""
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
    per_rank = rank_schedules(method, deg, mask, s, direction, max_ring_ranks)
    phases = [p for p in ("fwd", "bwd") if p in direction]
    time = compute = 0.0
    exposed = {"intra-node": 0.0, "inter-node": 0.0}
    for p in phases:
        t, ex = phase_seconds(per_rank, p, kt, net, p)
        c, _ = phase_seconds(per_rank, p, kt, net, p, with_comm=False)
        time, compute = time + t, compute + c
        exposed = {k: exposed[k] + ex[k] for k in exposed}
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
    )


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
