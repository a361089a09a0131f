"""An answer set against a baseline beside its ranking: "is block-sparse faster than dense?" in
the answer itself. A family names its baselines as data (AdviceFamily.against):

- OnSameMask: the fastest of the contenders at the answer's own point that the baseline names
  (dense kernels given the same block mask), against the fastest of the others: the same draws,
  so compared draw by draw (report.paired.compare);
- AtPoint: another family's answer at a point made from this one (dense kernels on the full mask
  at the same length, heads, head dim, dtype and direction, from whichever grid answers it,
  on the same device), its fastest against this answer's fastest: no shared draw (another mask),
  so compared without pairing (report.paired.compare_apart), and said so.

Where the tidy table holds no such number, the Against says what is missing instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .advice import Answer, Contender, one_per_question
from .labels import heads_label, seqlen_label
from .paired import Comparison, Standing, compare, compare_apart


def everyone(name: str) -> bool:
    return True


@dataclass(frozen=True)
class OnSameMask:
    """The baseline among the answer's own contenders: those `theirs` names."""

    key: str  # its name in JSON and CSV: 'dense_same_mask'
    words: str  # what it is: 'dense kernels on the same blocks'
    short: str  # in a few words, for one line per answer: 'dense, same blocks'
    theirs: Callable[[str], bool]  # a contender of the baseline
    mine: Callable[[str], bool] = everyone  # a contender it is set against

    def find(self, a: Answer, found: list[Answer]) -> Against:
        named = [c for c in (*a.ok, *a.not_ok) if self.theirs(c.name)]
        baseline = [c for c in a.ok if self.theirs(c.name)]  # fastest first, as ranked
        own = [c for c in a.ok if self.mine(c.name) and not self.theirs(c.name)]
        if not named:
            return Against(self, missing=f"none of {self.words} was measured at this point")
        if not baseline:
            why = "; ".join(f"{c.name} {c.why_not()}" for c in named)
            return Against(self, missing=f"none of {self.words} is ok here ({why})")
        if not own:
            return Against(self, missing="no other contender is ok here")
        mine, theirs = own[0], baseline[0]
        comparison = compare([mine.timed(), theirs.timed()], a.comparison.settings)
        if len(comparison.standings) < 2:
            return Against(self, missing=f"{mine.name} and {theirs.name} share no draw")
        return Against(self, mine, theirs, a, comparison)


@dataclass(frozen=True)
class AtPoint:
    """The baseline is another family's answer at `point(this point)`, same direction."""

    key: str  # 'dense_full'
    words: str  # 'dense full attention at the same length'
    short: str  # 'dense full'
    family: str  # the family whose answers hold it: 'kernel'
    point: Callable[[dict], dict]  # its point's values from this answer's point
    mine: Callable[[str], bool] = everyone

    def find(self, a: Answer, found: list[Answer]) -> Against:
        own = [c for c in a.ok if self.mine(c.name)]
        if not own:
            return Against(self, missing="no contender of this answer is ok here")
        want = self.point(a.point)
        b = answer_at(found, self.family, want, a.direction, devices(a))
        if b is None:
            return Against(self, missing=self._missing(a, want, found))
        if not b.ok:
            why = "; ".join(f"{c.name} {c.why_not()}" for c in b.not_ok)
            return Against(self, answer=b, missing=f"none ok in {b.grid} ({why})")
        mine, theirs = own[0], b.fastest
        rule = compare_apart(mine.timed(), theirs.timed(), a.comparison.settings)
        return Against(self, mine, theirs, b, rule)

    def _missing(self, a: Answer, want: dict, found: list[Answer]) -> str:
        """What the tidy table lacks, and where it has the baseline's mask at other lengths."""
        text = f"no {self.family} answer at {point_words(want)}, {a.direction}"
        here = matching(found, self.family, want, a.direction)
        if here:  # measured, but on another device
            others = sorted({d for b in here for d in devices(b)})
            return text + f" on {', '.join(sorted(devices(a)))} (only on {', '.join(others)})"
        rest = {k: v for k, v in want.items() if k != "seqlen"}
        lengths = sorted(
            {
                b.seqlen
                for b in matching(found, self.family, rest, a.direction)
                if devices(b) & devices(a)
            }
        )
        if lengths:
            text += f" (measured there at {', '.join(seqlen_label(s) for s in lengths)})"
        return text


Baseline = OnSameMask | AtPoint


