"""The distributed launcher without Slurm: its Slurm resources, its task environment, its refusals,
and a real two-rank gloo job on this machine (tests/slurm run it through a Slurm cluster)."""

import fcntl
import json
import os
import subprocess

import pytest
from attnbench.families import expand_cells, load_config
from attnbench.run import launch
from commands import REPO, cell_args, launched, package_env

ALLREDUCE = REPO / "tests/slurm/workflow/allreduce.py"


def test_one_node_resources_hold_all_ranks_in_one_step():
    r = launch.resources(1, 4, "cuda", cpus_per_rank=2)
    assert r == {
        "nodes": 1,
        "gpu": 4,
        "cpus_per_task": 8,
        "mpi": None,
        "tasks": None,
        "slurm_extra": None,
    }
    assert launch.resources(1, 2, "cpu")["gpu"] is None  # no --gpus=0 for a CPU cell


def test_several_nodes_ask_one_task_per_rank_and_gpus_per_node():
    r = launch.resources(3, 8, "cuda")
    assert r["mpi"] and r["nodes"] == 3 and r["tasks"] == 24 and r["cpus_per_task"] == 1
    assert r["gpu"] is None  # the plugin's `gpu` is a job total and adds --ntasks-per-gpu
    assert r["slurm_extra"].split() == ["--ntasks-per-node=8", "--gpus-per-node=8"]
    assert launch.resources(2, 1, "cpu")["slurm_extra"] == "--ntasks-per-node=1"
    assert set(r) == set(launch.RESOURCE_NAMES)


@pytest.mark.parametrize("args", [(0, 1, "cpu"), (1, 0, "cpu"), (1, 1, "tpu")])
def test_bad_placements_are_refused(args):
    with pytest.raises(ValueError):
        launch.resources(*args)


def test_slurm_task_becomes_a_torch_rank():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "8",
        "SLURM_NODEID": "2",
        "SLURM_STEP_NUM_NODES": "4",
    }
    assert launch.task_environment(env) == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "GROUP_RANK": "2",
        "NODE_RANK": "2",
        "LOCAL_WORLD_SIZE": "2",
    }
    with pytest.raises(SystemExit, match="SLURM_PROCID"):
        launch.task_environment({})


def test_one_node_uses_torchrun_standalone_with_the_whole_command():
    cmd, env = launch.command(1, 2, ["python", "-m", "x", "--flag"])
    assert cmd[1:] == [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--no-python",
        "--standalone",
        "--nnodes=1",
        "python",
        "-m",
        "x",
        "--flag",
    ]
    assert env == {}


def test_several_nodes_need_an_allocation_and_the_batch_step(monkeypatch):
    for var in [v for v in os.environ if v.startswith("SLURM_")]:
        monkeypatch.delenv(var)
    with pytest.raises(SystemExit, match="SLURM_JOB_ID is not set"):
        launch.command(2, 1, ["true"])
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    with pytest.raises(SystemExit, match="`mpi` resource"):
        launch.command(2, 1, ["true"])


