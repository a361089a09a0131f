"""The verdict rule's error rates (report.paired), simulated on the committed H200 timing noise.

Two contenders are compared on n draws, n = 1, 3, 5, 10, 20, by the rule itself
(report.paired.compare, with config.yaml's report.verdict or the settings given here):

- false winner (A/A): the two are the same kernel; the rule should say `A ~ B`. Any winner is
  false.
- missed winner: B takes 1.02, 1.03, 1.05 or 1.10 x A's time on every draw (A is that much
  faster); the rule should name A. A tie, or B named, misses it.

Two models of the noise, both read off the records of h200_paired and h200_sweep (each draw's 20
timed repetitions, `samples[].time_ms`):

- repetitions: a simulated draw is one recorded draw (any ok kernel cell, any mask and length);
  each contender's repetitions are resampled (bootstrap, as many as were timed) from that draw's
  own repetitions. Both contenders see the same per-draw noise and nothing else: the noise the
  rule's p20-p80 sees.
- repeats: a simulated draw is one recorded pair of measurements of the same kernel on the same
  mask: two draws of one fixed mask in one cell (full and causal draw it 3 times in h200_paired;
  some block-causal documents repeat at 1K-4K in h200_sweep), or the same kernel, mask, length and
  direction in both grids' sessions, days apart. Their difference is what remeasuring costs beyond
  the repetitions' noise: warm-up, clocks, the session.

    python benchmarks/verdict_error_rates.py [--trials 4000] [--seed 0] [--alpha 0.05 --threshold 1.02]

It prints a Markdown table (docs/measurement.md, "Which is faster") and the pools' sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from attnbench.report.paired import Draw, Timed, Verdict, compare  # noqa: E402

GRIDS = ("h200_paired", "h200_sweep")
DRAWS = (1, 3, 5, 10, 20)
SLOWER = (1.02, 1.03, 1.05, 1.10)  # B's time over A's on every draw


def recorded_draws(cells: Path, grids=GRIDS) -> list[dict]:
    """Every ok kernel draw of the grids: its point, mask and repetitions (ms)."""
    out = []
    for g in grids:
        for f in sorted((cells / g).rglob("*.json")):
            r = json.loads(f.read_text())
            if r.get("status") != "ok":
                continue
            c = r["cell"]
            for s in r["samples"]:
                t = s["time_ms"]
                t = np.asarray(json.loads(t) if isinstance(t, str) else t, dtype=float)
                point = (c["impl"], c["mask"], c["seqlen"], c["heads_kv"], c["direction"])
                mask = json.dumps(s["mask_params"], sort_keys=True)
                out.append({"grid": g, "point": point, "mask": mask, "reps": t})
    return out


def repeat_pairs(draws: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pairs of measurements of one kernel on one mask: two draws of the same mask in one cell,
    and the same kernel, point and mask in both grids (the first draw of each)."""
    by = defaultdict(list)
    for d in draws:
        by[(d["grid"], d["point"], d["mask"])].append(d["reps"])
    pairs = [(a, b) for same in by.values() for a, b in combinations(same, 2)]
    across = defaultdict(dict)
    for (g, point, mask), same in by.items():
        across[(point, mask)][g] = same[0]
    pairs += [tuple(v.values()) for v in across.values() if len(v) == 2]
    return pairs


def quantiles(reps: np.ndarray) -> np.ndarray:
    """[median, p20, p80] along the last axis (as harness.measure.quantiles)."""
    return np.stack(
        [np.median(reps, -1), np.percentile(reps, 20, -1), np.percentile(reps, 80, -1)], -1
    )


def stacked(reps: list[np.ndarray]) -> np.ndarray:
    """Each draw's [median, p20, p80]; at once where the draws timed as many repetitions."""
    if len({len(r) for r in reps}) == 1:
        return quantiles(np.stack(reps))
    return np.array([quantiles(r) for r in reps])


def timed(name: str, q: np.ndarray) -> Timed:
    return Timed(name, tuple(Draw(i, f"d{i}", *map(float, row)) for i, row in enumerate(q)))


