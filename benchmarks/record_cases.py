"""What each case of "a record is what it says" does to the records already on disk, shown on a tiny
CPU grid: a copy of the workflow in a temporary folder runs the grid once, then each case runs its
command there, and the records are checksummed (SHA-256) before and after. Prints a Markdown table:
the command, what happened (the first line it printed, or the cells it ran), and how many finished
records changed. The tests that hold each case are named in docs/running.md; this shows them at
once, end to end.

    python benchmarks/record_cases.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

GRID = {
    "family": "kernel",
    "device": "cpu",
    "kernels": ["naive", "sdpa"],
    "masks": ["causal", "causal_document"],
    "seqlen": [64, 128],
    "heads": [[2, 1]],
    "head_dim": [16],
    "dtype": ["float32"],
    "direction": ["fwd"],
    "samples": {"document": 2, "single": 1},
    "warmup": 0,
    "reps": 2,
}


def checksums(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((out / "cells").rglob("*.json"))
    }


def changed(before: dict, after: dict) -> str:
    kept = [k for k in before if k in after]
    n = sum(before[k] != after[k] for k in kept)
    gone = len(before) - len(kept)
    new = len(set(after) - set(before))
    words = [f"{n} of {len(before)} changed"]
    if gone:
        words.append(f"{gone} removed")
    if new:
        words.append(f"{new} new")
    return ", ".join(words)


class Folder:
    """The workflow copied into a temporary folder, its config holding the tiny grid."""

    def __init__(self, root: Path):
        self.root = root
        for name in ("Snakefile", "config.yaml"):
            shutil.copy(REPO / name, root / name)
        for name in ("workflow", "envs", "profiles"):
            shutil.copytree(
                REPO / name,
                root / name,
                ignore=shutil.ignore_patterns("__pycache__"),
                symlinks=True,
            )
        self.cfg = yaml.safe_load((REPO / "config.yaml").read_text())
        self.cfg.update(run=["tiny"], grids={"tiny": dict(GRID)}, output_dir="out")
        self.write_config()
        self.out = root / "out"
        # the copy's package first: an edit of the copy is what the cells run
        self.env = {
            **os.environ,
            "PATH": f"{Path(PY).parent}:{os.environ['PATH']}",
            "PYTHONPATH": str(root / "workflow"),
        }

    def write_config(self):
        (self.root / "config.yaml").write_text(yaml.safe_dump(self.cfg))

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args), cwd=self.root, env=self.env, capture_output=True, text=True, timeout=1200
        )

    def snakemake(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(PY, "-m", "snakemake", "--cores", "2", *args)

    def attnbench(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(PY, "-m", "attnbench", *args)


def first_line(p: subprocess.CompletedProcess) -> str:
    """What a refusal said: the line after Snakemake's "WorkflowError in file ...", or the first
    line of the command's own (with the next where it ends in a colon)."""
    lines = [x.strip() for x in (p.stderr + "\n" + p.stdout).splitlines() if x.strip()]
    for i, x in enumerate(lines[:-1]):
        if x.startswith("WorkflowError"):
            said = lines[i + 1]
            if said.endswith(":") and i + 2 < len(lines):
                said += " " + lines[i + 2]
            return said[:200]
    skip = ("Using workflow", "Config file", "Assuming")
    mine = [x for x in lines if not x.startswith(skip)]
    if not mine:
        return ""
    said = mine[0] + (" " + mine[1] if mine[0].endswith(":") and len(mine) > 1 else "")
    return said[:200]


