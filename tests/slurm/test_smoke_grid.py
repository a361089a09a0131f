"""The smoke grid through `snakemake --profile profiles/slurm` on a real (throwaway) Slurm cluster:
batches of cells as sbatch jobs, one cell crashed on purpose (a `crashed` record, its batch goes
on), the rerun of exactly that cell, and the same tidy table, tables and figures as a local run.

On a two-core machine the grid at one length took 345 s (105 cells in 6 batches), the rerun 56 s;
forward only (57 cells in 4 batches) 290 s; on four masks (25 cells in 4 batches) 104 s, the rerun
32 s.
The cluster has one node and no accounting, so the profile checks job states with squeue.
"""

from __future__ import annotations

import json
import subprocess
import time

import pandas as pd
import pytest
import yaml
from attnbench import families as outputs
from attnbench.families import expand_cells, validate
from attnbench.grid.expand import cell_path
from slurmtools import REPO, planned, slurm_cluster, slurm_states, snakemake, submitted_jobs

CRASHED = "sdpa/causal_document/s128-h4x2-d32-float32-fwd"
PARTITION = "attnbench"  # not the cluster's default: the profile must take it from the environment


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster(tmp_path_factory.mktemp("slurm-1node")) as c:
        yield c


# Masks of each kind: none, causal, documents drawn per sample (the crashed cell's), a sliding
# window. The other masks' code paths are the local tests'; here each cell costs a Slurm step.
MASKS = ["full", "causal", "causal_document", "sliding_window"]


def smoke_config(workdir):
    """config.yaml running the smoke grid at its first length, forward only, on MASKS: every
    kernel and status still, in a ninth of the jobs (inside a batch each cell is an srun of its
    own Snakemake, ~4 s here; the backward's code paths are the local tests')."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["run"] = ["smoke"]
    smoke = cfg["grids"]["smoke"]
    smoke["seqlen"] = smoke["seqlen"][:1]
    smoke["direction"] = ["fwd"]
    assert set(MASKS) <= set(smoke["masks"])
    smoke["masks"] = MASKS
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    return validate(cfg)


@pytest.mark.slurm
def test_smoke_grid_as_slurm_jobs_crash_keep_going_and_rerun(cluster, tmp_path):
    cfg = smoke_config(tmp_path)
    cells = {cell_path(c): c for c in expand_cells(cfg)}
    env = {"ATTNBENCH_SLURM_PARTITION": PARTITION}
    crashed = tmp_path / "results" / f"cells/smoke/kernel/{CRASHED}.json"
    assert crashed.relative_to(tmp_path / "results").as_posix() in cells

    t0 = time.monotonic()
    first = snakemake(tmp_path, limit_s=900, env={**env, "ATTNBENCH_CRASH_CELLS": f"^{CRASHED}$"})
    t_first = time.monotonic() - t0
    assert first.returncode == 0, first.stderr[-3000:]
    jobs = submitted_jobs(first)
    states = slurm_states()
    # Every rule ran as an sbatch job in the partition from ATTNBENCH_SLURM_PARTITION, and Slurm
    # kept a log of each (the profile keeps the logs of successful jobs too).
    assert jobs and set(jobs) <= set(states)
    assert {states[j]["partition"] for j in jobs} == {PARTITION}
    assert all(log.is_file() and log.stat().st_size > 0 for log in jobs.values())
    # This cluster keeps no accounting: sacct cannot answer, so the profile must have read the job
    # states with squeue (with sacct the plugin would have waited for ever).
    assert subprocess.run(["sacct", "-X"], capture_output=True, timeout=60).returncode != 0
    # The crash is a record (the launcher's, inside the batch): every job completed, every cell
    # has a record, and the tables were drawn from them.
    assert all(states[j]["state"] == "COMPLETED" for j in jobs), {
        j: states[j]["state"] for j in jobs
    }
    record = json.loads(crashed.read_text())
    assert record["status"] == "crashed" and record["crash"]["how"] == "exited with status 1"
    assert any("crash injected by ATTNBENCH_CRASH_CELLS" in x for x in record["crash"]["log_tail"])
    assert record["environment"]["slurm_job_id"] in jobs
    missing = {p for p in cells if not (tmp_path / "results" / p).exists()}
    assert missing == set()
    df = pd.read_csv(tmp_path / "results/tables/cells.csv")
    assert (df["status"] == "crashed").sum() == 1
    retried = {f"cells/smoke/kernel/{CRASHED}.json"}

    # The same command again would submit exactly the crashed cell and the aggregation.
    plan = planned(tmp_path)
    assert plan == {
        "kernel_cell": 1,
        "collect": 1,
        "union": 1,
        "tidy_table": 1,
        "tables_smoke": 1,
        "figures_smoke": 1,
        "all": 1,
    }

    t0 = time.monotonic()
    second = snakemake(tmp_path, limit_s=600, env=env)
    t_second = time.monotonic() - t0
    assert second.returncode == 0, second.stderr[-3000:]
    rerun = submitted_jobs(second)
    states = slurm_states()
    assert rerun and all(states[j]["state"] == "COMPLETED" for j in rerun)
    assert not set(rerun) & set(jobs)

    # Every record was written inside a Slurm job of these runs; the rerun wrote the crashed one.
    for p, c in cells.items():
        record = json.loads((tmp_path / "results" / p).read_text())
        job = record["environment"]["slurm_job_id"]
        assert job in (rerun if p in retried else jobs), (p, job)
    # The same tidy table, tables and figures as a local run of this grid makes.
    df = pd.read_csv(tmp_path / "results/tables/cells.csv")
    assert len(df) == len(cells) and df["status"].notna().all()
    assert {"ok", "unavailable"} <= set(df["status"])
    grid = cfg["grids"]["smoke"]
    for name in outputs.table_names(grid):
        assert (tmp_path / "results/tables/smoke" / name).stat().st_size > 0
    for name in outputs.figure_names(grid, cfg["figures"]["formats"]):
        assert (tmp_path / "results/figures/smoke" / name).stat().st_size > 0
    assert planned(tmp_path) == {}
    print(
        f"\nsmoke grid via Slurm: {len(cells)} cells, first run {t_first:.0f} s ({len(jobs)} jobs), "
        f"rerun {t_second:.0f} s ({len(rerun)} jobs)"
    )
