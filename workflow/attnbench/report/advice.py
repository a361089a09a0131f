"""The answer a reader comes for, from the tidy table alone: at every point of a grid, the fastest
kernel (or CP method), the runner-up, the margin, and whether the difference is resolved.

Decided on time per call (ms; the median over all timed repetitions), not TFLOP/s: time is what a
user waits for, and at one point every contender computes the same mask, so the faster in time is
also the higher in TFLOP/s. A winner is named only where its p20-p80 interval of time overlaps no
other contender's; otherwise the point has "no clear winner", naming the fastest and every
contender whose interval overlaps it. The margin is the runner-up's median over the fastest's. A
cell without a p20 or p80 counts its median as its interval.

Directions: each one measured (fwd, bwd; fwdbwd where a grid measures it) and `train`, one
training step: the fwd and the bwd record of the same contender at the same point, medians summed;
the p20 and p80 of the sum approximated by the sum of the two p20s and the sum of the two p80s
(exact when the two times rise and fall together, as over the same sampled masks; otherwise an
approximation). A contender competes in `train` only where both its records are ok.

Only `ok` cells compete: a cell that ran out of memory, cannot express the mask, is not installed,
disagrees with the float64 reference or timed out does not; each point lists them with their status.
A kernel the grid measures for the same mask and heads setting at another length but not at this
one (a sweep not yet finished) is listed too, as `no record`.

Per family:
- kernel: per mask x length x heads (x head dim x dtype) x direction, the fastest kernel;
- sparse: per block setting x density x length x heads x direction, the fastest block-sparse kernel
  (the grid's dense references, dense kernels on the full mask at equal visible area, answer another
  question and are compared in sparse_vs_dense, not here);
- cp: per mask x tokens per GPU x GPUs (two or more) x direction, the fastest CP method; each
  local-kernel setting, dK/dV dtype or degree factorisation a method runs in is its own contender;
  one-GPU cells (the bare kernel, the baseline of cp_vs_single_gpu, and a method on one rank) are
  not advice. Every point rests on measured cells (the CP throughput model's predictions are not in
  the tidy table); a cell marked emulated (optional column `emulated`) is marked in the advice.
Any other family is advised as the kernel family is (one contender per `impl` at a point).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..cp.catalog import BARE_KERNEL
from ..masks import ALL_MASKS, SPARSE_MASKS
from ..status import OK
from .labels import STATUS_LABEL, heads_label, order, seqlen_label
from .outputs import ADVICE_STEM as STEM
from .tables import MEDIAN_SPREAD, describe_setup, fmt_compared, write_sections

TRAIN = "train"
DIRECTIONS = ("fwd", "bwd", TRAIN, "fwdbwd")  # the order of rows at one point
NO_RECORD = "no record"  # a train contender lacking its fwd or bwd record


class AdviceError(ValueError):
    """A filter of `select` that matches nothing; the message names the valid values."""


@dataclass(frozen=True)
class Record:
    """One cell an answer rests on."""

    direction: str
    status: str
    median: float | None
    p20: float | None
    p80: float | None
    cell_id: str
    path: str
    ran: str = ""  # what ran where the name does not say it (a CP method's local kernel)
    emulated: bool = False

    @property
    def timed(self) -> bool:
        return self.status == OK and self.median is not None


@dataclass(frozen=True)
class Contender:
    """A kernel or method at one point and direction: one record, or two (train: fwd, bwd)."""

    name: str
    records: tuple[Record, ...]

    @property
    def ok(self) -> bool:
        return all(r.timed for r in self.records)

    @property
    def median(self) -> float:
        return sum(r.median for r in self.records)

    @property
    def interval(self) -> tuple[float, float]:
        """(p20, p80): summed over the records (train), each record's median where it lacks one."""
        lo = sum(r.median if r.p20 is None else r.p20 for r in self.records)
        hi = sum(r.median if r.p80 is None else r.p80 for r in self.records)
        return lo, hi

    @property
    def emulated(self) -> bool:
        return any(r.emulated for r in self.records)

    def label(self) -> str:
        """The name, what ran (CP: fwd + bwd local kernels) and an emulated mark."""
        ran = " + ".join(dict.fromkeys(r.ran for r in self.records if r.ran))
        return self.name + (f" ({ran})" if ran else "") + (" (emulated)" * self.emulated)

    def why_not(self) -> str:
        """Why it does not compete: the status of each record that is not ok."""
        bad = [r for r in self.records if not r.timed]
        words = [status_word(r) for r in bad]
        if len(self.records) > 1 and len(set(words)) == 1 and len(bad) == len(self.records):
            return words[0]  # the same in both directions
        if len(self.records) == 1:
            return words[0]
        return ", ".join(f"{r.direction} {w}" for r, w in zip(bad, words))


