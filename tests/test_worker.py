"""The warm worker (attnbench.run.worker): cells measured one after another in one process keep their
own records and their failures' meaning (a crash fails the job, a stopped job stops its cell)."""

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from attnbench.families import expand_cells, load_config
from attnbench.families.kernel.warm import RUNNER
from attnbench.harness.faults import CRASH_ENV, HANG_ENV, HANG_ONCE_ENV
from attnbench.run.launch import alive
from attnbench.run.worker import socket_path
from bounded import wait_until
from commands import PY, cell_args, launched


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
    for log in socket_path(RUNNER, "cpu", 1).parent.glob("*.log"):
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


# ---------------------------------------------------------------- the worker runs the code its records claim

EDITABLE = '''"""Kernels of one's own, outside the repository, that a test edits under a live worker."""

import os

import torch
import torch.nn.functional as F
from attnbench.kernels.base import Kernel
from attnbench.kernels.catalog import KernelInfo

ZEROS = False  # the test's edit: True


def info(name, impl):
    return KernelInfo(
        name=name, family="dense", summary="SDPA", impl=impl, masks=("causal",),
        directions={"cpu": ("fwd",)},
    )


class Edited(Kernel):
    info = info("edited_sdpa", "editkern:Edited")
    layout = "bhsd"

    def prepare(self, mask):
        def attention(q, k, v):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)
            return torch.zeros_like(out) if ZEROS else out

        return attention


class EnvScaled(Edited):
    info = info("env_scaled", "editkern:EnvScaled")

    def prepare(self, mask):
        attention = super().prepare(mask)
        scale = float(os.environ.get("ATTNBENCH_TEST_SCALE", "1"))  # read in each cell
        return lambda q, k, v: attention(q, k, v) * scale


class SetsThreads(Edited):
    info = info("sets_threads", "editkern:SetsThreads")

    def prepare(self, mask):
        torch.set_num_threads(1)  # a setting of the process, which the next cell must not inherit
        return super().prepare(mask)
'''


@pytest.fixture
def editable(repo, tmp_path, monkeypatch):
    """editkern.py in its own folder, importable here and in the cells' processes; the specs of a
    causal cell of each of its kernels."""
    from attnbench.kernels import catalog

    folder = tmp_path / "own"
    folder.mkdir()
    (folder / "editkern.py").write_text(EDITABLE)
    monkeypatch.syspath_prepend(str(folder))
    before = dict(catalog.KERNELS)
    grid = {
        "family": "kernel",
        "device": "cpu",
        "kernels": ["editkern:Edited", "editkern:SetsThreads", "editkern:EnvScaled"],
        "masks": ["causal"],
        "seqlen": [128],
        "heads": [[2, 1]],
        "head_dim": [16],
        "dtype": ["float32"],
        "direction": ["fwd"],
        "warmup": 0,
        "reps": 2,
    }
    cfg = load_config(repo / "config.yaml", {"run": ["own"], "grids": {"own": grid}})
    yield folder, {c["impl"]: c for c in expand_cells(cfg)}
    catalog.KERNELS.clear()
    catalog.KERNELS.update(before)


