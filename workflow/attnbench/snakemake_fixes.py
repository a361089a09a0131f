"""Two changes to Snakemake's job scheduler, made by workflow/rules/common.smk while the Snakefile is
read (before the scheduler exists). Each works around a Snakemake behaviour that would lose or hang
a benchmark run; the tests named below show both."""

from __future__ import annotations

import os
import threading

from snakemake.scheduling.job_scheduler import JobScheduler


def keep_going_in_batches() -> None:
    """Inside a Slurm batch (a group job) Snakemake runs without --keep-going and reads no profile,
    so one crashed cell would leave the batch's later cells unstarted and the rerun would resubmit
    them too (snakemake#2508). Its settings do not exist yet while the Snakefile is read, so the
    batch's scheduler is told to keep going once made (tests/slurm/test_smoke_grid.py)."""
    init = JobScheduler.__init__

    def init_keeping_going(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.keepgoing = True

    JobScheduler.__init__ = init_keeping_going


def sigterm_without_deadlock() -> None:
    """SIGTERM (scancel of the driver, `kill`) is Snakemake's graceful stop. Its handler takes the
    scheduler's lock, a non-reentrant one, on the main thread; a SIGTERM landing while the main
    thread itself holds that lock (finishing a job) waited for it forever, and the run hung
    (tests/test_failures.py, the SIGTERM tests). The handler here only writes a byte to a pipe, which
    takes no lock; a thread waiting on the pipe does Snakemake's own stop, waiting for the lock like
    any other thread."""
    if getattr(JobScheduler.exit_gracefully, "relayed", False):
        return  # the Snakefile read twice in one process
    stop = JobScheduler.exit_gracefully
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    to_stop: list[JobScheduler] = []

    def relay():
        while os.read(read_end, 1):
            while to_stop:
                stop(to_stop.pop())

    def on_sigterm(self, *args):
        to_stop.append(self)
        try:
            os.write(write_end, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of earlier signals: the relay is already woken

    on_sigterm.relayed = True
    threading.Thread(target=relay, name="sigterm-relay", daemon=True).start()
    JobScheduler.exit_gracefully = on_sigterm