def test_two_ranks_on_this_machine(tmp_path):
    out = tmp_path / "allreduce.json"
    p = subprocess.run(
        launched(["--nproc-per-node", "2"], str(ALLREDUCE), str(out)),
        capture_output=True,
        text=True,
        timeout=180,
        env=package_env(),
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2
    assert sorted(r["rank"] for r in result["ranks"]) == [0, 1]
    assert all(r["sum"] == result["expected_sum"] == 3 for r in result["ranks"])


def launched_devices(tmp_path, visible, probe, *launch_args):
    """Start `launch LAUNCH_ARGS` around `python -c PROBE`, as on a machine with these GPUs."""
    env = package_env(CUDA_VISIBLE_DEVICES=visible, ATTNBENCH_GPU_LOCK_DIR=str(tmp_path / "locks"))
    env.pop("SLURM_JOB_ID", None)
    return subprocess.Popen(
        launched(launch_args, "-c", probe),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def devices_seen(tmp_path, n_gpus, visible, hold_s=0.0):
    """Start `launch --gpus-per-node n` around a command that reports its CUDA_VISIBLE_DEVICES."""
    probe = f"import os, time; print(os.environ.get('CUDA_VISIBLE_DEVICES')); time.sleep({hold_s})"
    return launched_devices(tmp_path, visible, probe, "--gpus-per-node", str(n_gpus))


def test_concurrent_cells_on_one_machine_get_different_gpus(tmp_path):
    # Two commands at once on a machine with GPUs 3 and 5: each holds one of its own.
    first, second = (devices_seen(tmp_path, 1, "3,5", hold_s=3) for _ in range(2))
    seen = [p.communicate(timeout=60)[0].split()[-1] for p in (first, second)]
    assert sorted(seen) == ["3", "5"]
    # The locks went with the processes: both GPUs are free again.
    both = devices_seen(tmp_path, 2, "3,5")
    assert both.communicate(timeout=60)[0].split()[-1] == "3,5"


def test_asking_for_more_gpus_than_visible_fails_clearly(tmp_path):
    p = devices_seen(tmp_path, 3, "0,1")
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "3 GPUs asked for, 2 visible" in err


def test_no_gpu_here_runs_the_command_unchanged(tmp_path):
    p = devices_seen(tmp_path, 1, "")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and "no GPU visible here" in out and out.splitlines()[-1] == ""


@pytest.mark.parametrize("release_early", [False, True])
def test_claim_after_import_starts_at_once_and_waits_for_the_gpu_inside(tmp_path, release_early):
    """--claim-after-import: the command starts at once (its imports overlap another cell's GPU time)
    and claims the GPU itself; two such cells on one GPU start together and measure one after the other.
    release_gpus() hands the GPU on before the process ends (a cell writing its record)."""
    probe = (
        "import json, time; t0 = time.time(); from attnbench.run import launch; "
        "g = launch.claim_from_environment(); t1 = time.time(); time.sleep(2); t2 = t3 = time.time(); "
        + ("launch.release_gpus(); t3 = time.time(); time.sleep(3); " if release_early else "")
        + "print(json.dumps({'gpus': g, 'started': t0, 'claimed': t1, 'releasing': t2, "
        "'released': t3, 'ended': time.time()}))"
    )
    claimed_inside = ("--gpus-per-node", "1", "--claim-after-import")
    procs = [launched_devices(tmp_path, "4", probe, *claimed_inside) for _ in range(2)]
    runs = sorted(
        (json.loads(p.communicate(timeout=60)[0].splitlines()[-1]) for p in procs),
        key=lambda r: r["claimed"],
    )
    assert [r["gpus"] for r in runs] == [["4"], ["4"]]
    assert abs(runs[0]["started"] - runs[1]["started"]) < 1.5  # both started at once
    assert runs[1]["claimed"] >= runs[0]["releasing"] - 0.05  # the GPU was never shared
    # handed on at once (release_gpus imports torch first: `released` is when it returned)
    assert runs[1]["claimed"] - runs[0]["released"] < 1.0
    if release_early:  # long before the first process ended
        assert runs[1]["claimed"] < runs[0]["ended"] - 2


def test_a_cell_that_cannot_run_does_not_wait_for_the_gpu(tmp_path):
    """A cell that only records why it cannot run (here an unsupported mask) writes its record at
    once while another cell holds the GPU; it would otherwise wait for the lock."""
    spec = next(
        c
        for c in expand_cells(load_config(REPO / "config.yaml"), ["h200_sweep"])
        if (c["impl"], c["mask"]) == ("sdpa_flash", "full_document")
    )
    locks = tmp_path / "locks"
    locks.mkdir()
    with open(locks / "gpu-4.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another cell is measuring on GPU 4
        cmd = launched(
            ["--gpus-per-node", "1", "--claim-after-import"], *cell_args(spec, tmp_path / "r.json")
        )
        env = package_env(CUDA_VISIBLE_DEVICES="4", ATTNBENCH_GPU_LOCK_DIR=str(locks))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] in ("unsupported", "unavailable") and record["gpu_wait_s"] is None