def own_run(repo, folder, spec, out, idle_s, threads=1, **extra):
    env = run_env(repo, **extra)
    env["PYTHONPATH"] += f":{folder}"
    cmd = [PY, *cell_args(spec, out, "--threads", str(threads), "--worker-idle-s", str(idle_s))]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def test_a_kernel_edited_under_a_live_worker_is_run_as_edited(repo, editable, tmp_path):
    folder, specs = editable
    spec = specs["edited_sdpa"]
    first = own_run(repo, folder, spec, tmp_path / "1.json", idle_s=60)
    assert first["status"] == "ok" and first["worker"]["cell"] == 1
    source = folder / "editkern.py"
    source.write_text(EDITABLE.replace("ZEROS = False", "ZEROS = True"))
    # the first worker still listens (60 s idle); the edited kernel's cell must not go to it
    assert alive(first["worker"]["pid"])
    edited = own_run(repo, folder, spec, tmp_path / "2.json", idle_s=60)
    assert edited["status"] == "incorrect", edited["status_reason"]
    assert edited["worker"]["pid"] != first["worker"]["pid"]
    assert edited["code"]["sha256"] != first["code"]["sha256"]
    assert edited["kernel"]["source"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    name = str(source.resolve())
    assert edited["code"]["files"][name] == hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    # as a fresh process finds it
    fresh = own_run(repo, folder, spec, tmp_path / "3.json", idle_s=0)
    assert fresh["status"] == "incorrect" and fresh["code"] == edited["code"]


def test_a_cell_that_changes_threads_leaves_the_next_cell_of_its_worker_as_it_was(
    repo, editable, tmp_path
):
    folder, specs = editable
    changer = own_run(repo, folder, specs["sets_threads"], tmp_path / "a.json", 30, threads=2)
    assert changer["status"] == "ok"
    assert changer["environment"]["cpu_threads"] == 1  # it ran with what it set ...
    assert changer["worker"]["process_state_changed"] == ["threads 2 -> 1"]  # ... and says so
    after = own_run(repo, folder, specs["edited_sdpa"], tmp_path / "b.json", 30, threads=2)
    assert after["worker"]["pid"] == changer["worker"]["pid"]  # the same worker (same files)
    assert after["worker"]["cell"] == changer["worker"]["cell"] + 1
    assert (
        after["environment"]["cpu_threads"] == 2 and "process_state_changed" not in after["worker"]
    )


def test_a_worker_whose_code_is_not_the_jobs_refuses_the_cell_and_ends(
    repo, cells, tmp_path, capsys
):
    """A worker that imported other files than the job finds (edited in between: the key then
    matches, the code does not) measures nothing: it ends, and so does each new one that
    disagrees; no record is written."""
    from attnbench.run.worker import WorkerError, run_in_worker

    request = {
        "spec": cells[0],
        "code_sha256": "0" * 64,  # files the worker never saw
        "peak": None,
        "out": str(tmp_path / "never.json"),
        "cwd": str(tmp_path),
        "client_started": time.time(),
        "gpu_wait_s": None,
        "env": {},
    }
    with pytest.raises(WorkerError, match="no worker accepted the cell"):
        run_in_worker(request, RUNNER, "cpu", 3, idle_s=30)
    assert not (tmp_path / "never.json").exists()
    told = [line for line in capsys.readouterr().out.splitlines() if "this worker runs" in line]
    assert len(told) == 4 and len({line.split(":")[0] for line in told}) == 4  # 4 workers
    assert "the job's files hash to 000000000000" in told[0]
    assert not socket_path(RUNNER, "cpu", 3).exists()  # the last refusing worker ended too


# ---------------------------------------------------------------- the worker's key: libraries, settings


def test_a_keyed_variable_gets_its_own_worker_and_any_other_is_the_cells_own(
    repo, editable, tmp_path
):
    """ATEN_CPU_CAPABILITY is read when torch loads: a job with another value gets another
    worker, and its record says the capability it ran with. A variable outside the key
    (worker.KEYED_ENV) is the job's own: set for its cell in the shared worker, gone after."""
    folder, specs = editable
    plain = own_run(repo, folder, specs["env_scaled"], tmp_path / "a.json", 30)
    scaled = own_run(
        repo, folder, specs["env_scaled"], tmp_path / "b.json", 30, ATTNBENCH_TEST_SCALE="3"
    )
    again = own_run(repo, folder, specs["env_scaled"], tmp_path / "c.json", 30)
    assert [r["status"] for r in (plain, scaled, again)] == ["ok", "incorrect", "ok"]
    assert plain["worker"]["pid"] == scaled["worker"]["pid"] == again["worker"]["pid"]
    default = own_run(
        repo, folder, specs["env_scaled"], tmp_path / "d.json", 30, ATEN_CPU_CAPABILITY="default"
    )
    assert default["worker"]["pid"] != plain["worker"]["pid"]
    assert default["environment"]["cpu"]["torch_capability"] == "DEFAULT"
    if plain["environment"]["cpu"]["torch_capability"] != "DEFAULT":
        after = own_run(repo, folder, specs["env_scaled"], tmp_path / "e.json", 30)
        assert after["worker"]["pid"] == plain["worker"]["pid"]
        assert after["environment"]["cpu"]["torch_capability"] != "DEFAULT"


def test_the_worker_key_follows_the_installed_libraries_and_keyed_variables(monkeypatch):
    """An upgrade (another installed version of a library a record names) or another value of a
    keyed variable is another worker; a variable outside the key is not."""
    from attnbench.harness import environment
    from attnbench.run.worker import keyed_env, passed_env

    base = socket_path(RUNNER, "cpu", 1)
    monkeypatch.setenv("ATTNBENCH_SOMETHING_ELSE", "1")
    assert socket_path(RUNNER, "cpu", 1) == base
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    tuned = socket_path(RUNNER, "cpu", 1)
    assert tuned != base
    real = environment.library_versions()
    monkeypatch.setattr(environment, "library_versions", lambda: {**real, "torch": "99.0"})
    assert socket_path(RUNNER, "cpu", 1) not in (base, tuned)
    env = {"CUDA_VISIBLE_DEVICES": "0", "NCCL_ALGO": "Ring", "HOME": "/root", "X": "1"}
    assert keyed_env(env) == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_ALGO": "Ring"}
    assert passed_env(env) == {"HOME": "/root", "X": "1"}


def test_a_record_names_the_version_its_process_imported(monkeypatch):
    """After an upgrade under a live process, the version it runs is the one it imported."""
    import types

    from attnbench.kernels.libraries import first_version

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="0.0.1+old"))
    assert first_version(("torch",)) == "torch 0.0.1+old"


