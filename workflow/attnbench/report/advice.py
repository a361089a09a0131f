"""The answer a reader comes for, from the tidy tables alone: at every point of a grid and in every
direction, the contenders (kernels, block-sparse kernels or CP methods) compared draw by draw
(report.paired: the rule), the winner or the tie, and the records each answer rests on.

Decided on time per call (ms): time is what a user waits for, and at one point every contender
computes the same masks. Directions: each one measured (fwd, bwd; fwdbwd where a grid measures it)
and `train`, one training step: the fwd and the bwd record of the same contender, added draw by
draw. A contender competes in `train` only where both its records are ok.

Only `ok` cells compete: a cell that ran out of memory, cannot express the mask, is not
installed, disagrees with the float64 reference, timed out or is implausible does not; each point
lists them with their status. Each family says what its points, contenders and words are
(AdviceFamily, supplied by attnbench.families.<family>.advice); this module names no family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from ..status import OK
from .collect import emulated
from .labels import STATUS_LABEL, order
from .paired import NO_FINGERPRINT, Comparison, Draw, Timed, Verdict, compare, step

TRAIN = "train"
DIRECTIONS = ("fwd", "bwd", TRAIN, "fwdbwd")  # the order of rows at one point
NO_RECORD = "no record"  # a contender the grid measures elsewhere, without a record here
HEADS_ETC = ("heads_q", "heads_kv", "head_dim", "dtype")


class AdviceError(ValueError):
    """A question the tidy table cannot answer; the message names the valid values."""


@dataclass(frozen=True)
class AdviceFamily:
    """What a family's answers are about, supplied by the family (families/<name>/advice.py)."""

    name: str
    what: str  # a contender, in words: "kernel", "context-parallel method"
    per: str  # what one row decides, in words: "mask, length, heads"
    point_keys: tuple[str, ...]  # the columns that identify a point (besides the direction)
    # the rows that compete, with `_name` (the contender), `_base` (its name without settings of
    # one direction), `_ran` (what ran where the name does not say it); and a sentence on the rows
    # left out ('' where none is)
    contenders: Callable[[pd.DataFrame], tuple[pd.DataFrame, str]]
    leading: Callable[[dict], dict]  # the first columns of the point's row in advice.md
    where: Callable[[dict], list[str]]  # the point in words (mask, lengths, GPUs ...)
    short: Callable[[dict], str]  # the point in a few words, for one line per answer
    # the columns within which every length expects the same contenders (a contender measured at
    # another length but not this one is listed as `no record`); () where contenders differ by point
    same_contenders: tuple[str, ...] = ()
    # what `advise` sets each answer against beside its ranking (report.against: OnSameMask,
    # AtPoint), e.g. block-sparse kernels against dense attention
    against: tuple = ()


# ---------------------------------------------------------------- records and contenders


@dataclass(frozen=True)
class Record:
    """One cell an answer rests on, with its draws (one, read from the cell, where the per-sample
    table lacks it)."""

    direction: str
    status: str
    median: float | None
    p20: float | None
    p80: float | None
    cell_id: str
    path: str
    ran: str = ""  # what ran where the name does not say it (a CP method's local kernel)
    emulated: bool = False
    finished_at: str = ""
    draws: tuple[Draw, ...] = ()
    # how it was measured (docs/measurement.md): a caller's time over the device's, whether a
    # timed window was throttled or may have waited for the host, how far its job's control calls
    # moved
    host_overhead_ms: float | None = None
    throttled: bool = False
    host_waited: bool = False
    control_drift: float | None = None
    machine: str = ""  # the device, host and GPU it ran on (an answer mixing machines says so)
    device: str = ""  # the device's name alone
    outdated: str = ""  # why a run would not make it as it is now (pipeline.currency), or ""

    @property
    def timed(self) -> bool:
        return self.status == OK and bool(self.draws)


def no_record(direction: str) -> Record:
    return Record(direction, NO_RECORD, None, None, None, "", "")


