"""One colour and one marker per kernel and per context-parallel method, in every figure; the
marks for statuses; line styles per heads setting.

Dense and sparse kernels share figures (sparse grids draw dense references), so their
(colour, marker) pairs are all distinct; CP methods are drawn only among themselves.
Names come from attnbench.labels (re-exported here for the family report modules).
"""

from __future__ import annotations

import zlib

from .labels import CP_METHODS_ORDER, NAMES, SPARSE_ORDER, STATUS_LABEL, order  # noqa: F401

KERNEL_STYLE = {
    # dense: SDPA backends in blues, FlashAttention generations in orange/red/brown
    "naive": ("#7f7f7f", "o"),
    "sdpa": ("#1f77b4", "s"),
    "sdpa_math": ("#6baed6", "^"),
    "sdpa_flash": ("#08306b", "D"),
    "sdpa_efficient": ("#17becf", "v"),
    "sdpa_cudnn": ("#5254a3", "P"),
    "flex": ("#2ca02c", "*"),
    "varlen": ("#bcbd22", "<"),
    "fa2": ("#ff7f0e", ">"),
    "fa3": ("#d62728", "h"),
    "fa4": ("#8c564b", "p"),
    "cudnn_te": ("#9467bd", "H"),
    "flashmask": ("#e377c2", "d"),
    # block-sparse
    "triton_block_sparse": ("#000000", "8"),
    "vsa": ("#e7298a", "D"),
    "flashinfer": ("#e6ab02", "v"),
    "fa2_sparse": ("#a6761d", "H"),
    # context-parallel methods (and `local`, the bare kernel on one GPU, their baseline)
    "local": ("#000000", "*"),
    "ulysses": ("#377eb8", "o"),
    "ring_p2p": ("#e41a1c", "s"),
    "ring_allgather": ("#ff7f00", "^"),
    "usp": ("#4daf4a", "D"),
    "loongtrain": ("#984ea3", "v"),
    "torch_cp": ("#a65628", "P"),
}
_FALLBACK_COLOURS = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354"]
_FALLBACK_MARKERS = ["o", "s", "^", "D", "v", "P", "*", "h"]

# Line style per heads setting, in order of appearance (GQA first in the paper's grids).
HEADS_STYLES = ["-", "--", ":", "-."]

# How a cell that did not give a number is marked. Bars carry a text mark; lines an X (out of
# memory) or a T (stopped at the time budget) on the axis floor, or a red ring (incorrect);
# unsupported / unavailable lines are absent and listed under the figure.
BAR_MARK = {"oom": "OOM", "unsupported": "\u00d7", "unavailable": "n/a", "timeout": "T/O"}
OOM_MARKER = {"marker": "X", "ms": 8, "mec": "black", "mew": 0.5}
TIMEOUT_MARKER = {"marker": "$T$", "ms": 8, "mec": "black", "mew": 0.3}
INCORRECT_RING = {"marker": "o", "mfc": "none", "mec": "red", "ms": 10, "mew": 1.2}
INCORRECT_HATCH = "////"


def _fallback(name: str, seq: list) -> str:
    # crc32, not hash(): the same name must get the same style in every process
    return seq[zlib.crc32(name.encode()) % len(seq)]


def colour(name: str) -> str:
    return KERNEL_STYLE[name][0] if name in KERNEL_STYLE else _fallback(name, _FALLBACK_COLOURS)


def marker(name: str) -> str:
    return KERNEL_STYLE[name][1] if name in KERNEL_STYLE else _fallback(name, _FALLBACK_MARKERS)


# Stars and pentagons look smaller than circles at the same size.
_MARKER_SCALE = {"*": 1.6, "p": 1.15, "h": 1.1, "H": 1.1, "P": 1.1}


def marker_size(name: str, base: float = 4.5) -> float:
    return base * _MARKER_SCALE.get(marker(name), 1.0)
