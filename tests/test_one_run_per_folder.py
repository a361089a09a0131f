"""An output folder is written by one run at a time, whichever working folder (clone) it is started
from: a second run is refused at once, naming the holder; a run killed with SIGKILL takes its cells
with it, and the next run takes its lock over. Paths and parameters never pass through a shell
unquoted or a command line: a config whose values would have is refused, or runs."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from attnbench.harness.faults import HANG_ENV
from bounded import run_bounded
from commands import package_env, snakemake_cmd, wait_for
from tinygrids import config_running, kernel_grid

GRID = kernel_grid(
    description="one run per folder",
    kernels=["naive", "sdpa", "sdpa_math"],
    seqlen=[64, 128],
    runtime_min=10,
    cell_timeout_s=500,
)
STUCK = "sdpa/causal/s64-h2x1-d16-float32-fwd"


def clone(root: Path, name: str, out: Path, grids=None) -> Path:
    """A working folder of its own (as a second clone is), writing the shared output folder."""
    d = root / name
    d.mkdir()
    cfg = {**config_running(grids or {"g": GRID}), "output_dir": str(out)}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return d


def checksums(out: Path) -> dict:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((out / "cells").rglob("*.json"))
    }


def cell_processes(out: Path) -> list[int]:
    """Live processes whose command line names the output folder (the cells of a run)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(out).encode() in text and b"snakemake" not in text and state != "Z":
            found.append(int(cmdline.parent.name))
    return found


def test_a_second_run_is_refused_a_killed_run_ends_its_cells_and_its_lock_is_taken_over(
    tmp_path,
):
    out = tmp_path / "shared-results"
    a, b = clone(tmp_path, "clone_a", out), clone(tmp_path, "clone_b", out)
    log_a = tmp_path / "a.log"
    stuck_log = out / f"logs/cells/g/kernel/{STUCK}.log"
    with log_a.open("w") as log:
        run_a = subprocess.Popen(
            snakemake_cmd(a, "--cores", "2", profile="local"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=package_env(**{HANG_ENV: f"^{STUCK}$"}),
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: (
                (stuck_log.exists() and "hanging:" in stuck_log.read_text())
                or run_a.poll() is not None
            ),
            300,
            "run A measuring (one cell hanging)",
        )
        assert run_a.poll() is None, log_a.read_text()[-3000:]
        before = checksums(out)
        t0 = time.monotonic()
        p = run_bounded(snakemake_cmd(b, "--cores", "2", profile="local"), 300, env=package_env())
        refused_in = time.monotonic() - t0
        said = p.stdout + p.stderr
        assert p.returncode != 0
        assert f"{out}: another run is writing this output folder (pid {run_a.pid} on host" in said
        assert f"in {a}:" in said and "snakemake" in said.split("another run is writing")[1]
        assert (
            "(Rule: kernel_cell)" not in said
            and "rule kernel_cell" not in said.split("another run")[1]
        )
        now = checksums(out)
        assert {k: now[k] for k in before} == before  # B changed no record (A writes its own)
        assert run_a.poll() is None  # and A goes on
        # A is killed outright: its cells end with it, not minutes later
        cells = cell_processes(out)
        assert cells
        os.kill(run_a.pid, signal.SIGKILL)
        killed = time.monotonic()
        run_a.wait(timeout=30)
        wait_for(lambda: not cell_processes(out), 60, "the killed run's cells ended")
        ended_in = time.monotonic() - killed
    finally:
        if run_a.poll() is None:
            os.killpg(run_a.pid, signal.SIGKILL)
    kept = checksums(out)
    # the next run (the other clone: A's .snakemake lock is A's own) takes the lock over
    p = run_bounded(snakemake_cmd(b, "--cores", "2", profile="local"), 600, env=package_env())
    said = p.stdout + p.stderr
    assert p.returncode == 0, said[-3000:]
    assert f"took over the lock of a run that ended without releasing it (pid {run_a.pid}" in said
    after = checksums(out)
    assert {k: after[k] for k in kept} == kept  # A's finished records are kept, not remade
    assert len(after) == 6 and (out / ".attnbench/run.lock").read_text() == ""  # released
    print(
        f"\nB refused in {refused_in:.1f} s (parse and plan included); A's cells ended "
        f"{ended_in:.1f} s after A was killed; C kept {len(kept)} records and ran {6 - len(kept)}"
    )


def test_two_grids_in_one_folder_keep_each_others_rows(tmp_path):
    out = tmp_path / "results"
    first = clone(tmp_path, "first", out, {"g": {**GRID, "kernels": ["naive"], "seqlen": [64]}})
    second = clone(tmp_path, "second", out, {"h": {**GRID, "kernels": ["sdpa"], "seqlen": [64]}})
    for d in (first, second):
        p = run_bounded(snakemake_cmd(d, "--cores", "2", profile="local"), 600, env=package_env())
        assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    df = pd.read_csv(out / "tables/cells.csv")
    assert sorted(zip(df["grid"], df["impl"])) == [("g", "naive"), ("h", "sdpa")]
    assert (out / "tables/g/tflops.md").exists() and (out / "tables/h/tflops.md").exists()


@pytest.mark.parametrize(
    "edit, said",
    [
        (
            {"output_dir": "out $(touch PWNED)"},
            "output_dir: 'out $(touch PWNED)' has characters a path given to shell commands must not",
        ),
        ({"output_dir": "/"}, "output_dir: '/' is the filesystem root"),
        ({"run": ["my.grid"], "grids": {"my.grid": GRID}}, "'my.grid' is not a valid grid name"),
    ],
)
def test_snakemake_refuses_a_shell_path_or_a_bad_grid_name_before_any_job(tmp_path, edit, said):
    cfg = {**config_running({"g": GRID}), **edit}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    p = run_bounded(snakemake_cmd(tmp_path, "--cores", "2", "-n"), 300, env=package_env())
    text = p.stdout + p.stderr
    assert p.returncode != 0 and said in text, text[-3000:]
    assert "MissingInputException" not in text and "Traceback" not in text
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_a_histogram_and_a_description_too_large_for_a_command_line_run(tmp_path):
    """The spec and the grid's report settings reach their commands in files: 6,911 buckets
    (about 190 KB of JSON per cell) and a 200 KB description, each above the 128 KiB a command-line
    argument may hold."""
    buckets = [[4 * i, 4 * i + 4, 1.0] for i in range(6911)]
    grid = {
        **GRID,
        "kernels": ["naive"],
        "masks": ["causal_document"],
        "seqlen": [64],
        "description": "d" * 200_000,
    }
    cfg = {**config_running({"g": grid}), "doc_length_histograms": {"huge": {"buckets": buckets}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert len(json.dumps(buckets)) > 128 * 1024
    p = run_bounded(
        snakemake_cmd(tmp_path, "--cores", "2", profile="local"), 600, env=package_env()
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    record = json.loads(
        (
            tmp_path / "results/cells/g/kernel/naive/causal_document/s64-h2x1-d16-float32-fwd.json"
        ).read_text()
    )
    assert (
        record["status"] == "ok" and len(record["cell"]["histograms"]["huge"]["buckets"]) == 6911
    )
    caption = (tmp_path / "results/tables/g/tflops.caption.rst").read_text()
    assert "d" * 1000 in caption
