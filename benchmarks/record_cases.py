"""What each case of "a record is what it says" does to the records already on disk, shown on a tiny
CPU grid: a copy of the workflow in a temporary folder runs the grid once, then each case runs its
command there, and the records are checksummed (SHA-256) before and after. Prints a Markdown table:
the command, what happened (the first line it printed, or the cells it ran), and how many finished
records changed. The tests that hold each case are named in docs/running.md; this shows them at
once, end to end, with issue 56's: records that contradict themselves (signed again, so that the
contradiction refuses them, not their record_sha256), the warm worker's environment, a frozen
worker, code a cell runs edited, a figure of every kernel out of memory, advise's refusals. About
6 minutes on 2 cores, 10 where others share them; results/cpu/record_cases.md is its output.

    python benchmarks/record_cases.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timedelta
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

    def run(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args),
            cwd=self.root,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=1200,
        )

    def snakemake(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return self.run(PY, "-m", "snakemake", "--cores", "2", *args, env=env)

    def attnbench(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(PY, "-m", "attnbench", *args)

    def record(self, name: str) -> Path:
        """A record of out/ by its '{impl}/{mask}/s{seqlen}' start."""
        return next((self.out / "cells/tiny/kernel").glob(f"{name}-*.json"))

    @contextmanager
    def edited(self, changes: dict):
        """Records edited ({path: change(record)}), restored after. A record signed by its writer
        (record_sha256) is signed again over the edit: what refuses it is then the contradiction
        itself, as for a record a faulty writer made, not the signature."""
        saved = {path: path.read_text() for path in changes}
        try:
            for path, change in changes.items():
                r = json.loads(saved[path])
                change(r)
                path.write_text(json.dumps(r, indent=1))
                if "record_sha256" in r:
                    self.run(PY, "-c", RESIGN, str(path)).check_returncode()
            yield
        finally:
            for path, text in saved.items():
                path.write_text(text)

    def append(self, rel: str, text: str = "\n# an edit\n"):
        path = self.root / rel
        path.write_text(path.read_text() + text)


RESIGN = (
    "import json, sys\n"
    "from attnbench.record.record import CHECKSUM, content_sha256\n"
    "p = sys.argv[1]; r = json.load(open(p)); r[CHECKSUM] = content_sha256(r)\n"
    "open(p, 'w').write(json.dumps(r, indent=1))"
)


def records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "cells").rglob("*.json"))]


def alive(pid) -> bool:
    return pid is not None and Path(f"/proc/{pid}").exists()


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
    """How many cells a run measured and their statuses, from its per-cell lines
    (attnbench.report.progress: '... | 2 of 2 done (1 ok, 1 oom)')."""
    lines = [x for x in (p.stdout + p.stderr).splitlines() if x.startswith("tiny: ")]
    if p.returncode:
        return f"exit {p.returncode}: {first_line(p)}"
    if not lines:
        return "ran no cell"
    statuses = re.search(r"done \(([^)]*)\)", lines[-1])
    cells = f"{len(lines)} cell" + ("s" if len(lines) != 1 else "")
    return f"ran {cells}" + (f" ({statuses[1]})" if statuses else "")


def refused(p: subprocess.CompletedProcess) -> list[str]:
    """The files a refusal of records names, each with its problems (record.validate.read_all)."""
    lines = (p.stderr + "\n" + p.stdout).splitlines()
    start = next((i for i, x in enumerate(lines) if "record file(s) refused" in x), None)
    if start is None:
        return []
    out = []
    for x in lines[start + 1 :]:
        if not x.startswith("  "):
            break
        out.append(x.strip())
    return out


def refusal(p: subprocess.CompletedProcess) -> str:
    files = refused(p)
    if not files:
        return f"exit {p.returncode}: {first_line(p)} (no refusal of records)"
    return f"exit {p.returncode}, {len(files)} file(s) refused: " + "; ".join(files)


def said(p: subprocess.CompletedProcess, word: str) -> str:
    """The first line of the command's output that holds `word`."""
    lines = (p.stdout + "\n" + p.stderr).splitlines()
    return next((x.strip() for x in lines if word in x), f"(no line with {word!r})")


