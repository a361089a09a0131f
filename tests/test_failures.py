"""Every failure the "failure -> what happens" table of docs/running.md lists, made to happen
for real on the CPU: a cell that hangs past its time budget, a context-parallel rank killed with
SIGKILL, the workflow interrupted by SIGINT or SIGTERM, and a file under results/cells that is not
a record.
(The Slurm failures, a job stopped at its time limit and a drained node, are in
tests/slurm/test_failures_slurm.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from attnbench.families import expand_cells, validate
from attnbench.families.kernel.cell import run_cell
from attnbench.grid.config import ConfigError, cell_timeout_s
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import CellSpec
from attnbench.harness.faults import HANG_ENV
from attnbench.record.record import write_record
from attnbench.record.validate import record_problems
from attnbench.report.collect import read_cells
from attnbench.run import launch
from bounded import run_bounded
from commands import (
    PY,
    cp_cell_cmd,
    in_flight,
    package_env,
    planned_jobs,
    records,
    snakemake_cmd,
    wait_for,
)
from tinygrids import config_running, cp_grid, kernel_grid

# Two kernels on one mask and length: the cell that hangs, and one that must still run.
GRID = kernel_grid(description="failure tests", runtime_min=1, cell_timeout_s=10)
HUNG = "naive/causal/s64-h2x1-d16-float32-fwd"
CP_GRID = cp_grid()


def snakemake(workdir: Path, *args: str, timeout=600, **extra_env) -> subprocess.CompletedProcess:
    cmd = snakemake_cmd(workdir, *args, profile="local")
    return run_bounded(cmd, timeout, env=package_env(**extra_env))


def planned(workdir: Path) -> dict:
    return planned_jobs(snakemake(workdir, "-n", timeout=120))


def leftovers(root: Path) -> list[Path]:
    """Half-written records (write_record's temporary files) anywhere under root."""
    return sorted(root.rglob("*.tmp"))


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains text (a test's unique folder)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes() and int(cmdline.parent.name) != os.getpid():
                stat = (cmdline.parent / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(cmdline.parent.name))
        except (OSError, IndexError):
            pass
    return found


# ---------------------------------------------------------------- the time budget in the config


def test_time_budget_defaults_below_the_slurm_limit_and_a_budget_past_it_is_refused():
    cfg = validate(config_running({"g": {**GRID, "runtime_min": 10, "cell_timeout_s": "auto"}}))
    assert cell_timeout_s(cfg["grids"]["g"]) == 540  # 90% of 10 minutes
    default = validate(
        config_running(
            {"g": {k: v for k, v in GRID.items() if k not in ("runtime_min", "cell_timeout_s")}}
        )
    )
    assert (
        default["grids"]["g"]["cell_timeout_s"] == "auto"
        and cell_timeout_s(default["grids"]["g"]) == 1620
    )
    with pytest.raises(
        ConfigError, match=r"grids\.g\.cell_timeout_s: 60 s is not below runtime_min \(60 s\)"
    ):
        validate(config_running({"g": {**GRID, "cell_timeout_s": 60}}))
    with pytest.raises(ConfigError, match="cell_timeout_s"):
        validate(config_running({"g": {**GRID, "cell_timeout_s": 0}}))


# ---------------------------------------------------------------- a cell that hangs


@pytest.fixture(scope="module")
def hung_run(tmp_path_factory):
    """The grid through `snakemake --profile profiles/local` with one cell hanging for ever."""
    workdir = tmp_path_factory.mktemp("hang")
    (workdir / "config.yaml").write_text(yaml.safe_dump(config_running({"hang": GRID})))
    t0 = time.monotonic()
    p = snakemake(workdir, timeout=400, **{HANG_ENV: f"^{HUNG}$"})
    return workdir, p, time.monotonic() - t0


def test_a_hung_cell_is_stopped_at_its_budget_recorded_as_timeout_and_the_run_goes_on(hung_run):
    workdir, p, wall = hung_run
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    log = (workdir / f"results/logs/cells/hang/kernel/{HUNG}.log").read_text()
    assert "hanging: ATTNBENCH_HANG_CELLS" in log and "still running after 10 s" in log
    hung = json.loads((workdir / f"results/cells/hang/kernel/{HUNG}.json").read_text())
    assert hung["status"] == "timeout" and hung["time_budget_s"] == 10
    assert "time budget" in hung["status_reason"] and hung["samples"] == []
    assert not {"tflops", "time_ms_median", "peak_mem_bytes"} & set(
        hung
    )  # a timeout carries no timings
    assert record_problems(hung) == [] and hung["environment"]["torch"]
    # The run went on: the other cell measured, the tidy table, tables and figures made.
    df = read_cells(workdir / "results/tables/cells.csv")
    assert dict(zip(df["impl"], df["status"])) == {"naive": "timeout", "sdpa": "ok"}
    assert df.loc[df["impl"] == "naive", "tflops"].isna().all()
    assert planned(workdir) == {}
    assert not leftovers(workdir / "results") and not processes_mentioning(str(workdir))
    assert wall < 300


def test_timeout_is_drawn_in_tables_and_figures(hung_run):
    from attnbench.families.kernel.figures import bars_at_length, family_lines
    from attnbench.families.kernel.tables import support_table

    workdir, p, _ = hung_run
    assert p.returncode == 0
    tables = workdir / "results/tables/hang"
    assert "| timeout" in (tables / "tflops.md").read_text()
    assert "timeout: stopped at the time budget" in (tables / "tflops.md").read_text()
    df = read_cells(workdir / "results/tables/cells.csv")
    assert (
        support_table(df).loc["naive", "causal"] == "\u2713"
    )  # it ran (as an OOM does): the mask is supported
    _, drawn = bars_at_length(df, "t")
    assert drawn["marks"]["timeout"] == 1 and drawn["bars"] == 1
    # one length: the panel is bars, the timed-out kernel's place carries its T/O mark
    fig, counts = family_lines(df, ["causal"], "tflops", "TFLOP/s", "t")
    assert counts["bar_panels"] == 1 and counts["points"] == 1 and counts["bar_marks"] == 1
    marks = [
        t for ax in fig.axes for t in ax.texts if (t.get_gid() or "").startswith("mark|timeout|")
    ]
    assert [t.get_text() for t in marks] == ["T/O"]
    assert "1 timeout" in (tables / "tflops.caption.rst").read_text()


def test_a_timeout_record_runs_again_when_the_budget_is_raised_and_only_then(hung_run):
    workdir, p, _ = hung_run
    assert p.returncode == 0
    assert planned(workdir) == {}
    config = workdir / "config.yaml"
    original = config.read_text()
    try:
        for budget, runs in ((5, False), (10, False), (20, True)):
            cfg = yaml.safe_load(original)
            cfg["grids"]["hang"]["cell_timeout_s"] = budget
            config.write_text(yaml.safe_dump(cfg))
            dry = snakemake(workdir, "-n", "--printshellcmds", timeout=120)
            plan = planned_jobs(dry)
            if runs:
                assert plan["kernel_cell"] == 1 and f"/{HUNG}.json" in dry.stdout, plan
                assert (
                    "1 time budget (e.g. results/cells/hang/kernel/naive/causal/"
                    "s64-h2x1-d16-float32-fwd.json: time budget: stopped at 10 s; the grid's "
                    "cell_timeout_s is now 20 s)" in dry.stdout + dry.stderr
                )
            else:
                assert plan == {}, (budget, plan)
    finally:
        config.write_text(original)


def test_a_timeout_record_with_timings_or_an_unknown_status_is_not_a_record():
    record = {
        "schema_version": 1,
        "status": "timeout",
        "cell": dict.fromkeys(
            ("grid", "family", "impl", "mask", "seqlen", "direction", "device"), "x"
        ),
    }
    assert record_problems(record) == []
    assert "only ok, incorrect, implausible carry" in record_problems({**record, "tflops": 1.0})[0]
    assert (
        "none of ok, oom, unsupported, unavailable, incorrect, timeout, crashed"
        in record_problems({**record, "status": "hung"})[0]
    )


# ---------------------------------------------------------------- context parallelism


def cp_cell(tokens_per_gpu=32) -> dict:
    (cell,) = expand_cells(
        validate(config_running({"cp": {**CP_GRID, "tokens_per_gpu": [tokens_per_gpu]}}))
    )
    return cell


def test_a_hung_cp_cell_is_stopped_on_every_rank_and_recorded_as_timeout(tmp_path):
    cell = cp_cell()
    out = tmp_path / "cp.json"
    t0 = time.monotonic()
    p = run_bounded(
        cp_cell_cmd(cell, out, "--time-limit-s", "10"),
        180,
        env=package_env(**{HANG_ENV: "^ring_p2p/causal/"}),
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert time.monotonic() - t0 < 10 + launch.STOP_GRACE_S + 60
    r = json.loads(out.read_text())
    assert r["status"] == "timeout" and "tflops" not in r and r["samples"] == []
    # the CP tables' columns are there, without numbers
    assert r["table_extra"]["method"] == "ring_p2p" and r["table_extra"]["tflops_per_gpu"] is None
    assert not processes_mentioning(str(tmp_path)) and not leftovers(tmp_path)


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """RANK -> pid of each cp-cell process below the launcher."""
    ranks = {}
    for pid in launch.descendants(launcher_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        rank = next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), None)
        if rank is not None and b"cp-cell" in cmdline:
            ranks[rank] = pid
    return ranks


def test_a_cp_rank_killed_mid_cell_ends_every_rank_records_the_crash_and_a_rerun_completes(
    tmp_path,
):
    """Both ranks are inside the process group, running collectives (the hang hook keeps them in
    barriers), when rank 1 is killed with SIGKILL: every process of the cell ends within 60 s, no
    half record is left, and the launcher writes a `crashed` record saying how the ranks ended,
    with the last lines of the log; the same command again measures the cell."""
    cell = cp_cell()
    out = tmp_path / "cp.json"
    marker = tmp_path / "cp.log"
    record_it = ["--time-limit-s", "300", "--record", str(out), "--log", str(marker)]
    with marker.open("w") as log:
        proc = subprocess.Popen(
            cp_cell_cmd(cell, out, *record_it),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=package_env(**{HANG_ENV: "^ring_p2p/causal/"}),
            start_new_session=True,
        )
    try:
        # both ranks have reached the hang: the process group is up and its barriers are running
        wait_for(
            lambda: marker.read_text().count("hanging:") == 2, 120, "both ranks inside the cell"
        )
        ranks = rank_pids(proc.pid)
        assert set(ranks) == {0, 1}, ranks
        killed = time.monotonic()
        os.kill(ranks[1], signal.SIGKILL)
        rc = proc.wait(timeout=60)
        ended = time.monotonic() - killed
        wait_for(
            lambda: not processes_mentioning(str(tmp_path)), 30, "every process of the cell ended"
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 0 and ended < 60, (rc, ended)
    assert not leftovers(tmp_path)
    crashed = json.loads(out.read_text())
    assert crashed["status"] == "crashed" and record_problems(crashed) == []
    assert crashed["crash"]["how"] == "exited with status 1" and crashed["samples"] == []
    assert any("SIGKILL" in line or "Signal 9" in line for line in crashed["crash"]["log_tail"])
    assert crashed["table_extra"]["method"] == "ring_p2p"  # the CP tables' columns, no numbers
    print(f"\nrank 1 killed: the launcher recorded the crash {ended:.1f} s later")
    out.unlink()
    p = run_bounded(cp_cell_cmd(cell, out, *record_it), 180, env=package_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert json.loads(out.read_text())["status"] == "ok"


# ---------------------------------------------------------------- the workflow interrupted


INTERRUPTED = {
    **GRID,
    "kernels": ["naive", "sdpa", "sdpa_math"],
    "seqlen": [64, 128],
    "runtime_min": 10,
    "cell_timeout_s": 500,
}
STUCK = "sdpa/causal/s64-h2x1-d16-float32-fwd"


@pytest.mark.parametrize("how", ["SIGINT to the process group (Ctrl-C)", "SIGTERM to snakemake"])
def test_the_workflow_interrupted_mid_run_leaves_no_partial_record_and_a_rerun_runs_only_the_rest(
    tmp_path, how
):
    """Two jobs at a time; one cell is still running (hanging) when the interrupt comes, at least one
    is done, others have not started. Ctrl-C stops the running jobs at once; SIGTERM is Snakemake's
    graceful stop: it starts nothing new and lets the running jobs end, which the time budget bounds
    (the hanging cell ends as `timeout`). Nothing half written stays; the next run (same profile)
    is not blocked by Snakemake's incomplete markers and runs the cells without a record (and a cell
    whose job was ending at the very moment of a Ctrl-C), never one that had finished."""
    sigint = how.startswith("SIGINT")
    grid = {**INTERRUPTED, "cell_timeout_s": 500 if sigint else 30}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config_running({"int": grid})))
    cells = [cell_path(c) for c in expand_cells(validate(config_running({"int": grid})))]
    results = tmp_path / "results"
    stuck_log, log_path = (
        results / f"logs/cells/int/kernel/{STUCK}.log",
        tmp_path / "snakemake.log",
    )

    def ready():
        return (
            stuck_log.exists()
            and "hanging:" in stuck_log.read_text()
            and " done (" in log_path.read_text()  # a cell's progress line: one has finished
        ) or proc.poll() is not None

    with log_path.open("w") as log:
        # --prioritize: the stuck cell starts first; the others run one at a time beside it
        stuck_first = ["--prioritize", f"results/cells/int/kernel/{STUCK}.json"]
        proc = subprocess.Popen(
            snakemake_cmd(tmp_path, "--cores", "2", *stuck_first, profile="local"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=package_env(**{HANG_ENV: f"^{STUCK}$"}),
            start_new_session=True,
            # as from a terminal: under a shell's background job SIGINT is inherited ignored, and
            # Python then installs no KeyboardInterrupt handler, so Ctrl-C would never arrive
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        wait_for(ready, 300, "the stuck cell running and another cell finished")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        interrupted = time.monotonic()
        if sigint:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=grid["cell_timeout_s"] + 90)
        ended = time.monotonic() - interrupted
        wait_for(lambda: not processes_mentioning(str(tmp_path)), 60, "every job of the run ended")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc != 0 if sigint else ended < grid["cell_timeout_s"] + launch.STOP_GRACE_S + 60
    assert not leftovers(results)
    done = records(results / "cells")
    for text in done.values():
        assert record_problems(json.loads(text)) == []  # each record on disk is whole
    stuck = done.get(f"int/kernel/{STUCK}.json")
    assert stuck is None if sigint else json.loads(stuck)["status"] == "timeout"
    assert len(done) < len(cells)
    finished = {k: v for k, v in done.items() if f"results/cells/{k}" not in in_flight(tmp_path)}
    assert finished, (done, in_flight(tmp_path))
    again = len(cells) - len(finished)
    assert planned(tmp_path).get("kernel_cell") == again

    p = snakemake(tmp_path, "--cores", "2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    after = records(results / "cells")
    assert (
        len(after) == len(cells) and {k: after[k] for k in finished} == finished
    )  # not run again
    assert len(pd.read_csv(results / "tables/cells.csv")) == len(cells)
    print(
        f"\n{how}: {len(finished)} of {len(cells)} cells had their record after it, {again} run by the rerun "
        f"({len(done) - len(finished)} of them had a whole record from a job that was ending)"
    )


def test_sigterm_while_the_scheduler_holds_its_lock_still_stops_the_run(tmp_path):
    """Snakemake's SIGTERM handler takes the scheduler's lock on the main thread, so a SIGTERM that
    landed while the scheduler held it (finishing a job) hung the run forever; CI saw it once in the
    test above (attnbench.snakemake_fixes relays the stop to a thread). A SIGTERM every 3 ms while
    jobs start and finish makes that moment certain: without the fix all 3 runs here stuck there,
    nested handlers piling up to a RecursionError. The run must stop gracefully, before every cell
    has started."""
    grid = {**INTERRUPTED, "cell_timeout_s": 60}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config_running({"int": grid})))
    log_path = tmp_path / "snakemake.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            snakemake_cmd(tmp_path, "--cores", "2", profile="local"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=package_env(),
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: (
                (tmp_path / "results/device/cpu-float32.json").exists() or proc.poll() is not None
            ),
            300,
            "the first job finished",
        )
        storm_until = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < storm_until:
            os.kill(proc.pid, signal.SIGTERM)
            time.sleep(0.003)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text()
    # the graceful stop, not a crash: before the fix a storm ended in a hang or a RecursionError
    assert rc != 0 and "Traceback" not in text and "Shutting down" in text, text[-3000:]
    assert text.count("localrule kernel_cell") < len(
        expand_cells(validate(config_running({"int": grid})))
    )
    assert not leftovers(tmp_path / "results")


# ---------------------------------------------------------------- a job that fails


def test_a_job_that_fails_leaves_its_cell_missing_and_the_run_still_draws_what_finished(
    tmp_path,
):
    """A cell's job killed whole (as Slurm stops a job at its time limit: the launcher too, so no
    record): the run goes on, fails at its end, and still writes the tidy table, tables and
    figures of the records there, their captions and its closing summary listing the missing
    cell; the next run runs exactly that cell."""
    grid = {**INTERRUPTED, "cell_timeout_s": 500}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config_running({"int": grid})))
    n = len(expand_cells(validate(config_running({"int": grid}))))
    results = tmp_path / "results"
    stuck_log = results / f"logs/cells/int/kernel/{STUCK}.log"
    log_path = tmp_path / "snakemake.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            snakemake_cmd(tmp_path, "--cores", "2", profile="local"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=package_env(**{HANG_ENV: f"^{STUCK}$"}),
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: (
                (stuck_log.exists() and "hanging:" in stuck_log.read_text())
                or proc.poll() is not None
            ),
            300,
            "the stuck cell running",
        )
        (launcher,) = [  # the stuck cell's launcher (Snakemake gives it relative paths)
            pid
            for pid in processes_mentioning(f"results/cells/int/kernel/{STUCK}.json")
            if b"\0attnbench.run.launch\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
            and Path(f"/proc/{pid}/cwd").resolve() == tmp_path.resolve()
        ]
        for pid in [launcher, *launch.descendants(launcher)]:
            os.kill(pid, signal.SIGKILL)
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text()
    assert rc != 0, text[-3000:]
    missing = f"results/cells/int/kernel/{STUCK}.json"
    assert not (tmp_path / missing).exists()
    assert "drawing the tables and figures of the records on disk" in text
    assert "1 without a record (their job failed or did not run):" in text
    assert f"    {missing} (log: results/logs/cells/int/kernel/{STUCK}.log)" in text
    df = read_cells(results / "tables/cells.csv")
    assert len(df) == n - 1 and set(df["status"]) == {"ok"}
    caption = (results / "tables/int/tflops.caption.rst").read_text().replace("\\", "")
    assert f"1 without a record, not drawn: int/kernel/{STUCK}.json" in caption
    assert (results / "figures/int/tflops_bars_fwd.png").stat().st_size > 0
    assert planned(tmp_path).get("kernel_cell") == 1
    p = snakemake(tmp_path, "--cores", "2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert len(read_cells(results / "tables/cells.csv")) == n
    caption = (results / "tables/int/tflops.caption.rst").read_text()
    assert "without a record, not drawn" not in caption


# ---------------------------------------------------------------- a file that is not a record


def test_collect_stops_at_a_corrupted_or_foreign_json_naming_it_and_changes_nothing(tmp_path):
    cfg = validate(config_running({"c": GRID}))
    root = tmp_path / "results"
    for cell in expand_cells(cfg):
        write_record(run_cell(CellSpec.from_dict(cell)), root / cell_path(cell))
    good = records(root)
    assert len(good) == 2
    table = tmp_path / "cells.csv"
    collect = [
        PY,
        "-m",
        "attnbench",
        "collect",
        "--root",
        str(root / "cells"),
        "--out",
        str(table),
    ]
    assert run_bounded(collect, 120, env=package_env()).returncode == 0
    before = table.read_text()

    victim = root / cell_path(expand_cells(cfg)[0])
    bad_files = {
        "truncated": (victim, good[str(victim.relative_to(root))][:200]),
        "foreign JSON object": (
            root / "cells/c/notes.json",
            json.dumps({"note": "ran on Tuesday"}),
        ),
        "JSON that is a list": (root / "cells/c/kernel/list.json", "[1, 2, 3]"),
        "unknown status": (
            root / "cells/c/kernel/odd.json",
            json.dumps({**json.loads(good[str(victim.relative_to(root))]), "status": "hung"}),
        ),
    }
    for what, (path, text) in bad_files.items():
        path.write_text(text)
        p = run_bounded(collect, 120, env=package_env())
        assert p.returncode != 0, what
        assert "record file(s) refused" in p.stderr, (what, p.stderr[-2000:])
        assert f"\n  {path}: " in p.stderr, (what, p.stderr[-2000:])
        assert "Traceback" not in p.stderr
        assert table.read_text() == before  # the tidy table of the last good collect stays
        # nothing else is lost: every other record is as it was
        now = records(root)
        assert {k: v for k, v in now.items() if Path(root / k) != path} == {
            k: v for k, v in good.items() if Path(root / k) != path
        }
        if path == victim:
            path.write_text(good[str(victim.relative_to(root))])
        else:
            path.unlink()
    assert run_bounded(collect, 120, env=package_env()).returncode == 0
