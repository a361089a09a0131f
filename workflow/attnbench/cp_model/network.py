"""A network as the model sees it: the links inside a node, and the node's NICs across nodes.

Presets live in config.yaml (`cp_model.networks`); each names where its numbers come from. A
preset may name a communication benchmark's output (`comm_bench`: rule comm_bench, model/commbench.py):
its per-pattern fits (all-to-all, send/recv, all-gather) then time the intra-node transfers of
that pattern, in place of the preset's one intra-node bandwidth and latency.

Across nodes a node has `nics_per_node` NICs of `nic_gbytes_per_s` each (one per GPU unless said).
A transfer one GPU makes alone or beside every other GPU of its node (a ring step, an all-to-all)
gets that GPU's share of them, at most one NIC. A ring collective (all-gather, reduce-scatter)
spreads its bytes over as many rings as the node has NICs, as NCCL's rings and trees do: each ring
leaves the node through its own NIC, so the boundary carries the bytes at the node's aggregate
bandwidth, and every GPU still carries them all over its intra-node links (the slower of the two).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..cp.schedule import Transfer
from ..harness.environment import REPO


@dataclass(frozen=True)
class Network:
    name: str
    gpus_per_node: int
    intra_gbytes_per_s: float  # per GPU, per direction
    intra_latency_us: float
    nic_gbytes_per_s: float  # one NIC, per direction
    inter_latency_us: float
    nics_per_node: int | None = None  # None: one NIC per GPU
    # local-kernel time multiplier against the device the kernel records come from (a preset of
    # another GPU states it, with its source)
    compute_scale: float = 1.0
    # seconds per transfer call on top of the preset's latency (Python and the library's call):
    # fitted on the grid's comm-only measurements (model/overhead.py), never a preset value
    call_overhead_s: float = 0.0
    # ((pattern, GB/s, latency us), ...) measured intra-node by the comm benchmark; a pattern not
    # listed (or without a usable fit) uses intra_gbytes_per_s / intra_latency_us (reduce-scatter:
    # all-gather's fit)
    intra_by_pattern: tuple = ()

    @classmethod
    def from_config(cls, name: str, cfg: dict) -> Network:
        keys = (
            "gpus_per_node",
            "intra_gbytes_per_s",
            "intra_latency_us",
            "nic_gbytes_per_s",
            "inter_latency_us",
            "nics_per_node",
            "compute_scale",
        )
        measured = comm_bench_fits(cfg["comm_bench"], name) if cfg.get("comm_bench") else ()
        return cls(name, **{k: cfg[k] for k in keys if k in cfg}, intra_by_pattern=measured)

    @property
    def nics(self) -> int:
        return self.gpus_per_node if self.nics_per_node is None else self.nics_per_node

    @property
    def node_gbytes_per_s(self) -> float:
        """The node's aggregate bandwidth across nodes (every NIC)."""
        return self.nics * self.nic_gbytes_per_s

    @property
    def gpu_gbytes_per_s(self) -> float:
        """One GPU's bandwidth across nodes: its share of the node's NICs, at most one NIC."""
        return min(self.nic_gbytes_per_s, self.node_gbytes_per_s / self.gpus_per_node)

    def intra(self, pattern: str) -> tuple[float, float]:
        """(bytes per second, latency seconds) of an intra-node transfer of this pattern."""
        fits = dict((p, (bw, lat)) for p, bw, lat in self.intra_by_pattern)
        bw, lat = fits.get(
            "all_gather" if pattern == "reduce_scatter" else pattern,
            (self.intra_gbytes_per_s, self.intra_latency_us),
        )
        return bw * 1e9, lat * 1e-6

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def crosses_nodes(self, rank: int, peers) -> bool:
        return any(self.node(p) != self.node(rank) for p in peers)

    def seconds(self, t: Transfer, rank: int) -> float:
        """Time of one transfer on `rank`: the call's overhead, latency per message, and bytes
        over the slowest link the bytes take. Ring collectives (all-gather, reduce-scatter) pay
        n-1 latencies."""
        if t.nbytes == 0:
            return 0.0
        inter = self.crosses_nodes(rank, t.peers)
        bw_intra, lat_intra = self.intra(t.pattern)
        lat = self.inter_latency_us * 1e-6 if inter else lat_intra
        bw_gpu = self.gpu_gbytes_per_s * 1e9
        if t.pattern == "p2p":
            wire = lat + t.nbytes / (bw_gpu if inter else bw_intra)
        elif t.pattern == "all_to_all":
            # a share of the bytes to each other member: the off-node share goes over the NIC
            n = len(t.peers)
            off = sum(self.node(p) != self.node(rank) for p in t.peers)
            per_peer = t.nbytes / (n - 1)
            wire = lat + max(per_peer * (n - 1 - off) / bw_intra, per_peer * off / bw_gpu)
        else:  # ring all-gather / reduce-scatter: one ring per NIC across nodes
            bw = min(bw_intra, self.node_gbytes_per_s * 1e9) if inter else bw_intra
            wire = lat * (len(t.peers) - 1) + t.nbytes / bw
        return self.call_overhead_s + wire

    def link(self, t: Transfer, rank: int) -> str:
        return "inter-node" if self.crosses_nodes(rank, t.peers) else "intra-node"

    def text(self) -> str:
        """The links in words (tables and answers)."""
        nics = f"{self.nics} NICs of {self.nic_gbytes_per_s:g} GB/s per node"
        return (
            f"{self.gpus_per_node} GPUs per node; intra-node {self.intra_gbytes_per_s:g} GB/s, "
            f"{self.intra_latency_us:g} us; inter-node {nics} ({self.gpu_gbytes_per_s:g} GB/s per "
            f"GPU, {self.node_gbytes_per_s:g} GB/s for a collective's rings), "
            f"{self.inter_latency_us:g} us; compute scale {self.compute_scale:g}"
        )


def comm_bench_fits(path: str, network: str) -> tuple:
    """((pattern, GB/s, latency us), ...) from a comm benchmark's JSON (its `fit` section)."""
    try:  # a relative path is the repository's (the committed results/<device>/comm)
        fits = json.loads((REPO / path).read_text())["fit"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(
            f"network {network}: comm_bench {path!r} is not a readable comm benchmark output "
            f"(snakemake <output_dir>/comm/cuda_n<GPUs>.json writes one): {e}"
        ) from None
    # a pattern whose timings fitted no positive bandwidth (noise on small messages) keeps the
    # preset's numbers; a least-squares intercept just below zero is no latency, not a negative one
    return tuple(
        sorted(
            (p, f["gbytes_per_s"], max(0.0, f["latency_us"]))
            for p, f in fits.items()
            if f.get("gbytes_per_s")
        )
    )
