"""How many samples a cell draws and checks, at which length its float64 check runs, the cell's
mask at a length, and the cell's outcome from its checks (shared by the kernel and CP cells)."""

from __future__ import annotations

from .. import status as S
from ..masks import pattern, sample_mask


def n_samples(spec) -> int:
    return int(spec["samples"][pattern(spec["mask"]).sample_class if spec["mask"] else "single"])


def spec_mask(spec, s: int, rng, histograms):
    """One draw from rng of the cell's mask (its parameters, its heads) at length s."""
    params = spec.get("mask_params", {})
    return sample_mask(spec["mask"], s, params, rng, histograms, spec["heads_q"], spec["heads_kv"])


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


def checked_outcome(samples: list[dict]) -> tuple[str, str | None]:
    """A measured cell's status and reason: incorrect, naming the samples whose check failed, or ok."""
    failed = [s["index"] for s in samples if not s.get("check", {}).get("passed", True)]
    if failed:
        return (
            S.INCORRECT,
            f"samples {failed} disagree with the float64 reference beyond tolerance",
        )
    return S.OK, None


class CheckOutOfMemory(RuntimeError):
    """The float64 check ran out of memory even at the shortest length: the check could not be
    made. Not the kernel's `oom` (its timings ran fine): the job fails instead of lying."""
