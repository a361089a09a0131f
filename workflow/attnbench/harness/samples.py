"""How many samples a cell draws and checks, and at which length its float64 check runs (shared
by the kernel and CP cells)."""

from __future__ import annotations

from ..masks import pattern


def n_samples(spec) -> int:
    return int(spec["samples"][pattern(spec["mask"]).sample_class if spec["mask"] else "single"])


def check_seqlen(spec, cap: int | None = None) -> int:
    """The length correctness is checked at: the cell's own, or the largest affordable multiple
    of the mask's granule at or below `cap` (default check.max_seqlen)."""
    s = spec["seqlen"]
    cap = spec["check"]["max_seqlen"] if cap is None else cap
    if s <= cap:
        return s
    granule = mask_granule(spec)
    return max(granule, cap // granule * granule)


def mask_granule(spec) -> int:
    """Check lengths are multiples of this: the block of block masks, else 1."""
    p = spec.get("mask_params", {})
    return {
        "block_causal_document": p.get("block"),
        "block_sparse": p.get("block_size"),
        "variable_block_sparse": p.get("avg_block"),
    }.get(spec["mask"]) or 1


def shorter_check_seqlen(spec, s: int) -> int | None:
    """The next length to try when the check at `s` ran out of memory: half, on the granule;
    None when `s` is already the granule."""
    shorter = check_seqlen(spec, s // 2)
    return shorter if shorter < s else None


def checked_samples(spec) -> int:
    """How many samples a cell checks: check.samples, and for masks drawn afresh per sample
    (documents: sample_class other than 'single') at least 3, or all of them if fewer."""
    n, asked = n_samples(spec), spec["check"]["samples"]
    if spec["mask"] and pattern(spec["mask"]).sample_class != "single":
        return max(asked, min(3, n))
    return asked


class CheckOutOfMemory(RuntimeError):
    """The float64 check ran out of memory even at the shortest length: the check could not be
    made. Not the kernel's `oom` (its timings ran fine): the job fails instead of lying."""