# ---------------------------------------------------------------- issue 56's cases

TIMINGS = ("time_ms_median", "time_ms_p20", "time_ms_p80", "tflops", "tflops_p20", "tflops_p80")


def relabelled_unsupported(r):
    r["status"], r["status_reason"] = "unsupported", "relabelled by hand"
    for key in (*TIMINGS, "fraction_of_peak"):
        r.pop(key, None)


def samples_untimed(r):
    relabelled_unsupported(r)
    for sample in r["samples"]:
        for key in [k for k in sample if k.startswith(("time_ms", "tflops"))]:
            del sample[key]


def day_ahead(r):
    r["finished_at"] = (datetime.fromisoformat(r["finished_at"]) + timedelta(days=1)).isoformat()


CONTRADICTIONS = (
    ("tflops doubled", lambda r: r.update(tflops=2 * r["tflops"])),
    (
        "check_passed false, max_rel_err 0.9, status ok",
        lambda r: r.update(check_passed=False, max_rel_err=0.9),
    ),
    ("an ok record relabelled unsupported, its timings removed", relabelled_unsupported),
    ("the same, its samples' times removed too", samples_untimed),
    ("a sample without mask_area", lambda r: r["samples"][0].pop("mask_area")),
    ("environment a list", lambda r: r.update(environment=sorted(r["environment"]))),
    ("finished_at a day ahead", day_ahead),
)


def both(f: Folder) -> str:
    """What `snakemake --cores 2` and `attnbench check-config` do with the records as they are."""
    sm, cc = f.snakemake(), f.attnbench("check-config")
    if not refused(sm):
        return (
            f"accepted: snakemake {ran(sm)}; check-config exit {cc.returncode}: "
            f"{said(cc, 'records on disk')}"
        )
    now = re.compile(r" \(\d{4}-\d\d-\d\dT[^)]*\)")  # a clock-skew refusal names its now
    same = [now.sub("", x) for x in refused(cc)] == [now.sub("", x) for x in refused(sm)]
    again = f"exit {cc.returncode}, the same refusal" if same else refusal(cc)
    return f"snakemake {refusal(sm)}. check-config: {again}"


def contradictions(f: Folder, case):
    """Records that contradict themselves, each edited into one record, then two at once."""
    one, other = f.record("naive/causal/s64"), f.record("sdpa/causal_document/s128")
    command = "snakemake --cores 2; attnbench check-config"
    for what, change in CONTRADICTIONS:
        with f.edited({one: change}):
            edited = checksums(f.out)
            outcome = both(f)
            if outcome.startswith("accepted"):
                outcome += f"; cells.csv: {tidy_status(f.out, 'naive', 'causal', '64')}"
            after = checksums(f.out)
        case(
            f"a record that contradicts itself (signed again): {what}",
            command,
            outcome,
            edited,
            after,
        )
    two = {one: CONTRADICTIONS[0][1], other: CONTRADICTIONS[5][1]}
    with f.edited(two):
        edited = checksums(f.out)
        outcome = both(f)
        after = checksums(f.out)
    case(
        "two such records at once (tflops doubled; environment a list; signed again)",
        command,
        outcome,
        edited,
        after,
    )


def tidy_status(out: Path, impl: str, mask: str, seqlen: str) -> str:
    """The status the tidy table gives a cell."""
    with open(out / "tables/cells.csv") as fh:
        row = next(
            r
            for r in csv.DictReader(fh)
            if (r["impl"], r["mask"], r["seqlen"]) == (impl, mask, seqlen)
        )
    return f"{impl} {mask} S={seqlen} {row['status']}"


def code_edits(f: Folder, case):
    """A file every cell runs edited, one the cells' code lists lacked before issue 56."""
    for rel in ("attnbench/harness/cpu_math.py", "attnbench/__main__.py"):
        before = checksums(f.out)
        f.append(f"workflow/{rel}")
        cc, sm = f.attnbench("check-config"), f.snakemake()
        case(
            f"a file the cells run edited ({rel})",
            f"(append a comment to {rel}) attnbench check-config; snakemake --cores 2",
            f"check-config: {said(cc, 'records on disk')}. snakemake: {ran(sm)}",
            before,
        )


