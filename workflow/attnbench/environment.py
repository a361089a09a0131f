"""The environment fingerprint every record carries (spec/measurement.md)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from .kernels.catalog import all_library_versions

REPO = Path(__file__).resolve().parents[2]


def _run(cmd) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_state() -> dict:
    """The checkout's commit; where the tree was copied without .git (a remote GPU machine),
    ATTNBENCH_GIT_COMMIT / ATTNBENCH_GIT_DIRTY say what it was copied from."""
    commit = _run(["git", "rev-parse", "HEAD"])
    if commit:
        dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
        return {"git_commit": commit, "git_dirty": None if dirty is None else bool(dirty)}
    env_dirty = os.environ.get("ATTNBENCH_GIT_DIRTY")
    return {"git_commit": os.environ.get("ATTNBENCH_GIT_COMMIT", "unknown"),
            "git_dirty": None if env_dirty is None else env_dirty == "1"}


def fingerprint(device: str) -> dict:
    """Facts about this machine and checkout. Imports torch only if the cell already did."""
    libs = all_library_versions()
    env = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": libs.get("torch"),
        "libraries": libs,
        "cpu_count": os.cpu_count(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        # The devices Slurm (or the user) gave this process; None when nothing restricted them.
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **git_state(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        env.update(torch=torch.__version__, cpu_threads=torch.get_num_threads())
    if device == "cuda" and torch is not None and torch.cuda.is_available():
        n = torch.cuda.device_count()
        env.update(
            device_name=torch.cuda.get_device_name(0),
            device_names=[torch.cuda.get_device_name(i) for i in range(n)],
            device_count=n,
            compute_capability=list(torch.cuda.get_device_capability(0)),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None,
            driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
    else:
        env.update(device_name=cpu_model(), device_count=1)
    return env
