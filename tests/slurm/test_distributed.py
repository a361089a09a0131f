"""Distributed launches and GPU requests through `snakemake --profile profiles/slurm` on a throwaway
cluster of two emulated nodes with two fake GPUs each (character devices behind a `gpu` GRES), with
accounting (slurmdbd), so the profile checks job states with sacct.

tests/slurm/workflow/Snakefile launches a gloo all_reduce the way a context-parallel cell does:
resources from attnbench.run.launch.resources(), command `python -m attnbench.run.launch --nodes N
--nproc-per-node P -- ...`. The GPU cell is a real kernel cell of the benchmark's own workflow.
"""

from __future__ import annotations

import json

import pytest
import yaml
from slurmtools import REPO, Snakemake, sacct, slurm_cluster, submitted_jobs

TEST_WORKFLOW = REPO / "tests/slurm/workflow/Snakefile"
CASES = {
    "one_node_two_ranks": {"nodes": 1, "nproc": 2, "device": "cpu"},
    "two_nodes_one_rank_each": {"nodes": 2, "nproc": 1, "device": "cpu"},
    "two_nodes_two_gpus_each": {"nodes": 2, "nproc": 2, "device": "cuda"},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Four CPUs per emulated node (more than this machine has): every job here starts at once.
    with slurm_cluster(
        tmp_path_factory.mktemp("slurm-2nodes"), nodes=2, gpus=2, accounting=True, cpus=4
    ) as c:
        yield c


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """Both workflows at once (their tiny jobs mostly wait for the plugin's status checks)."""
    launches, gpu_cell = tmp_path_factory.mktemp("launches"), tmp_path_factory.mktemp("gpu_cell")
    cp_cell = tmp_path_factory.mktemp("cp_cell")
    (launches / "config.yaml").write_text(yaml.safe_dump({"cases": CASES}))
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["run"] = ["gpu"]
    cfg["grids"] = {
        "gpu": {
            "description": "one CUDA cell",
            "family": "kernel",
            "device": "cuda",
            "kernels": ["sdpa_flash"],
            "masks": ["causal"],
            "seqlen": [128],
            "heads": [[2, 1]],
            "head_dim": [16],
            "dtype": ["float16"],
            "direction": ["fwd"],
            "warmup": 0,
            "reps": 2,
            "runtime_min": 5,
            "mem_mb": 1000,
        }
    }
    (gpu_cell / "config.yaml").write_text(yaml.safe_dump(cfg))
    # A real context-parallel cell of the benchmark's own workflow: Ring P2P on 2 ranks (gloo).
    cp = yaml.safe_load((REPO / "config.yaml").read_text())
    smoke_cp = cp["grids"]["smoke_cp"]
    cp["run"] = ["cp"]
    cp["grids"] = {
        "cp": {**smoke_cp, "methods": ["ring_p2p"], "masks": ["causal"], "gpus": [2], "also": []}
    }
    (cp_cell / "config.yaml").write_text(yaml.safe_dump(cp))
    started = {
        "launches": Snakemake(launches, snakefile=TEST_WORKFLOW, limit_s=300),
        "gpu_cell": Snakemake(gpu_cell, limit_s=300),
        "cp_cell": Snakemake(cp_cell, limit_s=300),
    }
    return {name: (run.workdir, run.result()) for name, run in started.items()}


def tres(row) -> dict:
    return dict(kv.split("=", 1) for kv in row["AllocTRES"].split(",") if "=" in kv)


def completed(runs, name):
    """The run's folder, Slurm jobs and their accounting, after checking every job completed."""
    workdir, p = runs[name]
    assert p.returncode == 0, p.stderr[-4000:]
    jobs = submitted_jobs(p)
    accounted = sacct(jobs)
    assert jobs and all(accounted[j]["State"] == "COMPLETED" for j in jobs), accounted
    return workdir, jobs, accounted


@pytest.mark.slurm
def test_distributed_jobs_find_their_ranks_and_rendezvous_inside_slurm(runs):
    tmp_path, jobs, accounted = completed(runs, "launches")
    assert len(jobs) == len(CASES)
    job_of_case = {
        log.parent.name: j for j, log in jobs.items()
    }  # logs: rule_distributed/<case>/<id>.log

    for case, placement in CASES.items():
        result = json.loads((tmp_path / "out" / f"{case}.json").read_text())
        world = placement["nodes"] * placement["nproc"]
        ranks = sorted(result["ranks"], key=lambda r: r["rank"])
        # Every rank joined one process group of the full size and saw the full all_reduce.
        assert result["world_size"] == world and [r["rank"] for r in ranks] == list(range(world))
        assert all(r["sum"] == world * (world + 1) / 2 for r in ranks)
        # The ranks ran on as many Slurm nodes as the cell asked for, nproc on each.
        nodes = [r["node"] for r in ranks]
        assert len(set(nodes)) == placement["nodes"] and all(
            nodes.count(n) == placement["nproc"] for n in set(nodes)
        )
        assert sorted(r["local_rank"] for r in ranks) == sorted(
            list(range(placement["nproc"])) * placement["nodes"]
        )
        assert all(r["local_world_size"] == placement["nproc"] for r in ranks)
        alloc = tres(accounted[job_of_case[case]])
        assert int(alloc["node"]) == placement["nodes"]
        if placement["device"] == "cuda":
            # Slurm gave each node its GPUs and told every rank which ones (CUDA_VISIBLE_DEVICES).
            assert int(alloc["gres/gpu"]) == world
            assert all(
                r["cuda_visible_devices"] == ",".join(map(str, range(placement["nproc"])))
                for r in ranks
            )
        else:
            assert "gres/gpu" not in alloc and all(
                r["cuda_visible_devices"] is None for r in ranks
            )


@pytest.mark.slurm
def test_gpu_cell_gets_its_device_from_slurm(runs):
    tmp_path, jobs, accounted = completed(runs, "gpu_cell")
    gpu_jobs = {j for j in jobs if "gres/gpu" in tres(accounted[j])}
    # The device's matmul ceiling and the cell each held one GPU; the tables and figures none.
    assert len(gpu_jobs) == 2 and all(tres(accounted[j])["gres/gpu"] == "1" for j in gpu_jobs)
    record = json.loads(next((tmp_path / "results/cells/gpu").rglob("*.json")).read_text())
    assert record["environment"]["slurm_job_id"] in gpu_jobs
    assert record["environment"]["cuda_visible_devices"] == "0"
    # This CPU build of torch has no CUDA: the record says so instead of measuring anything.
    assert record["status"] == "unavailable"


@pytest.mark.slurm
def test_context_parallel_cell_runs_its_ranks_inside_one_slurm_job(runs):
    tmp_path, jobs, accounted = completed(runs, "cp_cell")
    record = json.loads(next((tmp_path / "results/cells/cp").rglob("*.json")).read_text())
    assert record["status"] == "ok", record.get("status_reason")
    assert record["environment"]["slurm_job_id"] in jobs
    alloc = tres(accounted[record["environment"]["slurm_job_id"]])
    # one node, one CPU per rank, both ranks of the ring in that job
    assert int(alloc["node"]) == 1 and int(alloc["cpu"]) >= 2
    assert record["cell"]["gpus"] == 2 and record["check_passed"] is True
