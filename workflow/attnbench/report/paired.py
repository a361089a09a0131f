"""Contenders compared draw by draw: the rule behind every answer (kernel, block-sparse, CP).

Every contender at a grid point sees the same sampled masks (draws) in the same order, one data
seed, so two contenders are compared on each draw separately, never on repetitions pooled over
draws whose cost differs several-fold. Per draw, each contender has the median and the p20-p80 of
its timed repetitions (its own timing noise on that draw).

The rule (docs/measurement.md, "Which is faster"), with settings alpha and threshold
(config.yaml `report.verdict`: 0.05 and 1.02 by default):
- The contenders are ranked by their mean time over the shared draws (draws weigh by their cost).
- Many draws (n at least the smallest count at which a one-sided sign test can reach alpha: 5 at
  0.05): B is *slower* than the fastest A where B's median is above A's on at least k of the n
  draws, k the smallest count whose sign-test p-value (Binomial(n, 1/2) tail) is <= alpha, AND
  the geometric mean of B/A over the draws is >= threshold. Its false-winner rate is at most
  alpha per pair where draws are independent; the threshold keeps consistent but tiny
  differences (a 1% kernel) a tie.
- Few draws (fewer than that, down to one fixed mask): the sign test cannot reach alpha, so the
  repetitions decide as well: B is slower where on every draw B's p20 is above A's p80 (bands
  apart) AND the geometric mean of B/A is >= threshold.
- The fastest is the *winner* when every other contender is slower than it; otherwise the answer
  is a tie of the fastest and every contender that is not slower.
- Each contender's ratio to the fastest is given per draw (its min-max and geometric mean over the
  draws), its sign-test p-value, and the draws it wins (the lowest median of all on that draw).
A tie cannot hide a winner: a contender faster than the fastest on every draw would have the lower
mean. The Comparison names the rule that decided (`rule`, `how`); benchmarks/verdict_error_rates.py
simulates its error rates on the committed H200 noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from itertools import count

NO_FINGERPRINT = ""  # a record without per-sample data: read as one draw
SIGN_TEST = "sign test"  # Comparison.rule: many draws
BANDS = "p20-p80 apart"  # Comparison.rule: few draws, decided on the repetitions as well
# Comparison.rule: few draws measured side by side in interleaved windows (families/kernel/point.py):
# the sign test over the windows, each contender's window k taken in the same round as the others'
WINDOWS = "sign test over windows"
# Comparison.rule: two contenders that share no draw (another mask: dense full attention beside a
# block-sparse answer), decided on the repetitions of every draw of each (compare_apart)
APART = "no shared draw: p20-p80 apart"


@dataclass(frozen=True)
class Verdict:
    """The rule's settings (config.yaml `report.verdict`)."""

    alpha: float = 0.05  # the sign test's one-sided significance level
    threshold: float = 1.02  # the least geometric-mean ratio B/A called slower (1.02: 2%)

    @classmethod
    def of(cls, cfg: dict | None) -> Verdict:
        """From a config, or a grid's report settings (grid.config.report_settings), that have
        `report: {verdict: ...}`; the defaults where they have none."""
        given = ((cfg or {}).get("report") or {}).get("verdict") or {}
        return cls(**{k: float(v) for k, v in given.items() if k in ("alpha", "threshold")})

    @property
    def min_draws(self) -> int:
        """The fewest draws on which the sign test can reach alpha (all n slower: p = 2^-n)."""
        return next(n for n in count(1) if 0.5**n <= self.alpha)

    def percent(self) -> str:
        """The threshold in words: '2%'."""
        return f"{(self.threshold - 1) * 100:.3g}%"


DEFAULT = Verdict()
# The settings compare() uses where none are given: the drivers of the tables, figures and advise
# set them from the config for the work they do (`ruled_by`); a ContextVar, so one process can
# hold several and a worker process starts from the defaults.
_CURRENT: ContextVar[Verdict] = ContextVar("verdict", default=DEFAULT)


def current() -> Verdict:
    return _CURRENT.get()