def ran(p: subprocess.CompletedProcess) -> str:
    """How many cells a run measured, from its per-cell lines (attnbench.progress)."""
    lines = [x for x in (p.stdout + p.stderr).splitlines() if x.startswith("tiny: ")]
    if p.returncode:
        return f"exit {p.returncode}: {first_line(p)}"
    return f"ran {len(lines)} cells" if lines else "ran no cell"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", help="run in this folder (kept) instead of a temporary one")
    a = ap.parse_args()
    root = Path(a.keep or tempfile.mkdtemp(prefix="record_cases_"))
    root.mkdir(parents=True, exist_ok=True)
    f = Folder(root)
    rows = []

    def case(what: str, command: str, outcome: str, before: dict):
        rows.append((what, f"`{command}`", outcome, changed(before, checksums(f.out))))

    t0 = time.time()
    p = f.snakemake()
    if p.returncode:
        sys.exit(f"the first run failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    base = checksums(f.out)
    rows.append(("the first run", "`snakemake --cores 2`", ran(p), f"{len(base)} records made"))

    before = checksums(f.out)
    case("the same run again", "snakemake --cores 2", ran(f.snakemake()), before)

    before = checksums(f.out)
    sdpa = root / "workflow/attnbench/kernels/sdpa.py"
    sdpa.write_text(sdpa.read_text() + "\n# an edit\n")
    case(
        "a kernel adapter edited",
        "(edit kernels/sdpa.py) snakemake --cores 2",
        ran(f.snakemake()),
        before,
    )

    before = checksums(f.out)
    f.cfg["grids"]["tiny"]["reps"] = 3
    f.write_config()
    case("a config value (reps 2 -> 3)", "snakemake --cores 2", ran(f.snakemake()), before)

    before = checksums(f.out)
    p = f.attnbench("check-config", "--config", "output_dir=$(touch PWNED)")
    outcome = f"exit {p.returncode}: {first_line(p)}; PWNED made: {(root / 'PWNED').exists()}"
    case(
        "a shell command as output_dir",
        "attnbench check-config --config 'output_dir=$(touch PWNED)'",
        outcome,
        before,
    )

    before = checksums(f.out)
    p = f.snakemake("--config", "output_dir=$(touch PWNED)")
    outcome = f"exit {p.returncode}: {first_line(p)}; PWNED made: {(root / 'PWNED').exists()}"
    case(
        "the same, to snakemake", "snakemake --config 'output_dir=$(touch PWNED)'", outcome, before
    )

    for what, key, value in (
        ("a tolerance of .inf", "tolerance_factor", float("inf")),
        ("a length written as a float", "seqlen", [128.0]),
    ):
        before = checksums(f.out)
        cfg = json.loads(json.dumps(f.cfg))
        if key == "tolerance_factor":
            cfg["grids"]["tiny"]["check"] = {"max_seqlen": 512, "tolerance_factor": value}
        else:
            cfg["grids"]["tiny"][key] = value
        (root / "bad.yaml").write_text(yaml.safe_dump(cfg))
        p = f.snakemake("--configfile", "bad.yaml")
        case(
            what,
            "snakemake --configfile bad.yaml",
            f"exit {p.returncode}: {first_line(p)}",
            before,
        )

    before = checksums(f.out)
    holder = subprocess.Popen(
        [PY, "-c", "import sys, time; from attnbench.run_lock import RunLock\n"
         "with RunLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)", str(f.out)],
        cwd=root, env=f.env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    holder.stdout.readline()
    f.cfg["grids"]["tiny"]["reps"] = 4  # cells to run, were the folder free
    f.write_config()
    p = f.snakemake()
    holder.kill()
    holder.wait()
    case(
        "a second run on a folder another run holds",
        "snakemake --cores 2 (while a run holds out/)",
        f"exit {p.returncode}: {first_line(p)}",
        before,
    )

    before = checksums(f.out)
    record = sorted((f.out / "cells").rglob("*.json"))[0]
    saved = record.read_text()
    r = json.loads(saved)
    r["time_ms_median"] = float("nan")
    record.write_text(json.dumps(r))
    p = f.attnbench("regenerate")
    record.write_text(saved)
    case(
        "a record edited by hand to NaN",
        "attnbench regenerate",
        f"exit {p.returncode}: {first_line(p)} (the record restored after)",
        before,
    )

    before = checksums(f.out)
    (root / "empty.csv").write_text("")
    p = f.attnbench("advise", "--cells", "empty.csv", "--mask", "causal")
    case(
        "advise on an empty table",
        "attnbench advise --cells empty.csv --mask causal",
        f"exit {p.returncode}: {first_line(p)}",
        before,
    )

    print(
        f"# Records through each case (a tiny CPU grid, {len(base)} records, {time.time() - t0:.0f} s)\n"
    )
    print("| case | command | what happened | finished records |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
