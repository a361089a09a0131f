"""Heterogeneous masks draw their parameters per sample (every kernel at a point the same ones),
a grid can bound a prefix, window or question as a fraction of S so that a length series keeps
its shape, and check-config says how many cells a grid has, what its records estimate it takes,
and where a GPU grid draws too few masks for a paired answer. No committed cell id changes."""

import copy
import json
from datetime import datetime, timedelta, timezone

import attnbench.masks as M
import numpy as np
import pytest
from attnbench.families import expand_cells, load_config, plan_lines, validate
from attnbench.grid.config import ConfigError
from attnbench.grid.spec import CellSpec
from attnbench.harness.inputs import mask_rng
from attnbench.harness.samples import n_samples, spec_mask


def draws(name, seqlen, cfg, n=40, histograms=None):
    rng = np.random.default_rng(7)
    return [M.sample_mask(name, seqlen, cfg, rng, histograms).params for _ in range(n)]


@pytest.mark.parametrize("name", ["prefix_lm_causal", "global_sliding_window"])
def test_prefix_and_window_masks_draw_afresh_per_sample(name, base, repo):
    assert M.pattern(name).sample_class == "document"
    cfg = load_config(repo / "config.yaml")
    cell = next(c for c in expand_cells(cfg, ["smoke"]) if c["mask"] == name)
    spec = CellSpec.from_dict(cell)
    assert n_samples(spec.problem, spec.measurement) == cell["samples"]["document"] == 2
    rng = mask_rng(7)
    first, second = (spec_mask(spec.problem, cell["seqlen"], rng).params for _ in range(2))
    assert first != second  # two draws, not one mask timed twice


def test_a_prefix_bounded_as_a_fraction_keeps_its_shape_at_every_length(histograms):
    for s in (4096, 16384, 65536):
        got = [
            p["prefix"] / s
            for p in draws("prefix_lm_causal", s, {"prefix_fraction": [0.25, 0.75]})
        ]
        assert 0.25 - 1 / s <= min(got) and max(got) <= 0.75 + 1 / s
        assert max(got) - min(got) > 0.3  # drawn, not fixed
    fixed = draws("prefix_lm_causal", 1000, {"prefix_fraction": 0.5}, n=3)
    assert [p["prefix"] for p in fixed] == [500, 500, 500]
    unbounded = [p["prefix"] / 4096 for p in draws("prefix_lm_causal", 4096, {})]
    assert min(unbounded) < 0.2 and max(unbounded) > 0.8  # the paper's 1..S


def test_a_window_and_a_question_bounded_as_fractions(histograms):
    for s in (8192, 32768):
        w = [
            p["window"] / s
            for p in draws("global_sliding_window", s, {"window_fraction": [1 / 64, 1 / 8]})
        ]
        assert 1 / 64 - 1 / s <= min(w) and max(w) <= 1 / 8 + 1 / s
        hist = {"h": {**histograms["pile"], "use_up_to": None}}
        qs = draws("share_question", s, {"question_fraction": [0.05, 0.25]}, histograms=hist)
        for p in qs:
            assert 0.05 - 1 / s <= p["doc_lengths"][0] / s <= 0.25 + 1 / s
            assert sum(p["doc_lengths"]) == s
    p = draws(
        "prefix_lm_document", 8192, {"prefix_fraction": 0.5}, histograms={"h": histograms["pile"]}
    )
    assert all(q["prefix"] == max(1, round(q["doc_lengths"][0] / 2)) for q in p)


@pytest.mark.parametrize(
    "params, named",
    [
        ({"prefix_fraction": [0.8, 0.2]}, "prefix_fraction [0.8, 0.2] must be a fraction"),
        (
            {"window_fraction": 0.5},
            "window_fraction 0.5 must be a fraction of the sequence in (0, 0.333333]",
        ),
        ({"question_fraction": 0}, "question_fraction"),
    ],
)
def test_a_bad_fraction_is_refused_naming_the_key(base, params, named):
    cfg = copy.deepcopy(base)
    cfg["grids"]["smoke"]["mask_params"].update(params)
    with pytest.raises(
        ConfigError,
        match=named.replace("[", r"\[")
        .replace("(", r"\(")
        .replace(")", r"\)")
        .replace("]", r"\]"),
    ):
        validate(cfg)