@dataclass(frozen=True)
class Contender:
    """A kernel or method at one point and direction: one record, or two (train: fwd, bwd)."""

    name: str
    records: tuple[Record, ...]
    apart: str = ""  # why an ok contender is not compared (it shares no draw with the others)

    @property
    def ok(self) -> bool:
        return all(r.timed for r in self.records) and not self.apart

    @property
    def emulated(self) -> bool:
        return any(r.emulated for r in self.records)

    def timed(self) -> Timed:
        """Its draws (train: fwd + bwd on each draw both have)."""
        parts = [Timed(self.name, r.draws) for r in self.records]
        return parts[0] if len(parts) == 1 else step(*parts, name=self.name)

    @property
    def host_overhead_ms(self) -> float | None:
        """A caller's time over the device's (train: fwd + bwd); None where a record lacks it."""
        values = [r.host_overhead_ms for r in self.records]
        return None if any(v is None for v in values) else sum(values)

    @property
    def throttled(self) -> bool:
        return any(r.throttled for r in self.records)

    @property
    def host_waited(self) -> bool:
        return any(r.host_waited for r in self.records)

    @property
    def machines(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.machine for r in self.records if r.machine))

    @property
    def control_drift(self) -> float | None:
        """The largest move of its jobs' control calls (signed), None where none was timed."""
        moves = [r.control_drift for r in self.records if r.control_drift is not None]
        return max(moves, key=abs) if moves else None

    def label(self) -> str:
        """The name with what ran (CP: fwd + bwd local kernels)."""
        ran = " + ".join(dict.fromkeys(r.ran for r in self.records if r.ran))
        return self.name + (f" ({ran})" if ran else "")

    def why_not(self) -> str:
        """Why it does not compete: the status of each record that is not ok."""
        if self.apart:
            return self.apart
        bad = [r for r in self.records if not r.timed]
        words = [status_word(r) for r in bad]
        if len(self.records) == 1 or (len(set(words)) == 1 and len(bad) == len(self.records)):
            return words[0]
        return ", ".join(f"{r.direction} {w}" for r, w in zip(bad, words))


def status_word(r: Record) -> str:
    if r.status == NO_RECORD:
        return NO_RECORD
    if r.status == OK:
        return "no time recorded"
    return STATUS_LABEL.get(r.status, r.status)


@dataclass(frozen=True)
class Answer:
    """The advice at one point of a grid in one direction."""

    grid: str
    family: AdviceFamily
    point: dict
    direction: str
    ok: tuple[Contender, ...]  # fastest first (the comparison's order)
    not_ok: tuple[Contender, ...]
    comparison: Comparison = field(default_factory=lambda: Comparison((), 0, True))

    @property
    def standing(self) -> dict:
        return {s.name: s for s in self.comparison.standings}

    @property
    def fastest(self) -> Contender | None:
        return self.ok[0] if self.ok else None

    @property
    def runner_up(self) -> Contender | None:
        return self.ok[1] if len(self.ok) > 1 else None

    @property
    def winner(self) -> Contender | None:
        w = self.comparison.winner
        return self.ok[0] if w is not None else None

    @property
    def tied(self) -> list[Contender]:
        """The fastest and every contender not slower than it, where that is more than one."""
        names = {s.name for s in self.comparison.not_slower}
        return [c for c in self.ok if c.name in names] if len(names) > 1 else []

    @property
    def draws(self) -> int:
        return self.comparison.draws

    @property
    def per_sample(self) -> bool:
        return self.comparison.per_sample

    @property
    def how(self) -> str:
        """How the verdict was decided, in words (report.paired.Comparison.how)."""
        return self.comparison.how

    @property
    def emulated(self) -> bool:
        return any(c.emulated for c in (*self.ok, *self.not_ok))

    @property
    def seqlen(self) -> int:
        return int(self.point["seqlen"])

    @property
    def gpus(self) -> int:
        return int(self.point.get("gpus", 1))

    @property
    def heads(self) -> str:
        return f"{int(self.point['heads_q'])}:{int(self.point['heads_kv'])}"

    @property
    def finished_at(self) -> str:
        return max((r.finished_at for c in self.ok for r in c.records), default="")

    def verdict(self) -> str:
        """The winner, the tie, the only one ok, or none ok; how many draws where it is one."""
        if not self.ok:
            return "none ok"
        if len(self.ok) == 1:
            return f"{self.fastest.name} (the only one ok)"
        text = self.winner.name if self.winner else " ~ ".join(c.name for c in self.tied)
        return text + (" (one draw)" if self.draws == 1 else "")


# ---------------------------------------------------------------- from the tidy tables


def _num(v) -> float | None:
    return None if pd.isna(v) else float(v)


