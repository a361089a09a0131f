"""The numbers that README.md and docs/ quote about the committed H200 records, recomputed from
them (issue 55, item 9), so that a text can be checked against its records after they change:

- draws: how many distinct draws each mask has per cell, per grid;
- records: a kernel's records of a grid, per length and status, against the cells its grid names;
- verdicts: the training step's answers (advice, draw by draw) on the heterogeneous masks;
- ratio: one kernel's training-step time over another's, per draw and as a ratio of means;
- band: the largest per-draw spread of the repetitions, (p80 - p20) / median (and p80 / p20 - 1),
  of the tied kernels in the ties that list a kernel 10% slower than the fastest on every draw
  (benchmarks/paired_vs_pooled.py), and of every ok draw at 1K-4K.

    python benchmarks/check_statements.py results/h200/tables/cells.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from attnbench.families import advice_of, expand_cells, load_config  # noqa: E402
from attnbench.grid.expand import cell_path  # noqa: E402
from attnbench.report.advice import grid_answers  # noqa: E402
from attnbench.report.collect import read_cells, read_samples  # noqa: E402
from paired_vs_pooled import per_draw, slow_in_tie  # noqa: E402  (beside this file)

SWEEP, PAIRED = "h200_sweep", "h200_paired"
HETEROGENEOUS = (
    "share_question",
    "causal_blockwise",
    "prefix_lm_causal",
    "prefix_lm_document",
    "global_sliding_window",
    "block_causal_document",
)
GQA = (64, 8)


def draws(samples: pd.DataFrame, grid: str) -> pd.DataFrame:
    """Draws per cell (min-max over the grid's cells) of each mask."""
    s = samples[samples["grid"] == grid]
    per_cell = s.groupby(["mask", "cell_id"])["draw"].nunique()
    return per_cell.groupby("mask").agg(["min", "max"])


def records(grid: str, impl: str) -> pd.DataFrame:
    """The kernel's records on disk per length and status, and the cells its grid names."""
    cfg = load_config(ROOT / "config.yaml")
    named = [c for c in expand_cells(cfg, [grid]) if c["impl"] == impl]
    rows = []
    for c in named:
        path = ROOT / "results" / "h200" / cell_path(c)
        status = pd.read_json(path, typ="series")["status"] if path.exists() else "(no record)"
        rows.append({"seqlen": c["seqlen"], "status": status})
    return pd.DataFrame(rows).value_counts().unstack(fill_value=0)


def verdicts(cells: pd.DataFrame, samples: pd.DataFrame) -> list[tuple[str, int, str, bool]]:
    """(mask, length, verdict, names a winner) of the training step on the heterogeneous masks."""
    rows = cells[(cells["heads_q"] == GQA[0]) & (cells["heads_kv"] == GQA[1])]
    out = []
    for a in grid_answers(rows[rows["grid"] == SWEEP], SWEEP, advice_of("kernel"), samples)[0]:
        if a.direction == "train" and a.point["mask"] in HETEROGENEOUS:
            if int(a.point["seqlen"]) in (8192, 32768):
                c = a.comparison
                words = c.winner.name if c.winner else " ~ ".join(s.name for s in c.not_slower)
                out.append((a.point["mask"], int(a.point["seqlen"]), words, c.winner is not None))
    return sorted(out)


def train_per_draw(samples: pd.DataFrame, grid: str, impl: str, mask: str, seqlen: int):
    """{draw: fwd median + bwd median} of a kernel's ok cells at a GQA point."""
    s = samples[
        (samples["grid"] == grid)
        & (samples["impl"] == impl)
        & (samples["mask"] == mask)
        & (samples["seqlen"] == seqlen)
        & (samples["heads_q"] == GQA[0])
        & (samples["heads_kv"] == GQA[1])
        & (samples["status"] == "ok")
    ]
    by = s.pivot_table(index="draw", columns="direction", values="time_ms_median")
    return (by["fwd"] + by["bwd"]).dropna() if {"fwd", "bwd"} <= set(by) else pd.Series()


def ratio(samples, slow: str, fast: str, masks, lengths=(8192, 32768)) -> pd.DataFrame:
    """slow's training step over fast's: per draw (min, max) and the ratio of the means."""
    rows = []
    for m in masks:
        for n in lengths:
            a, b = (train_per_draw(samples, SWEEP, k, m, n) for k in (slow, fast))
            r = (a / b).dropna()
            if len(r):
                rows.append(
                    {
                        "mask": m,
                        "seqlen": n,
                        "draws": len(r),
                        "per_draw_min": r.min(),
                        "per_draw_max": r.max(),
                        "of_means": a.mean() / b.mean(),
                    }
                )
    return pd.DataFrame(rows)


def tie_band(cells: pd.DataFrame, samples: pd.DataFrame, grid: str) -> pd.DataFrame:
    """Every draw of the tied kernels in the ties that list a kernel 10% slower than the fastest
    on every draw: its median (ms) and its p20-p80 over the median, widest first."""
    rows = cells[cells["grid"] == grid]
    found, _ = grid_answers(rows, grid, advice_of("kernel"), samples)
    out = []
    for x in found:
        if len(x.ok) < 2:
            continue
        d, tie = per_draw(x), [c.name for c in x.tied]
        if slow_in_tie(tie, d):
            where = f"{x.point['mask']} {int(x.point['seqlen']) // 1024}K {x.direction}"
            out += [
                {
                    "tie": where,
                    "kernel": n,
                    "median_ms": m,
                    "of_median": (p80 - p20) / m,
                    "p80_over_p20": p80 / p20 - 1,
                }
                for n in tie
                for m, p20, p80 in d[n]
            ]
    return pd.DataFrame(out).sort_values("of_median", ascending=False)


def band(samples: pd.DataFrame, grid: str, lengths) -> pd.DataFrame:
    """The widest per-draw p20-p80 (over its median) of any ok cell at each length."""
    s = samples[(samples["grid"] == grid) & samples["seqlen"].isin(lengths)]
    s = s[s["status"] == "ok"].copy()
    s["of_median"] = (s["time_ms_p80"] - s["time_ms_p20"]) / s["time_ms_median"]
    s["p80_over_p20"] = s["time_ms_p80"] / s["time_ms_p20"] - 1
    worst = s.loc[s.groupby("seqlen")["of_median"].idxmax()]
    return worst[["seqlen", "impl", "mask", "direction", "sample", "of_median", "p80_over_p20"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells", nargs="?", default=str(ROOT / "results/h200/tables/cells.csv"))
    a = ap.parse_args()
    cells, samples = read_cells(a.cells), read_samples(a.cells)
    pd.set_option("display.width", 160)
    for g in (SWEEP, PAIRED):
        print(f"\n## draws per cell, {g}\n{draws(samples, g).to_string()}")
    print(f"\n## fa4's records in {PAIRED} (cells its grid names)\n{records(PAIRED, 'fa4')}")
    vs = verdicts(cells, samples)
    print(f"\n## training step, {SWEEP}, GQA 64:8, heterogeneous masks")
    for v in vs:
        print(f"  {v[0]} {v[1] // 1024}K: {v[2]}")
    print(f"  {sum(v[3] for v in vs)} of {len(vs)} name a winner")
    five = [m for m in HETEROGENEOUS if m != "global_sliding_window"]
    r = ratio(samples, "flex", "flashmask", five)
    print(f"\n## flex over flashmask, training step, {SWEEP}, 8K and 32K\n{r.to_string()}")
    print(
        f"  per draw {r['per_draw_min'].min():.3f}-{r['per_draw_max'].max():.3f}x, "
        f"ratio of means {r['of_means'].min():.3f}-{r['of_means'].max():.3f}x"
    )
    t = tie_band(cells, samples, SWEEP)
    print(
        f"\n## ties listing a kernel 10% slower on every draw, {SWEEP}: {t['tie'].nunique()}, "
        f"calls of {t['median_ms'].min():.2f}-{t['median_ms'].max():.2f} ms; widest draws\n"
        f"{t.head(3).to_string(index=False)}"
    )
    b = band(samples, SWEEP, (1024, 2048, 4096))
    print(
        f"\n## widest per-draw p20-p80 of any ok cell, {SWEEP}, 1K-4K\n{b.to_string(index=False)}"
    )


if __name__ == "__main__":
    main()