def test_unset_fractions_leave_every_cell_as_it_was(base):
    """The new keys enter a cell only where a grid sets them: every other cell id is as before."""
    cfg = validate(copy.deepcopy(base))
    for c in expand_cells(cfg, ["h200_sweep"]):
        assert not {"prefix_fraction", "window_fraction", "question_fraction"} & set(
            c["mask_params"]
        )
    paired = [c for c in expand_cells(cfg, ["h200_paired"]) if c["mask"] == "prefix_lm_causal"]
    assert paired[0]["mask_params"] == {"prefix_fraction": [0.25, 0.75]}


def test_check_config_counts_cells_estimates_gpu_time_and_notes_few_draws(repo):
    cfg = load_config(repo / "config.yaml", {"output_dir": str(repo / "results" / "h200")})
    lines = plan_lines(cfg, ["h200_paired", "h200_sweep", "smoke"])
    paired = next(x for x in lines if x.startswith("h200_paired:"))
    assert "320 cells; estimated" in paired and "min of device time for 320 of 320 cells" in paired
    assert "from records of the same points in h200_sweep" in paired
    assert any("note: h200_sweep draws 3 masks per point" in x for x in lines)
    assert not any("note: h200_paired" in x for x in lines)
    smoke = len(expand_cells(cfg, ["smoke"]))
    assert f"smoke: {smoke} cells" in lines  # a CPU grid: no device time to estimate


def test_the_call_plan_lists_every_cell_once_in_order_with_its_estimate(repo, tmp_path):
    from attnbench.families.estimate import calls, write_calls

    out = repo / "results" / "h200"
    cfg = load_config(repo / "config.yaml", {"output_dir": str(out)})
    cells = expand_cells(cfg, ["h200_paired"])
    plan = calls(cells, out, 420)
    written = write_calls(plan, out, tmp_path)
    assert [p.name for p in written][-1] == "order.tsv"
    by_call = [p.read_text().splitlines() for p in written[:-1]]
    order = [line.split("\t") for line in (tmp_path / "order.tsv").read_text().splitlines()]
    # the order is the calls' files one after the other: each cell once
    assert [path for _, path in order] == [p for lines in by_call for p in lines]
    assert len(order) == len(cells) == len({path for _, path in order})
    seconds = {path: float(s) for s, path in order}
    for lines in by_call:  # a call of several cells keeps within its seconds
        if len(lines) > 1:
            assert sum(seconds[p] for p in lines) <= 420


def test_each_cell_is_estimated_with_its_start_as_measured_between_records_of_one_worker(
    repo, tmp_path
):
    """The time from one record's end to the next one's start in the same worker is each cell's
    start; a long pause (the run waiting) is not, nor records of another worker."""
    from attnbench.families.estimate import cell_estimate, cell_seconds, start_seconds

    src = sorted((repo / "results/h200/cells/h200_paired/kernel/fa3/full").glob("*.json"))[0]
    record = json.loads(src.read_text())
    spans = [  # (worker pid, start, end) in seconds after a fixed moment
        (1, 0, 10),
        (1, 12, 20),  # 2 s after the first
        (1, 23, 30),  # 3 s
        (1, 200, 210),  # a pause of 170 s: not a start
        (2, 11, 15),  # another worker: its own runs
        (2, 15.5, 16),  # 0.5 s
    ]
    at = datetime(2026, 12, 1, tzinfo=timezone.utc)
    for i, (pid, a, b) in enumerate(spans):
        one = dict(record, worker={"pid": pid, "cell": i})
        one["started_at"] = (at + timedelta(seconds=a)).isoformat()
        one["finished_at"] = (at + timedelta(seconds=b)).isoformat()
        path = tmp_path / f"cells/g{i}/kernel/fa3/full" / src.name
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(one))
    assert start_seconds(tmp_path) == (2 + 3 + 0.5) / 3
    cell = {**record["cell"], "grid": "new"}
    assert cell_estimate(cell, tmp_path) == cell_seconds(record, cell) + (2 + 3 + 0.5) / 3
