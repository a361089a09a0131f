"""The time left a run says (attnbench.report.progress), on a fake clock: a real `make run`
replayed finish by finish (tests/make_run_cells.tsv), as it ran and on faster and slower
machines."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from attnbench.report.progress import (
    REFERENCE_S,
    REPORT_REFERENCE_S,
    Progress,
    features,
    fitted_rates,
    keep_report_seconds,
    reference_seconds,
    report_seconds,
)
from commands import REPO


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def within(seen, at_least=0.25):
    """The worst relative error of what was said from a quarter of the run on (while more than
    30 s were left)."""
    late = [(f, said, true) for f, said, true in seen if f >= at_least and true > 30]
    assert len(late) > 20
    return max(abs(said / true - 1) for _, said, true in late)


def replayed_run():
    """The cells of tests/make_run_cells.tsv and their finishes (seconds since the run began)."""
    lines = (REPO / "tests/make_run_cells.tsv").read_text().splitlines()
    rows = [line.split("\t") for line in lines if line and not line.startswith("#")]
    header, cells = rows[0], []
    for row in rows[1:]:
        r = dict(zip(header, row))
        kept = {
            k: v if k in ("family", "direction") else int(v)
            for k, v in r.items()
            if k != "finished_s"
        }
        # the default run's three grids, one per family
        grid = {"kernel": "smoke", "sparse": "smoke_sparse", "cp": "smoke_cp"}[kept["family"]]
        cells.append(({"grid": grid, "device": "cpu", **kept}, float(r["finished_s"])))
    return cells


def replay(tmp_path, stretch=1.0, first_run=False):
    """What the run said and what was left at each finish, its clock `stretch` times slower;
    `first_run`: no earlier run into the folder timed its tables and figures."""
    run = replayed_run()
    cells = {str(tmp_path / f"c{i}.json"): cell for i, (cell, _) in enumerate(run)}
    clock = Clock()
    report_s = None if first_run else 32.7 * stretch
    progress = Progress(cells, list(cells), started=0.0, report_s=report_s, clock=clock)
    end, seen, old = 470.9 * stretch, [], []
    for i, (path, (_, t)) in enumerate(zip(cells, run), 1):
        clock.now = t * stretch
        (tmp_path / f"c{i - 1}.json").write_text(json.dumps({"status": "ok"}))
        progress.line(path)
        said = progress.left_s()
        if said is not None:
            left = end - clock.now
            seen.append((i / len(run), said, left))
            old.append((i / len(run), clock.now / i * (len(run) - i), left))
    return seen, old


def test_the_reference_costs_are_those_the_replayed_run_gives():
    """REFERENCE_S is fitted_rates over the replayed run's finishes, not a guess."""
    so_far, done, elapsed = Counter(), [], []
    for cell, t in replayed_run():
        so_far.update(features(cell))
        done.append(dict(so_far))
        elapsed.append(t)
    fitted = fitted_rates(done, elapsed)
    assert fitted.keys() == REFERENCE_S.keys()
    for k, v in fitted.items():
        assert REFERENCE_S[k] == pytest.approx(v, rel=0.005), k


@pytest.mark.parametrize("first_run", [False, True])
@pytest.mark.parametrize("stretch", [1.0, 0.25, 3.0])
def test_a_real_make_run_is_told_within_30_percent_from_a_quarter_on(tmp_path, stretch, first_run):
    """A clean clone's `make run` (220 cells) replayed finish by finish, on its own clock and on
    a machine four times faster or three times slower: the run's rate is learned from its own
    finishes, and the tables and figures counted, as the last run into the folder took for them
    or, on a first run, at the reference seconds per grid. The rule before (seconds per cell
    done, times the cells left, no tables and figures) said less than half of what was left there
    from a third of the run on."""
    seen, old = replay(tmp_path, stretch, first_run)
    assert within(seen) <= 0.30
    assert within(old) > 0.50


def test_the_fit_and_what_the_line_says(tmp_path):
    # elapsed = 2 s per cell + 0.5 s per work, exactly
    done = [
        {"kernel": 1.0, "work": 1.0},
        {"kernel": 2.0, "work": 3.0},
        {"kernel": 3.0, "work": 7.0},
    ]
    elapsed = [2 * d["kernel"] + 0.5 * d["work"] for d in done]
    assert fitted_rates(done, elapsed) == pytest.approx({"kernel": 2.0, "work": 0.5})
    # a rate that comes out negative is left out, the rest fitted again
    rates = fitted_rates(done, [3.0, 2.0, 1.0])
    assert all(r > 0 for r in rates.values()) and len(rates) < 2
    cells = {str(tmp_path / f"c{i}.json"): dict(grid="g", seqlen=64 * (i + 1)) for i in range(3)}
    clock = Clock()
    progress = Progress(cells, list(cells), started=0.0, clock=clock)
    first = next(iter(cells))
    (tmp_path / "c0.json").write_text(json.dumps({"status": "ok", "wall_s": 2.0}))
    clock.now = 2.0
    line = progress.line(first)
    assert "| 1 of 3 done (1 ok); about" in line and line.endswith(" left")
    # a first run counts the tables and figures of its one grid at the reference seconds
    assert progress.left_s() == pytest.approx(
        2.0
        / progress.reference_done
        * (sum(reference_seconds(c) for p, c in cells.items() if p != first) + REPORT_REFERENCE_S)
    )
    # the tables' and figures' time kept for the next run
    keep_report_seconds(str(tmp_path), progress)
    assert report_seconds(str(tmp_path)) == 0.0
    assert report_seconds(str(tmp_path / "none")) is None


def test_the_closing_hint_asks_a_question_the_run_answers():
    """The summary's `next:` command names a mask and a length the run's kernel cells measured
    (the default grids stop at 256 tokens: a hint of 32K would find nothing)."""
    from attnbench.report.progress import example_question

    cells = {
        f"c{i}": {"family": f, "mask": m, "seqlen": s}
        for i, (f, m, s) in enumerate(
            [("kernel", "full", 256), ("kernel", "causal", 256), ("kernel", "causal", 128),
             ("cp", "causal", 4096)]
        )
    }  # fmt: skip
    assert example_question(cells) == "--mask causal --seqlen 256"
    cells["c9"] = {"family": "kernel", "mask": "full", "seqlen": 32768}
    assert example_question(cells) == "--mask full --seqlen 32K"
    assert example_question({}) == "--mask MASK --seqlen 32K"
