"""How long a run takes to plan as the grid grows (issue 56, "Scale"): `snakemake -n` and
`python -m attnbench check-config` on one CPU kernel grid of about N cells, no records on disk.

    python benchmarks/planning_time.py                      # N = 2,000, 6,000, 20,000
    python benchmarks/planning_time.py --cells 20000 --side-by-side
    python benchmarks/planning_time.py --repo /tmp/old      # another checkout's Snakefile and package
    python benchmarks/planning_time.py --repeat 3           # each command 3 times: median [range]

Cells: kernels x masks x directions (96) x lengths x head splits, the last two grown to reach N.
Columns: `snakemake -n` as plain `snakemake -n` runs it (profiles/local: --quiet rules), which
passes every job through Snakemake's scheduler as a run does; `snakemake -n --quiet`, which ends
once the DAG is built; a run (`snakemake`) until its first job starts (its planning: the DAG, the
files the jobs read, the first scheduling), then stopped; check-config. Each: wall seconds (CPU
seconds: on a busy machine the wall time is other processes' too).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
KERNELS = ["naive", "sdpa_math", "sdpa", "flex"]
DIRECTIONS = ["fwd", "bwd"]


def grid_of(cfg: dict, n: int, side_by_side: bool) -> tuple[dict, int]:
    """A CPU kernel grid of about n cells (lengths x head splits grown together), its cells."""
    masks = cfg["grids"]["smoke"]["masks"]
    per = len(KERNELS) * len(masks) * len(DIRECTIONS)
    lengths = max(1, round((n / per) ** 0.5))
    splits = max(1, round(n / per / lengths))
    return {
        "family": "kernel",
        "device": "cpu",
        "kernels": KERNELS,
        "masks": masks,
        "seqlen": [128 * (i + 1) for i in range(lengths)],
        "heads": [[2 * (i + 1), 1] for i in range(splits)],
        "head_dim": [16],
        "dtype": ["float32"],
        "direction": DIRECTIONS,
        "mask_params": cfg["grids"]["smoke"]["mask_params"],
        "side_by_side": side_by_side,
    }, per * lengths * splits


def repeated(measure, times: int) -> str:
    """A measurement taken `times` times: its median and range (wall seconds), since a shared
    machine's speed changes from one minute to the next; one take as it is."""
    takes = [measure() for _ in range(times)]
    if times == 1 or any(t.startswith(">") for t in takes):
        return " / ".join(takes)
    walls = sorted(float(t.split()[0]) for t in takes)
    return f"{statistics.median(walls):.1f} [{walls[0]:.1f}-{walls[-1]:.1f}]"


def timed(cmd: list[str], cwd: Path, repo: Path, limit_s: float) -> str:
    """'wall (CPU)' seconds of the command, or '> limit'."""
    env = {**os.environ, "PYTHONPATH": f"{repo / 'workflow'}:{os.environ.get('PYTHONPATH', '')}"}
    cpu = _children_cpu()
    start = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return f"> {limit_s:.0f}"
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{(p.stdout + p.stderr)[-3000:]}")
    return f"{time.perf_counter() - start:.1f} ({_children_cpu() - cpu:.1f})"


def until_first_job(cmd: list[str], cwd: Path, repo: Path, limit_s: float) -> str:
    """Wall seconds of a run until its first job starts (Snakemake marks its outputs incomplete
    then); the run is then stopped."""
    env = {**os.environ, "PYTHONPATH": f"{repo / 'workflow'}:{os.environ.get('PYTHONPATH', '')}"}
    # each take from nothing: an earlier take's lock, marks and half-written outputs removed
    for left in (cwd / ".snakemake", cwd / "results"):
        shutil.rmtree(left, ignore_errors=True)
    marks = cwd / ".snakemake" / "incomplete"
    start = time.perf_counter()
    p = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        while not (marks.is_dir() and any(marks.iterdir())):
            if p.poll() is not None:
                sys.exit(f"{' '.join(cmd)} ended before a job started:\n{p.stderr.read()[-3000:]}")
            if time.perf_counter() - start > limit_s:
                return f"> {limit_s:.0f}"
            time.sleep(0.05)
        return f"{time.perf_counter() - start:.1f}"
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="*", type=int, default=[2000, 6000, 20000])
    ap.add_argument("--side-by-side", action="store_true", help="the grid's cells point by point")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose workflow runs")
    ap.add_argument("--limit-s", type=float, default=600, help="a command's longest wait")
    ap.add_argument(
        "--repeat", type=int, default=1, help="take each N times: median [min-max] wall seconds"
    )
    args = ap.parse_args()
    print("wall seconds (CPU seconds)" if args.repeat == 1 else "wall seconds, median [range]")
    print(flush=True)
    print("| cells | snakemake -n | snakemake -n --quiet | run: first job | check-config |")
    print("|---:|---:|---:|---:|---:|", flush=True)
    for n in args.cells:
        with tempfile.TemporaryDirectory() as d:
            # the repository's config (its other settings), with only this grid
            cfg = yaml.safe_load((REPO / "config.yaml").read_text())
            grid, cells = grid_of(cfg, n, args.side_by_side)
            cfg.update(run=["scale"], output_dir=f"{d}/results", grids={"scale": grid})
            (Path(d) / "config.yaml").write_text(json.dumps(cfg))
            snakemake = [sys.executable, "-m", "snakemake", "--cores", "1", "--quiet", "rules"]
            snakemake += ["-s", str(args.repo / "Snakefile"), "--configfile", "config.yaml"]
            check = [sys.executable, "-m", "attnbench", "check-config", "config.yaml"]
            at = (Path(d), args.repo, args.limit_s)
            times = [
                repeated(lambda: timed(snakemake + ["-n"], *at), args.repeat),
                repeated(lambda: timed(snakemake + ["-n", "--quiet"], *at), args.repeat),
                repeated(lambda: until_first_job(snakemake, *at), args.repeat),
                repeated(lambda: timed(check, *at), args.repeat),
            ]
        print(f"| {cells:,} | {' | '.join(times)} |", flush=True)


if __name__ == "__main__":
    main()