def status_word(r: Record) -> str:
    if r.status == NO_RECORD:
        return NO_RECORD
    if r.status == OK:
        return "no time recorded"
    return STATUS_LABEL.get(r.status, r.status)


def overlap(a: Contender, b: Contender) -> bool:
    (alo, ahi), (blo, bhi) = a.interval, b.interval
    return alo <= bhi and blo <= ahi


@dataclass(frozen=True)
class Answer:
    """The advice at one point of a grid in one direction."""

    grid: str
    family: str
    point: dict  # the point's values (POINTS of its family)
    direction: str
    ranked: tuple[Contender, ...]  # the ok contenders, fastest first
    not_ok: tuple[Contender, ...]

    @property
    def fastest(self) -> Contender | None:
        return self.ranked[0] if self.ranked else None

    @property
    def runner_up(self) -> Contender | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    @property
    def ties(self) -> list[Contender]:
        """The contenders whose p20-p80 overlaps the fastest's."""
        return [c for c in self.ranked[1:] if overlap(self.ranked[0], c)]

    @property
    def winner(self) -> Contender | None:
        """The fastest where it is resolved from every other contender (or is the only one)."""
        return self.fastest if self.ranked and not self.ties else None

    @property
    def margin(self) -> float | None:
        """The runner-up's median time over the fastest's."""
        return self.runner_up.median / self.fastest.median if self.runner_up else None

    def verdict(self) -> str:
        if not self.ranked:
            return "none ok"
        if len(self.ranked) == 1:
            return f"{self.fastest.name} (the only one ok)"
        if self.winner:
            return self.winner.name
        return "no clear winner: " + " ~ ".join(c.name for c in [self.fastest, *self.ties])

    @property
    def seqlen(self) -> int:
        return int(self.point["seqlen"])

    @property
    def gpus(self) -> int:
        return int(self.point.get("gpus", 1))

    @property
    def heads(self) -> str:
        return f"{int(self.point['heads_q'])}:{int(self.point['heads_kv'])}"


# ---------------------------------------------------------------- contenders per family

HEADS_ETC = ["heads_q", "heads_kv", "head_dim", "dtype"]
# Where a kernel family grid measures the same kernels at every length (`no record` where one lacks)
SAME_KERNELS = ["mask", *HEADS_ETC]
# What identifies a point in each family (besides the direction), in the order of a row.
POINTS = {
    "kernel": ["mask", "seqlen", *HEADS_ETC, "gpus"],
    "sparse": ["mask", "blocks", "density", "seqlen", *HEADS_ETC],
    "cp": ["mask", "tokens_per_gpu", "gpus", "seqlen", *HEADS_ETC],
}


def _flag(df: pd.DataFrame, col: str) -> pd.Series:
    """A boolean column that may be absent (False) or read back from CSV as text."""
    if col not in df:
        return pd.Series(False, index=df.index)
    return df[col].map(lambda v: str(v).strip().lower() in ("true", "1", "1.0"))


def _text(df: pd.DataFrame, col: str, default: str) -> pd.Series:
    if col not in df:
        return pd.Series(default, index=df.index, dtype=object)
    return df[col].astype(object).where(df[col].notna(), default).astype(str)


def _block_setting(r) -> str:
    if r["mask"] == "variable_block_sparse" and pd.notna(r.get("avg_block")):
        return f"var A={int(r['avg_block'])}"
    if pd.notna(r.get("block_size")):
        return f"B={int(r['block_size'])}"
    return r["mask"]


def _degrees(r) -> str:
    if pd.isna(r.get("ulysses_degree")) or pd.isna(r.get("ring_degree")):
        return ""
    w = r.get("windows")
    windows = f"/W{int(w)}" if pd.notna(w) and int(w) > 1 else ""
    return f"U{int(r['ulysses_degree'])}xR{int(r['ring_degree'])}{windows}"


