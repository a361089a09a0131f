"""One run per output folder: a lock file inside the folder, held for as long as a run writes to it.

Snakemake's own lock lives in the working folder's .snakemake/, so two clones (or two working
folders) writing one output folder never see each other's: both measured every cell at once, each
cell slowed by the other's. This lock is `<output_dir>/.attnbench/run.lock`, taken with flock(2)
when a run starts (workflow/rules/common.smk, onstart; `python -m attnbench regenerate`) and held by
that process' open file. A second run is refused at once, naming the holder (host, pid, start,
command) that the file holds.

The operating system releases a flock when its process ends, however it ends (SIGKILL, a crash),
so a lock left by a killed run is free: the next run takes it over and says whose it was. Cells
end with their run (attnbench.launch watches the process named by RUN_PID_ENV), so a run that took
over the lock measures alone. The lock is as good as flock on the filesystem of the output folder:
local filesystems and NFS (Linux emulates flock with NFS locks) hold it across hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

LOCK_FILE = ".attnbench/run.lock"
# The process a run's cells belong to: Snakemake's, set when the workflow is read. A cell whose
# ancestors no longer include it (its run was killed) stops (attnbench.launch).
RUN_PID_ENV = "ATTNBENCH_RUN_PID"


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