def _text(v) -> str:
    return "" if v is None or pd.isna(v) else str(v)


def _flag(v) -> bool:
    """A true/false column of the tidy table (None or NaN where a record does not say): false."""
    return bool(v) and not pd.isna(v)


def window_medians(text) -> tuple[float, ...]:
    """A sample's windows' medians from the per-sample table ('' or NaN: none)."""
    if text is None or (isinstance(text, float) and pd.isna(text)) or not str(text).strip():
        return ()
    return tuple(float(x) for x in str(text).split())


def draws_by_cell(samples: pd.DataFrame | None) -> dict[str, tuple[Draw, ...]]:
    """{cell_id: its draws in sample order} from the per-sample table."""
    if samples is None or samples.empty:
        return {}
    out: dict[str, list[Draw]] = {}
    for r in samples.sort_values(["cell_id", "sample"]).itertuples(index=False):
        fingerprint = NO_FINGERPRINT if pd.isna(r.draw) else str(r.draw)
        out.setdefault(str(r.cell_id), []).append(
            Draw(
                int(r.sample),
                fingerprint,
                float(r.time_ms_median),
                float(r.time_ms_p20),
                float(r.time_ms_p80),
                window_medians(getattr(r, "window_medians_ms", None)),
            )
        )
    return {k: tuple(v) for k, v in out.items()}


def _record(r, draws: dict) -> Record:
    med, p20, p80 = (_num(r.get(k)) for k in ("time_ms_median", "time_ms_p20", "time_ms_p80"))
    cell_id = _text(r.get("cell_id"))
    mine = draws.get(cell_id, ())
    if not mine and med is not None:  # no per-sample data: the cell read as one draw
        lo, hi = med if p20 is None else p20, med if p80 is None else p80
        mine = (Draw(0, NO_FINGERPRINT, med, lo, hi),)
    return Record(
        direction=r["direction"],
        status=r["status"],
        median=med,
        p20=p20,
        p80=p80,
        cell_id=cell_id,
        path=_text(r.get("record")),
        ran=r["_ran"],
        emulated=bool(r["_emulated"]),
        finished_at=_text(r.get("finished_at")),
        draws=mine,
        host_overhead_ms=_num(r.get("host_overhead_ms")),
        throttled=_flag(r.get("throttled")),
        host_waited=_flag(r.get("host_waited")),
        control_drift=_num(r.get("control_drift")),
        machine=machine_of(r),
        device=_text(r.get("device_name")) or _text(r.get("device")),
        outdated=_text(r.get("outdated")),
    )


def machine_of(row) -> str:
    """'device on host (GPU uuid)' of a tidy-table row, from what it names."""
    device, host, uuid = (_text(row.get(k)) for k in ("device_name", "host", "gpu_uuid"))
    return f"{device or '?'} on {host or '?'}" + (f" ({uuid[:16]})" if uuid else "")


def _answer(grid, fam, point, direction, contenders, settings=None) -> Answer:
    ok = [c for c in contenders if c.ok]
    bad = [c for c in contenders if not c.ok]
    names = order(c.name for c in bad)
    bad.sort(key=lambda c: names.index(c.name))
    comparison = compare([c.timed() for c in ok], settings) if ok else Comparison((), 0, True)
    unpaired = set(comparison.unpaired)
    rank = {s.name: i for i, s in enumerate(comparison.standings)}
    ranked = sorted((c for c in ok if c.name in rank), key=lambda c: rank[c.name])
    # a contender sharing no draw with the others cannot be compared: listed, not ranked
    apart = "other draws (shares none with the others)"
    bad += [Contender(c.name, c.records, apart) for c in ok if c.name in unpaired]
    return Answer(grid, fam, point, direction, tuple(ranked), tuple(bad), comparison)


def _unique_names(rows: pd.DataFrame, where: str) -> None:
    dup = rows[rows.duplicated("_name", keep=False)]
    if len(dup):
        raise ValueError(
            f"{where}: {len(dup)} rows share the name {dup['_name'].iloc[0]!r} (cells "
            f"{', '.join(map(str, dup['cell_id']))}); they differ in an axis the advice does not "
            "name; use one value of it per grid"
        )


