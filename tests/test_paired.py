"""Contenders compared draw by draw (report.paired), the per-sample table it reads
(report.collect), and the answers built on both: SYNTHETIC draws for the rule, then real CPU cell
records of two kernels over the same three sampled document masks."""

import pandas as pd
import pytest
from attnbench import families
from attnbench.grid.spec import CellSpec
from attnbench.report import advice, advice_text
from attnbench.report.collect import (
    SAMPLE_COLUMNS,
    collect,
    collect_samples,
    draw_fingerprint,
    read_samples,
    samples_path,
    write_cells,
)
from attnbench.report.paired import BANDS, SIGN_TEST, Draw, Timed, compare, step


def timed(name, *draws, noise=0.02):
    """A contender with one draw per median (ms), its p20-p80 at -/+ noise x median."""
    return Timed(
        name,
        tuple(
            Draw(i, f"mask{i}", m, m * (1 - noise), m * (1 + noise)) for i, m in enumerate(draws)
        ),
    )


def test_a_contender_slower_on_every_draw_is_slower_though_pooled_spreads_overlap():
    # draws cost 1x, 3x and 10x: pooled over draws the two intervals overlap almost entirely
    a = timed("a", 1.0, 3.0, 10.0)
    b = timed("b", 1.1, 3.3, 11.0)
    c = compare([b, a])
    assert [s.name for s in c.standings] == ["a", "b"]
    assert c.winner.name == "a" and c.draws == 3 and c.per_sample
    s = c.standings[1]
    assert s.slower and s.wins == 0 and s.ratio_lo == pytest.approx(1.1)
    assert (c.standings[0].min_ms, c.standings[0].max_ms) == (1.0, 10.0)


def test_one_draw_within_the_noise_makes_a_tie_and_only_the_not_slower_are_tied():
    a = timed("a", 1.0, 3.0, 10.0)
    b = timed("b", 1.01, 3.3, 11.0)  # within a's noise on the first draw
    d = timed("d", 2.0, 6.0, 20.0)  # slower on every draw
    c = compare([a, b, d])
    assert c.winner is None
    assert [s.name for s in c.not_slower] == ["a", "b"]
    assert c.standings[2].slower and c.standings[2].ratio_hi == pytest.approx(2.0)


def test_draws_won_count_the_draws_each_was_fastest_on():
    a = timed("a", 1.0, 3.0, 10.0)
    b = timed("b", 0.9, 3.3, 11.0)  # faster on the first draw only
    c = compare([a, b])
    assert {s.name: s.wins for s in c.standings} == {"a": 2, "b": 1}
    assert c.winner is None and c.standings[1].ratio_lo == pytest.approx(0.9)


def test_the_training_step_adds_forward_and_backward_on_each_draw():
    fwd, bwd = timed("a", 1.0, 2.0), timed("a", 3.0, 5.0)
    t = step(fwd, bwd)
    assert [d.median for d in t.draws] == [4.0, 7.0]
    assert t.draws[0].p20 == pytest.approx(0.98 + 2.94)


def test_contenders_are_compared_on_the_draws_they_share():
    a = timed("a", 1.0, 3.0, 10.0)
    b = Timed("b", timed("b", 1.5, 4.0, 99.0).draws[:2])  # a record of fewer samples
    c = compare([a, b])
    assert c.draws == 2 and c.standings[1].slower
    other = Timed("x", (Draw(0, "elsewhere", 0.1, 0.1, 0.1),))  # another mask altogether
    c = compare([a, b, other])
    assert c.unpaired == ("x",) and [s.name for s in c.standings] == ["a", "b"]


def test_with_few_draws_one_draw_within_the_noise_keeps_a_tie():
    # apart on three draws, within the noise on a fourth: no longer slower (4 draws: too few for
    # the sign test, so every draw's bands must be apart)
    three = compare([timed("a", 1.0, 2.0, 3.0), timed("b", 1.2, 2.4, 3.6)])
    four = compare([timed("a", 1.0, 2.0, 3.0, 4.0), timed("b", 1.2, 2.4, 3.6, 4.01)])
    assert three.winner and not four.winner
    assert three.rule == four.rule == BANDS


