"""Changes to Snakemake's job scheduler, made by workflow/rules/common.smk while the Snakefile is
read (before the scheduler exists). Two work around a Snakemake behaviour that would lose or hang
a benchmark run; the third logs a line of ours per finished job. The tests named below show them."""

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


def log_each_finished_job(describe) -> None:
    """After each job that Snakemake finishes without error, log `describe(job)` (None: nothing)
    on Snakemake's own log: a run then says what each cell found as it goes, not only "N of M
    steps" (tests/test_workflow.py). Snakemake has no hook per job; its postprocessing of a job's
    outputs is where a job is known to be done, locally, in a Slurm batch and for its driver."""
    from snakemake.jobs import Job
    from snakemake.logging import logger

    if getattr(Job.postprocess, "describes", False):
        return  # the Snakefile read twice in one process
    postprocess = Job.postprocess

    async def postprocess_and_log(self, *args, **kwargs):
        result = await postprocess(self, *args, **kwargs)
        if not kwargs.get("error", False):
            try:
                line = describe(self)
            except Exception as e:  # noqa: BLE001 - a line that cannot be made stops no run
                line = f"{self.rule.name}: finished ({type(e).__name__} describing it: {e})"
            if line:
                logger.info(line)
        return result

    postprocess_and_log.describes = True
    Job.postprocess = postprocess_and_log