def _train(rows: pd.DataFrame, draws: dict) -> list[Contender]:
    """fwd + bwd of each contender at a point: a bwd row pairs with the fwd row of its name, else
    with the one fwd row of its base (a setting of the backward alone, the dK/dV dtype, does not
    change the forward)."""
    fwd = {r["_name"]: r for _, r in rows[rows["direction"] == "fwd"].iterrows()}
    out, paired = [], set()
    for _, b in rows[rows["direction"] == "bwd"].iterrows():
        f = fwd.get(b["_name"])
        if f is None:
            same = [n for n, r in fwd.items() if r["_base"] == b["_base"]]
            f = fwd[same[0]] if len(same) == 1 else None
        if f is not None:
            paired.add(f["_name"])
        first = no_record("fwd") if f is None else _record(f, draws)
        out.append(Contender(b["_name"], (first, _record(b, draws))))
    for name, f in fwd.items():
        if name not in paired:
            out.append(Contender(name, (_record(f, draws), no_record("bwd"))))
    return out


def _expected_names(rows: pd.DataFrame, fam: AdviceFamily) -> dict:
    """The contenders a grid measures within each `same_contenders` group, at some length."""
    if not fam.same_contenders or rows.empty:
        return {}
    keys = list(fam.same_contenders)
    return {
        tuple(values): tuple(dict.fromkeys(g["_name"]))
        for values, g in rows.groupby(keys, dropna=False, sort=False)
    }


def _absent(names, rows: pd.DataFrame, *directions: str) -> list[Contender]:
    have = set(rows["_name"])
    return [Contender(n, tuple(map(no_record, directions))) for n in names if n not in have]


def _value_order(v):
    """Numbers by value; a block setting ('B=64', 'var A=512') by its kind, then its number."""
    if not isinstance(v, str):
        return ("", float(v))
    kind, _, n = v.partition("=")
    return (kind, float(n)) if n.isdigit() else (v, 0.0)


def _point_order(a: Answer):
    from ..masks import ALL_MASKS

    mask = a.point["mask"]
    rank = ALL_MASKS.index(mask) if mask in ALL_MASKS else len(ALL_MASKS)
    rest = [a.point[k] for k in a.family.point_keys if k != "mask"]
    d = DIRECTIONS.index(a.direction) if a.direction in DIRECTIONS else len(DIRECTIONS)
    return (rank, mask, *(_value_order(v) for v in rest), d)


def grid_answers(
    df: pd.DataFrame,
    grid: str,
    fam: AdviceFamily,
    samples: pd.DataFrame | None = None,
    settings: Verdict | None = None,
) -> tuple[list[Answer], str]:
    """Every answer of one grid's rows, in the order of its table, and the sentence on the rows
    left out. `samples`: the per-sample table (without it every record is read as one draw);
    `settings`: the verdict rule's (default: the current ones, report.paired.ruled_by)."""
    rows, left = fam.contenders(df)
    rows = rows.assign(_emulated=emulated(rows).values)
    draws = draws_by_cell(samples)
    keys = list(fam.point_keys)
    expected = _expected_names(rows, fam)
    out = []
    for values, at in rows.groupby(keys, dropna=False, sort=False):
        point = dict(zip(keys, values))
        names = expected.get(tuple(point[k] for k in fam.same_contenders), ())
        for direction, d in at.groupby("direction", sort=False):
            _unique_names(d, f"grid {grid}, {point}, {direction}")
            here = [Contender(r["_name"], (_record(r, draws),)) for _, r in d.iterrows()]
            contenders = here + _absent(names, d, direction)
            out.append(_answer(grid, fam, point, direction, contenders, settings))
        if {"fwd", "bwd"} <= set(at["direction"]):
            contenders = _train(at, draws) + _absent(names, at, "fwd", "bwd")
            out.append(_answer(grid, fam, point, TRAIN, contenders, settings))
    out.sort(key=_point_order)
    return out, left


def answers(
    df: pd.DataFrame, families: Callable[[str], AdviceFamily], samples=None, settings=None
) -> list[Answer]:
    """Every answer of every grid in a tidy table (each grid advised by its rows' family;
    `families(name)` gives a family's AdviceFamily; `settings`: as grid_answers)."""
    out = []
    for grid, g in df.groupby("grid", sort=False):
        fam = families(str(g["family"].iloc[0]))
        out += grid_answers(g, str(grid), fam, samples, settings)[0]
    return out


