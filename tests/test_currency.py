"""Whether a record on disk is still what a run would make (attnbench.pipeline.currency), read from the
record alone: its cell's config, the code it ran, its libraries, its status and time budget. And
the committed H200 records, made before records named their code: drawn as they are, and said to
be outdated."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from attnbench.families import expand_cells, validate
from attnbench.families.kernel.cell import run_cell
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import CellSpec
from attnbench.pipeline import currency
from attnbench.record.record import summarise, write_record
from attnbench.record.validate import RecordError
from commands import REPO, package_env
from tinygrids import config_running, kernel_grid, measured


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A real record of a tiny cell, its cell and path."""
    cfg = validate(config_running({"c": kernel_grid(kernels=["sdpa"])}))
    (cell,) = expand_cells(cfg)
    root = tmp_path_factory.mktemp("currency") / "results"
    path = root / cell_path(cell)
    write_record(measured(cell), path)
    return cell, path, json.loads(path.read_text())


def limits(budget_s, record, threads=None):
    """The grid limits a run here gives the record's cell: this budget, the threads it ran on."""
    ran = record["environment"]["cpu_threads"]
    return currency.GridLimits(budget_s=budget_s, cpu_threads=ran if threads is None else threads)


def snakemake(workdir, *args):
    """Snakemake on the workflow with workdir/config.yaml, one core; a dry run (-n) shows each
    job's block (--quiet host)."""
    quiet = ["--quiet", "host"] if "-n" in args else []
    p = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *quiet, "--configfile", "config.yaml"]
        + ["-s", str(REPO / "Snakefile"), *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=package_env(),
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def test_a_fresh_record_is_current(made):
    cell, path, record = made
    assert currency.outdated_reason(record, cell, limits(60, record)) is None
    assert currency.judge({str(path): cell}, {"c": limits(60, record)}) == []
    assert set(record["libraries"]) == {"torch", "numpy", "sdpa"}
    assert "attnbench/harness/measure.py" in record["code"]["files"]
    assert "attnbench/kernels/sdpa.py" in record["code"]["files"]
    assert "attnbench/kernels/flash_attn.py" not in record["code"]["files"]  # not this kernel's
    assert "attnbench/report/labels.py" not in record["code"]["files"]  # no cell imports it


def test_each_reason_a_record_is_outdated(made):
    cell, _, record = made
    reason = currency.outdated_reason
    assert reason(record, {**cell, "reps": 3}, limits(60, record)) == ("config", "reps 2 -> 3")
    assert reason(
        record, {**cell, "check": {**cell["check"], "tolerance_factor": 7}}, limits(60, record)
    ) == (
        "config",
        "check.tolerance_factor 5 -> 7",
    )
    edited = copy.deepcopy(record)
    edited["code"]["files"]["attnbench/harness/measure.py"] = "0" * 16
    edited["code"]["sha256"] = "0" * 64
    assert reason(edited, cell, limits(60, record)) == (
        "code",
        "attnbench/harness/measure.py edited",
    )
    older = {**record, "libraries": {**record["libraries"], "torch": "torch 2.0.0"}}
    kind, detail = reason(older, cell, limits(60, record))
    assert kind == "libraries" and detail.startswith("torch torch 2.0.0 -> torch ")
    assert reason({k: v for k, v in record.items() if k != "code"}, cell, limits(60, record)) == (
        "code",
        "the record names no code (made before records did)",
    )
    crashed = {**record, "status": "crashed", "status_reason": "its process exited with status 1"}
    assert reason(crashed, cell, limits(60, record)) == (
        "crashed",
        "its process exited with status 1",
    )
    timeout = {**record, "status": "timeout", "time_budget_s": 30}
    assert (
        reason(timeout, cell, limits(30, record)) is None
        and reason(timeout, cell, limits(20, record)) is None
    )
    assert reason(timeout, cell, limits(60, record)) == (
        "time budget",
        "stopped at 30 s; the grid's cell_timeout_s is now 60 s",
    )
    # a CPU kernel cell timed on other threads than a run here gives it
    kind, detail = reason(
        record, cell, limits(60, record, threads=record["environment"]["cpu_threads"] + 1)
    )
    assert kind == "config" and detail.startswith("cpu_threads ")
    # not judged for a record without timings
    gone = {**record, "status": "unsupported"}
    assert reason(gone, cell, limits(60, record, threads=99)) is None


def test_a_record_of_another_machine_than_its_points_is_outdated(made, tmp_path):
    """Contenders are compared draw by draw: at one grid point, the record measured on another
    machine than most of the point's (a GPU by its UUID, else device and host) is outdated with
    the machines named; with two machines one record each, the one measured last wins."""
    cell, _, record = made
    other = {**cell, "impl": "naive"}
    third = {**cell, "impl": "attnbench.kernels.twins:SDPATwin"}
    root = tmp_path / "results"

    def on(spec, host, finished):
        r = copy.deepcopy(record)
        r["cell"] = spec
        r["environment"] = {**r["environment"], "host": host}
        r["finished_at"] = finished
        path = root / cell_path(spec)
        write_record(r, path)
        return str(path)

    a = on(cell, "node-a", "2026-12-01T00:00:00+00:00")
    b = on(other, "node-a", "2026-12-01T00:01:00+00:00")
    c = on(third, "node-b", "2026-12-02T00:00:00+00:00")
    records = {p: json.loads(Path(p).read_text()) for p in (a, b, c)}
    by_point = currency.machines_by_point(records.values())
    assert [currency.other_machine(records[p], by_point) for p in (a, b)] == [None, None]
    kind, detail = currency.other_machine(records[c], by_point)
    assert kind == "machine" and "on node-b; the rest of its point on" in detail
    assert "node-a" in detail
    # two machines, one record each: the later one is the point's
    tie = {p: records[p] for p in (a, c)}
    by_point = currency.machines_by_point(tie.values())
    assert currency.other_machine(records[c], by_point) is None
    assert currency.other_machine(records[a], by_point)[0] == "machine"


def test_a_file_that_is_not_this_cells_record_is_refused_naming_each(made, tmp_path):
    """Another cell's record, an edited one or unreadable JSON at a record's path is never remade
    over: the judging refuses them all at once, naming each file, before anything runs."""
    cell, path, record = made
    other = {**cell, "seqlen": 128}
    there = tmp_path / "results" / cell_path(other)
    there.parent.mkdir(parents=True)
    shutil.copy(path, there)  # cell 64's record at cell 128's path
    edited = tmp_path / "results" / cell_path(cell)
    edited.write_text(json.dumps({**record, "cell": {**cell, "reps": 9}}))  # its id disagrees
    garbage = tmp_path / "results/cells/c/kernel/sdpa/causal/garbage.json"
    garbage.write_text("{not json")
    cells = {str(there): other, str(edited): cell, str(garbage): cell}
    with pytest.raises(RecordError, match="4 record file") as e:
        currency.judge(cells, {"c": limits(60, record)})
    assert f"{garbage}: not readable JSON" in str(e.value)
    assert f"{there}: holds the record of another cell" in str(e.value)
    assert f"{edited}: its cell_id" in str(e.value)
    assert f"{edited}: record_sha256 does not match its content" in str(e.value)


def test_records_lists_missing_and_outdated_cells(made, tmp_path):
    cell, path, _ = made
    grid = kernel_grid(kernels=["sdpa"], seqlen=[64, 128])
    cfg = {**config_running({"c": grid}), "output_dir": str(path.parents[5])}
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))

    def records(edit, *options, said=None):
        config = {**cfg, "grids": {"c": {**grid, **edit}}}
        (tmp_path / "mine.yaml").write_text(json.dumps(config))
        p = subprocess.run(
            [sys.executable, "-m", "attnbench", "records", "--configfile", "mine.yaml", *options],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=package_env(),
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        assert said is None or said in p.stderr, p.stderr
        return [line.split("/cells/")[1] for line in p.stdout.split()]

    assert records({}) == ["c/kernel/sdpa/causal/s128-h2x1-d16-float32-fwd.json"]  # missing
    assert len(records({"reps": 3})) == 2  # ... and the outdated one
    # by status, for snakemake --forcerun: the one record on disk is ok, and current
    here = ["c/kernel/sdpa/causal/s64-h2x1-d16-float32-fwd.json"]
    assert records({}, "--rerun", "ok") == here
    assert records({"reps": 3}, "--rerun", "outdated") == here
    assert records({}, "--rerun", "implausible", "outdated", said="no records with status") == []
    assert records({}, "--seqlen", "64", said="no cells missing or outdated in c") == []


def test_committed_h200_records_are_drawn_as_they_are_and_said_outdated(tmp_path):
    """They were made on an H200 before records named their code: a run here would remake them,
    so regenerate draws them as they are, and the captions say they are outdated and why; no
    record changes."""
    out = tmp_path / "h200"
    shutil.copytree(REPO / "results/h200/cells/h200", out / "cells/h200")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*.json")}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnbench",
            "regenerate",
            "--grids",
            "h200",
            "--config",
            f"output_dir={out}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=package_env(),
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert {q: hashlib.sha256(q.read_bytes()).hexdigest() for q in before} == before
    df = pd.read_csv(out / "tables/cells.csv")
    # measured alone, before GPU grids were measured side by side: the config says otherwise now
    assert len(df) == len(before) and df["outdated"].str.startswith("config: side_by_side").all()
    caption = (out / "tables/h200/tflops.caption.rst").read_text().replace("\\", "")
    n = len(before)
    assert f":Outdated: {n} of {n} records are outdated relative to the current config" in caption
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnbench",
            "check-config",
            "--config",
            f"output_dir={out}",
            "run=[h200]",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=package_env(),
        timeout=300,
    )
    assert f"{n} of {n} records on disk are outdated" in check.stdout, check.stdout + check.stderr


