"""A run says what it finds: each finished cell logs one line (the cell, its status, its TFLOP/s or
why not) on Snakemake's log, with how many of the run's cells have a record so far."""

from __future__ import annotations

import re

import pytest
from bounded import run_bounded
from commands import package_env, snakemake_cmd
from tinygrids import config_running, kernel_grid, workflow_copy

GRID = kernel_grid(
    description="log tests",
    also=[{"kernels": ["fa2"]}],  # GPU-only: an `unavailable` record here
)
LINE = re.compile(r"^cell (\S+): (\w+)(?: \((.*)\))?; (\d+) of (\d+) cells recorded$", re.M)


@pytest.mark.slow
def test_each_finished_cell_logs_its_outcome_and_the_progress(tmp_path):
    workdir = workflow_copy(tmp_path, config_running({"log": GRID}))
    cmd = snakemake_cmd(workdir, "--cores", "2", snakefile=workdir / "code/Snakefile")
    p = run_bounded(cmd, 600, env=package_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = LINE.findall(p.stdout + p.stderr)
    by_cell = {path.split("/cells/log/kernel/")[1]: rest for path, *rest in lines}
    assert set(by_cell) == {
        "naive/causal/s64-h2x1-d16-float32-fwd.json",
        "sdpa/causal/s64-h2x1-d16-float32-fwd.json",
        "fa2/causal/s64-h2x1-d16-float32-fwd.json",
    }
    for cell, (status, details, _, total) in by_cell.items():
        assert total == "3"
        if cell.startswith("fa2/"):
            assert status == "unavailable" and "fa2 runs only on cuda" in details, details
        else:
            assert status == "ok" and re.fullmatch(r"[\d.e+-]+ TFLOP/s", details), details
    done = [int(d) for *_, d, _ in lines]  # records on disk as each cell ended (two at a time)
    assert done == sorted(done) and done[-1] == 3
    # the cell's own log ends with the same verdict
    log = workdir / "results/logs/cells/log/kernel/sdpa/causal/s64-h2x1-d16-float32-fwd.log"
    assert re.search(r"^ok: \S+sdpa/causal/s64\S+ \([\d.e+-]+ TFLOP/s\)$", log.read_text(), re.M)
    # a rerun with nothing to do logs no cell
    p = run_bounded(cmd, 600, env=package_env())
    assert p.returncode == 0 and not LINE.findall(p.stdout + p.stderr)
