"""One run per output folder: a lock file inside the folder, held for as long as a run writes to it.

Snakemake's own lock lives in the working folder's .snakemake/, so two clones (or two working
folders) writing one output folder never see each other's: both measured every cell at once, each
cell slowed by the other's. This lock is `<output_dir>/.attnbench/run.lock`, taken with flock(2)
when a run starts (workflow/rules/common.smk, onstart; `python -m attnbench regenerate`) and held by
that process' open file. A second run is refused at once, naming the holder (host, pid, start,
command) that the file holds.

The operating system releases a flock when its process ends, however it ends (SIGKILL, a crash),
so a lock left by a killed run is free: the next run takes it over and says whose it was. Cells
end with their run (attnbench.run.launch watches the process named by RUN_PID_ENV), so a run that took
over the lock measures alone. The lock is as good as flock on the filesystem of the output folder:
local filesystems and NFS (Linux emulates flock with NFS locks) hold it across hosts.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

LOCK_FILE = ".attnbench/run.lock"
# The process a run's cells belong to: Snakemake's, set when the workflow is read. A cell whose
# ancestors no longer include it (its run was killed) stops (attnbench.run.launch).
RUN_PID_ENV = "ATTNBENCH_RUN_PID"
# How often a process of a run looks whether its run still lives.
WATCH_S = 1.0
PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) an output folder's lock."""

    host: str
    pid: int
    started_at: str
    command: str
    cwd: str

    def describe(self) -> str:
        return (
            f"pid {self.pid} on host {self.host}, started {self.started_at} UTC in {self.cwd}: "
            f"{self.command}"
        )

    @classmethod
    def now(cls, command: str) -> Holder:
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            command=command,
            cwd=os.getcwd(),
        )


class RunLocked(RuntimeError):
    """Another run holds the output folder."""


def _holder(fd: int) -> Holder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 1 << 16).decode(errors="replace")
    try:
        return Holder(**json.loads(text))
    except (ValueError, TypeError):
        return None


class RunLock:
    """The lock of one output folder; acquire() once, release() (or the process' end) frees it."""

    def __init__(self, out_dir):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_FILE
        self.fd: int | None = None

    def acquire(self, command: str | None = None) -> Holder | None:
        """Take the lock, or raise RunLocked naming its holder. Returns the holder of a lock that
        was left behind (its run ended without releasing it: killed) and is now taken over, else
        None."""
        if self.fd is not None:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            who = holder.describe() if holder else "a run that has not written its name yet"
            raise RunLocked(
                f"{self.out_dir}: another run is writing this output folder ({who}); wait for "
                f"it to end or stop it, or choose another output_dir. The lock is {self.path}"
            ) from None
        left = _holder(fd)
        me = Holder.now(command or " ".join(sys.argv))
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(asdict(me)).encode())
        os.fsync(fd)
        self.fd = fd
        return left

    def release(self) -> None:
        """Free the lock, leaving the file empty: an empty lock file is one released in order."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)  # closing the descriptor releases the flock
        self.fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def taken_over_note(out_dir, left: Holder) -> str:
    """What a run says when it takes over a lock its holder never released."""
    return (
        f"{out_dir}: took over the lock of a run that ended without releasing it ({left.describe()}); "
        "its cells ended with it. If Snakemake then says the working folder cannot be locked, "
        "run `snakemake --unlock` once (its own lock, in .snakemake/, was left behind too)"
    )


# ---------------------------------------------------------------- processes that end with their run


def ancestors() -> list[int]:
    """This process' parent, its parent's parent, ... up to init (from /proc: Linux)."""
    out, pid = [], os.getppid()
    while pid > 1 and pid not in out:
        out.append(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def run_to_watch() -> int | None:
    """The run (Snakemake's process, run_lock.RUN_PID_ENV) this cell belongs to, where it is one of
    this process' ancestors: when it is gone (killed), the cell stops. None where the variable is
    unset or names no ancestor (a cell started by hand, or on a Slurm node by another host's run)."""
    try:
        pid = int(os.environ.get(RUN_PID_ENV, ""))
    except ValueError:
        return None
    return pid if pid in ancestors() else None


_RUN: list[int | None] = []  # the run this process belonged to when it began (end_with_run)


def die_with_parent() -> None:
    """This process is killed (SIGKILL) the moment its parent ends, however the parent ends
    (Linux: prctl PR_SET_PDEATHSIG; elsewhere nothing): a cell whose launcher is killed does not
    measure on beside the next cell."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the signal was set
        os._exit(1)


def end_with_run() -> None:
    """Where this process belongs to a run (run_to_watch), a thread ends it (exit 1, writing
    nothing more) the moment the run is gone, as a launcher stops its cell; a report step
    started by Snakemake's shell does not outlive a killed Snakemake."""
    if _RUN:
        return
    _RUN.append(run_to_watch())
    run = _RUN[0]
    if run is None:
        return

    def watch():
        while run in ancestors():
            time.sleep(WATCH_S)
        print(f"the run that started this process (pid {run}) has ended: stopping", flush=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="end_with_run").start()


def run_gone() -> bool:
    """Whether the run this process belonged to (end_with_run) has ended: what it would write now
    is no longer its run's (record.record.write_record refuses it)."""
    return bool(_RUN) and _RUN[0] is not None and _RUN[0] not in ancestors()
