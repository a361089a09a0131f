"""A block-sparse answer set against dense attention (report.against, `advise`): the dense kernels
given the same blocks (paired draw by draw), dense full attention at the same length from a
kernel grid (no shared draw: compared without pairing, and said so), what is missing where no
record holds it; on SYNTHETIC tidy tables, then on the committed H200 records."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from attnbench import families
from attnbench.__main__ import main
from attnbench.report import advice
from attnbench.report.against import against
from attnbench.report.paired import APART, Draw, Timed, compare_apart
from synthetic_cells import tidy


def timed(name, *medians, noise=0.01):
    return Timed(
        name,
        tuple(
            Draw(i, f"{name}-mask{i}", m, m * (1 - noise), m * (1 + noise))
            for i, m in enumerate(medians)
        ),
    )


# ---------------------------------------------------------------- the rule without a shared draw


def test_without_a_shared_draw_the_slower_is_slower_only_where_every_draw_is_apart():
    c = compare_apart(timed("sparse", 10.0, 11.0), timed("dense", 30.0))
    assert c.rule == APART and [s.name for s in c.standings] == ["sparse", "dense"]
    dense = c.standings[1]
    assert dense.slower and dense.ratio_lo == pytest.approx(30 / 11)
    assert dense.ratio_hi == pytest.approx(3.0) and c.winner.name == "sparse"
    # one draw of the faster reaches into the other's spread: no verdict, whatever the means
    c = compare_apart(timed("sparse", 10.0, 29.8), timed("dense", 30.0))
    assert not c.standings[1].slower and c.winner is None
    # apart, but by less than the threshold (1.02): not slower either
    c = compare_apart(timed("a", 1.0, noise=0.001), timed("b", 1.01, noise=0.001))
    assert not c.standings[1].slower
    assert "every draw's p20 of the slower above every draw's p80" in c.how


# ---------------------------------------------------------------- synthetic tidy tables


def row(impl, ms, direction, mask="block_sparse", seqlen=32768, device="NVIDIA H200", **kw):
    """One cell of one draw (no per-sample data), p20-p80 +-1%."""
    return {
        "impl": impl,
        "mask": mask,
        "seqlen": seqlen,
        "heads_q": 64,
        "heads_kv": 8,
        "direction": direction,
        "status": "ok",
        "time_ms_median": ms,
        "time_ms_p20": None if ms is None else ms * 0.99,
        "time_ms_p80": None if ms is None else ms * 1.01,
        "cell_id": f"{impl}-{mask}-{seqlen}-{direction}-{device[-4:]}",
        "record": f"results/cells/{impl}-{mask}-{seqlen}-{direction}.json",
        "device_name": device,
        **kw,
    }


def sparse_rows(seqlen=32768):
    blocks = dict(block_size=128, density=0.2, seqlen=seqlen)
    return [
        row("triton_block_sparse", 20.0, "fwd", **blocks),
        row("triton_block_sparse", 40.0, "bwd", **blocks),
        row("flex", 21.0, "fwd", **blocks),  # a dense kernel given the same blocks
        row("flex", 60.0, "bwd", **blocks),
        row("fa2_sparse", 30.0, "fwd", **blocks),
        row("fa2_sparse", None, "bwd", status="unsupported", **blocks),
    ]


def dense_rows(device="NVIDIA H200"):
    full = dict(mask="full", device=device)
    return [
        row("fa4", 50.0, "fwd", **full),
        row("fa4", 140.0, "bwd", **full),
        row("fa3", 52.0, "fwd", **full),
        row("fa3", 150.0, "bwd", **full),
        row("fa2", 90.0, "fwd", **full, seqlen=65536),  # full attention at another length
    ]


def tables(sparse, dense) -> pd.DataFrame:
    return pd.concat(
        [tidy(sparse, "sp", "sparse"), tidy(dense, "dense", "kernel")], ignore_index=True
    )


def answer_against(df, direction="train", seqlen=32768):
    found = advice.answers(df, families.advice_of)
    (a,) = [x for x in found if x.grid == "sp" and x.direction == direction and x.seqlen == seqlen]
    return a, {ag.baseline.key: ag for ag in against(a, found)}


def test_the_same_blocks_compare_the_fastest_sparse_and_dense_kernels_draw_by_draw():
    a, ag = answer_against(tables(sparse_rows(), dense_rows()))
    same = ag["dense_same_blocks"]
    assert (same.mine.name, same.theirs.name) == ("triton_block_sparse", "flex")
    assert same.paired and same.draws == "paired on 1 draw"
    assert same.speedup == pytest.approx(81.0 / 60.0) and same.verdict == "faster"
    # forward: flex 21 ms against triton's 20 (+-1%: apart, and 1.05x >= 1.02); fa2_sparse,
    # ok in the forward, is block-sparse, so never the baseline
    _, fwd = answer_against(tables(sparse_rows(), dense_rows()), "fwd")
    same = fwd["dense_same_blocks"]
    assert same.speedup == pytest.approx(21.0 / 20.0) and same.verdict == "faster"
    assert same.theirs.name == "flex"
    # within each other's spread: neither is faster by the rule
    rows = sparse_rows()
    rows[2] = row("flex", 20.1, "fwd", block_size=128, density=0.2)
    _, fwd = answer_against(tables(rows, dense_rows()), "fwd")
    assert fwd["dense_same_blocks"].verdict == "not apart"


def test_full_attention_comes_from_the_kernel_grid_at_the_same_length_and_is_not_paired():
    a, ag = answer_against(tables(sparse_rows(), dense_rows()))
    full = ag["dense_full"]
    assert full.answer.grid == "dense" and full.theirs.name == "fa4"  # 190 ms against fa3's 202
    assert full.mine.name == "triton_block_sparse" and not full.paired
    assert full.speedup == pytest.approx(190.0 / 60.0) and full.verdict == "faster"
    assert full.comparison.rule == APART
    assert full.draws == "not paired, no shared draw: 1 draw against 1"


def test_a_dense_kernel_faster_than_every_sparse_one_is_said_to_be():
    rows = sparse_rows()
    rows[3] = row("flex", 30.0, "bwd", block_size=128, density=0.2)  # flex 51 ms vs triton 60
    a, ag = answer_against(tables(rows, dense_rows()))
    assert a.fastest.name == "flex"
    same = ag["dense_same_blocks"]
    assert same.mine.name == "triton_block_sparse" and same.verdict == "slower"
    assert same.speedup == pytest.approx(51.0 / 60.0)
    assert ag["dense_full"].mine.name == "triton_block_sparse"  # the fastest block-sparse kernel


def test_what_is_missing_is_named_not_invented():
    # no dense record at 64K in train (fa2's forward only), none on another device counts
    df = tables(sparse_rows(65536), dense_rows(device="Other GPU"))
    _, ag = answer_against(df, seqlen=65536)
    full = ag["dense_full"]
    assert full.comparison is None and full.theirs is None
    assert full.missing.startswith("no kernel answer at full mask, S=64K, GQA 64:8, head dim 128")
    _, ag = answer_against(tables(sparse_rows(), dense_rows(device="Other GPU")))
    assert "(only on Other GPU)" in ag["dense_full"].missing
    # at a point without any dense kernel: said so too
    no_flex = [r for r in sparse_rows() if r["impl"] != "flex"]
    _, ag = answer_against(tables(no_flex, dense_rows()))
    assert ag["dense_same_blocks"].missing == (
        "none of the dense kernels given the same blocks was measured at this point"
    )


@pytest.fixture
def cells_csv(tmp_path):
    path = tmp_path / "cells.csv"
    df = tables(sparse_rows() + sparse_rows(65536), dense_rows())
    df.to_csv(path, index=False)
    return path


def advise(cells_csv, *args):
    main(["advise", "--cells", str(cells_csv), "--grid", "sp", *args])


def test_advise_prints_the_dense_comparisons_in_every_format(cells_csv, capsys):
    ask = ["--seqlen", "32K", "--direction", "train"]
    advise(cells_csv, *ask)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "  against the dense kernels given the same blocks: flex 81 ms" in lines
    assert "    triton_block_sparse 60 ms, speed-up 1.35x: faster (paired on 1 draw;" in out
    assert "  against dense full attention at the same length: fa4 190 ms (dense, full mask" in out
    assert "    triton_block_sparse 60 ms, speed-up 3.17x: faster (not paired, no shared" in out
    first = next(i for i, x in enumerate(lines) if x.startswith("  against"))
    assert max(len(x) for x in lines[first:]) <= 100  # wrapped as the answer's other lines
    advise(cells_csv, *ask, "--format", "json")
    (a,) = json.loads(capsys.readouterr().out)
    by = {x["key"]: x for x in a["against"]}
    assert by["dense_full"]["baseline_contender"] == "fa4"
    assert by["dense_full"]["speedup"] == pytest.approx(190 / 60)
    assert by["dense_full"]["baseline_grid"] == "dense" and not by["dense_full"]["paired"]
    assert by["dense_full"]["ground"].startswith("measured on NVIDIA H200")
    assert by["dense_same_blocks"]["verdict"] == "faster" and by["dense_same_blocks"]["paired"]
    advise(cells_csv, *ask, "--format", "csv")
    t = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(t["dense_full speedup"]) == pytest.approx([190 / 60] * 2)
    assert list(t["block-sparse kernel"]) == ["triton_block_sparse", "flex"]
    advise(cells_csv, *ask, "--format", "md")
    md = capsys.readouterr().out
    assert "- against dense full attention at the same length: fa4 190 ms" in md
    assert "  triton_block_sparse 60 ms, speed-up 3.17x: faster" in md
    # at 64K the tidy table holds no dense full attention in train: said so in every format
    advise(cells_csv, "--seqlen", "64K", "--direction", "train")
    out = capsys.readouterr().out.replace("\n    ", " ")
    assert (
        "against dense full attention at the same length: no kernel answer at full mask, S=64K"
        in out
    )
    assert "(measured there at 32K)" in out
    advise(cells_csv, "--seqlen", "64K", "--direction", "train", "--format", "json")
    (a,) = json.loads(capsys.readouterr().out)
    full = next(x for x in a["against"] if x["key"] == "dense_full")
    assert full["speedup"] is None and full["missing"].startswith("no kernel answer")


# ---------------------------------------------------------------- the committed H200 records


def test_block_sparse_20_percent_at_32k_against_dense_on_the_h200_records(repo, capsys):
    """The issue's question: from the committed records, the speed-up over dense full attention
    is the dense kernel grid's fastest training step over the sparse one's, as the tidy table has
    them (no number written here)."""
    cells = repo / "results/h200/tables/cells.csv"
    df = pd.read_csv(cells, low_memory=False)
    main(
        [
            "advise",
            "--cells",
            str(cells),
            "--grid",
            "h200_sparse",
            "--density",
            "0.2",
            "--seqlen",
            "32K",
            "--block-size",
            "128",
            "--heads",
            "64:8",
            "--direction",
            "train",
            "--format",
            "json",
        ]
    )
    (a,) = json.loads(capsys.readouterr().out)
    by = {x["key"]: x for x in a["against"]}
    full = by["dense_full"]

    def step(grid, impl, mask, **at):
        rows = df[(df["grid"] == grid) & (df["impl"] == impl) & (df["mask"] == mask)]
        for k, v in at.items():
            rows = rows[rows[k] == v]
        rows = rows[(rows["seqlen"] == 32768) & (rows["heads_kv"] == 8)]
        assert sorted(rows["direction"]) == ["bwd", "fwd"]
        return float(rows["time_ms_median"].sum())

    sparse = step("h200_sparse", full["contender"], "block_sparse", block_size=128, density=0.2)
    dense = step(full["baseline_grid"], full["baseline_contender"], "full")
    assert full["baseline_grid"] in ("h200_sweep", "h200_paired") and not full["paired"]
    assert full["speedup"] == pytest.approx(dense / sparse, rel=1e-6)
    assert full["verdict"] == "faster" and full["speedup"] > 1
    same = by["dense_same_blocks"]
    assert same["baseline_contender"] == "flex" and same["paired"]
    flex = step("h200_sparse", "flex", "block_sparse", block_size=128, density=0.2)
    assert same["speedup"] == pytest.approx(flex / sparse, rel=1e-6)


def test_a_question_over_many_points_gives_each_answers_speed_ups_on_a_line(
    cells_csv, capsys, monkeypatch
):
    from attnbench.report import question

    monkeypatch.setattr(question, "MANY", 1)
    advise(cells_csv, "--direction", "train")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sp: B=128 density 0.2 32K GQA 64:8 train: triton_block_sparse")
    assert lines[1] == (
        "  triton_block_sparse against dense, same blocks flex 1.35x: faster; "
        "dense full fa4 3.17x: faster"
    )
    assert lines[3] == (
        "  triton_block_sparse against dense, same blocks flex 1.35x: faster; dense full: no record"
    )
