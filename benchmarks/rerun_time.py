"""What a run that makes one record again costs (issue 59, "a rerun costs what it reruns"): each
record given is deleted, then the run `make run` starts (`snakemake --profile profiles/local
--cores 2`) is timed to its end; printed: its wall seconds and the jobs it ran (Snakemake's job
stats). Run it in a checkout whose default run has finished (`make run`), nothing left to do.

    python benchmarks/rerun_time.py results/cells/smoke_sparse/sparse/sdpa/block_sparse/s256-h4x2-d32-float32-fwd-b64-r0.5.json
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def snakemake(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", "--cores", "2"]
    # the rules' commands run `python` from PATH: this interpreter's, as the Makefile puts it first
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, env=env)


def job_stats(text: str) -> dict[str, int]:
    """{rule: jobs} of Snakemake's first "Job stats" table in its output."""
    block = text.split("Job stats:", 1)[1].split("total", 1)[0] if "Job stats:" in text else ""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", block, re.M)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", type=Path, help="records to delete, one run each")
    args = ap.parse_args()
    if job_stats((p := snakemake("-n")).stdout + p.stderr):
        sys.exit("the default run has jobs left: run `make run` first")
    for record in args.records:
        (REPO / record).unlink()
        start = time.perf_counter()
        p = snakemake()
        wall = time.perf_counter() - start
        if p.returncode:
            sys.exit(f"the run failed:\n{(p.stdout + p.stderr)[-3000:]}")
        jobs = ", ".join(f"{rule} {n}" for rule, n in job_stats(p.stdout + p.stderr).items())
        print(f"{record}: {wall:.1f} s; jobs: {jobs}", flush=True)


if __name__ == "__main__":
    main()