@contextmanager
def ruled_by(settings: Verdict) -> Iterator[Verdict]:
    """compare() uses these settings within the block."""
    token = _CURRENT.set(settings)
    try:
        yield settings
    finally:
        _CURRENT.reset(token)


@cache
def sign_test_p(slower: int, n: int) -> float:
    """One-sided sign test: P(at least `slower` of n draws slower) where each is a coin toss."""
    return sum(math.comb(n, i) for i in range(slower, n + 1)) / 2**n


@cache
def draws_needed(n: int, alpha: float) -> int | None:
    """k: the fewest of n draws B must be slower on for p <= alpha; None where even n of n is not
    enough (too few draws for the sign test)."""
    return next((k for k in range(n + 1) if sign_test_p(k, n) <= alpha), None)


def geometric_mean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


@dataclass(frozen=True)
class Draw:
    """One contender's timings on one draw: its repetitions' median and p20-p80, ms."""

    sample: int  # its place in the point's sequence of draws
    fingerprint: str  # its mask's (report.collect.draw_fingerprint); NO_FINGERPRINT: unknown
    median: float
    p20: float
    p80: float
    windows: tuple[float, ...] = ()  # its windows' medians, side by side, round by round

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
            tuple(a + b for a, b in zip(self.windows, other.windows))
            if len(self.windows) == len(other.windows)
            else (),
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
    slower: bool  # slower than the fastest by the comparison's rule (never for the fastest)
    geomean: float = 1.0  # geometric mean of its per-draw median over the fastest's
    slower_on: int = 0  # draws on which its median is above the fastest's
    p_value: float = 1.0  # one-sided sign test of slower_on of the draws (1 for the fastest)


@dataclass(frozen=True)
class Comparison:
    """Contenders at one point and direction, compared on the draws they share."""

    standings: tuple[Standing, ...]  # fastest first
    draws: int  # how many draws the comparison rests on
    per_sample: bool  # False: a record had no per-sample data and was read as one draw
    unpaired: tuple[str, ...] = ()  # contenders that share no draw with the others
    rule: str = ""  # how `slower` was decided: SIGN_TEST or BANDS ('' where nothing was compared)
    need: int = 0  # SIGN_TEST: the draws of `draws` a slower contender is slower on, at least
    settings: Verdict = field(default=DEFAULT)
    windows: int = 0  # WINDOWS: how many windows the sign test counted

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

    @property
    def how(self) -> str:
        """The rule that decided, in words: 'one draw: repetitions' p20-p80 apart and >= 2%'."""
        s, n = self.settings, self.draws
        at_least = f">= {s.percent()}"
        if self.rule == SIGN_TEST:
            return (
                f"{n} draws: slower on >= {self.need} of {n} (sign test, p <= {s.alpha:g}) "
                f"and {at_least} (geometric mean)"
            )
        if self.rule == WINDOWS:
            draws = "one draw" if n == 1 else f"{n} draws"
            return (
                f"{draws} in {self.windows} interleaved windows: slower in >= {self.need} of "
                f"{self.windows} (sign test, p <= {s.alpha:g}) and {at_least} (geometric mean)"
            )
        if self.rule == APART:
            return (
                "every draw's p20 of the slower above every draw's p80 of the faster and "
                f"{at_least} (geometric mean over every pair of draws)"
            )
        if self.rule == BANDS:
            if n == 1:
                return f"one draw: repetitions' p20-p80 apart and {at_least}"
            return f"{n} draws: repetitions' p20-p80 apart on each and {at_least} (geometric mean)"
        return ""


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


