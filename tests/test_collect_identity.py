"""A record is read only at its own cell's path; the tidy table is replaced only by a complete
one; a table or figure that cannot be drawn names the tidy table (and records) it read."""

from __future__ import annotations

import json
import shutil
import subprocess

import pandas as pd
import pytest
from attnbench.families import expand_cells, validate
from attnbench.families.kernel.cell import run_cell
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import CellSpec
from attnbench.record.record import write_record
from attnbench.report.collect import RecordError, collect, write_cells
from bounded import run_bounded
from commands import PY, package_env, snakemake_cmd
from tinygrids import config_running, kernel_grid, workflow_copy

GRID = kernel_grid(description="identity tests", kernels=["naive"], seqlen=[64, 128])


@pytest.fixture
def root(tmp_path):
    """Two real records (naive, causal, 64 and 128 tokens) under root/cells."""
    cfg = validate(config_running({"c": GRID}))
    root = tmp_path / "results"
    for cell in expand_cells(cfg):
        write_record(run_cell(CellSpec.from_dict(cell)), root / cell_path(cell))
    return root


def collect_cli(root, table):
    cmd = [PY, "-m", "attnbench", "collect", "--root", str(root / "cells"), "--out", str(table)]
    return run_bounded(cmd, 120, env=package_env())


def test_a_record_copied_to_another_cells_path_stops_collect_naming_both(root, tmp_path):
    a, b = sorted((root / "cells").rglob("*.json"))
    table = tmp_path / "cells.csv"
    assert collect_cli(root, table).returncode == 0
    before = table.read_text()
    assert len(pd.read_csv(table)) == 2
    original_b = b.read_text()
    shutil.copy(a, b)  # a valid record, at the other cell's path
    p = collect_cli(root, table)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert (
        f"{b}: holds the record of another cell, {cell_path(json.loads(a.read_text())['cell'])}"
        in p.stderr
    )
    assert f"{a} and {b} hold the record of the same cell" in p.stderr
    assert table.read_text() == before  # the last good table stays
    b.write_text(original_b)
    # an edited record: its id no longer matches the cell it describes
    record = json.loads(a.read_text())
    record["cell"]["reps"] += 1
    a.write_text(json.dumps(record))
    with pytest.raises(
        RecordError, match=r"its cell_id \w+ is not the id of the cell it describes"
    ):
        collect(root=root / "cells")


def test_the_tidy_table_is_replaced_only_by_a_complete_one(root, tmp_path):
    table = tmp_path / "cells.csv"
    write_cells(collect(root=root / "cells"), table)
    before = table.read_text()

    class Unwritable:
        def __str__(self):
            raise OSError("the disk filled up half way")

    df = collect(root=root / "cells")
    df["status_reason"] = [None, Unwritable()]
    with pytest.raises(OSError, match="half way"):
        write_cells(df, table)
    assert table.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells.csv", "results"]  # no temp file


def test_figures_and_tables_that_fail_name_their_input(root, tmp_path):
    """The issue's case: a tidy table with a duplicate row; the figure step used to end in a
    traceback naming no file."""
    table = tmp_path / "cells.csv"
    df = collect(root=root / "cells")
    dup = df.iloc[[0]].assign(record="results/cells/elsewhere.json", dtype="bfloat16")
    write_cells(pd.concat([df, dup], ignore_index=True), table)
    grid_cfg = json.dumps(GRID)
    for command in ("figures", "tables"):
        cmd = [PY, "-m", "attnbench", command, "--cells", str(table), "--out-dir"]
        cmd += [str(tmp_path / command), "--grid", "c", "--grid-config", grid_cfg]
        p = run_bounded(cmd, 300, env=package_env())
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode != 0
        assert last.startswith(f"{command}: the {command} of grid c from {table} failed: "), last
        assert "rows share a (kernel, mask, length, heads, direction)" in last
        assert f"records: {df['record'].iloc[0]}, results/cells/elsewhere.json" in last
        assert "Traceback" in p.stderr  # the log keeps where it failed


def test_snakemake_keeps_the_old_table_when_collect_refuses(tmp_path):
    workdir = workflow_copy(tmp_path, config_running({"c": GRID}))
    snakemake = snakemake_cmd(workdir, "--cores", "2", snakefile=workdir / "code/Snakefile")
    p = run_bounded(snakemake, 600, env=package_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    table = workdir / "results/tables/cells.csv"
    before = table.read_text()
    a, b = sorted((workdir / "results/cells").rglob("*.json"))
    shutil.copy(a, b)
    p = run_bounded(snakemake, 600, env=package_env())
    assert p.returncode != 0
    same = [line for line in p.stderr.splitlines() if "hold the record of the same cell" in line]
    assert same and all(str(x.relative_to(workdir)) in same[0] for x in (a, b)), p.stderr[-3000:]
    assert table.read_text() == before


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("tflops", "nan", "tflops is 'nan', not a number"),
        ("tflops", "inf", "tflops is 'inf', not a number"),
        ("time_ms_median", -1.5, "time_ms_median is -1.5, not a finite number >= 0"),
        ("peak_mem_bytes", "12 GB", "peak_mem_bytes is '12 GB', not a number"),
        ("flops", True, "flops is True, not a number"),
    ],
)
def test_a_hand_edited_number_stops_collect_naming_the_file(root, tmp_path, key, value, why):
    a, b = sorted((root / "cells").rglob("*.json"))
    table = tmp_path / "cells.csv"
    assert collect_cli(root, table).returncode == 0
    before = table.read_text()
    record = json.loads(a.read_text())
    assert record["status"] == "ok" and isinstance(record[key], (int, float))
    record[key] = value
    a.write_text(json.dumps(record))
    p = collect_cli(root, table)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert f"{a}: {why}" in p.stderr
    assert table.read_text() == before