def one_trial(rng, n: int, model: str, pool, ratio: float, settings: Verdict) -> str:
    """The verdict on n simulated draws: 'A' (the truly faster or first), 'B', or 'tie'."""
    picks = rng.integers(len(pool), size=n)
    a_reps, b_reps = [], []
    for i in picks:
        if model == "repetitions":
            reps = pool[i]
            a = rng.choice(reps, size=len(reps))
            b = rng.choice(reps, size=len(reps))
        else:
            a, b = pool[i] if rng.random() < 0.5 else pool[i][::-1]
        a_reps.append(a)
        b_reps.append(b * ratio)
    qa, qb = stacked(a_reps), stacked(b_reps)
    c = compare([timed("A", qa), timed("B", qb)], settings)
    return c.winner.name if c.winner else "tie"


def rates(rng, model: str, pool, trials: int, settings: Verdict) -> dict:
    """{(row, n): percent} for the A/A row and each SLOWER row."""
    out = {}
    for n in DRAWS:
        same = [one_trial(rng, n, model, pool, 1.0, settings) for _ in range(trials)]
        out[("A/A: false winner", n)] = 100 * sum(v != "tie" for v in same) / trials
        for r in SLOWER:
            got = [one_trial(rng, n, model, pool, r, settings) for _ in range(trials)]
            out[(f"A {(r - 1) * 100:.0f}% faster: missed", n)] = (
                100 * sum(v != "A" for v in got) / trials
            )
            out[(f"A {(r - 1) * 100:.0f}% faster: B named", n)] = (
                100 * sum(v == "B" for v in got) / trials
            )
    return out


def table(results: dict, settings: Verdict) -> str:
    head = "| noise | case | " + " | ".join("1 draw" if n == 1 else f"{n} draws" for n in DRAWS)
    rule = " | ".join(
        "bands" if n < settings.min_draws else f"sign >= {need(n, settings)}/{n}" for n in DRAWS
    )
    lines = [head + " |", "|" + " --- |" * (len(DRAWS) + 2), f"| | rule | {rule} |"]
    for model, res in results.items():
        rows = dict.fromkeys(k for k, _ in res if not k.endswith("B named"))
        for row in rows:
            cells = " | ".join(f"{res[(row, n)]:.1f}%" for n in DRAWS)
            lines.append(f"| {model} | {row} | {cells} |")
    return "\n".join(lines)


def need(n: int, settings: Verdict) -> int:
    from attnbench.report.paired import draws_needed

    return draws_needed(n, settings.alpha)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default=str(ROOT / "results/h200/cells"), help="records' folder")
    p.add_argument("--trials", type=int, default=4000, help="simulated comparisons per entry")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alpha", type=float, help="default: config.yaml's report.verdict")
    p.add_argument("--threshold", type=float, help="default: config.yaml's report.verdict")
    a = p.parse_args(argv)
    import yaml

    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    settings = Verdict.of(cfg)
    settings = Verdict(a.alpha or settings.alpha, a.threshold or settings.threshold)
    draws = recorded_draws(Path(a.cells))
    reps = [d["reps"] for d in draws]
    pairs = repeat_pairs(draws)
    rng = np.random.default_rng(a.seed)
    results = {
        "repetitions": rates(rng, "repetitions", reps, a.trials, settings),
        "repeats": rates(rng, "repeats", pairs, a.trials, settings),
    }
    print(
        f"alpha {settings.alpha:g}, threshold {settings.threshold:g}; {a.trials} trials per entry, "
        f"seed {a.seed}; pools: {len(reps)} recorded draws of "
        f"{len({(d['grid'], d['point']) for d in draws})} ok kernel cells ({', '.join(GRIDS)}), "
        f"{len(pairs)} repeated measurements\n"
    )
    print(table(results, settings))
    named = {
        (model, row, n): v
        for model, res in results.items()
        for (row, n), v in res.items()
        if row.endswith("B named")
    }
    (model, row, n), most = max(named.items(), key=lambda kv: kv[1])
    print(
        f"\nthe slower one named the winner: at most {most:.1f}% of trials in any entry "
        f"({model}, {row.split(':')[0]}, {n} draw{'s' * (n > 1)})"
    )


if __name__ == "__main__":
    main()
