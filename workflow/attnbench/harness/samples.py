"""How many samples a cell draws and checks, at which length its float64 check runs, the cell's
mask at a length, and the cell's outcome from its checks (shared by the kernel and CP cells)."""

from __future__ import annotations

from .. import status as S
from ..masks import pattern, sample_mask
from .inputs import check_mask_rng, data_seed


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
    """Check lengths are multiples of this: the block of block masks, else 1 (the pattern's)."""
    return pattern(spec["mask"]).check_granule(spec.get("mask_params", {}))


def mask_features(spec) -> list[tuple[str, int]]:
    """What a check of the cell's mask must hold to see its pattern, known from its settings:
    (feature, the tokens it needs), the pattern's check_features (a window one key too wide
    shows only where a row sees more than 2w + 1 keys; blocks only where there are two).
    Prefixes and global tokens are drawn at the check's own length, so they always fit; document
    boundaries are drawn (check_masks)."""
    return pattern(spec["mask"]).check_features(spec.get("mask_params", {}))


def check_masks(spec, s: int, histograms) -> list:
    """The masks a cell's checks at a shorter length `s` draw, one per checked sample: the same
    draws as the cell's (check_mask_rng of its data seed), made without torch."""
    seed = data_seed(spec)
    return [
        spec_mask(spec, s, check_mask_rng(seed, i, s), histograms)
        for i in range(checked_samples(spec))
    ]


def sees_a_document_boundary(spec, s: int, histograms) -> bool:
    """Whether the checks at length `s` of a document mask draw a document boundary (in at least
    one checked sample): without one a kernel that ignores the documents passes them."""
    return any(len(m.params["doc_lengths"]) > 1 for m in check_masks(spec, s, histograms))


def boundary_check_seqlen(spec, s: int, histograms, longer) -> int:
    """The shortest check length from `s` on (longer(s): the next one to try) whose checks draw
    a document boundary; at most the cell's own length, where its timed masks are checked."""
    while s < spec["seqlen"] and not sees_a_document_boundary(spec, s, histograms):
        s = min(longer(s), spec["seqlen"])
    return s


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
