"""Whether a second session reproduces the first: the same kernel, cell and draw in two grids.

Two grids measured in different sessions with the same cells and seeds (h200_paired, then
h200_repeat; or h200_sweep against either) draw the same masks and inputs: a draw is keyed by its
mask parameters and data seed (the `draw` column of samples.csv), so each (kernel, point,
direction, draw) measured in both is one pair. Per length it prints the pairs, the share within
+-3% and +-10%, and the range of the ratio B/A of the per-draw medians (the device time since the
harness times the kernel alone); then each grid's per-draw p20-p80 spread, as a share of the
median, by length.

    python benchmarks/session_repeat.py results/h200/tables/samples.csv --a h200_paired --b h200_repeat
    python benchmarks/session_repeat.py A/samples.csv --a h200_sweep --b h200_paired [--b-table B/samples.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

POINT = ["impl", "mask", "seqlen", "heads_q", "heads_kv", "head_dim", "dtype", "direction"]


def draws_of(samples: pd.DataFrame, grid: str) -> pd.DataFrame:
    """One row per (kernel, point, direction, draw) of `grid` that ran ok: its median and spread."""
    s = samples[(samples.grid == grid) & (samples.status == "ok")]
    s = s.dropna(subset=["time_ms_median"])
    # a draw measured more than once in a cell (a fixed mask's repetitions) counts once: its median
    g = s.groupby([*POINT, "draw"], as_index=False).agg(
        median=("time_ms_median", "median"),
        p20=("time_ms_p20", "median"),
        p80=("time_ms_p80", "median"),
    )
    return g


def pairs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """The draws measured in both, with ratio = B's median over A's."""
    m = a.merge(b, on=[*POINT, "draw"], suffixes=("_a", "_b"))
    m["ratio"] = m.median_b / m.median_a
    return m


def reproduction_table(m: pd.DataFrame) -> str:
    lines = [
        "| length | pairs | within +-3% | within +-10% | ratio B/A: min | median | max |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    groups = [(str(n), g) for n, g in m.groupby("seqlen")] + [("all", m)]
    for name, g in groups:
        dev = (g.ratio - 1).abs()
        lines.append(
            f"| {name} | {len(g)} | {(dev <= 0.03).mean():.1%} | {(dev <= 0.10).mean():.1%} | "
            f"{g.ratio.min():.3f} | {g.ratio.median():.3f} | {g.ratio.max():.3f} |"
        )
    return "\n".join(lines)


def spread_table(d: pd.DataFrame, grid: str) -> str:
    """Each draw's p20-p80 as a share of its median, by length: median, p90 and worst."""
    d = d.dropna(subset=["p20", "p80"])
    share = (d.p80 - d.p20) / d["median"]
    lines = [
        f"{grid}: per-draw p20-p80 spread, share of the median",
        "| length | draws | median | p90 | worst | over 10% |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, s in share.groupby(d.seqlen):
        lines.append(
            f"| {n} | {len(s)} | {s.median():.1%} | {s.quantile(0.9):.1%} | {s.max():.1%} | "
            f"{int((s > 0.10).sum())} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "samples", type=Path, help="a samples.csv holding grid A (and B, unless --b-table)"
    )
    ap.add_argument("--a", required=True, help="the first session's grid")
    ap.add_argument("--b", required=True, help="the second session's grid")
    ap.add_argument(
        "--b-table", type=Path, help="the samples.csv holding grid B, where it is another"
    )
    args = ap.parse_args(argv)
    read = lambda p: pd.read_csv(p, dtype={"draw": str, "cell_id": str})  # noqa: E731
    sa = read(args.samples)
    sb = read(args.b_table) if args.b_table else sa
    a, b = draws_of(sa, args.a), draws_of(sb, args.b)
    m = pairs(a, b)
    if m.empty:
        print(f"no draw of {args.a} was measured in {args.b} too (same kernel, point and draw)")
        return 1
    print(
        f"{args.b} against {args.a}: the same kernel, cell and draw, ratio of the per-draw medians"
    )
    print(reproduction_table(m))
    worst = m.assign(dev=(m.ratio - 1).abs()).nlargest(5, "dev")
    print("\nfarthest apart:")
    for r in worst.itertuples():
        print(
            f"  {r.impl} {r.mask} {r.seqlen} {r.direction} draw {r.draw}: "
            f"{r.median_a:.3f} ms, then {r.median_b:.3f} ms ({r.ratio:.3f})"
        )
    print()
    print(spread_table(a, args.a))
    print()
    print(spread_table(b, args.b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
