"""Two failures only a cluster has, on a real (throwaway) Slurm cluster, in one run of the workflow:
a job that Slurm stops at its time limit, and the node drained while the run goes on. The rerun
submits exactly the cells without a record.

One node that runs two jobs at a time, one cell per job, two submitted at a time. The cell that
hangs starts first: its job may run 1 minute (`--set-resources kernel_cell:runtime=1`, below the grid's own time budget,
so Slurm stops it, not the launcher). When another cell has finished, the node is drained: the jobs
running there go on, the jobs submitted after it wait. Once Slurm has stopped the hanging job
(state TIMEOUT), Snakemake is interrupted (it cancels the waiting jobs); the node is resumed and
the same command runs again. About 3 minutes on two cores.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from attnbench.families import expand_cells, validate
from attnbench.grid.expand import cell_path
from attnbench.harness.faults import HANG_ENV
from attnbench.record.validate import record_problems
from commands import in_flight, records, wait_for
from slurmtools import (
    Snakemake,
    planned,
    slurm_cluster,
    slurm_states,
    snakemake,
    submitted_jobs,
)
from tinygrids import config_running, kernel_grid

GRID = kernel_grid(
    description="Slurm failure tests", seqlen=[64, 128], runtime_min=10, mem_mb=1000
)
HUNG = "naive/causal/s64-h2x1-d16-float32-fwd"
# One cell per job, each allowed one minute by Slurm; two jobs submitted at a time, the hanging
# cell's among the first two.
ARGS = (
    "--group-components",
    "cells=1",
    "--set-resources",
    "kernel_cell:runtime=1",
    "--jobs",
    "2",
    "--prioritize",
    f"results/cells/slurmfail/kernel/{HUNG}.json",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Two CPUs declared: two one-CPU jobs at a time, so that some wait when the node is drained.
    with slurm_cluster(tmp_path_factory.mktemp("slurm-failures"), cpus=2) as c:
        yield c


def node_name() -> str:
    return subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()[0]


def node_state(node: str) -> str:
    return subprocess.run(
        ["sinfo", "-h", "-n", node, "-o", "%T"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()


def scontrol_update(*args: str):
    subprocess.run(
        ["scontrol", "update", *args], capture_output=True, text=True, timeout=60, check=True
    )


@pytest.mark.slurm
def test_time_limit_and_drained_node_then_a_rerun_runs_only_the_missing_cells(cluster, tmp_path):
    cfg = config_running({"slurmfail": GRID})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    cells = [cell_path(c) for c in expand_cells(validate(cfg))]
    results = tmp_path / "results"
    hung_log = results / f"logs/cells/slurmfail/kernel/{HUNG}.log"
    node = node_name()

    run = Snakemake(tmp_path, *ARGS, limit_s=420, env={HANG_ENV: f"^{HUNG}$"})
    try:
        wait_for(
            lambda: (
                hung_log.exists()
                and "hanging:" in hung_log.read_text()
                and records(results / "cells")
            ),
            240,
            "the hanging cell running and another cell finished",
        )
        scontrol_update(f"NodeName={node}", "State=DRAIN", "Reason=attnbench-failure-test")
        drained_at = records(results / "cells")
        # Slurm stops the hanging job at its 1-minute limit (checked every 30 s, SIGTERM then SIGKILL).
        wait_for(
            lambda: "TIMEOUT" in {j["state"] for j in slurm_states().values()},
            180,
            "Slurm stopping the hanging job at its time limit",
            every_s=1,  # each look asks the Slurm controller
        )
        # jobs that were running when the node was drained have ended; the waiting ones still wait
        wait_for(
            lambda: not {"RUNNING", "COMPLETING"} & {j["state"] for j in slurm_states().values()},
            120,
            "the jobs running at the drain ending",
            every_s=1,  # each look asks the Slurm controller
        )
        assert "PENDING" in {j["state"] for j in slurm_states().values()}
        assert node_state(node) == "drained"
    finally:
        run.proc.send_signal(
            2
        )  # SIGINT (to `timeout`, which passes it on): Snakemake cancels its jobs
        first = run.result()
        scontrol_update(f"NodeName={node}", "State=RESUME")
    states = slurm_states()
    jobs = submitted_jobs(first)
    (stopped,) = [j for j in jobs if states[j]["state"] == "TIMEOUT"]
    assert "DUE TO TIME LIMIT" in jobs[stopped].read_text()  # slurmstepd's words in the job's log
    assert not list(results.rglob("*.tmp"))
    done = records(results / "cells")
    for text in done.values():
        assert record_problems(json.loads(text)) == []  # whole records only
    assert (
        f"slurmfail/kernel/{HUNG}.json" not in done
    )  # stopped by Slurm: no record, not a timeout record
    assert (
        set(drained_at) <= set(done) and len(done) < len(cells) - 1
    )  # cells waited on the drained node
    marked = in_flight(tmp_path)
    finished = {k: v for k, v in done.items() if f"results/cells/{k}" not in marked}
    plan = planned(tmp_path, *ARGS)
    assert plan.get("kernel_cell") == len(cells) - len(finished), (plan, sorted(done), marked)

    second = snakemake(tmp_path, *ARGS, limit_s=420)
    assert second.returncode == 0, second.stderr[-3000:]
    after = records(results / "cells")
    assert (
        len(after) == len(cells) and {k: after[k] for k in finished} == finished
    )  # none of these ran again
    states = slurm_states()
    rerun = submitted_jobs(second)
    assert rerun and all(states[j]["state"] == "COMPLETED" for j in rerun)
    assert json.loads(after[f"slurmfail/kernel/{HUNG}.json"])["status"] == "ok"
    assert planned(tmp_path, *ARGS) == {}
    print(
        f"\nSlurm failures: {len(finished)} of {len(cells)} cells kept from the first run, "
        f"{len(cells) - len(finished)} run again ({len(rerun)} jobs with the tables and figures)"
    )
