"""The smoke grid through `snakemake --profile profiles/slurm` on a real (throwaway) Slurm cluster:
batches of cells as sbatch jobs, one cell crashed on purpose, --keep-going, the rerun, and the
same tidy table, tables and figures as a local run.

CI has two cores, and every cell under Slurm also pays a Snakemake start-up inside its batch (about
1.2 s of CPU on top of the cell's own 2 s). The whole smoke grid (177 cells) took 14 min through
Slurm on a busy two-core machine (8 min locally there; about 650 CPU-seconds of Slurm jobs), too long
for CI. So CI runs a named subset, SMOKE_AT_128: the smoke grid's settings, kernels and all 12 masks
at sequence length 128, FlexAttention on one mask, and the GPU-only kernels (83 cells).
ATTNBENCH_SLURM_FULL_SMOKE=1 runs the whole grid instead.
The cluster has one node and no accounting, so the profile checks job states with squeue.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pandas as pd
import pytest
import yaml

from attnbench import outputs
from attnbench.config import cell_path, expand_cells, validate

from slurmtools import REPO, planned, slurm_cluster, slurm_states, snakemake, submitted_jobs

CRASHED = "sdpa/causal_document/s128-h4x2-d32-float32-fwd"
PARTITION = "attnbench"  # not the cluster's default: the profile must take it from the environment


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster(tmp_path_factory.mktemp("slurm-1node")) as c:
        yield c


def smoke_config(workdir):
    """config.yaml running the smoke grid, or its subset SMOKE_AT_128 (see above)."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["run"] = ["smoke"]
    if not os.environ.get("ATTNBENCH_SLURM_FULL_SMOKE"):
        smoke = cfg["grids"]["smoke"]
        smoke["seqlen"] = [128]
        smoke["also"] = [{**extra, "seqlen": [128], **({"masks": ["causal"]} if "flex" in extra["kernels"] else {})}
                         for extra in smoke.get("also", [])]
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    return validate(cfg)


@pytest.mark.slurm
@pytest.mark.slow
def test_smoke_grid_as_slurm_jobs_crash_keep_going_and_rerun(cluster, tmp_path):
    cfg = smoke_config(tmp_path)
    cells = {cell_path(c): c for c in expand_cells(cfg)}
    env = {"ATTNBENCH_SLURM_PARTITION": PARTITION}
    args = ("--configfile", str(tmp_path / "config.yaml"))
    crashed = tmp_path / "results" / f"cells/smoke/kernel/{CRASHED}.json"
    assert crashed.relative_to(tmp_path / "results").as_posix() in cells

    t0 = time.monotonic()
    first = snakemake(tmp_path, *args, limit_s=900, env={**env, "ATTNBENCH_CRASH_CELLS": f"^{CRASHED}$"})
    t_first = time.monotonic() - t0
    assert first.returncode == 1, first.stderr[-3000:]
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
    failed = [j for j in jobs if states[j]["state"] != "COMPLETED"]
    assert len(failed) == 1 and states[failed[0]]["state"] == "FAILED", {j: states[j]["state"] for j in jobs}
    # The batch that failed holds the crashed cell; its Slurm log says why.
    batch_log = jobs[failed[0]].read_text()
    assert "crash injected by ATTNBENCH_CRASH_CELLS" in (tmp_path / "results/logs/cells/smoke/kernel" /
                                                         f"{CRASHED}.log").read_text()
    assert f"point={CRASHED.split('/')[-1]}" in batch_log
    # --keep-going: every other batch finished; the crashed cell has no record, and no table was made.
    missing = {p for p in cells if not (tmp_path / "results" / p).exists()}
    assert not crashed.exists() and f"cells/smoke/kernel/{CRASHED}.json" in missing
    # The cells a batch had finished before the crash kept their records (keep-incomplete); those
    # it had not started yet (a batch stops at a failed cell: snakemake#2508) are missing too.
    for p in missing:
        c = cells[p]
        assert f"impl={c['impl']},mask={c['mask']},point={p.rsplit('/', 1)[1][:-5]}" in batch_log
    assert not (tmp_path / "results/tables/cells.csv").exists()

    # The same command again would submit exactly the missing cells and the aggregation.
    plan = planned(tmp_path, *args)
    assert plan == {"kernel_cell": len(missing), "collect": 1, "tables_smoke": 1, "figures_smoke": 1, "all": 1}

    t0 = time.monotonic()
    second = snakemake(tmp_path, *args, limit_s=600, env=env)
    t_second = time.monotonic() - t0
    assert second.returncode == 0, second.stderr[-3000:]
    rerun = submitted_jobs(second)
    states = slurm_states()
    assert rerun and all(states[j]["state"] == "COMPLETED" for j in rerun)
    assert not set(rerun) & set(jobs)

    # Every record was written inside a Slurm job of these runs; the rerun wrote the missing ones.
    for p, c in cells.items():
        record = json.loads((tmp_path / "results" / p).read_text())
        job = record["environment"]["slurm_job_id"]
        assert job in (rerun if p in missing else jobs), (p, job)
    # The same tidy table, tables and figures as a local run of this grid makes.
    df = pd.read_csv(tmp_path / "results/tables/cells.csv")
    assert len(df) == len(cells) and df["status"].notna().all()
    assert {"ok", "unavailable"} <= set(df["status"])
    grid = cfg["grids"]["smoke"]
    for name in outputs.table_names(grid):
        assert (tmp_path / "results/tables/smoke" / name).stat().st_size > 0
    for name in outputs.figure_names(grid, cfg["figures"]["formats"]):
        assert (tmp_path / "results/figures/smoke" / name).stat().st_size > 0
    assert planned(tmp_path, *args) == {}
    print(f"\nsmoke grid via Slurm: {len(cells)} cells, first run {t_first:.0f} s ({len(jobs)} jobs), "
          f"rerun {t_second:.0f} s ({len(rerun)} jobs)")
