"""A run says what it finds: each finished cell logs one line (its grid and cell, its status and
seconds, its TFLOP/s or why not, the counts so far by status and the time left) on Snakemake's
log, and the run ends with a summary: counts by status per grid, where the outputs are, what to
run next."""

from __future__ import annotations

import re

from bounded import run_bounded
from commands import package_env, snakemake_cmd
from tinygrids import config_running, kernel_grid, workflow_copy

GRID = kernel_grid(
    description="log tests",
    also=[{"kernels": ["fa2"]}],  # GPU-only: an `unavailable` record here
)
LINE = re.compile(
    r"^log: (\S+): (\w+) in [\d.]+ s(?: \((.*)\))? \| (\d+) of (\d+) done \(([^)]*)\)(; about .* left(?: and the tables and figures)?)?$",
    re.M,
)


def test_each_finished_cell_logs_its_outcome_and_the_progress(tmp_path):
    workdir = workflow_copy(tmp_path, config_running({"log": GRID}))
    cmd = snakemake_cmd(workdir, "--cores", "2", snakefile=workdir / "code/Snakefile")
    p = run_bounded(cmd, 600, env=package_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout + p.stderr
    lines = LINE.findall(out)
    by_cell = {cell: rest for cell, *rest in lines}
    assert set(by_cell) == {
        "naive/causal/s64-h2x1-d16-float32-fwd",
        "sdpa/causal/s64-h2x1-d16-float32-fwd",
        "fa2/causal/s64-h2x1-d16-float32-fwd",
    }
    for cell, (status, details, _, total, _, _) in by_cell.items():
        assert total == "3"
        if cell.startswith("fa2/"):
            assert status == "unavailable" and "fa2 runs only on cuda" in details, details
        else:
            assert status == "ok" and re.fullmatch(r"[\d.e+-]+ TFLOP/s", details), details
    done = [int(x[3]) for x in lines]  # each cell told once, as it ended
    assert done == [1, 2, 3]
    assert lines[-1][5] in ("2 ok, 1 unavailable", "1 unavailable, 2 ok")
    assert "about" in lines[0][6] and lines[-1][6] == ""  # the time left, until none is
    # the closing summary: counts per grid, the outputs, what to run next
    assert "summary:" in out and "  log: 2 ok, 1 unavailable" in out
    assert "tidy tables: results/tables/cells.csv, results/tables/samples.csv" in out
    assert "next: python -m attnbench advise --cells results/tables/cells.csv" in out
    # the cell's own log ends with the same verdict
    log = workdir / "results/logs/cells/log/kernel/sdpa/causal/s64-h2x1-d16-float32-fwd.log"
    assert re.search(r"^ok: \S+sdpa/causal/s64\S+ \([\d.e+-]+ TFLOP/s\)$", log.read_text(), re.M)
    # a rerun with nothing to do logs no cell
    p = run_bounded(cmd, 600, env=package_env())
    assert p.returncode == 0 and not LINE.findall(p.stdout + p.stderr)