def test_a_stopped_worker_is_killed_and_the_cell_goes_to_a_new_one(repo, cells, tmp_path):
    """A worker stopped (SIGSTOP) between cells: the next job finds it stopped, kills it and
    gets a new worker, instead of waiting until its time budget for a false `timeout`."""
    first = run(repo, cells[0], tmp_path / "1.json", idle_s=60)
    assert first.returncode == 0, first.stderr
    pid = json.loads((tmp_path / "1.json").read_text())["worker"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        second = run(repo, cells[1], tmp_path / "2.json", idle_s=5)
        assert second.returncode == 0, second.stderr
        assert f"worker pid {pid} is stopped: killed" in second.stdout
        record = json.loads((tmp_path / "2.json").read_text())
        assert record["status"] == "ok" and record["worker"]["pid"] != pid
        assert time.monotonic() - t0 < 120
        assert wait_until(lambda: not alive(pid), 10)
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_busy_past_the_jobs_deadline_is_killed_and_the_job_measures_the_cell(
    repo, cells, tmp_path
):
    """A worker that hangs in a cell (not stopped: busy) is killed once it has not answered by the
    job's deadline (half the launcher's time budget), and the cell is measured in the job's own
    process before any `timeout` record."""
    out = tmp_path / "r.json"
    cmd = launched(
        ["--time-limit-s", "40", "--record", str(out)], *cell_cmd(cells[0], out, 30)[1:]
    )
    hang = {HANG_ENV: "sdpa/", HANG_ONCE_ENV: str(tmp_path / "hung-once")}
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=run_env(repo, **hang))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "had not answered by the job's deadline: killed" in p.stdout
    record = json.loads(out.read_text())
    assert record["status"] == "ok" and "worker" not in record  # measured by the job itself
    assert 18 < time.monotonic() - t0 < 40
    hung = [line for line in p.stdout.splitlines() if "had not answered" in line][0]
    pid = int(hung.split("pid ")[1].split(")")[0])
    assert wait_until(lambda: not alive(pid), 10)
