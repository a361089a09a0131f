"""How many samples a cell draws and checks, at which length its float64 check runs, the cell's
mask at a length, and the cell's outcome from its checks (shared by the kernel and CP cells)."""

from __future__ import annotations

from ..grid.spec import Measurement, Problem
from ..masks import pattern, sample_mask
from ..record import status as S
from .inputs import check_mask_rng, data_seed


def n_samples(problem: Problem, measurement: Measurement) -> int:
    """Masks a cell draws: the grid's count for its mask's sample class."""
    cls = pattern(problem.mask).sample_class if problem.mask else "single"
    return int(measurement.samples[cls])


def spec_mask(problem: Problem, s: int, rng):
    """One draw from rng of the cell's mask (its parameters, its heads, its document-length
    histogram) at length s."""
    return sample_mask(
        problem.mask,
        s,
        problem.mask_params,
        rng,
        problem.histograms,
        problem.heads_q,
        problem.heads_kv,
    )


def check_seqlen(problem: Problem, cap: int) -> int:
    """The length correctness is checked at: the cell's own, or the largest affordable multiple
    of the mask's granule at or below `cap` (a cell's: its check.max_seqlen)."""
    s = problem.seqlen
    if s <= cap:
        return s
    granule = mask_granule(problem)
    return max(granule, cap // granule * granule)


def mask_granule(problem: Problem) -> int:
    """Check lengths are multiples of this: the block of block masks, else 1 (the pattern's)."""
    return pattern(problem.mask).check_granule(problem.mask_params)


def mask_features(problem: Problem) -> list[tuple[str, int]]:
    """What a check of the cell's mask must hold to see its pattern, known from its settings:
    (feature, the tokens it needs), the pattern's check_features (a window one key too wide
    shows only where a row sees more than 2w + 1 keys; blocks only where there are two).
    Prefixes and global tokens are drawn at the check's own length, so they always fit; document
    boundaries are drawn (check_masks)."""
    return pattern(problem.mask).check_features(problem.mask_params)


def check_masks(problem: Problem, measurement: Measurement, s: int) -> list:
    """The masks a cell's checks at a shorter length `s` draw, one per checked sample: the same
    draws as the cell's (check_mask_rng of its data seed), made without torch."""
    seed = data_seed(problem)
    return [
        spec_mask(problem, s, check_mask_rng(seed, i, s))
        for i in range(checked_samples(problem, measurement))
    ]


def sees_a_document_boundary(problem: Problem, measurement: Measurement, s: int) -> bool:
    """Whether the checks at length `s` of a document mask draw a document boundary (in at least
    one checked sample): without one a kernel that ignores the documents passes them."""
    return any(len(m.params["doc_lengths"]) > 1 for m in check_masks(problem, measurement, s))


def boundary_check_seqlen(problem: Problem, measurement: Measurement, s: int, longer) -> int:
    """The shortest check length from `s` on (longer(s): the next one to try) whose checks draw
    a document boundary; at most the cell's own length, where its timed masks are checked."""
    while s < problem.seqlen and not sees_a_document_boundary(problem, measurement, s):
        s = min(longer(s), problem.seqlen)
    return s


def shorter_check_seqlen(problem: Problem, s: int) -> int | None:
    """The next length to try when the check at `s` ran out of memory: half, on the granule;
    None when `s` is already the granule."""
    shorter = check_seqlen(problem, s // 2)
    return shorter if shorter < s else None


def checked_samples(problem: Problem, measurement: Measurement) -> int:
    """How many samples a cell checks: check.samples, and for masks drawn afresh per sample
    (documents: sample_class other than 'single') at least 3, or all of them if fewer."""
    n, asked = n_samples(problem, measurement), measurement.check.samples
    if problem.mask and pattern(problem.mask).sample_class != "single":
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