def compare(contenders: list[Timed], settings: Verdict | None = None) -> Comparison:
    """The paired comparison of contenders (each with at least one draw), by the rule of the
    module's docstring with `settings` (default: the current ones, `ruled_by`)."""
    settings = settings or current()
    keys, kept, left = shared_draws(contenders)
    if not kept:
        return Comparison((), 0, True, tuple(t.name for t in left), settings=settings)
    n = len(keys)
    on = {t.name: t.on(keys) for t in kept}
    mean = {name: sum(d.median for d in ds) / n for name, ds in on.items()}
    ranked = sorted(kept, key=lambda t: mean[t.name])
    best = on[ranked[0].name]
    winners = [min(on, key=lambda name, i=i: on[name][i].median) for i in range(n)]
    need = draws_needed(n, settings.alpha)
    rule = SIGN_TEST if need is not None else BANDS
    # too few draws, but measured side by side in windows: the windows are the pairs counted
    counts = {len(d.windows) for ds in on.values() for d in ds}
    m = n * counts.pop() if rule == BANDS and len(counts) == 1 else 0
    if m and draws_needed(m, settings.alpha) is not None:
        rule, need = WINDOWS, draws_needed(m, settings.alpha)
    standings = []
    for i, t in enumerate(ranked):
        ds = on[t.name]
        ratios = [d.median / b.median for d, b in zip(ds, best)]
        geomean = geometric_mean(ratios)
        slower_on = sum(d.median > b.median for d, b in zip(ds, best))  # a tie is not slower
        if rule == SIGN_TEST:
            consistent = slower_on >= need
        elif rule == WINDOWS:
            pairs = [(w, v) for d, b in zip(ds, best) for w, v in zip(d.windows, b.windows)]
            consistent = sum(w > v for w, v in pairs) >= need
        else:  # too few draws to count them: each draw's repetitions must be apart
            consistent = all(d.p20 > b.p80 for d, b in zip(ds, best))
        standings.append(
            Standing(
                name=t.name,
                mean_ms=mean[t.name],
                min_ms=min(d.median for d in ds),
                max_ms=max(d.median for d in ds),
                ratio_lo=min(ratios),
                ratio_hi=max(ratios),
                wins=winners.count(t.name),
                slower=i > 0 and consistent and geomean >= settings.threshold,
                geomean=geomean,
                slower_on=slower_on,
                p_value=sign_test_p(slower_on, n),
            )
        )
    per_sample = all(t.per_sample for t in kept)
    return Comparison(
        tuple(standings),
        n,
        per_sample,
        tuple(t.name for t in left),
        rule=rule,
        need=need or 0,
        settings=settings,
        windows=m if rule == WINDOWS else 0,
    )


def compare_apart(one: Timed, other: Timed, settings: Verdict | None = None) -> Comparison:
    """Two contenders that share no draw (each with at least one), compared without pairing: the
    faster has the lower mean over its own draws; the other is slower where the p20 of each of its
    draws is above the p80 of each of the faster's draws (so no draw of one overlaps a draw of the
    other) and the geometric mean of their ratios over every pair of draws (the ratio of their
    geometric means) is >= threshold. A ratio's min-max is over every pair of draws. `draws` is
    the fewer of the two counts: what the comparison rests on at least."""
    settings = settings or current()
    mean = {t.name: sum(d.median for d in t.draws) / len(t.draws) for t in (one, other)}
    fast, slow = sorted((one, other), key=lambda t: mean[t.name])
    pairs = [(d.median / f.median) for d in slow.draws for f in fast.draws]
    geomean = geometric_mean(pairs)
    apart = min(d.p20 for d in slow.draws) > max(f.p80 for f in fast.draws)

    def standing(t: Timed, ratios: list[float], slower: bool) -> Standing:
        medians = [d.median for d in t.draws]
        return Standing(
            name=t.name,
            mean_ms=mean[t.name],
            min_ms=min(medians),
            max_ms=max(medians),
            ratio_lo=min(ratios),
            ratio_hi=max(ratios),
            wins=0,  # no draw of both to win
            slower=slower,
            geomean=geometric_mean(ratios),
        )

    return Comparison(
        (
            standing(fast, [1.0], False),
            standing(slow, pairs, apart and geomean >= settings.threshold),
        ),
        min(len(one.draws), len(other.draws)),
        one.per_sample and other.per_sample,
        rule=APART,
        settings=settings,
    )
