"""Contenders compared draw by draw: the rule behind every answer (kernel, block-sparse, CP).

Every contender at a grid point sees the same sampled masks (draws) in the same order, one data
seed, so two contenders are compared on each draw separately, never on repetitions pooled over
draws whose cost differs several-fold. Per draw, each contender has the median and the p20-p80 of
its timed repetitions (its own timing noise on that draw).

The rule (docs/measurement.md, "Which is faster"):
- B is *slower* than A when, on every draw they share, B's p20 is above A's p80: slower on each
  draw by more than either's noise. More draws make it harder to meet, never easier.
- The contenders are ranked by their mean time over the shared draws (draws weigh by their cost).
- The fastest is the *winner* when every other contender is slower than it; otherwise the answer
  is a tie of the fastest and every contender that is not slower.
- Each contender's ratio to the fastest is given per draw (its min-max over the draws), and the
  draws it wins (it has the lowest median of all on that draw).
A tie cannot hide a winner: a contender faster than the fastest on every draw would have the lower
mean. With one draw the rule is the p20-p80 of that draw alone, and answers say "one draw".
"""

from __future__ import annotations

from dataclasses import dataclass

NO_FINGERPRINT = ""  # a record without per-sample data: read as one draw


@dataclass(frozen=True)
class Draw:
    """One contender's timings on one draw: its repetitions' median and p20-p80, ms."""

    sample: int  # its place in the point's sequence of draws
    fingerprint: str  # its mask's (report.collect.draw_fingerprint); NO_FINGERPRINT: unknown
    median: float
    p20: float
    p80: float

    @property
    def key(self) -> tuple[int, str]:
        """The same draw has the same place and mask for every contender (full and causal masks
        have one fingerprint for every draw: the place tells them apart)."""
        return self.sample, self.fingerprint

    def __add__(self, other: Draw) -> Draw:
        """The training step on one draw: forward + backward (p20s and p80s summed)."""
        return Draw(
            self.sample,
            self.fingerprint,
            self.median + other.median,
            self.p20 + other.p20,
            self.p80 + other.p80,
        )


@dataclass(frozen=True)
class Timed:
    """A contender's draws at one point and direction."""

    name: str
    draws: tuple[Draw, ...]

    @property
    def per_sample(self) -> bool:
        return all(d.fingerprint != NO_FINGERPRINT for d in self.draws)

    def on(self, keys) -> list[Draw]:
        at = {d.key: d for d in self.draws}
        return [at[k] for k in keys]


def step(fwd: Timed, bwd: Timed, name: str | None = None) -> Timed:
    """fwd + bwd draw by draw (the draws both have)."""
    back = {d.key: d for d in bwd.draws}
    return Timed(name or fwd.name, tuple(d + back[d.key] for d in fwd.draws if d.key in back))


@dataclass(frozen=True)
class Standing:
    """One contender in a paired comparison."""

    name: str
    mean_ms: float  # mean of its per-draw medians over the compared draws
    min_ms: float  # its fastest and slowest draw (per-draw medians)
    max_ms: float
    ratio_lo: float  # its per-draw median over the fastest's: min and max over the draws
    ratio_hi: float
    wins: int  # draws on which its median is the lowest of all
    slower: bool  # slower than the fastest on every draw, p20-p80 apart (never for the fastest)


@dataclass(frozen=True)
class Comparison:
    """Contenders at one point and direction, compared on the draws they share."""

    standings: tuple[Standing, ...]  # fastest first
    draws: int  # how many draws the comparison rests on
    per_sample: bool  # False: a record had no per-sample data and was read as one draw
    unpaired: tuple[str, ...] = ()  # contenders that share no draw with the others

    @property
    def fastest(self) -> Standing | None:
        return self.standings[0] if self.standings else None

    @property
    def not_slower(self) -> tuple[Standing, ...]:
        """The fastest and every contender not slower than it: the tie, where there are several."""
        return tuple(s for s in self.standings if not s.slower)

    @property
    def winner(self) -> Standing | None:
        """The fastest, where every other contender is slower than it (or it is alone)."""
        return self.fastest if len(self.not_slower) == 1 else None


def shared_draws(contenders: list[Timed]) -> tuple[list[tuple], list[Timed], list[Timed]]:
    """(the draws compared, in order; the contenders compared; those sharing none of them).
    Normally every contender has the same draws. Where some lack draws (records made with other
    sample counts), the contenders with the most draws are taken first while a shared draw remains."""
    order = sorted(contenders, key=lambda t: -len(t.draws))
    keys: list[tuple] | None = None
    kept, left = [], []
    for t in order:
        mine = [d.key for d in t.draws]
        common = mine if keys is None else [k for k in keys if k in set(mine)]
        if common:
            keys, kept = common, [*kept, t]
        else:
            left.append(t)
    kept.sort(key=contenders.index)
    return keys or [], kept, left


def compare(contenders: list[Timed]) -> Comparison:
    """The paired comparison of contenders (each with at least one draw)."""
    keys, kept, left = shared_draws(contenders)
    if not kept:
        return Comparison((), 0, True, tuple(t.name for t in left))
    on = {t.name: t.on(keys) for t in kept}
    mean = {n: sum(d.median for d in ds) / len(ds) for n, ds in on.items()}
    ranked = sorted(kept, key=lambda t: mean[t.name])
    best = on[ranked[0].name]
    winners = [min(on, key=lambda n, i=i: on[n][i].median) for i in range(len(keys))]
    standings = []
    for i, t in enumerate(ranked):
        ds = on[t.name]
        ratios = [d.median / b.median for d, b in zip(ds, best)]
        slower = i > 0 and all(d.p20 > b.p80 for d, b in zip(ds, best))
        standings.append(
            Standing(
                name=t.name,
                mean_ms=mean[t.name],
                min_ms=min(d.median for d in ds),
                max_ms=max(d.median for d in ds),
                ratio_lo=min(ratios),
                ratio_hi=max(ratios),
                wins=winners.count(t.name),
                slower=slower,
            )
        )
    per_sample = all(t.per_sample for t in kept)
    return Comparison(tuple(standings), len(keys), per_sample, tuple(t.name for t in left))
