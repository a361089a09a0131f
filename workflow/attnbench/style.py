"""One colour and one marker per kernel and per context-parallel method, in every figure."""

from __future__ import annotations

from .kernels.catalog import KERNELS

CP_METHODS_ORDER = ("ulysses", "ring_p2p", "ring_allgather", "usp", "loongtrain", "torch_cp")
SPARSE_ORDER = ("triton_block_sparse", "vsa", "flashinfer", "fa2_sparse")
NAMES = tuple(dict.fromkeys(tuple(KERNELS) + SPARSE_ORDER + CP_METHODS_ORDER))

# 20 distinguishable colours (tab20 without its pale halves first, then the pale ones).
_PALETTE = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363",
]
_MARKERS = ["o", "s", "^", "D", "v", "P", "*", "<", ">", "h", "p", "H", "8", "d", "X", "o", "s", "^", "D", "v"]

STATUS_LABEL = {"oom": "OOM", "unsupported": "unsup.", "unavailable": "n/a", "incorrect": "wrong"}


def colour(name: str) -> str:
    i = NAMES.index(name) if name in NAMES else hash(name) % len(_PALETTE)
    return _PALETTE[i % len(_PALETTE)]


def marker(name: str) -> str:
    i = NAMES.index(name) if name in NAMES else hash(name) % len(_MARKERS)
    return _MARKERS[i % len(_MARKERS)]


def order(names) -> list:
    """Names in the registry's order (unknown ones last, alphabetically)."""
    names = list(dict.fromkeys(names))
    return sorted(names, key=lambda n: (NAMES.index(n) if n in NAMES else len(NAMES), n))
