"""Helpers for the tests of the Slurm path: a real Slurm cluster on this machine, bounded Snakemake runs.

The tests start the cluster themselves (workflow/scripts/slurm/start.sh) when they may: as root, on
Debian, with the Slurm packages installed (.ci/run installs them). Elsewhere they are skipped, saying
why. Every Snakemake run is bounded by `timeout -s INT` (SIGINT makes Snakemake scancel its jobs),
and the cluster is always stopped, by the pids start.sh recorded, when the module's tests end.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from commands import REPO, package_env, planned_jobs, snakemake_cmd

SCRIPTS = REPO / "workflow/scripts/slurm"
PACKAGES = ["munge", "slurmctld", "slurmd", "slurm-client"]
ACCOUNTING_PACKAGES = ["slurmdbd", "mariadb-server"]
MARK = "# attnbench throwaway cluster"


def _installed(package: str) -> bool:
    p = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
    )
    return p.returncode == 0 and "ok installed" in p.stdout


def why_no_cluster(accounting: bool = False) -> str | None:
    """Why a throwaway cluster cannot be started here, or None when it can."""
    if os.environ.get("ATTNBENCH_SKIP_SLURM"):
        return "ATTNBENCH_SKIP_SLURM is set"
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "a throwaway Slurm cluster needs root on Linux (daemons, /etc/slurm, mknod)"
    if not shutil.which("dpkg-query"):
        return "a throwaway Slurm cluster needs Debian's Slurm packages (no dpkg here)"
    missing = [
        p for p in PACKAGES + (ACCOUNTING_PACKAGES if accounting else []) if not _installed(p)
    ]
    if missing:
        return (
            f"Debian packages missing: {' '.join(missing)} (.ci/run installs them: "
            f"apt-get install --no-install-recommends {' '.join(missing)})"
        )
    conf = Path("/etc/slurm/slurm.conf")
    if conf.exists() and MARK not in conf.read_text():
        return (
            "/etc/slurm/slurm.conf belongs to a real Slurm installation; the tests leave it alone"
        )
    running = subprocess.run(
        ["pgrep", "-x", "slurmctld"], capture_output=True, text=True
    ).stdout.split()
    if running:
        return f"a slurmctld is already running here (pid {', '.join(running)})"
    return None


@dataclass
class Cluster:
    state: Path
    nodes: int
    gpus: int
    accounting: bool


@contextlib.contextmanager
def slurm_cluster(
    state: Path, nodes: int = 1, gpus: int = 0, accounting: bool = False, cpus: int | None = None
):
    """Start a cluster (skip the tests if it cannot be started here), yield it, always stop it.
    cpus: what each node declares (default: this machine's); more lets tiny jobs run side by side."""
    reason = why_no_cluster(accounting)
    if reason:
        pytest.skip(f"Slurm tests skipped: {reason}")
    args = ["--state", str(state), "--nodes", str(nodes), "--gpus", str(gpus)] + (
        ["--accounting"] if accounting else []
    )
    args += ["--cpus", str(cpus)] if cpus else []
    try:
        p = subprocess.run(
            [str(SCRIPTS / "start.sh"), *args], capture_output=True, text=True, timeout=300
        )
        if p.returncode != 0:
            pytest.fail(
                f"start.sh {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            )
        yield Cluster(state, nodes, gpus, accounting)
    finally:
        subprocess.run(
            [str(SCRIPTS / "stop.sh"), "--state", str(state)], capture_output=True, timeout=180
        )


class Snakemake:
    """`snakemake --profile profiles/slurm` on workdir and its config.yaml, started now, interrupted
    with SIGINT (which makes it scancel its jobs) after limit_s seconds; `.result()` waits for it."""

    def __init__(
        self,
        workdir: Path,
        *args: str,
        snakefile: Path = REPO / "Snakefile",
        limit_s: int = 300,
        env: dict | None = None,
    ):
        # Tiny test jobs: look at them soon (the plugin's default is 40 s, +10 s per idle look).
        soon = ["--slurm-init-seconds-before-status-checks", "2"]
        snakemake = snakemake_cmd(workdir, *soon, *args, snakefile=snakefile, profile="slurm")
        self.cmd = ["timeout", "-s", "INT", "-k", "60", str(limit_s), *snakemake]
        self.workdir, self.limit_s = workdir, limit_s
        # Output to files, not pipes: several runs at once must never block on a full pipe.
        self.out, self.err = (
            open(workdir / f"snakemake-{os.getpid()}-{id(self)}.{n}", "w+") for n in ("out", "err")
        )
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.out, stderr=self.err, text=True, env=package_env(**(env or {}))
        )

    def result(self) -> subprocess.CompletedProcess:
        try:
            self.proc.wait(timeout=self.limit_s + 120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        out, err = (f.seek(0) or f.read() for f in (self.out, self.err))
        for f in (self.out, self.err):
            f.close()
            os.unlink(f.name)
        p = subprocess.CompletedProcess(self.cmd, self.proc.returncode, out, err)
        with (self.workdir / "snakemake-runs.log").open("a") as log:
            log.write(f"$ {' '.join(self.cmd)}\n{out}{err}\nrc={p.returncode}\n")
        assert p.returncode not in (124, 137, -9), (
            f"snakemake ran past {self.limit_s}s and was stopped:\n{err[-4000:]}"
        )
        return p


def snakemake(workdir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run Snakemake (see Snakemake) and wait for it."""
    return Snakemake(workdir, *args, **kwargs).result()


SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.")


def submitted_jobs(p: subprocess.CompletedProcess) -> dict[str, Path]:
    """Slurm job id -> Slurm log file, for every sbatch that Snakemake run made."""
    return {m.group(1): Path(m.group(2)) for m in SUBMITTED.finditer(p.stdout + p.stderr)}


def slurm_states() -> dict[str, dict]:
    """Every job the controller still knows (MinJobAge keeps finished ones an hour): id -> fields."""
    out = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%i|%T|%P|%j|%D|%C"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    jobs = {}
    for line in out.splitlines():
        job_id, state, partition, name, nodes, cpus = line.split("|")
        jobs[job_id] = {
            "state": state,
            "partition": partition,
            "name": name,
            "nodes": int(nodes),
            "cpus": int(cpus),
        }
    return jobs


def sacct(job_ids, fields: str = "JobID,State,NodeList,AllocTRES") -> dict[str, dict]:
    """Accounting records (slurmdbd) of whole jobs: id -> {field: value}."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", fields],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    names = fields.split(",")
    rows = [dict(zip(names, line.split("|"))) for line in out.splitlines() if line.strip()]
    return {r["JobID"]: r for r in rows}


def planned(workdir: Path, *args: str, snakefile: Path = REPO / "Snakefile") -> dict[str, int]:
    """Jobs per rule that the same command would run now (a dry run; submits nothing)."""
    return planned_jobs(snakemake(workdir, "-n", *args, snakefile=snakefile, limit_s=120))
