"""h200_paired's verdicts (10 draws per document or heterogeneous mask) against h200_sweep's (3
draws) at the points both measure, on the kernels both have ok records of there.

Per mask, length, heads and direction (fwd, bwd, the training step) it prints the paired verdict of each
grid (report.paired: a winner where every other kernel is slower on every draw, p20-p80 apart, else
the tie of the kernels not slower than the fastest), the draws the fastest won, whether the two
grids agree, and the per-draw spread (min-max of per-draw medians) of h200_paired's fastest.
Where h200_paired has no ok record of a kernel of its grid that the sweep has, the comparison
leaves that kernel out of both, and the line names it (kernels outside h200_paired's grid, naive,
sdpa_flash and varlen, are left out silently).

    python benchmarks/paired_vs_sweep.py results/h200/tables/cells.csv [--markdown]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from attnbench.families import advice_of, load_config  # noqa: E402
from attnbench.report.advice import answers  # noqa: E402
from attnbench.report.collect import read_cells, read_samples  # noqa: E402
from attnbench.report.paired import Comparison, compare  # noqa: E402

NEW, OLD = "h200_paired", "h200_sweep"


def by_point(df, samples, grid) -> dict:
    """{(mask, length, heads, direction): answer}. The heads are part of the point: at 8K the
    sweep measures MHA 64:64 beside GQA 64:8, and neither answers for the other."""
    found = answers(df[df["grid"] == grid], advice_of, samples)
    return {
        (
            a.point["mask"],
            int(a.point["seqlen"]),
            f"{int(a.point['heads_q'])}:{int(a.point['heads_kv'])}",
            a.direction,
        ): a
        for a in found
    }


def verdict(c: Comparison) -> str:
    if c.winner is not None:
        return f"{c.winner.name} ({c.winner.wins}/{c.draws})"
    return (
        " ~ ".join(s.name for s in c.not_slower)
        + f" ({c.fastest.name} {c.fastest.wins}/{c.draws})"
    )


def agreement(new: Comparison, old: Comparison) -> str:
    if (new.winner and old.winner and new.winner.name == old.winner.name) or (
        not new.winner
        and not old.winner
        and {s.name for s in new.not_slower} == {s.name for s in old.not_slower}
    ):
        return "agree"
    if new.fastest.name == old.fastest.name:
        return "same fastest"
    return "differ"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    a = ap.parse_args()
    df = read_cells(a.cells)
    samples = read_samples(a.cells)
    new, old = by_point(df, samples, NEW), by_point(df, samples, OLD)
    # the kernels of h200_paired's grid: those without an ok record at a point are named there
    kernels = set(load_config(ROOT / "config.yaml")["grids"][NEW]["kernels"])
    rows = []
    for key in sorted(new, key=lambda k: (k[0], k[1], k[2], ["fwd", "bwd", "train"].index(k[3]))):
        if key not in old:
            continue
        na, oa = new[key], old[key]
        common = [c.name for c in na.ok if c.name in {o.name for o in oa.ok}]
        if len(common) < 2:
            continue
        nc = compare([c.timed() for c in na.ok if c.name in common])
        oc = compare([c.timed() for c in oa.ok if c.name in common])
        lacking = sorted(({o.name for o in oa.ok} & kernels) - {c.name for c in na.ok})
        f = nc.fastest
        rows.append(
            (
                key[0],
                f"{key[1] // 1024}K",
                key[2],
                key[3],
                verdict(nc),
                verdict(oc),
                agreement(nc, oc),
                f"{f.min_ms:.3f}-{f.max_ms:.3f}",
                ", ".join(lacking) or "-",
            )
        )
    head = (
        "mask",
        "S",
        "heads",
        "dir",
        f"{NEW} (draws won)",
        f"{OLD} (draws won)",
        "",
        "fastest's ms per draw",
        "not in both",
    )
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in rows:
            print("  ".join(r))
    counts = {k: sum(r[6] == k for r in rows) for k in ("agree", "same fastest", "differ")}
    print(f"\n{len(rows)} answers compared: " + ", ".join(f"{v} {k}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