def test_with_many_draws_the_sign_test_decides_and_a_draw_in_the_noise_does_not_undo_it():
    # slower on 9 of 10 draws (p 0.011), 9 of them by 20%: slower, though one draw is a tie;
    # on 8 of 10 (p 0.055) it is not
    a = [1.0 + i for i in range(10)]
    nine = compare([timed("a", *a), timed("b", *(m * 1.2 for m in a[:9]), a[9] * 0.99)])
    assert nine.rule == SIGN_TEST and nine.need == 9 and nine.winner.name == "a"
    assert nine.standings[1].slower_on == 9 and nine.standings[1].p_value == pytest.approx(
        11 / 1024
    )
    eight = compare([timed("a", *a), timed("b", *(m * 1.2 for m in a[:8]), *a[8:])])
    assert eight.winner is None and eight.standings[1].slower_on == 8


def test_the_fastest_has_ratio_one_and_no_evidence_against_it():
    c = compare([timed("a", 1.0, 3.0, 10.0), timed("b", 1.1, 3.3, 11.0)])
    best = c.fastest
    assert (best.geomean, best.slower_on, best.p_value, best.slower) == (1.0, 0, 1.0, False)
    assert c.standings[1].geomean == pytest.approx(1.1)


# ---------------------------------------------------------------- real records


@pytest.fixture(scope="module")
def document_records(tmp_path_factory):
    """Real CPU records: naive and sdpa on causal_document at 256 tokens, 3 draws, fwd and bwd."""
    from attnbench.families import expand_cells, load_config
    from attnbench.families.kernel.cell import run_cell
    from attnbench.grid.expand import cell_path
    from attnbench.record.record import write_record
    from tinygrids import config_running, kernel_grid

    cfg = config_running(
        {
            "t": kernel_grid(
                kernels=["naive", "sdpa"],
                masks=["causal_document"],
                seqlen=[256],
                direction=["fwd", "bwd"],
                samples={"document": 3, "single": 1},
                reps=5,
                check={"max_seqlen": 256, "tolerance_factor": 5, "samples": 1},
            )
        }
    )
    out = tmp_path_factory.mktemp("paired")
    path = out / "config.yaml"
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    cells = expand_cells(load_config(path), ["t"])
    records = {}
    for c in cells:
        p = out / cell_path(c)
        r = run_cell(CellSpec.from_dict(c), {"matmul_peak_tflops": None})
        write_record(r, p)
        records[str(p)] = r
    return out, records


def test_the_per_sample_table_has_one_row_per_draw_with_the_same_fingerprints(document_records):
    _, records = document_records
    s = collect_samples(records)
    assert list(s.columns) == SAMPLE_COLUMNS
    assert len(s) == 4 * 3 and s["per_sample"].all()
    prints = s.groupby(["impl", "direction"])["draw"].apply(tuple)
    assert len(set(prints)) == 1 and len(prints.iloc[0]) == 3  # the same 3 draws, same order
    r = next(iter(records.values()))
    assert prints.iloc[0][0] == draw_fingerprint(r["samples"][0]["mask_params"])
    assert (s["time_ms_p20"] <= s["time_ms_median"]).all()
    assert (s["time_ms_median"] <= s["time_ms_p80"]).all()
    assert s["mask_area"].gt(0).all() and s["tflops"].gt(0).all()


def test_the_answer_over_real_records_rests_on_their_three_draws(document_records, tmp_path):
    out, records = document_records
    cells_csv = tmp_path / "tables" / "cells.csv"
    write_cells(collect(records=records), cells_csv)
    write_cells(collect_samples(records), samples_path(cells_csv))
    assert len(pd.read_csv(samples_path(cells_csv))) == 12
    df = pd.read_csv(cells_csv)
    found, _ = advice.grid_answers(df, "t", families.advice_of("kernel"), read_samples(cells_csv))
    assert {a.direction for a in found} == {"fwd", "bwd", "train"}
    for a in found:
        assert a.draws == 3 and a.per_sample and len(a.ok) == 2
        assert sum(a.standing[c.name].wins for c in a.ok) == 3
    text = advice_text.render(advice.one_per_question(found), "text")
    assert "3 draws" in text


def test_the_tidy_tables_of_a_folder_hold_every_grids_records_and_samples(document_records):
    """regenerate's tidy tables (the workflow's too: pipeline/tidy.py): the union of every grid in
    the folder, in the per-sample table as in the cells' table."""
    from attnbench.pipeline.regenerate import write_tidy_tables
    from attnbench.pipeline.tidy import union_table
    from attnbench.report.collect import read_cells, read_samples

    out, records = document_records
    # a config that names none of its grids: every record under out/cells
    assert write_tidy_tables({"grids": {}}, out) == ["t"]
    df, samples = read_cells(union_table(out)), read_samples(union_table(out))
    assert set(df["grid"]) == {"t"} and len(df) == 4
    assert len(samples) == 12 and set(samples["cell_id"]) == set(df["cell_id"])
