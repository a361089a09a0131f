"""The Snakemake profiles as Snakemake reads them (user settings from the environment, GPU count,
status command), and the sbatch/srun options snakemake-executor-plugin-slurm builds from our rules'
resources. The real submissions are tested against a real cluster in tests/slurm."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from attnbench.run import launch
from snakemake.profiles import ProfileConfigFileParser

REPO = Path(__file__).resolve().parents[1]


def read_profile(name: str) -> dict:
    with open(REPO / "profiles" / name / "config.yaml") as f:
        return dict(ProfileConfigFileParser().parse(f))


def fake_scontrol(tmp_path, monkeypatch, accounting: str):
    (tmp_path / "scontrol").write_text(
        f"#!/bin/sh\necho 'AccountingStorageType   = {accounting}'\n"
    )
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_slurm_profile_takes_partition_and_account_from_the_environment(tmp_path, monkeypatch):
    fake_scontrol(tmp_path, monkeypatch, "accounting_storage/none")
    monkeypatch.setenv("ATTNBENCH_SLURM_PARTITION", "gpu-h200")
    monkeypatch.setenv("ATTNBENCH_SLURM_ACCOUNT", "123456")
    defaults = read_profile("slurm")["default-resources"]
    assert "slurm_partition='gpu-h200'" in defaults and "slurm_account='123456'" in defaults
    monkeypatch.delenv("ATTNBENCH_SLURM_PARTITION")
    monkeypatch.delenv("ATTNBENCH_SLURM_ACCOUNT")
    # Unset: no partition or account at all, so the plugin uses the cluster's default partition.
    defaults = read_profile("slurm")["default-resources"]
    assert not any(d.startswith(("slurm_partition", "slurm_account")) for d in defaults)
    assert "runtime=20 * attempt" in defaults and "mem_mb=4000 * attempt" in defaults


@pytest.mark.parametrize(
    "accounting, command",
    [("accounting_storage/slurmdbd", "sacct"), ("accounting_storage/none", "squeue")],
)
def test_slurm_profile_checks_states_with_what_the_cluster_answers(
    tmp_path, monkeypatch, accounting, command
):
    fake_scontrol(tmp_path, monkeypatch, accounting)
    assert read_profile("slurm")["slurm-status-command"] == command


def test_slurm_profile_without_slurm_still_reads(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert read_profile("slurm")["slurm-status-command"] == "squeue"


def test_slurm_profile_batches_cells_one_after_another():
    p = read_profile("slurm")
    assert p["groups"] == ["kernel_cell=cells"] and p["group-components"] == ["cells=20"]
    assert p["resources"] == ["batch_slots=1"] and p["set-resource-scopes"] == [
        "batch_slots=local"
    ]


@pytest.mark.parametrize(
    "env, gpus",
    [
        ({"ATTNBENCH_GPUS": "4"}, 4),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, 2),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0),
    ],
)
def test_local_profile_limits_gpu_cells_to_the_gpus_present(monkeypatch, env, gpus):
    for var in ("ATTNBENCH_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert read_profile("local")["resources"] == [f"gpu={gpus}"]


@pytest.mark.parametrize(
    "argv, env, named",
    [
        (["-n"], {}, False),
        (["--profile", "slurm", "-n"], {}, True),
        (["--profile=profiles/slurm"], {}, True),
        (["--prof", "local"], {}, True),  # argparse takes an abbreviation
        (["--printshellcmds"], {}, False),
        (["-n"], {"SNAKEMAKE_PROFILE": "slurm"}, True),
    ],
)
def test_default_profile_is_the_local_one_unless_a_profile_is_named(monkeypatch, argv, env, named):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("SNAKEMAKE_PROFILE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "argv", ["snakemake", *argv])
    assert read_profile("default") == ({} if named else read_profile("local"))


def snakemake_in_repo_root(*args: str) -> str:
    """`snakemake ARGS` as a user types it in the repository root, with the venv's bin on PATH."""
    env = {k: v for k, v in os.environ.items() if k != "SNAKEMAKE_PROFILE"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    # -F: every job in the dry run, also where `make run` has written the results already;
    # --quiet host: Snakemake's block per job, which the profiles leave out, is what is read here
    cmd = ["snakemake", *args, "-n", "-F", "--quiet", "host"]
    p = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


# Snakemake says this when the executor is `local` (the local profile's), not in a plain dry run.
LOCAL_EXECUTOR = "Assuming unrestricted shared filesystem usage."


def test_profiles_are_found_by_name_from_the_repository_root():
    out = snakemake_in_repo_root("--profile", "slurm")
    assert "Using profiles slurm and workflow specific profile profiles/default" in out
    # The slurm profile's batching and executor hold: the default profile added nothing.
    assert "Group job cells" in out and LOCAL_EXECUTOR not in out
    out = snakemake_in_repo_root("--profile", "local")
    assert "Using profiles local and workflow specific profile profiles/default" in out
    assert LOCAL_EXECUTOR in out and "Group job cells" not in out


def test_plain_snakemake_uses_the_local_profile():
    out = snakemake_in_repo_root()
    assert "Using workflow specific profile profiles/default" in out
    assert LOCAL_EXECUTOR in out and "Group job cells" not in out


class FakeJob:
    """What the plugin reads from a job: resources (by key and attribute) and threads."""

    def __init__(self, threads=1, **resources):
        self.threads = threads
        res = {
            k: v for k, v in resources.items() if v is not None
        }  # Snakemake drops None resources
        self.resources = SimpleNamespace(**res)
        self.resources.get = res.get
        self.resources.keys = res.keys


def sbatch_and_srun(job):
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm_jobstep import get_gpu_setting

    params = {
        "run_uuid": "r",
        "slurm_logfile": "l",
        "comment_str": "c",
        "account": "",
        "partition": "",
        "workdir": "",
    }
    return (get_submit_command(job, params) + set_gres_string(job)).split(), get_gpu_setting(
        job
    ).split()


def test_a_cpu_kernel_cell_asks_slurm_for_no_gpu():
    sbatch, srun = sbatch_and_srun(FakeJob(gpu=0, runtime=10, mem_mb=4000))
    assert not [a for a in sbatch + srun if "gpu" in a]


def test_a_cuda_kernel_cell_asks_for_one_gpu():
    sbatch, srun = sbatch_and_srun(FakeJob(gpu=1, runtime=10, mem_mb=4000))
    assert "--gpus=1" in sbatch and srun == ["--gpus=1"]


def test_distributed_cell_resources_become_the_right_allocation():
    one_node = FakeJob(**launch.resources(1, 4, "cuda", cpus_per_rank=2), runtime=30, mem_mb=8000)
    sbatch, srun = sbatch_and_srun(one_node)
    assert {"--nodes=1", "--gpus=4", "--cpus-per-task=8"} <= set(sbatch) and srun == ["--gpus=4"]
    two_nodes = FakeJob(**launch.resources(2, 4, "cuda"), runtime=30, mem_mb=8000)
    sbatch, _ = sbatch_and_srun(two_nodes)
    assert {
        "--nodes=2",
        "--ntasks=8",
        "--ntasks-per-node=4",
        "--gpus-per-node=4",
        "--cpus-per-task=1",
    } <= set(sbatch)
    assert not [a for a in sbatch if a.startswith(("--gpus=", "--ntasks-per-gpu", "--gres"))]


@pytest.mark.parametrize(
    "argv, logs",
    [
        ([], "results/logs/slurm"),
        (
            ["--config", "run=[paper_cp]", "output_dir=/scratch/me/out"],
            "/scratch/me/out/logs/slurm",
        ),
        (["--configfile", "mine.yaml"], "elsewhere/logs/slurm"),
        (["--configfile", "mine.yaml", "--config", "output_dir=last"], "last/logs/slurm"),
    ],
)
def test_slurm_logs_go_under_the_runs_output_folder(tmp_path, monkeypatch, argv, logs):
    """Slurm's own logs of every job sit with the run's other logs, <output_dir>/logs/slurm,
    read as Snakemake reads output_dir: config.yaml, then --configfile, then --config."""
    fake_scontrol(tmp_path, monkeypatch, "accounting_storage/none")
    (tmp_path / "config.yaml").write_text("output_dir: results\n")
    (tmp_path / "mine.yaml").write_text("output_dir: elsewhere/\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["snakemake", "--profile", "slurm", *argv])
    assert read_profile("slurm")["slurm-logdir"] == logs
    profile = (REPO / "profiles" / "local" / "config.yaml").read_text()
    assert "quiet: [rules]" in profile  # Snakemake's block per job is off; --quiet host brings it