def seen(out: Path) -> tuple[str, set]:
    """The CPU capabilities torch had in a folder's records, and the workers that measured them."""
    rs = records(out)
    caps = sorted({r["environment"]["cpu"]["torch_capability"] for r in rs})
    pids = {(r.get("worker") or {}).get("pid") for r in rs}
    counts = ", ".join(
        f"{c} in {sum(r['environment']['cpu']['torch_capability'] == c for r in rs)}" for c in caps
    )
    return (
        f"torch_capability {counts} of {len(rs)} records; worker pid "
        + ", ".join(str(p) for p in sorted(pids, key=str)),
        pids,
    )


def warm_worker(f: Folder, case):
    """A warm worker started under ATEN_CPU_CAPABILITY=default, a plain run beside it, then the
    plain run's worker frozen (SIGSTOP) as a cell comes."""
    f.cfg["grids"]["tiny"]["worker_idle_s"] = 60  # cells measured in one warm process
    f.write_config()
    before = checksums(f.out)
    p = f.snakemake("--config", "output_dir=out_default", env={"ATEN_CPU_CAPABILITY": "default"})
    said_default, first = seen(f.root / "out_default")
    case(
        "a run under ATEN_CPU_CAPABILITY=default in a warm worker (worker_idle_s: 60), into out_default/",
        "ATEN_CPU_CAPABILITY=default snakemake --cores 2 --config output_dir=out_default",
        f"{ran(p)}; {said_default}",
        before,
    )
    before = checksums(f.out)
    was = ", ".join(f"{pid} {'alive' if alive(pid) else 'gone'}" for pid in sorted(first, key=str))
    p = f.snakemake("--config", "output_dir=out2")
    said_plain, second = seen(f.root / "out2")
    case(
        "then a plain run into out2/, that worker still warm",
        "snakemake --cores 2 --config output_dir=out2",
        f"{ran(p)}, the first run's worker at its start: {was}; {said_plain}",
        before,
    )

    frozen = next(iter(second))
    before = checksums(f.out)
    stopped = alive(frozen)
    if stopped:
        os.kill(frozen, signal.SIGSTOP)
    try:
        cell = f.record("sdpa/causal/s64")
        cell.unlink()
        p = f.snakemake()
        log = next((f.out / "logs/cells/tiny/kernel/sdpa/causal").glob("s64-*.log"))
        r = json.loads(cell.read_text()) if cell.exists() else {}
        outcome = (
            f"{ran(p)}: status {r.get('status')}, measured by worker pid "
            f'{(r.get("worker") or {}).get("pid")}; its log: "{said_text(log, "is stopped")}"; '
            f"pid {frozen} now {'alive' if alive(frozen) else 'gone'}"
        )
    finally:
        if alive(frozen):  # not killed by the job: ours to end
            os.kill(frozen, signal.SIGKILL)
    case(
        f"the warm worker frozen (SIGSTOP pid {frozen}, {'alive' if stopped else 'gone'} "
        "before), one record deleted",
        f"kill -STOP {frozen}; rm sdpa/causal/s64-….json; snakemake --cores 2",
        outcome,
        before,
    )


def said_text(path: Path, word: str) -> str:
    return next((x.strip() for x in path.read_text().splitlines() if word in x), "")


def figures(folder: Path, since: float = 0) -> str:
    pngs = sorted(folder.glob("*.png"))
    new = [p for p in pngs if p.stat().st_mtime >= since]
    return f"{len(new)} of {len(pngs)} figures drawn"


def placeholders(text: str) -> str:
    stems = re.findall(r"figure (\S+) not drawn", text)
    return f"{len(stems)} placeholders" + (f" ({', '.join(stems)})" if stems else "")


