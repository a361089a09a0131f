"""A network as the model sees it: bandwidth and latency per GPU, inside a node and across nodes.

Presets live in config.yaml (`cp_model.networks`); each names where its numbers come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....cp.schedule import Transfer


@dataclass(frozen=True)
class Network:
    name: str
    gpus_per_node: int
    intra_gbytes_per_s: float  # per GPU, per direction
    intra_latency_us: float
    inter_gbytes_per_s: float
    inter_latency_us: float
    compute_scale: float = (
        1.0  # local-kernel time multiplier against the device the kernel records come from
    )
    # seconds per transfer call on top of the preset's latency (Python and the library's call):
    # fitted on the grid's comm-only measurements (model/overhead.py), never a preset value
    call_overhead_s: float = 0.0

    @classmethod
    def from_config(cls, name: str, cfg: dict) -> Network:
        keys = (
            "gpus_per_node",
            "intra_gbytes_per_s",
            "intra_latency_us",
            "inter_gbytes_per_s",
            "inter_latency_us",
            "compute_scale",
        )
        return cls(name, **{k: cfg[k] for k in keys if k in cfg})

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
        lat = (self.inter_latency_us if inter else self.intra_latency_us) * 1e-6
        bw_intra, bw_inter = self.intra_gbytes_per_s * 1e9, self.inter_gbytes_per_s * 1e9
        if t.pattern == "p2p":
            wire = lat + t.nbytes / (bw_inter if inter else bw_intra)
        elif t.pattern == "all_to_all":
            # a share of the bytes to each other member: the off-node share goes over the NIC
            n = len(t.peers)
            off = sum(self.node(p) != self.node(rank) for p in t.peers)
            per_peer = t.nbytes / (n - 1)
            wire = lat + max(per_peer * (n - 1 - off) / bw_intra, per_peer * off / bw_inter)
        else:  # ring all-gather / reduce-scatter: every byte passes the slowest link of the ring
            wire = lat * (len(t.peers) - 1) + t.nbytes / (bw_inter if inter else bw_intra)
        return self.call_overhead_s + wire

    def link(self, t: Transfer, rank: int) -> str:
        return "inter-node" if self.crosses_nodes(rank, t.peers) else "intra-node"
