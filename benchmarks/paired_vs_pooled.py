"""How the answers of a grid change from pooled intervals to the paired rule, read off its records.

Before (the rule the advice had until 2026-12-04): a winner only where the cell-level p20-p80 of
time (repetitions pooled over all of a cell's draws; the training step: the fwd and bwd p20s and
p80s summed) overlaps no other contender's; else a tie of the fastest (lowest pooled median) and
every contender whose interval overlaps it. After: report.paired (draw by draw).

For both it counts, over the answers with two or more ok contenders:
- verdicts that differ;
- ties that list a contender at least 10% slower than the fastest on every draw;
- hidden winners: a contender faster than every other on every draw with the per-draw p20-p80
  apart, where the verdict names no winner.

    python benchmarks/paired_vs_pooled.py results/h200/tables/cells.csv --grid h200_sweep
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from attnbench.families import advice_of  # noqa: E402
from attnbench.report.advice import grid_answers  # noqa: E402
from attnbench.report.collect import read_cells, read_samples  # noqa: E402


def pooled(c) -> tuple[float, float, float]:
    """(median, p20, p80) of a contender's cells, pooled over draws (summed over fwd + bwd)."""
    rs = c.records
    return (
        sum(r.median for r in rs),
        sum(r.p20 if r.p20 is not None else r.median for r in rs),
        sum(r.p80 if r.p80 is not None else r.median for r in rs),
    )


def pooled_verdict(a) -> tuple[str, list[str]]:
    """(winner or '', the tie's names) under the pooled rule."""
    stats = {c.name: pooled(c) for c in a.ok}
    ranked = sorted(stats, key=lambda n: stats[n][0])
    best = stats[ranked[0]]
    tie = [n for n in ranked[1:] if stats[n][1] <= best[2] and best[1] <= stats[n][2]]
    return ("", [ranked[0], *tie]) if tie else (ranked[0], [])


def per_draw(a) -> dict:
    """{name: [(median, p20, p80) per shared draw]}, from the contenders' paired draws."""
    timed = {c.name: c.timed() for c in a.ok}
    keys = set.intersection(*(set(d.key for d in t.draws) for t in timed.values()))
    order = [d.key for d in next(iter(timed.values())).draws if d.key in keys]
    return {n: [(d.median, d.p20, d.p80) for d in t.on(order)] for n, t in timed.items()}


def hidden_winner(draws: dict) -> str:
    """A contender faster than every other on every draw, p20-p80 apart; '' where none is."""
    for n, mine in draws.items():
        if all(
            all(m[2] < o[1] for m, o in zip(mine, other)) for k, other in draws.items() if k != n
        ):
            return n
    return ""


def slow_in_tie(tie: list[str], draws: dict) -> list[str]:
    """Tied names at least 10% slower than the tie's first on every draw."""
    if not tie:
        return []
    first = draws[tie[0]]
    return [n for n in tie[1:] if all(o[0] >= 1.1 * f[0] for o, f in zip(draws[n], first))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells")
    ap.add_argument("--grid", required=True)
    ap.add_argument("--show", action="store_true", help="print each changed verdict")
    a = ap.parse_args()
    df = read_cells(a.cells)
    df = df[df["grid"] == a.grid]
    fam = advice_of(str(df["family"].iloc[0]))
    found, _ = grid_answers(df, a.grid, fam, read_samples(a.cells))
    rows = [x for x in found if len(x.ok) >= 2]
    counts = dict.fromkeys(
        [
            "rows",
            "changed",
            "pooled_slow_ties",
            "paired_slow_ties",
            "pooled_hidden",
            "paired_hidden",
        ],
        0,
    )
    counts["rows"] = len(rows)
    draws_seen = {}
    for x in rows:
        draws = per_draw(x)
        draws_seen[x.draws] = draws_seen.get(x.draws, 0) + 1
        winner, tie = pooled_verdict(x)
        new_winner = x.winner.name if x.winner else ""
        new_tie = [c.name for c in x.tied]
        before = winner or " ~ ".join(tie)
        after = new_winner or " ~ ".join(new_tie)
        if before != after:
            counts["changed"] += 1
            if a.show:
                print(
                    f"{fam.short(x.point)} {x.direction} ({x.draws} draws): {before}  ->  {after}"
                )
        counts["pooled_slow_ties"] += bool(slow_in_tie(tie, draws))
        counts["paired_slow_ties"] += bool(slow_in_tie(new_tie, draws))
        hidden = hidden_winner(draws)
        counts["pooled_hidden"] += bool(hidden and not winner)
        counts["paired_hidden"] += bool(hidden and not new_winner)
        if hidden and new_winner and hidden != new_winner:
            print(
                f"!! {fam.short(x.point)} {x.direction}: {hidden} beats all but {new_winner} named"
            )
    print(f"grid {a.grid}: {counts['rows']} answers with two or more ok contenders")
    print(f"  draws per answer: {dict(sorted(draws_seen.items()))}")
    print(f"  verdicts that change from pooled to paired: {counts['changed']}")
    print(
        "  ties listing a contender >= 10% slower on every draw: "
        f"pooled {counts['pooled_slow_ties']}, paired {counts['paired_slow_ties']}"
    )
    print(
        "  hidden winners (faster on every draw, p20-p80 apart, no winner named): "
        f"pooled {counts['pooled_hidden']}, paired {counts['paired_hidden']}"
    )


if __name__ == "__main__":
    main()
