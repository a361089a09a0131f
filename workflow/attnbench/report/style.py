"""How every figure draws a kernel or a context-parallel method (the colour and marker its registry
entry carries: attnbench.kernels.catalog, attnbench.cp.catalog; a fallback for names in neither),
the marks for statuses, and line styles per heads setting.

Dense and sparse kernels share figures (sparse grids draw dense references), so their
(colour, marker) pairs are all distinct; CP methods are drawn only among themselves.
"""

from __future__ import annotations

import zlib

from ..cp.catalog import METHODS
from ..kernels.catalog import KERNELS, OUT_OF_MEMORY_MARKER

_FALLBACK_COLOURS = [
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#3182bd",
    "#e6550d",
    "#31a354",
]
_FALLBACK_MARKERS = ["o", "s", "^", "D", "v", "P", "*", "h"]

# Line style per heads setting, in order of appearance (GQA first in the paper's grids).
HEADS_STYLES = ["-", "--", ":", "-."]

# How a cell that did not give a number is marked. Bars carry a text mark; lines an X (out of
# memory) or a T (stopped at the time budget) on the axis floor, or a red ring (incorrect);
# unsupported / unavailable lines are absent and listed under the figure.
BAR_MARK = {
    "oom": "OOM",
    "unsupported": "\u00d7",
    "unavailable": "n/a",
    "timeout": "T/O",
    "crashed": "crash",
    "incorrect": "wrong",  # an incorrect cell without a time (its output was malformed)
}
OOM_MARKER = {"marker": OUT_OF_MEMORY_MARKER, "ms": 8, "mec": "black", "mew": 0.5}
TIMEOUT_MARKER = {"marker": "$T$", "ms": 8, "mec": "black", "mew": 0.3}
INCORRECT_RING = {"marker": "o", "mfc": "none", "mec": "red", "ms": 10, "mew": 1.2}
INCORRECT_HATCH = "////"


def _fallback(name: str, seq: list) -> str:
    # crc32, not hash(): the same name must get the same style in every process
    return seq[zlib.crc32(name.encode()) % len(seq)]


def _entry(name: str):
    """The registry entry of a kernel or CP method (their names are distinct), or None."""
    return KERNELS.get(name) or METHODS.get(name)


def colour(name: str) -> str:
    entry = _entry(name)
    return entry.colour if entry and entry.colour else _fallback(name, _FALLBACK_COLOURS)


def marker(name: str) -> str:
    entry = _entry(name)
    return entry.marker if entry and entry.marker else _fallback(name, _FALLBACK_MARKERS)


# Stars and pentagons look smaller than circles at the same size.
_MARKER_SCALE = {"*": 1.6, "p": 1.15, "h": 1.1, "H": 1.1, "P": 1.1}


def marker_size(name: str, base: float = 4.5) -> float:
    return base * _MARKER_SCALE.get(marker(name), 1.0)
