"""An answer's comparisons with its baselines (report.against) in words and as data: the same
content for a terminal, Markdown, JSON and CSV (advice_text renders them with the answer)."""

from __future__ import annotations

from .against import Against
from .tables import fmt_ms as ms
from .tables import fmt_ratio as _x


def speedup_text(ag: Against) -> str:
    """'3.17x', with its range over the draws (or pairs of draws) where it differs: '3.1x [3.0-3.2]'."""
    lo, hi = (_x(v) for v in ag.speedup_range)
    return f"{_x(ag.speedup)}x" + ("" if lo == hi else f" [{lo}-{hi}]")


VERDICT_WORDS = {
    "faster": "faster",
    "slower": "slower",
    "not apart": "not apart (neither is faster by the rule)",
}


def lines(ag: Against) -> list[str]:
    """Its lines (unwrapped): the baseline's fastest and where it comes from, then the answer's
    fastest with the speed-up, the verdict and how it was decided; or what is missing."""
    head = f"against {ag.baseline.words}"
    if ag.missing:
        return [f"{head}: {ag.missing}"]
    source = ag.source()
    first = f"{head}: {ag.theirs.label()} {ms(ag.theirs_ms)} ms" + (
        f" ({source})" if source else ""
    )
    second = (
        f"{ag.mine.label()} {ms(ag.mine_ms)} ms, speed-up {speedup_text(ag)}: "
        f"{VERDICT_WORDS[ag.verdict]} ({ag.draws}; {ag.comparison.how})"
    )
    return [first, second]


def summary(ag: Against) -> str:
    """In a few words, for one line per answer: 'dense full fa4 3.17x: faster', or 'dense full:
    no record'."""
    if ag.missing:
        return f"{ag.baseline.short}: no record"
    return f"{ag.baseline.short} {ag.theirs.name} {speedup_text(ag)}: {ag.verdict}"


def _records(ag: Against) -> list[dict]:
    return [
        {"direction": r.direction, "status": r.status, "cell_id": r.cell_id, "path": r.path}
        for r in ag.theirs.records
    ]


def as_dict(ag: Against) -> dict:
    """The same as data (JSON; CSV flattens it): every field present, None where missing."""
    out = {"key": ag.baseline.key, "baseline": ag.baseline.words, "missing": ag.missing or None}
    found = not ag.missing
    b = ag.answer
    out.update(
        {
            "contender": ag.mine.name if found else None,
            "contender_ms": ag.mine_ms if found else None,
            "baseline_contender": ag.theirs.name if found else None,
            "baseline_ms": ag.theirs_ms if found else None,
            "speedup": ag.speedup if found else None,
            "speedup_lo": ag.speedup_range[0] if found else None,
            "speedup_hi": ag.speedup_range[1] if found else None,
            "verdict": ag.verdict if found else None,
            "paired": ag.paired if found else None,
            "draws": ag.draws if found else None,
            "rule": ag.comparison.rule if found else None,
            "how": ag.comparison.how if found else None,
            "baseline_grid": b.grid if b is not None else None,
            "baseline_verdict": b.verdict() if b is not None and not ag.paired else None,
            "baseline_records": _records(ag) if found else [],
        }
    )
    return out


def csv_columns(ag: Against, ground: str) -> dict:
    """as_dict flattened for one CSV row: '<key> <field>' columns, the records' paths joined."""
    d = {**as_dict(ag), "ground": ground}
    key = d.pop("key")
    d["baseline_records"] = " ".join(r["path"] for r in d["baseline_records"])
    return {f"{key} {k}": v for k, v in d.items()}
