"""What the verdict rule with a stated error rate changes in the committed answers.

Old (the rule until 2026-12): B is slower than the fastest A where, on every shared draw, B's p20
is above A's p80. New (report.paired, config.yaml report.verdict): with enough draws for a sign
test (5 or more at alpha 0.05), B is slower on at least k of the n draws and B/A's geometric mean
is >= the threshold; with fewer, the old bands on every draw and the geometric mean >= the
threshold. Both rank by mean time, so the fastest is the same; only who is `slower` differs.

For every answer of the grids (every point and direction, train included) with two or more ok
contenders, it prints the counts of changed verdicts by kind (tie -> winner, winner -> tie,
winner changed, tie changed: the same fastest with other contenders tied), and each change with
the runner-up's per-draw ratios and what decided it.

    python benchmarks/verdict_changes.py [results/h200/tables/cells.csv] [--grid h200_sweep h200_paired]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

import yaml  # noqa: E402
from attnbench.families import advice_of  # noqa: E402
from attnbench.report.advice import grid_answers  # noqa: E402
from attnbench.report.advice_text import ratio_text  # noqa: E402
from attnbench.report.collect import read_cells, read_samples  # noqa: E402
from attnbench.report.labels import seqlen_label  # noqa: E402
from attnbench.report.paired import Verdict, shared_draws  # noqa: E402

KINDS = ("tie -> winner", "winner -> tie", "winner changed", "tie changed")


def old_not_slower(a) -> list[str]:
    """The fastest and every contender not slower under the old rule (bands on every draw)."""
    timed = [c.timed() for c in a.ok]
    keys, kept, _ = shared_draws(timed)
    on = {t.name: t.on(keys) for t in kept}
    best = on[a.fastest.name]
    return [
        c.name
        for c in a.ok
        if c.name == a.fastest.name or not all(d.p20 > b.p80 for d, b in zip(on[c.name], best))
    ]


def words(names: list[str]) -> str:
    return names[0] if len(names) == 1 else " ~ ".join(names)


def kind(old: list[str], new: list[str]) -> str | None:
    if old == new:
        return None
    if len(old) > 1 and len(new) == 1:
        return KINDS[0]
    if len(old) == 1 and len(new) > 1:
        return KINDS[1]
    if len(old) == 1:
        return KINDS[2]
    return KINDS[3]


def standing_text(s, draws: int) -> str:
    """A contender over the fastest: per draw, geometric mean, draws slower on."""
    return f"{s.name} {ratio_text(s)}, geo. {s.geomean:.3f}, slower on {s.slower_on}/{draws}"


def where(a) -> str:
    p = a.point
    heads = f"{int(p['heads_q'])}:{int(p['heads_kv'])}"
    return f"{a.grid} {p['mask']} {seqlen_label(a.seqlen)} {heads} {a.direction}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cells", nargs="?", default=str(ROOT / "results/h200/tables/cells.csv"))
    p.add_argument("--grid", nargs="+", default=["h200_sweep", "h200_paired"])
    a = p.parse_args(argv)
    settings = Verdict.of(yaml.safe_load((ROOT / "config.yaml").read_text()))
    df, samples = read_cells(a.cells), read_samples(a.cells)
    counts: dict[str, Counter] = {}
    changes = []
    for grid in a.grid:
        g = df[df["grid"] == grid]
        found, _ = grid_answers(g, grid, advice_of("kernel"), samples, settings)
        found = [x for x in found if len(x.ok) > 1]
        c = counts[grid] = Counter(answers=len(found))
        for x in found:
            old = old_not_slower(x)
            new = [s.name for s in x.comparison.not_slower]
            k = kind(old, new)
            c[f"{x.comparison.rule}, {x.draws} draw{'s' * (x.draws > 1)}"] += 1
            if k is None:
                continue
            c[k] += 1
            moved = [n for n in [*old, *new] if (n in old) != (n in new)]
            changes.append(
                f"| {where(x)} | {x.draws} | {words(old)} | {words(new)} | {k} | "
                + "; ".join(standing_text(x.standing[n], x.draws) for n in moved)
                + " |"
            )
    print(f"settings: alpha {settings.alpha:g}, threshold {settings.threshold:g}\n")
    print("| grid | answers (2+ ok) | " + " | ".join(KINDS) + " | rule used |")
    print("| --- | --- |" + " --- |" * len(KINDS) + " --- |")
    for grid, c in counts.items():
        rules = "; ".join(f"{k}: {v}" for k, v in sorted(c.items()) if " draw" in k)
        print(
            f"| {grid} | {c['answers']} | "
            + " | ".join(str(c[k]) for k in KINDS)
            + f" | {rules} |"
        )
    print(f"\n{len(changes)} changed verdicts:\n")
    print("| answer | draws | old | new | kind | changed: x fastest per draw, geometric mean |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(changes))


if __name__ == "__main__":
    main()