def cp_names(df: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(base, name, ran) of each CP row. base: the method with the local-kernel setting, the
    degrees and the documents split where the method runs several (and `emulated` where it also
    has measured cells); name: base with the dK/dV dtype where the method's
    backward runs several (it changes only the backward, so a fwd row is named by its base); ran:
    the local kernel that ran."""
    setting = _text(df, "local_kernel_setting", "")
    ran = _text(df, "local_kernel", "")
    setting = setting.where(setting != "", ran)
    dkv = _text(df, "dkv_comm_dtype", "accumulator")
    degrees = pd.Series([_degrees(r) for _, r in df.iterrows()], index=df.index, dtype=object)
    split = _text(df, "split_documents", "all")
    emulated = _flag(df, "emulated")
    base = []
    for i, impl in df["impl"].items():
        mine = df["impl"] == impl
        same_gpus = mine & (df["gpus"] == df.at[i, "gpus"])
        tags = []
        if setting[mine].nunique() > 1:
            tags.append(setting[i])
        if degrees[same_gpus].nunique() > 1:
            tags.append(degrees[i])
        if split[mine].nunique() > 1:
            tags.append(f"split {split[i]}")
        if emulated[mine].nunique() > 1 and emulated[i]:  # beside the same method measured
            tags.append("emulated")
        base.append(impl + "".join(f" [{t}]" for t in tags))
    base = pd.Series(base, index=df.index)
    name = [
        b + (f" [dkv {dkv[i]}]" if dkv[(base == b) & (df["direction"] == d)].nunique() > 1 else "")
        for (i, b), d in zip(base.items(), df["direction"])
    ]
    return base, pd.Series(name, index=df.index), ran.where(ran != setting, "")


def competing(df: pd.DataFrame, family: str) -> tuple[pd.DataFrame, str]:
    """The rows advised in this family, with `_base`, `_name`, `_ran`, `_emulated` (and `blocks`),
    and a sentence on the rows left out (empty where none is)."""
    df = df.copy()
    left = ""
    if family == "sparse":
        dense = ~df["mask"].isin(SPARSE_MASKS)
        if dense.any():
            left = (
                f"{int(dense.sum())} dense reference cells (mask "
                f"{', '.join(dict.fromkeys(df.loc[dense, 'mask']))}) are compared in sparse_vs_dense, "
                "not here"
            )
        df = df[~dense].copy()
        df["blocks"] = [_block_setting(r) for _, r in df.iterrows()]
    if family == "cp":
        one = (df["gpus"] == 1) | (df["impl"] == BARE_KERNEL)
        if one.any():
            left = (
                f"{int(one.sum())} one-GPU cells (the bare kernel {BARE_KERNEL}, methods on one "
                "rank) are baselines, not advice"
            )
        df = df[~one].copy()
        per_gpu = df["seqlen"] // df["gpus"]  # the CP cell's own split, where a row lacks it
        tokens = df["tokens_per_gpu"] if "tokens_per_gpu" in df else per_gpu
        df["tokens_per_gpu"] = tokens.fillna(per_gpu).astype(int)
    if family == "cp" and len(df):
        df["_base"], df["_name"], df["_ran"] = cp_names(df)
    else:
        df["_base"] = df["_name"] = df["impl"].astype(str)
        df["_ran"] = ""
    df["_emulated"] = _flag(df, "emulated")
    return df, left


def _num(v) -> float | None:
    return None if pd.isna(v) else float(v)


def _record(r) -> Record:
    return Record(
        direction=r["direction"],
        status=r["status"],
        median=_num(r["time_ms_median"]),
        p20=_num(r["time_ms_p20"]),
        p80=_num(r["time_ms_p80"]),
        cell_id="" if pd.isna(r.get("cell_id")) else str(r["cell_id"]),
        path="" if pd.isna(r.get("record")) else str(r["record"]),
        ran=r["_ran"],
        emulated=bool(r["_emulated"]),
    )


def _answer(grid, family, point, direction, contenders) -> Answer:
    ok = sorted((c for c in contenders if c.ok), key=lambda c: c.median)
    bad = [c for c in contenders if not c.ok]
    names = order(c.name for c in bad)
    bad.sort(key=lambda c: names.index(c.name))
    return Answer(grid, family, point, direction, tuple(ok), tuple(bad))


def _unique_names(rows: pd.DataFrame, where: str) -> None:
    dup = rows[rows.duplicated("_name", keep=False)]
    if len(dup):
        raise ValueError(
            f"{where}: {len(dup)} rows share the name {dup['_name'].iloc[0]!r} (cells "
            f"{', '.join(map(str, dup['cell_id']))}); they differ in an axis the advice does not "
            "name; use one value of it per grid"
        )


def _train(rows: pd.DataFrame) -> list[Contender]:
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
        missing = Record("fwd", NO_RECORD, None, None, None, "", "")
        out.append(Contender(b["_name"], (missing if f is None else _record(f), _record(b))))
    for name, f in fwd.items():
        if name not in paired:
            missing = Record("bwd", NO_RECORD, None, None, None, "", "")
            out.append(Contender(name, (_record(f), missing)))
    return out


def _expected_names(rows: pd.DataFrame, family: str) -> dict:
    """Kernel family (and any other advised as it): the kernels a grid measures for a mask and heads
    setting at some length, which a length without their record lists as `no record` (a sweep not
    yet finished). Sparse and CP points differ in who competes: none expected there."""
    if family in ("sparse", "cp") or rows.empty:
        return {}
    return {
        tuple(values): tuple(dict.fromkeys(g["_name"]))
        for values, g in rows.groupby(SAME_KERNELS, dropna=False, sort=False)
    }


def _absent(names, rows: pd.DataFrame, *directions: str) -> list[Contender]:
    """A contender with `no record` in each direction for every expected name without a row here."""
    have = set(rows["_name"])
    missing = tuple(Record(d, NO_RECORD, None, None, None, "", "") for d in directions)
    return [Contender(n, missing) for n in names if n not in have]


def _point_order(family: str, point: dict, direction: str):
    mask = point["mask"]
    rank = ALL_MASKS.index(mask) if mask in ALL_MASKS else len(ALL_MASKS)
    rest = [point[k] for k in POINTS.get(family, POINTS["kernel"])[1:]]
    d = DIRECTIONS.index(direction) if direction in DIRECTIONS else len(DIRECTIONS)
    return (rank, mask, *(_value_order(v) for v in rest), d)


def _value_order(v):
    """Numbers by value; a block setting ('B=64', 'var A=512') by its kind, then its number."""
    if not isinstance(v, str):
        return ("", float(v))
    kind, _, n = v.partition("=")
    return (kind, float(n)) if n.isdigit() else (v, 0.0)


def grid_answers(df: pd.DataFrame, grid: str, family: str) -> tuple[list[Answer], str]:
    """Every answer of one grid's rows, in the order of its table, and the sentence on the rows
    left out (competing)."""
    rows, left = competing(df, family)
    keys = POINTS.get(family, POINTS["kernel"])
    expected = _expected_names(rows, family)
    out = []
    for values, at in rows.groupby(keys, dropna=False, sort=False):
        point = dict(zip(keys, values))
        names = expected.get(tuple(point[k] for k in SAME_KERNELS), ())
        for direction, d in at.groupby("direction", sort=False):
            _unique_names(d, f"grid {grid}, {point}, {direction}")
            here = [Contender(r["_name"], (_record(r),)) for _, r in d.iterrows()]
            out.append(
                _answer(grid, family, point, direction, here + _absent(names, d, direction))
            )
        if {"fwd", "bwd"} <= set(at["direction"]):
            out.append(
                _answer(grid, family, point, TRAIN, _train(at) + _absent(names, at, "fwd", "bwd"))
            )
    out.sort(key=lambda a: _point_order(family, a.point, a.direction))
    return out, left


def answers(df: pd.DataFrame) -> list[Answer]:
    """Every answer of every grid in a tidy table (each grid advised by its rows' family)."""
    out = []
    for grid, g in df.groupby("grid", sort=False):
        out += grid_answers(g, str(grid), str(g["family"].iloc[0]))[0]
    return out


# ---------------------------------------------------------------- the advice table


def ms(v: float) -> str:
    """Four significant digits (differences of a few tenths of a percent are compared), whole
    milliseconds from 1 s on (no exponents)."""
    return f"{v:.0f}" if abs(v) >= 1000 else fmt_compared(v)


def _timed_text(c: Contender | None) -> str:
    if c is None:
        return ""
    lo, hi = c.interval
    return f"{c.label()} {ms(c.median)} [{ms(lo)}-{ms(hi)}]"


def _not_ok_text(a: Answer) -> str:
    if not a.not_ok:
        return ""
    return f"{len(a.not_ok)}: " + ", ".join(f"{c.name} {c.why_not()}" for c in a.not_ok)


def _leading(a: Answer) -> dict:
    p = a.point
    s = seqlen_label(p["seqlen"])
    if a.family == "sparse":
        return {"blocks": p["blocks"], "density": f"{p['density']:g}", "S": s}
    if a.family == "cp":
        return {"mask": p["mask"], "tokens/GPU": int(p["tokens_per_gpu"]), "GPUs": a.gpus, "S": s}
    return {"mask": p["mask"], "S": s}


def _row(a: Answer) -> dict:
    row = {
        **_leading(a),
        "direction": a.direction,
        "advice": a.verdict(),
        "fastest, ms [p20-p80]": _timed_text(a.fastest),
        "runner-up, ms [p20-p80]": _timed_text(a.runner_up),
        "margin": "" if a.margin is None else f"{a.margin:.2f}x",
    }
    if a.family == "cp":
        emulated = [c.name for c in (*a.ranked, *a.not_ok) if c.emulated]
        row["cells"] = f"emulated: {', '.join(emulated)}" if emulated else "measured"
    row["not ok (do not compete)"] = _not_ok_text(a)
    return row


def _section_title(a: Answer, varying: list[str]) -> str:
    p = a.point
    title = heads_label(p["heads_q"], p["heads_kv"])
    if "head_dim" in varying:
        title += f", head dim {int(p['head_dim'])}"
    if "dtype" in varying:
        title += f", {p['dtype']}"
    return title


def sections(found: list[Answer]) -> list[tuple[str, pd.DataFrame]]:
    """(title, table) per heads setting (and head dim and dtype where they vary), rows in order."""
    varying = [k for k in ("head_dim", "dtype") if len({str(a.point[k]) for a in found}) > 1]
    groups: dict[str, list[dict]] = {}
    for a in found:
        groups.setdefault(_section_title(a, varying), []).append(_row(a))
    out = []
    for title, rows in groups.items():
        t = pd.DataFrame(rows)
        out.append((title, t.set_index(t.columns[0])))
    return out


WHAT = {
    "kernel": ("kernel", "mask, length, heads"),
    "sparse": ("block-sparse kernel", "block size, density, length, heads"),
    "cp": ("context-parallel method", "mask, tokens per GPU, GPUs, heads"),
}


def caption(df: pd.DataFrame, family: str, left: str) -> str:
    """The first line of advice.md: what each row decides and how, and the cells that do not compete."""
    what, per = WHAT.get(family, WHAT["kernel"])
    rows, _ = competing(df, family)
    bad = rows[rows["status"] != OK]["status"].value_counts()
    counts = ", ".join(f"{n} {STATUS_LABEL.get(s, s)}" for s, n in bad.items())
    parts = [
        f"advice: the fastest {what} per {per} and direction (fwd, bwd; train = fwd + bwd)",
        f"decided on time per call, ms, {MEDIAN_SPREAD} (the time a user waits; every contender "
        "at a point computes the same mask)",
        "a winner is named only where its p20-p80 overlaps no other contender's, else 'no clear "
        "winner' naming the fastest and each contender whose p20-p80 overlaps it",
        "margin = the runner-up's median over the fastest's",
        "train: the two records' medians summed, its p20 and p80 the sums of their p20s and of "
        "their p80s",
        f"only ok cells compete: {int(bad.sum())} of {len(rows)} cells are not ok"
        + (f" ({counts})" if counts else ""),
    ]
    if family == "cp":
        parts.append(
            "every point is a measured cell ('cells': measured, or emulated where its cells say so)"
        )
    if left:
        parts.append(left)
    if len(df):
        parts.append(describe_setup(df))
    return "; ".join(parts)


def write_advice(df: pd.DataFrame, out: Path, grid: str | None, family: str) -> list[Path]:
    """advice.md and advice.tex of one grid's rows."""
    found, left = grid_answers(df, grid or "(all grids)", family)
    return write_sections(sections(found), Path(out) / STEM, caption(df, family, left))


def advice_text(df: pd.DataFrame) -> str:
    """The whole advice of a tidy table, as Markdown: every grid's caption and tables."""
    parts = []
    for grid, g in df.groupby("grid", sort=False):
        family = str(g["family"].iloc[0])
        found, left = grid_answers(g, str(grid), family)
        parts += [f"## {grid} ({family})", "", caption(g, family, left), ""]
        for title, t in sections(found):
            parts += [f"### {title}", "", t.to_markdown(), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------- one answer, from the command line


def parse_length(text: str) -> int:
    """'32768' or '32K'."""
    t = str(text).strip().upper()
    return int(t[:-1]) * 1024 if t.endswith("K") else int(t)


def _choices(values) -> str:
    return ", ".join(str(v) for v in values) or "none"


def _narrow(found: list[Answer], flag: str, wanted, value_of, context: list[str], words=None):
    """The answers whose value_of equals wanted; AdviceError naming the valid values where none is."""
    if wanted is None:
        return found
    kept = [a for a in found if value_of(a) == wanted]
    if kept:
        context.append(f"{flag} {wanted}")
        return kept
    valid = sorted({value_of(a) for a in found if value_of(a) is not None}, key=_sort_key)
    where = f" with {', '.join(context)}" if context else ""
    what = words(wanted) if words else "not in the tidy table"
    raise AdviceError(f"{flag} {wanted}: {what}{where}; valid {flag}: {_choices(valid)}")


def _sort_key(v):
    return (0, v, "") if isinstance(v, int | float) else (1, 0, str(v))


def _gpus_words(n) -> str:
    return f"no context-parallel cells at {n} GPUs" if n != 1 else "no one-GPU cells"


def select(
    found: list[Answer],
    grid: str | None = None,
    mask: str | None = None,
    seqlen: int | None = None,
    tokens_per_gpu: int | None = None,
    gpus: int | None = None,
    heads: str | None = None,
    direction: str | None = None,
) -> list[Answer]:
    """The answers matching every filter given; AdviceError naming the bad value and the valid ones
    (those left by the filters before it) where one matches nothing. seqlen is the whole sequence
    (a CP cell's tokens per GPU x GPUs); gpus 1 selects the one-GPU grids."""
    if not found:
        raise AdviceError("the tidy table has no cells to advise on")
    context: list[str] = []
    found = _narrow(found, "--grid", grid, lambda a: a.grid, context)
    found = _narrow(found, "--mask", mask, lambda a: a.point["mask"], context)
    found = _narrow(found, "--seqlen", seqlen, lambda a: a.seqlen, context)
    found = _narrow(
        found,
        "--tokens-per-gpu",
        tokens_per_gpu,
        lambda a: int(a.point["tokens_per_gpu"]) if a.family == "cp" else None,
        context,
    )
    found = _narrow(found, "--gpus", gpus, lambda a: a.gpus, context, _gpus_words)
    found = _narrow(found, "--heads", heads, lambda a: a.heads, context)
    return _narrow(found, "--direction", direction, lambda a: a.direction, context)


def _where(a: Answer) -> str:
    p = a.point
    parts = [f"{a.grid} ({a.family})", p["mask"], f"S={seqlen_label(a.seqlen)} ({a.seqlen})"]
    if a.family == "cp":
        parts.append(f"{int(p['tokens_per_gpu'])} tokens/GPU x {a.gpus} GPUs")
    if a.family == "sparse":
        parts.append(f"{p['blocks']}, density {p['density']:g}")
    parts += [
        heads_label(p["heads_q"], p["heads_kv"]),
        f"head dim {int(p['head_dim'])}",
        p["dtype"],
    ]
    direction = "train (fwd + bwd)" if a.direction == TRAIN else a.direction
    return ", ".join(parts + [direction])


def _record_line(r: Record) -> str:
    if r.status == NO_RECORD:
        return f"{r.direction}: no record"
    numbers = ""
    if r.median is not None:
        lo = r.median if r.p20 is None else r.p20
        hi = r.median if r.p80 is None else r.p80
        numbers = f" {ms(r.median)} [{ms(lo)}-{ms(hi)}] ms"
    ran = f" local kernel {r.ran}," if r.ran else ""
    emulated = " (emulated)" if r.emulated else ""
    return f"{r.direction} {r.status}{numbers},{ran} cell {r.cell_id}{emulated}: {r.path}"


def explain(a: Answer) -> str:
    """One answer and every record it rests on: the ranked contenders, then those not ok."""
    lines = [f"{_where(a)}:", f"  advice: {a.verdict()}"]
    if a.fastest:
        lines.append(f"  fastest: {_timed_text(a.fastest)} ms")
    if a.runner_up:
        lines.append(
            f"  runner-up: {_timed_text(a.runner_up)} ms; margin {a.margin:.2f}x"
            + (" (p20-p80 overlap)" if a.ties else " (p20-p80 apart)")
        )
    lines.append("  contenders (time per call, ms, median [p20-p80]), fastest first:")
    for i, c in enumerate(a.ranked, 1):
        lines.append(f"    {i}. {_timed_text(c)}")
        lines += [f"       {_record_line(r)}" for r in c.records]
    if a.not_ok:
        lines.append("  not ok (do not compete):")
        for c in a.not_ok:
            lines.append(f"    {c.name}: {c.why_not()}")
            lines += [f"       {_record_line(r)}" for r in c.records]
    return "\n".join(lines)
