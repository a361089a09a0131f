"""Every process of a run ends with it (run.lock): a cell whose launcher is killed dies at once,
a process whose run is killed stops, and what it would still write is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from attnbench.families import expand_cells, validate
from attnbench.harness.faults import HANG_ENV
from attnbench.run.launch import alive
from bounded import wait_until
from commands import PY, cell_args, launched, package_env
from tinygrids import config_running, kernel_grid


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_a_cell_dies_the_moment_its_launcher_is_killed(tmp_path):
    """kill -9 of a cell's launcher: the cell (hanging here) ends at once, writing nothing."""
    (cell,) = expand_cells(validate(config_running({"c": kernel_grid(kernels=["sdpa"])})))
    out = tmp_path / "record.json"
    env = package_env(**{HANG_ENV: "sdpa/"})
    launcher = subprocess.Popen(
        launched(["--time-limit-s", "300"], *cell_args(cell, out)),
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: children(launcher.pid), 60), "the launcher started no cell"
        (child,) = children(launcher.pid)
        assert wait_until(lambda: "hanging" in launcher.stdout.readline(), 60)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        assert wait_until(lambda: not alive(child), 3), "the cell outlived its launcher"
        assert not out.exists()
    finally:
        for pid in children(launcher.pid) + [launcher.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


RUN = """import os, subprocess, sys, time
os.environ["ATTNBENCH_RUN_PID"] = str(os.getpid())  # as the Snakefile sets it
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(child.pid, flush=True)
time.sleep(600)
"""

WATCHED = """import time
from attnbench.run.lock import end_with_run
end_with_run()
time.sleep(600)
"""

WRITER = """import sys, time
from attnbench.run import lock as run_lock
from attnbench.record.record import RunGone, write_json
run_lock._RUN.append(run_lock.run_to_watch())  # belongs to the run, without the watching thread
assert run_lock._RUN[0] is not None and not run_lock.run_gone()
while not run_lock.run_gone():
    time.sleep(0.1)
try:
    write_json({"a": 1}, sys.argv[1])
except RunGone as e:
    print("refused:", e, flush=True)
"""


def start_run(script: str, *args: str):
    run = subprocess.Popen(
        [PY, "-c", RUN, script, *args],
        env=package_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    return run, int(run.stdout.readline())


def test_a_process_of_a_killed_run_stops():
    run, child = start_run(WATCHED)
    time.sleep(1.5)
    assert alive(child)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=10)
    assert wait_until(lambda: not alive(child), 5), "it outlived its run"


def test_what_a_process_of_a_killed_run_writes_is_refused(tmp_path):
    out = tmp_path / "r.json"
    writer = [sys.executable, "-c", WRITER, str(out)]
    run = subprocess.Popen(
        [PY, "-c", RUN.replace('[sys.executable, "-c", sys.argv[1]]', repr(writer))],
        env=package_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(run.stdout.readline())
    time.sleep(1.0)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=10)
    assert wait_until(lambda: not alive(child), 10)
    assert "refused:" in run.stdout.read()
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))
