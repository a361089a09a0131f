"""The command lines the tests start, with the environment each needs: a command under the
distributed launcher (attnbench.run.launch), a CP cell, the CP verification matrix, and Snakemake on a
workflow in a folder; and what such a run leaves behind (records, Snakemake's plan and marks)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bounded import run_bounded

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
VERIFY_HEADS = (8, 2)  # cp_verify's query and KV heads (GQA)


def tool_env(**extra: str) -> dict:
    """This environment with this Python's scripts (snakemake, torchrun) first on PATH, and extra."""
    return {**os.environ, "PATH": f"{Path(PY).parent}:{os.environ['PATH']}", **extra}


def package_env(**extra: str) -> dict:
    """tool_env with this checkout's package first on PYTHONPATH (extra may replace it)."""
    pythonpath = f"{REPO / 'workflow'}:{os.environ.get('PYTHONPATH', '')}"
    return tool_env(**{"PYTHONPATH": pythonpath, **extra})


def launched(launch_args, *command: str) -> list[str]:
    """`python -m attnbench.run.launch LAUNCH_ARGS -- python COMMAND`."""
    return [PY, "-m", "attnbench.run.launch", *launch_args, "--", PY, *command]


def cell_args(spec: dict, out: Path, *extra: str) -> list[str]:
    """The arguments (after python) of one kernel cell writing its record to out."""
    return ["-m", "attnbench", "cell", "--spec", json.dumps(spec), "--out", str(out), *extra]


def cp_cell_cmd(cell: dict, out: Path, *launch_args: str) -> list[str]:
    """One CP cell on its ranks, its record written to out."""
    cell_args = ["cp-cell", "--spec", json.dumps(cell), "--out", str(out)]
    return launched(
        ["--nproc-per-node", str(cell["gpus"]), *launch_args], "-m", "attnbench", *cell_args
    )


def cp_verify(world: int, out: Path, *args: str, timeout: int, env=None) -> list[dict]:
    """attnbench.cp.verify on `world` CPU ranks (gloo) with VERIFY_HEADS; its rows, one per case."""
    heads = "{}:{}".format(*VERIFY_HEADS)
    verify = ["attnbench.cp.verify", "--device", "cpu", "--out", str(out), "--heads", heads]
    cmd = launched(["--nproc-per-node", str(world)], "-m", *verify, "--timeout-s", "60", *args)
    p = run_bounded(cmd, timeout, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def snakemake_cmd(
    workdir: Path, *args: str, snakefile: Path = REPO / "Snakefile", profile: str | None = None
) -> list[str]:
    """Snakemake on workdir with its config.yaml (and profiles/PROFILE when given)."""
    profile_args = ["--profile", str(REPO / "profiles" / profile)] if profile else []
    config = str(workdir / "config.yaml")
    where = ["-s", str(snakefile), "-d", str(workdir), "--configfile", config]
    return [PY, "-m", "snakemake", *profile_args, *where, *args]


def planned_jobs(p: subprocess.CompletedProcess) -> dict[str, int]:
    """Jobs per rule in a dry run's 'Job stats' table ({} when there is nothing to be done)."""
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    text = p.stdout + p.stderr
    if "Nothing to be done" in text:
        return {}
    stats = text.split("Job stats:")[1].split("\n\n")[0]
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M)
        if m.group(1) != "total"
    }


def in_flight(workdir: Path) -> set[str]:
    """Outputs Snakemake marks incomplete: their jobs were running when it stopped (it cannot know
    whether they finished; the next run, with the profile's rerun-incomplete, runs them again)."""
    marks = workdir / ".snakemake/incomplete"
    return (
        {base64.b64decode(m.name).decode() for m in marks.iterdir()} if marks.exists() else set()
    )


def records(root: Path) -> dict[str, str]:
    """Every record under root: its path below root -> its text."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.json"))}


def wait_for(predicate, limit_s: float, what: str, every_s: float = 0.2):
    """predicate's first true value, looked for every every_s seconds for at most limit_s."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"not within {limit_s} s: {what}")