# ---------------------------------------------------------------- one question, one answer


def parse_length(text: str) -> int:
    """'32768' or '32K'."""
    t = str(text).strip().upper()
    return int(t[:-1]) * 1024 if t.endswith("K") else int(t)


def _blocks(n) -> set[str]:
    return {f"B={n}", f"var A={n}"}


@dataclass(frozen=True)
class Filter:
    """One command-line filter of a question: its flag and the value it reads off an answer."""

    flag: str
    value_of: Callable[[Answer], object]
    matches: Callable[[object, object], bool] = lambda wanted, have: wanted == have
    words: Callable[[object], str] = lambda wanted: "not in the tidy table"


def _gpus_words(n) -> str:
    return f"no measured cells at {n} GPUs" if n != 1 else "no one-GPU cells"


FILTERS = {
    "grid": Filter("--grid", lambda a: a.grid, words=lambda g: "no such grid"),
    "mask": Filter("--mask", lambda a: a.point["mask"]),
    "seqlen": Filter("--seqlen", lambda a: a.seqlen),
    "tokens_per_gpu": Filter(
        "--tokens-per-gpu",
        lambda a: int(a.point["tokens_per_gpu"]) if "tokens_per_gpu" in a.point else None,
    ),
    "gpus": Filter("--gpus", lambda a: a.gpus, words=_gpus_words),
    "heads": Filter("--heads", lambda a: a.heads),
    "block_size": Filter(
        "--block-size",
        lambda a: a.point.get("blocks"),
        matches=lambda wanted, have: have in _blocks(wanted),
    ),
    "density": Filter(
        "--density",
        lambda a: None if a.point.get("density") is None else float(a.point["density"]),
        matches=lambda wanted, have: have is not None and abs(float(wanted) - have) < 1e-9,
    ),
    "direction": Filter("--direction", lambda a: a.direction),
}


def _choices(values) -> str:
    return ", ".join(str(v) for v in values) or "none"


def _sort_key(v):
    return (0, v, "") if isinstance(v, int | float) else (1, 0, str(v))


def select(found: list[Answer], **wanted) -> list[Answer]:
    """The answers matching every filter given (each a value or a list of values, any of which
    matches); AdviceError naming the bad value and the valid ones (those left by the filters
    before it) where one matches nothing."""
    if not found:
        raise AdviceError("the tidy table has no cells to advise on")
    context: list[str] = []
    for key, f in FILTERS.items():
        values = wanted.get(key)
        if values is None:
            continue
        values = values if isinstance(values, list | tuple) else [values]
        kept = []
        for v in values:
            hits = [a for a in found if f.matches(v, f.value_of(a))]
            if not hits:
                valid = sorted({f.value_of(a) for a in found} - {None}, key=_sort_key)
                where = f" with {', '.join(context)}" if context else ""
                raise AdviceError(
                    f"{f.flag} {v}: {f.words(v)}{where}; valid {f.flag}: {_choices(valid)}"
                )
            kept += [a for a in hits if a not in kept]
        context.append(f"{f.flag} {' '.join(map(str, values))}")
        found = kept
    return found


def question(a: Answer) -> tuple:
    """What an answer answers, whichever grid it comes from: its family, point and direction,
    measured or emulated (an emulated answer never stands in for a measured one)."""
    return (
        a.family.name,
        *(str(a.point[k]) for k in a.family.point_keys),
        a.direction,
        a.emulated,
    )


def precedence(a: Answer) -> tuple:
    """Which grid answers a question measured by several (the highest first): the one with the
    most ok contenders, then the most draws, then the newest records."""
    return (len(a.ok), a.draws, a.finished_at)


@dataclass(frozen=True)
class Choice:
    """One answer per question, the other grids' answers to it, and the answer set against its
    family's baselines (report.against.Against, where `advise` looked them up)."""

    answer: Answer
    others: tuple[Answer, ...]
    against: tuple = ()


def one_per_question(found: list[Answer]) -> list[Choice]:
    """Each question's answer from one grid (precedence), the others kept beside it, in order."""
    by: dict[tuple, list[Answer]] = {}
    for a in found:
        by.setdefault(question(a), []).append(a)
    out = []
    for same in by.values():
        ranked = sorted(same, key=precedence, reverse=True)
        out.append(Choice(ranked[0], tuple(ranked[1:])))
    return out
