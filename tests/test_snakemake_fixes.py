"""attnbench.snakemake_fixes, on Snakemake's own scheduler class: a SIGTERM that arrives while the
main thread holds the scheduler's lock stops the run instead of hanging it."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from attnbench import snakemake_fixes
from snakemake.scheduling.job_scheduler import JobScheduler


class Hung(Exception):
    pass


def _hung(*_):
    raise Hung


def test_sigterm_while_this_thread_holds_the_scheduler_lock_returns_and_the_stop_follows():
    snakemake_fixes.sigterm_without_deadlock()
    snakemake_fixes.sigterm_without_deadlock()  # a second reading of the Snakefile changes nothing
    # a scheduler with only what its SIGTERM handler uses (its __init__ needs a whole workflow)
    scheduler = JobScheduler.__new__(JobScheduler)
    scheduler._lock, scheduler._open_jobs = threading.Lock(), threading.Semaphore(0)
    scheduler._user_kill = None
    before = signal.signal(signal.SIGTERM, scheduler.exit_gracefully)
    alarm = signal.signal(signal.SIGALRM, _hung)
    try:
        signal.alarm(10)  # Snakemake's own handler waits here forever: the alarm ends the test
        with scheduler._lock:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs on this thread, lock held
            assert scheduler._user_kill is None  # the stop waits for the lock, like any thread
        signal.alarm(0)
    except Hung:
        pytest.fail("the SIGTERM handler waited for a lock its own thread held")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, alarm)
        signal.signal(signal.SIGTERM, before)
    assert scheduler._open_jobs.acquire(timeout=10)  # the scheduler is woken ...
    assert scheduler._user_kill == "graceful"  # ... to stop gracefully
