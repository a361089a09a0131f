"""A cell faster than its device can compute is not `ok`: real CPU cells judged against a matmul
ceiling far below what they ran at (and far above), and records made before the guard judged the
same way when collected; the tables and the advice leave such cells out."""

import pandas as pd
import pytest
from attnbench import families
from attnbench.families import expand_cells, load_config
from attnbench.families.kernel.cell import run_cell
from attnbench.grid.spec import CellSpec
from attnbench.record.record import write_record
from attnbench.record.status import IMPLAUSIBLE, OK
from attnbench.record.validate import read_record
from attnbench.report import advice
from attnbench.report.collect import collect


@pytest.fixture(scope="module")
def spec(repo):
    cells = expand_cells(load_config(repo / "config.yaml"), ["smoke"])
    return next(c for c in cells if (c["impl"], c["mask"], c["seqlen"]) == ("sdpa", "causal", 128))


def test_a_cell_above_the_ceiling_by_more_than_5_percent_is_implausible(spec, tmp_path):
    r = run_cell(CellSpec.from_dict(spec), {"matmul_peak_tflops": 1e-6})
    assert r["status"] == IMPLAUSIBLE
    assert "above the device's measured matmul ceiling" in r["status_reason"]
    assert r["tflops"] > 0 and r["samples"]  # the timings stay, for whoever looks
    write_record(r, tmp_path / "r.json")
    assert read_record(tmp_path / "r.json")["status"] == IMPLAUSIBLE  # a valid record
    ok = run_cell(CellSpec.from_dict(spec), {"matmul_peak_tflops": 1e6})
    assert ok["status"] == OK


def test_a_record_made_before_the_guard_is_judged_when_collected(spec, tmp_path):
    r = run_cell(CellSpec.from_dict(spec), {"matmul_peak_tflops": 1e6})
    r["matmul_peak"] = {"matmul_peak_tflops": r["tflops"] / 1.2}  # as an older cell recorded it
    path = tmp_path / "cells" / "x.json"
    from attnbench.grid.expand import cell_path

    path = tmp_path / cell_path(spec)
    write_record(r, path)
    row = collect([path]).iloc[0]
    assert row["status"] == IMPLAUSIBLE and "20% above" in row["status_reason"]
    r["matmul_peak"] = {"matmul_peak_tflops": r["tflops"] / 1.04}  # within 5%: possible
    write_record(r, path)
    assert collect([path]).iloc[0]["status"] == OK


def test_the_advice_and_tables_leave_an_implausible_cell_out():
    from synthetic_cells import tidy

    rows = [
        {"impl": "fa2", "mask": "causal", "seqlen": 4096, "heads_q": 64, "heads_kv": 8},
        {"impl": "fa3", "mask": "causal", "seqlen": 4096, "heads_q": 64, "heads_kv": 8},
    ]
    rows[0].update(status=OK, time_ms_median=2.0, time_ms_p20=1.9, time_ms_p80=2.1, tflops=500.0)
    rows[1].update(status=IMPLAUSIBLE, time_ms_median=0.1, time_ms_p20=0.1, time_ms_p80=0.1)
    rows[1]["tflops"] = 9000.0
    for r in rows:
        r.update(direction="fwd", cell_id=f"id-{r['impl']}", record=f"{r['impl']}.json")
    df = tidy(rows)
    (a,) = advice.grid_answers(df, "g", families.advice_of("kernel"))[0]
    assert [c.name for c in a.ok] == ["fa2"]
    assert [(c.name, c.why_not()) for c in a.not_ok] == [("fa3", "implausible")]
    from attnbench.report.tables import status_pivot

    t = status_pivot(df, "tflops")
    assert t.loc[("causal", "64:8", 4096), "fa3"] == "implausible"
    assert not pd.isna(t.loc[("causal", "64:8", 4096), "fa2"])