def all_oom(f: Folder, case):
    """Every kernel of one mask out of memory, for real: full_document at S=256K (its dense mask
    needs 64 GiB, more than the machine has), added to the grid; then the figures redrawn."""
    f.cfg["grids"]["tiny"]["also"] = [{"masks": ["full_document"], "seqlen": [262144]}]
    f.write_config()
    before = checksums(f.out)
    t = time.time()
    p = f.snakemake()
    log = f.out / "logs/figures_tiny.log"
    drawn = f"{figures(f.out / 'figures/tiny', t)}, {placeholders(log.read_text() if log.exists() else '')}"
    case(
        "every kernel of one mask out of memory (full_document at S=256K added to the grid)",
        "snakemake --cores 2",
        f"{ran(p)}; {drawn}",
        before,
    )
    before = checksums(f.out)
    t = time.time()
    p = f.attnbench("regenerate")
    case(
        "its figures drawn again",
        "attnbench regenerate",
        f"exit {p.returncode}: {said(p, 'records ->')}; {figures(f.out / 'figures/tiny', t)}, "
        f"{placeholders(p.stderr)}",
        before,
    )


def advise_cases(f: Folder, case):
    for what, args in (
        ("advise's overview of a table with no train answers (fwd only)", ["--overview"]),
        (
            "advise, a filter repeated, one value not in the table",
            ["--mask", "causal", "--mask", "full"],
        ),
    ):
        before = checksums(f.out)
        p = f.attnbench("advise", *args)
        case(
            what,
            f"attnbench advise {' '.join(args)}",
            f"exit {p.returncode}: {first_line(p)}",
            before,
        )
    before = checksums(f.out)
    p = f.attnbench("advise", "--mask", "causal", "--mask", "causal_document")
    answers = re.findall(r"^tiny \(kernel\), (\w+), S=(\d+)", p.stdout, re.M)
    case(
        "the same, both in the table",
        "attnbench advise --mask causal --mask causal_document",
        f"exit {p.returncode}: answers for " + ", ".join(f"{m} S={s}" for m, s in answers),
        before,
    )
    before = checksums(f.out)
    p = f.attnbench("records", "--grids", "nosuch")
    case(
        "records of a grid the config lacks",
        "attnbench records --grids nosuch",
        f"exit {p.returncode}: {first_line(p)}",
        before,
    )


def machine() -> str:
    """The machine and the commit the copy was taken from."""

    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout

    dirty = " with uncommitted changes" if git("status", "--porcelain").strip() else ""
    return (
        f"Machine {os.uname().nodename}, {len(os.sched_getaffinity(0))} cores; commit "
        f"{git('rev-parse', '--short', 'HEAD').strip()}{dirty}."
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", help="run in this folder (kept) instead of a temporary one")
    a = ap.parse_args()
    root = Path(a.keep or tempfile.mkdtemp(prefix="record_cases_"))
    root.mkdir(parents=True, exist_ok=True)
    f = Folder(root)
    rows = []

    def case(what: str, command: str, outcome: str, before: dict, after: dict | None = None):
        after = checksums(f.out) if after is None else after
        rows.append((what, f"`{command}`", outcome, changed(before, after)))

    header = machine()

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
    threads = f.cfg["grids"]["tiny"].get("cpu_threads", 1)
    f.cfg["grids"]["tiny"]["cpu_threads"] = threads + 1
    f.write_config()
    cc = f.attnbench("check-config")
    case(
        f"the grid's cpu_threads ({threads} -> {threads + 1}), {os.cpu_count()} cores",
        "attnbench check-config; snakemake --cores 2",
        f"check-config: {said(cc, 'outdated')}. snakemake: {ran(f.snakemake())}",
        before,
    )

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
        [PY, "-c", "import sys, time; from attnbench.run.lock import RunLock\n"
         "with RunLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)", str(f.out)],
        cwd=root, env=f.env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    holder.stdout.readline()
    f.cfg["grids"]["tiny"]["reps"] = 4  # cells to run, were the folder free
    f.write_config()
    p = f.snakemake()
    holder.kill()
    holder.wait()
    f.cfg["grids"]["tiny"]["reps"] = 3  # the records on disk current again
    f.write_config()
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
        f"{refusal(p)} (the record restored after)",
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

    contradictions(f, case)
    code_edits(f, case)
    warm_worker(f, case)
    all_oom(f, case)
    advise_cases(f, case)

    print(
        f"# Records through each case (a tiny CPU grid, {len(base)} records, {time.time() - t0:.0f} s)\n"
    )
    print(f"{header}\n")
    print("| case | command | what happened | finished records |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
