"""Run a command with a time limit and, past it, end its whole process group (torchrun and
every rank it started), so a hung distributed test never leaves processes behind; wait for a
condition, with a limit."""

import os
import signal
import subprocess
import time


def run_bounded(cmd, timeout, env=None):
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(
            f"timed out after {timeout} s: {' '.join(cmd[:8])} ...\n{out[-2000:]}\n{err[-2000:]}"
        )
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def wait_until(predicate, limit_s: float) -> bool:
    """Whether predicate() came true within limit_s seconds (looked at every 0.1 s)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()
