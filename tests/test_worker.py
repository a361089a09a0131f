"""The warm worker (attnbench.worker): cells measured one after another in one process keep their
own records and their failures' meaning (a crash fails the job, a stopped job stops its cell)."""

import json
import os
import signal
import subprocess
import time

import pytest
from attnbench.families import expand_cells, load_config
from attnbench.harness.faults import CRASH_ENV, HANG_ENV
from attnbench.launch import alive
from attnbench.worker import socket_path
from commands import PY, cell_args


@pytest.fixture(scope="module")
def cells(repo):
    cfg = load_config(repo / "config.yaml")
    return [c for c in expand_cells(cfg, ["smoke"]) if c["impl"] == "sdpa" and c["seqlen"] == 128]


def cell_cmd(spec, out, idle_s=30):
    return [PY, *cell_args(spec, out, "--threads", "1", "--worker-idle-s", str(idle_s))]


# Workers are shared by environment (worker.socket_path): an entry of PYTHONPATH naming these
# tests keeps theirs apart from the worker a workflow run just before may have left idling.
OWN_WORKER = f"/attnbench-test-worker-{os.getpid()}"


def run_env(repo, **extra):
    env = {
        **os.environ,
        "PYTHONPATH": f"{repo / 'workflow'}:{os.environ.get('PYTHONPATH', '')}:{OWN_WORKER}",
    }
    for name in (CRASH_ENV, HANG_ENV):
        env.pop(name, None)
    return {**env, **extra}


def run(repo, spec, out, idle_s=30, cwd=None, **extra):
    return subprocess.run(
        cell_cmd(spec, out, idle_s),
        capture_output=True,
        text=True,
        timeout=300,
        env=run_env(repo, **extra),
        cwd=cwd,
    )


def wait_until(predicate, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_cells_share_one_worker_and_each_keeps_its_record(repo, cells, tmp_path):
    idle_s = 7  # this test's own worker (socket keyed on the environment: threads differ)
    first, second = cells[0], cells[1]
    recs = []
    for i, spec in enumerate((first, second)):
        p = run(repo, spec, tmp_path / f"{i}.json", idle_s)
        assert p.returncode == 0, p.stderr
        assert f"ok: {tmp_path / f'{i}.json'}" in p.stdout
        recs.append(json.loads((tmp_path / f"{i}.json").read_text()))
    assert [r["status"] for r in recs] == ["ok", "ok"]
    assert recs[0]["cell"] == first and recs[1]["cell"] == second
    assert recs[0]["worker"]["pid"] == recs[1]["worker"]["pid"]
    assert recs[1]["worker"]["cell"] == recs[0]["worker"]["cell"] + 1
    assert all(r["samples"][0]["check"]["passed"] for r in recs)
    assert all(r["process_s"] > 0 for r in recs)
    pid = recs[0]["worker"]["pid"]
    # idle: the worker ends by itself and removes its socket
    assert wait_until(lambda: not alive(pid), idle_s + 20)


def test_jobs_in_two_folders_share_a_worker_and_each_record_lands_in_its_own(
    repo, cells, tmp_path
):
    """Snakemake hands a job relative paths; the worker was started from the first job's folder."""
    recs = []
    for i in (0, 1):
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        p = run(repo, cells[i], "record.json", cwd=folder)
        assert p.returncode == 0, p.stderr
        recs.append(json.loads((folder / "record.json").read_text()))
    assert [r["cell"] for r in recs] == cells[:2]
    assert recs[0]["worker"]["pid"] == recs[1]["worker"]["pid"]


def test_a_crash_fails_the_job_without_a_record_and_the_next_cell_gets_a_new_worker(
    repo, cells, tmp_path
):
    spec = cells[0]
    name = f"{spec['impl']}/{spec['mask']}/"
    ok = run(repo, cells[1], tmp_path / "before.json")
    assert ok.returncode == 0, ok.stderr
    crashed = run(repo, spec, tmp_path / "crash.json", **{CRASH_ENV: name})
    assert crashed.returncode != 0 and "crash injected" in crashed.stderr
    assert not (tmp_path / "crash.json").exists()
    after = run(repo, spec, tmp_path / "after.json")
    assert after.returncode == 0, after.stderr
    before_pid = json.loads((tmp_path / "before.json").read_text())["worker"]["pid"]
    after_rec = json.loads((tmp_path / "after.json").read_text())
    assert after_rec["status"] == "ok" and after_rec["worker"]["pid"] != before_pid
    # it ended at the crash, not when idle (30 s)
    assert wait_until(lambda: not alive(before_pid), 10)


def worker_started(out) -> int | None:
    """The pid of the worker whose log says it started the cell writing `out`."""
    for log in socket_path("cpu", 1).parent.glob("*.log"):
        for line in log.read_text().splitlines():
            if line.endswith(f": {out}"):
                return int(line.split(" pid ")[1].split()[0])
    return None


def test_a_job_stopped_mid_cell_takes_its_cell_and_worker_with_it(repo, cells, tmp_path):
    spec, out = cells[2], tmp_path / "hung.json"
    job = subprocess.Popen(
        cell_cmd(spec, out),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=run_env(repo, **{HANG_ENV: f"{spec['impl']}/{spec['mask']}/"}),
    )
    assert wait_until(lambda: worker_started(out), 120), "no worker started the cell"
    pid = worker_started(out)
    time.sleep(1.0)
    assert alive(pid)  # hanging in the cell
    job.send_signal(signal.SIGKILL)  # as the launcher stops a job past its time budget
    job.wait(timeout=30)
    assert wait_until(lambda: not alive(pid), 30)
    assert not out.exists()
