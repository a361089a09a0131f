"""A rerun costs what it reruns (issue 59): a changed record redraws only its own grid's tables and
figures, while the output folder's tidy tables (every grid's rows) stay whole; a grid the run does
not name keeps its rows there; a cp grid's figures read the other cp grids' tidy tables."""

import pandas as pd
import pytest
from attnbench.families import validate
from attnbench.pipeline.tidy import drawn_from, grid_table
from commands import planned_jobs
from tinygrids import config_running, cp_grid, kernel_grid, snakemake_on_copy, workflow_copy

GRIDS = {"ga": kernel_grid(description="grid A"), "gb": kernel_grid(description="grid B")}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = workflow_copy(tmp_path_factory.mktemp("scope"), config_running(GRIDS))
    p = snakemake_on_copy(d)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return d


def outputs_of(workdir, grid) -> dict:
    """{file: mtime} of a grid's tables and figures."""
    files = [*(workdir / f"results/tables/{grid}").iterdir()]
    files += [*(workdir / f"results/figures/{grid}").iterdir()]
    return {f: f.stat().st_mtime_ns for f in files}


def test_a_deleted_record_redraws_only_its_own_grid(workdir):
    record = workdir / "results/cells/ga/kernel/naive/causal/s64-h2x1-d16-float32-fwd.json"
    record.unlink()
    # the plan: the cell, its grid's tidy tables, tables and figures, and the union; nothing of gb
    plan = planned_jobs(snakemake_on_copy(workdir, "-n"))
    assert plan == {
        "kernel_cell": 1,
        "collect": 1,
        "tables_ga": 1,
        "figures_ga": 1,
        "union": 1,
        "tidy_table": 1,
        "all": 1,
    }
    before = {g: outputs_of(workdir, g) for g in GRIDS}
    p = snakemake_on_copy(workdir)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert record.exists()
    assert outputs_of(workdir, "gb") == before["gb"]  # not one file of gb rewritten
    redrawn = outputs_of(workdir, "ga")
    assert all(redrawn[f] > t for f, t in before["ga"].items())
    # the output folder's tidy tables hold both grids' rows, each grid's its own
    df = pd.read_csv(workdir / "results/tables/cells.csv")
    assert dict(df["grid"].value_counts()) == {"ga": 2, "gb": 2}
    assert set(pd.read_csv(grid_table(workdir / "results", "gb"))["grid"]) == {"gb"}
    assert planned_jobs(snakemake_on_copy(workdir, "-n")) == {}


def test_a_grid_the_run_does_not_name_keeps_its_rows_in_the_tidy_table(workdir, tmp_path):
    """Running ga alone: gb's records on disk are its tidy table's inputs; its rows stay in the
    union, and no cell of gb is made or judged."""
    only_a = tmp_path / "only_a.yaml"
    only_a.write_text("run: [ga]\n")
    configs = ["--configfile", str(workdir / "config.yaml"), str(only_a)]
    assert planned_jobs(snakemake_on_copy(workdir, "-n", *configs)) == {}
    (workdir / "results/cells/ga/kernel/sdpa/causal/s64-h2x1-d16-float32-fwd.json").unlink()
    p = snakemake_on_copy(workdir, *configs)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = pd.read_csv(workdir / "results/tables/cells.csv")
    assert dict(df["grid"].value_counts()) == {"ga": 2, "gb": 2}


def test_a_cp_grids_figures_read_the_other_cp_grids_tables_and_a_kernel_grids_its_own(tmp_path):
    cfg = validate(config_running({"k": kernel_grid(), "c1": cp_grid(), "c2": cp_grid()}))
    grids = ["c1", "c2", "k"]
    assert drawn_from(cfg, tmp_path, "c2", grids) == [grid_table(tmp_path, g) for g in grids[:2]]
    assert drawn_from(cfg, tmp_path, "k", grids) == [grid_table(tmp_path, "k")]
    # a grid the config does not name: its family is the folder its records are in
    (tmp_path / "cells/old_cp/cp").mkdir(parents=True)
    assert grid_table(tmp_path, "old_cp") in drawn_from(cfg, tmp_path, "c1", [*grids, "old_cp"])


def test_a_sparse_grids_figures_read_the_kernel_grids_tables(tmp_path):
    """The density figure draws dense full attention from the kernel grids: a sparse grid's
    figures read their tidy tables beside its own, and a kernel grid's figures only its own."""
    cfg = validate(config_running({"k": kernel_grid(), "c1": cp_grid()}))
    (tmp_path / "cells/sp/sparse").mkdir(parents=True)  # known by its records' folder
    grids = ["c1", "k", "sp"]
    assert drawn_from(cfg, tmp_path, "sp", grids) == [grid_table(tmp_path, g) for g in ("k", "sp")]
    assert drawn_from(cfg, tmp_path, "k", grids) == [grid_table(tmp_path, "k")]