def test_a_record_this_environment_cannot_run_is_kept_not_made_again(tmp_path):
    """A CUDA record where torch is built without CUDA (CI, a laptop): its libraries are another
    machine's and not judged; outdated by code, it is kept, since a run here could only replace
    its measurement with `unavailable`. An `unavailable` record of it is made again."""
    why = currency.missing_runtime("cuda")
    if why is None:
        pytest.skip("torch here has CUDA: its CUDA records are judged as any other")
    assert "without CUDA" in why and currency.missing_runtime("cpu") is None
    cfg = {
        **config_running({"g": kernel_grid(kernels=["sdpa"], device="cuda", dtype=["bfloat16"])}),
        "output_dir": str(tmp_path / "results"),
    }
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    (cell,) = expand_cells(validate(cfg))
    path = tmp_path / "results" / cell_path(cell)
    write_record(run_cell(CellSpec.from_dict(cell)), path)  # here: unavailable, no CUDA
    unavailable = json.loads(path.read_text())
    assert unavailable["status"] == "unavailable"
    # the same record as an H200 would have written it, with its own torch
    measured = {**unavailable, "status": "ok", "status_reason": None}
    measured["samples"] = [{"index": 0, "mask_area": 2080, "flops": 1e9, "time_ms": [1.0, 1.2]}]
    summarise(measured, None)
    measured["libraries"] = {**measured["libraries"], "torch": "torch 2.11.0"}
    assert currency.outdated_reason(measured, cell, limits(60, measured)) is None
    measured["code"] = {**measured["code"], "sha256": "0" * 64}
    measured["code"]["files"] = {**measured["code"]["files"], "attnbench/harness/measure.py": "0"}

    def planned(record):
        write_record(record, path)  # as that machine wrote it, its checksum its own
        (o,) = currency.judge({str(path): cell}, {"g": limits(60, record)})
        p = snakemake(tmp_path, "-n", str(path))
        # the list is written by a run reading the workflow (a dry run writes none): one that
        # runs nothing
        assert snakemake(tmp_path, "--list-rules").returncode == 0
        listed = (tmp_path / "results/.attnbench/outdated.txt").read_text()
        # a GPU grid's cells are measured point by point (side by side): the point's job
        return o, "rule kernel_point" in p.stdout + p.stderr, listed

    o, runs, listed = planned(measured)
    assert (o.kind, o.kept) == ("code", why) and not runs
    assert f"kept: {path}: code: attnbench/harness/measure.py edited" in listed
    assert currency.to_make_again([o], keep=False) == ([], [o])
    assert "1 kept as they are, since this environment cannot run them" in currency.summary([o], 1)
    o, runs, listed = planned({**unavailable, "code": measured["code"]})
    assert (o.kind, o.kept) == ("code", None) and runs
    assert listed.splitlines()[1] == f"{path}: code: attnbench/harness/measure.py edited"