def _same(have, want) -> bool:
    """Point values compare as numbers where both are numbers (32768 == 32768.0)."""
    try:
        return float(have) == float(want)
    except (TypeError, ValueError):
        return str(have) == str(want)


def point_words(p: dict) -> str:
    """A point's values in words: 'full mask, S=96K, GQA 64:8, head dim 128, bfloat16'."""
    words = {
        "mask": lambda: f"{p['mask']} mask",
        "seqlen": lambda: f"S={seqlen_label(p['seqlen'])}",
        "heads_q": lambda: heads_label(p["heads_q"], p["heads_kv"]),
        "head_dim": lambda: f"head dim {int(p['head_dim'])}",
    }
    out = [words[k]() if k in words else str(v) for k, v in p.items() if k != "heads_kv"]
    return ", ".join(out)


def devices(a: Answer) -> set[str]:
    """The devices an answer's records ran on (by name)."""
    return {r.device for c in (*a.ok, *a.not_ok) for r in c.records if r.device}


def matching(found: list[Answer], family: str, want: dict, direction: str) -> list[Answer]:
    """The measured answers of `family` in `direction` whose point has every value of `want`."""
    return [
        b
        for b in found
        if b.family.name == family
        and b.direction == direction
        and not b.emulated
        and all(_same(b.point.get(k), v) for k, v in want.items())
    ]


def answer_at(
    found: list[Answer], family: str, want: dict, direction: str, on: set[str]
) -> Answer | None:
    """The answer of `family` at the point `want` in `direction`, measured on one of the devices
    `on`; where several grids answer it, the one `advise` would choose (advice.precedence)."""
    same = [b for b in matching(found, family, want, direction) if devices(b) & on]
    return one_per_question(same)[0].answer if same else None


@dataclass(frozen=True)
class Against:
    """An answer's fastest (`mine`) against a baseline's fastest (`theirs`), or what is missing."""

    baseline: Baseline
    mine: Contender | None = None
    theirs: Contender | None = None
    answer: Answer | None = None  # the answer the baseline's contender comes from
    comparison: Comparison | None = None
    missing: str = ""  # why there is no comparison ('' where there is one)

    def _standing(self, c: Contender) -> Standing:
        return {s.name: s for s in self.comparison.standings}[c.name]

    @property
    def paired(self) -> bool:
        return isinstance(self.baseline, OnSameMask)

    @property
    def mine_ms(self) -> float:
        return self._standing(self.mine).mean_ms

    @property
    def theirs_ms(self) -> float:
        return self._standing(self.theirs).mean_ms

    @property
    def speedup(self) -> float:
        """The baseline's mean time over mine: above 1, mine is faster."""
        return self.theirs_ms / self.mine_ms

    @property
    def speedup_range(self) -> tuple[float, float]:
        """Per draw (paired) or per pair of draws (not paired): min and max of the same ratio."""
        fast = self.comparison.standings[0]
        slow = self.comparison.standings[1]
        if fast.name == self.mine.name:
            return slow.ratio_lo, slow.ratio_hi
        return 1 / slow.ratio_hi, 1 / slow.ratio_lo

    @property
    def verdict(self) -> str:
        """'faster' or 'slower' (mine, by the comparison's rule), or 'not apart'."""
        slow = self.comparison.standings[1]
        if not slow.slower:
            return "not apart"
        return "faster" if slow.name == self.theirs.name else "slower"

    @property
    def draws(self) -> str:
        """What the comparison rests on, in words."""
        if self.paired:
            n = self.comparison.draws
            return f"paired on {n} draw{'s' * (n != 1)}"
        n, m = len(self.mine.timed().draws), len(self.theirs.timed().draws)
        return f"not paired, no shared draw: {n} draw{'s' * (n != 1)} against {m}"

    def source(self) -> str:
        """Where the baseline's number comes from: its grid and its verdict, its point."""
        b = self.answer
        if b is None or self.paired:
            return ""
        at = f"{b.point['mask']} mask, S={seqlen_label(b.seqlen)}, {heads_label(*_heads(b))}"
        return f"{b.grid}, {at}: {b.verdict()}"


def _heads(a: Answer) -> tuple[int, int]:
    return int(a.point["heads_q"]), int(a.point["heads_kv"])


def against(a: Answer, found: list[Answer]) -> tuple[Against, ...]:
    """An answer set against each baseline its family names (`found`: every answer of the tidy
    table, where another family's baseline is looked up)."""
    return tuple(b.find(a, found) for b in a.family.against)