def _doubled_tflops(r):
    r["tflops"] *= 2  # the median then outside its own samples' (and p20-p80)


def _failed_check_called_ok(r):
    r["check_passed"], r["max_rel_err"] = False, 0.9


def _ok_relabelled_unsupported(r):
    from attnbench.record.schema import SUMMARY

    r["status"] = "unsupported"
    for key in SUMMARY:  # what only a timed record carries (record.schema)
        r.pop(key, None)


def _a_day_ahead(r):
    from datetime import datetime, timedelta, timezone

    r["finished_at"] = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat(
        timespec="seconds"
    )


SELF_CONTRADICTIONS = [
    (_doubled_tflops, "tflops is "),
    (_failed_check_called_ok, "status 'ok' with check_passed false"),
    # consistent in itself (an oom at a later draw keeps the draws it timed), not what was written
    (_ok_relabelled_unsupported, "record_sha256 does not match"),
    (lambda r: r["samples"][0].pop("mask_area"), "samples[0] lacks mask_area"),
    (lambda r: r.update(environment=["cpu"]), "environment is not an object"),
    (_a_day_ahead, "is ahead of now"),
    # consistent in itself, but not what was written: an outdated record made to look current
    (lambda r: r["libraries"].update(torch="torch 9.9"), "record_sha256 does not match"),
]


@pytest.mark.parametrize("edit, why", SELF_CONTRADICTIONS, ids=lambda x: getattr(x, "__name__", x))
def test_a_record_that_contradicts_itself_is_refused_naming_file_and_field(
    root, tmp_path, edit, why
):
    """Each edit a careless hand (or a buggy tool) could make, with every field still a valid
    number: the record's own samples, check and clock give it away; collect names the file."""
    a, _ = sorted((root / "cells").rglob("*.json"))
    record = json.loads(a.read_text())
    edit(record)
    a.write_text(json.dumps(record))
    with pytest.raises(RecordError) as e:
        collect(root=root / "cells")
    assert f"{a}: " in str(e.value) and why in str(e.value)


def test_every_refused_record_is_named_in_one_pass_before_any_cell_runs(tmp_path):
    """Two self-contradicting records: check-config and the workflow both name both files, with
    their fields, and stop before any cell runs; neither file is touched."""
    workdir = workflow_copy(tmp_path, config_running({"c": GRID}))
    snakemake = snakemake_cmd(workdir, "--cores", "2", snakefile=workdir / "code/Snakefile")
    p = run_bounded(snakemake, 600, env=package_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    a, b = sorted((workdir / "results/cells").rglob("*.json"))
    for path, edit in ((a, _doubled_tflops), (b, _failed_check_called_ok)):
        record = json.loads(path.read_text())
        edit(record)
        path.write_text(json.dumps(record))
    edited = {p: p.read_bytes() for p in (a, b)}
    check = [PY, "-m", "attnbench", "check-config", str(workdir / "config.yaml")]
    for cmd in (check, snakemake):
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, env=package_env())
        out = p.stdout + p.stderr
        assert p.returncode != 0 and "Traceback" not in out, out[-3000:]
        assert "2 record file(s) refused" in out and f"{a.name}: tflops is " in out, out[-3000:]
        assert "status 'ok' with check_passed false" in out
        assert {p: p.read_bytes() for p in (a, b)} == edited


def test_a_cell_out_of_memory_at_a_later_draw_is_a_record_with_the_draws_it_timed(root):
    """The cell code keeps the draws it timed when a later one runs out of memory (or turns out
    unsupported): such a record, unsummarised, is consistent, not refused."""
    from attnbench.record.record import finish_record
    from attnbench.record.validate import read_record

    a, _ = sorted((root / "cells").rglob("*.json"))
    record = json.loads(a.read_text())
    assert record["samples"][0]["time_ms"]
    from attnbench.record.schema import SUMMARY

    for key in (*SUMMARY, "record_sha256"):  # an oom cell is never summarised (record.schema)
        record.pop(key, None)
    finish_record(record, "oom", "out of memory at sample 1", None, "cpu")
    write_record(record, a)
    assert read_record(a)["status"] == "oom"
    assert len(collect(root=root / "cells")) == 2