def test_a_dry_run_writes_nothing_and_a_run_writes_the_list(made, tmp_path):
    """A dry run leaves the output folder as it is, read-only there, a live run's list of outdated
    records included, and still plans an outdated record again; a run writes the list."""
    cell, path, _ = made
    cfg = {
        **config_running({"c": kernel_grid(kernels=["sdpa"], reps=3)}),  # the record's: 2
        "output_dir": str(tmp_path / "results"),
    }
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    results = tmp_path / "results"
    record = results / cell_path(cell)
    record.parent.mkdir(parents=True)
    shutil.copy(path, record)
    listed = results / ".attnbench/outdated.txt"

    def state():
        return {f: (f.stat().st_mtime_ns, f.is_file() and f.read_bytes()) for f in results.rglob("*")}  # fmt: skip

    def dry_run_leaves_results_alone():
        before = state()
        folders = [results, *(f for f in results.rglob("*") if f.is_dir())]
        for d in folders:
            d.chmod(0o555)  # (root writes there all the same: the state is compared below)
        try:
            p = snakemake(tmp_path, "-n", str(record))
        finally:
            for d in folders:
                d.chmod(0o755)
        assert "rule kernel_cell" in p.stdout and "config: reps 2 -> 3" in p.stdout + p.stderr
        assert state() == before

    dry_run_leaves_results_alone()  # no list yet
    listed.parent.mkdir()
    listed.write_text("the list of a run still going\n")
    os.utime(listed, (0, 0))  # older than the record: the dry run plans it again all the same
    dry_run_leaves_results_alone()
    assert listed.read_text() == "the list of a run still going\n"
    # a run writes it (keeping the record: nothing runs)
    p = snakemake(tmp_path, str(record), "--config", "outdated_records=keep")
    assert "kernel_cell" not in p.stdout + p.stderr
    assert f"kept: {record}: config: reps 2 -> 3" in listed.read_text().splitlines()
