"""Names as they appear in tables, figures and file names: orders (the registries'), status words,
length and heads labels, and the mask families the paper draws one figure each for. No plotting
here, so the table rules do not depend on the plotting style."""

from __future__ import annotations

from ..cp.catalog import METHODS
from ..kernels.catalog import KERNELS
from ..masks.patterns import FAMILY_TITLES, FIGURE_FAMILIES

GIB = 2**30  # bytes in records, GiB in tables and figures

# Every kernel and CP method once, in the order of legends, table columns and colours: the order
# of their registries.
NAMES = tuple(dict.fromkeys(tuple(KERNELS) + tuple(METHODS)))

STATUS_LABEL = {
    "oom": "OOM",
    "unsupported": "unsup.",
    "unavailable": "n/a",
    "incorrect": "wrong",
    "timeout": "timeout",
    "implausible": "implausible",
    "crashed": "crashed",
}
STATUS_MEANING = {
    "ok": "measured, agrees with the float64 reference",
    "oom": "out of memory at this size",
    "unsupported": "the kernel cannot express this mask or shape",
    "unavailable": "library not installed or device lacks what it needs; not measured here",
    "incorrect": "ran, but disagrees with the float64 reference (time kept, flagged)",
    "timeout": "still running at the grid's time budget (cell_timeout_s); stopped, no time",
    "implausible": "faster than the device's measured matmul ceiling allows (by over 5%): a FLOP "
    "count or a timing is wrong; kept, never compared",
    "crashed": "its process ended without a record (a crash, a kill); no time; the next run retries it",
}
# What the status words in tables stand for.
STATUS_NOTE = (
    "OOM: out of memory; unsup.: unsupported; n/a: unavailable (not measured on this machine); "
    "timeout: stopped at the time budget; crashed: the process ended without a record; implausible: above the device's matmul ceiling; "
    "(wrong): disagrees with the float64 reference"
)

# The paper draws TFLOP/s vs length one figure per family of related masks (Figs. 8-14): each
# pattern declares its family (masks/patterns/, figure_family), in the order of its registry.
MASK_FAMILIES = FIGURE_FAMILIES
FAMILY_TITLE = FAMILY_TITLES
DIRECTION_LABEL = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward+backward"}


def order(names) -> list:
    """Names in the registry's order (unknown ones last, alphabetically)."""
    names = list(dict.fromkeys(names))
    return sorted(names, key=lambda n: (NAMES.index(n) if n in NAMES else len(NAMES), n))


def mask_family(mask: str) -> str:
    """The family a mask is drawn with; a mask outside every family is its own family."""
    for fam, masks in MASK_FAMILIES.items():
        if mask in masks:
            return fam
    return mask


def mask_families(masks) -> dict:
    """{family: [its masks present]} for the given masks, families and masks in canonical order."""
    masks = list(dict.fromkeys(masks))
    out = {}
    for fam, members in MASK_FAMILIES.items():
        present = [m for m in members if m in masks]
        if present:
            out[fam] = present
    grouped = {m for members in MASK_FAMILIES.values() for m in members}
    for m in masks:
        if m not in grouped:
            out[m] = [m]
    return out


def family_title(fam: str) -> str:
    return FAMILY_TITLE.get(fam, f"{fam} mask")


def seqlen_label(s) -> str:
    s = int(s)
    return f"{s // 1024}K" if s >= 1024 and s % 1024 == 0 else str(s)


def heads_label(hq, hkv) -> str:
    """'GQA 64:8', 'MHA 64:64' or 'MQA 64:1', as the paper names the head settings."""
    hq, hkv = int(hq), int(hkv)
    kind = "MHA" if hq == hkv else ("MQA" if hkv == 1 else "GQA")
    return f"{kind} {hq}:{hkv}"


def direction_label(d: str) -> str:
    return DIRECTION_LABEL.get(d, d)
