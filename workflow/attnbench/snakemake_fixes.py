"""Changes to Snakemake's job scheduler, made by workflow/rules/common.smk while the Snakefile is
read (before the scheduler exists). Two work around a Snakemake behaviour that would lose or hang
a benchmark run; the third logs a line of ours per finished job; the last five keep a large grid's
planning short. The tests named below show them; tests/test_snakemake_fixes.py checks that each
patch's target is still there, that the unpatched Snakemake still behaves as the patch assumes,
and that the installed Snakemake is one they were checked on (PATCHES, CHECKED_ON)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from snakemake.scheduling.job_scheduler import JobScheduler

# The Snakemake versions every patch below was checked on: another version fails
# tests/test_snakemake_fixes.py until each patch is checked again (still needed, still allowed).
CHECKED_ON = ("9.27.0",)


@dataclass(frozen=True)
class Patch:
    name: str  # the function of this module that applies it
    target: str  # what it replaces, 'module:Class.attribute'
    upstream: str  # the upstream report, or why there is none


PATCHES = (
    Patch(
        "keep_going_in_batches",
        "snakemake.scheduling.job_scheduler:JobScheduler.__init__",
        "snakemake/snakemake#2508 (a group job's Snakemake ignores --keep-going)",
    ),
    Patch(
        "sigterm_without_deadlock",
        "snakemake.scheduling.job_scheduler:JobScheduler.exit_gracefully",
        "none found (searched 2026-12-07): exit_gracefully takes the scheduler's non-reentrant "
        "lock inside a signal handler, so a SIGTERM while the main thread holds it hangs the run",
    ),
    Patch(
        "log_each_finished_job",
        "snakemake.jobs:Job.postprocess",
        "none: a feature, not a bug; Snakemake has no per-job hook (its logger plugins see "
        "'N of M steps' only)",
    ),
    Patch(
        "group_readiness_in_group_time",
        "snakemake.dag:DAG._ready",
        "none found (searched 2026-12-07; nearest: snakemake/snakemake#598, non-linear runtime "
        "on large workflows): _ready scans every dependency of each group member",
    ),
    Patch(
        "function_params_read_once",
        "snakemake.common:get_function_params",
        "none found (searched 2026-12-07): inspect.signature is called anew per call",
    ),
    Patch(
        "job_info_only_when_shown",
        "snakemake.jobs:Job.log_info",
        "none found (searched 2026-12-07): a job's block is built (its shell command formatted "
        "three times) before the logger's filter drops it under --quiet rules",
    ),
    Patch(
        "conda_env_without_params",
        "snakemake.jobs:Job.conda_env_spec.fget",
        "none found (searched 2026-12-07): DAG.update_conda_envs asks every job for its conda "
        "environment, with or without conda, and Job.conda_env_spec evaluates the job's params "
        "for it though only a function given to `conda:` reads them",
    ),
    Patch(
        "dry_run_gives_back_nothing",
        "snakemake.scheduling.job_scheduler:JobScheduler._free_resources",
        "none found (searched 2026-12-07): a dry run selects jobs without taking their resources "
        "but gives each job's back, evaluating every resource function of every job",
    ),
)


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
    on_sigterm.original = stop
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


def group_readiness_in_group_time() -> None:
    """Whether a group job is ready (Snakemake's DAG._ready) counted each member's dependencies
    inside the group by scanning all its dependencies: the report group's collect job depends on
    every record, and this runs as each cell finishes, in a dry run too, so planning a grid took
    time quadratic in its cells (20,000 cells: minutes; benchmarks/planning_time.py). Counted here
    over the group's few members instead: the same number (tests/test_snakemake_fixes.py)."""
    from snakemake.dag import DAG

    if getattr(DAG._ready, "per_member", False):
        return  # the Snakefile read twice in one process

    def ready(self, job):
        group = self._group.get(job, None)
        if group is None:
            return self._n_until_ready[job] == 0
        return all(
            self._n_until_ready[j] == sum(d in self._dependencies[j] for d in group) for j in group
        )

    ready.per_member = True
    ready.original = DAG._ready
    DAG._ready = ready


def function_params_read_once() -> None:
    """Snakemake reads the parameters of a rule's functions (input, params, resources, conda,
    threads, priority: inspect.signature) anew at each call, a dozen times per cell job: a fifth
    of a large grid's planning. Read once per function here (a function's parameters never
    change); what cannot be kept (not weakly referable, unhashable) is read each time, as before."""
    import inspect
    import weakref

    import snakemake.common
    import snakemake.jobs
    import snakemake.rules

    read = snakemake.common.get_function_params
    if getattr(read, "read_once", False):
        return  # the Snakefile read twice in one process
    known = weakref.WeakKeyDictionary()  # a function (a bound method's: its own) -> parameters
    methods = weakref.WeakKeyDictionary()

    def params(func):
        # a bound method is made anew at each access (Resource.evaluate, per job and resource)
        where, key = (methods, func.__func__) if inspect.ismethod(func) else (known, func)
        try:
            return where[key]
        except KeyError:
            where[key] = found = read(func)
            return found
        except TypeError:
            return read(func)

    params.read_once = True
    params.original = read
    for module in (snakemake.common, snakemake.jobs, snakemake.rules):
        module.get_function_params = params


def job_info_only_when_shown() -> None:
    """Snakemake builds every job's block (its files, reason, resources, and its shell command,
    formatted three times) before its logger drops it under `--quiet rules`, as the profiles set:
    half of a 20,000-cell `snakemake -n` (benchmarks/planning_time.py). Built only where shown:
    not under `--quiet rules`, unless a logger plugin (which sees every event) is enabled."""
    from snakemake.jobs import Job
    from snakemake.settings.enums import Quietness

    build = Job.log_info
    if getattr(build, "original", None):
        return  # the Snakefile read twice in one process

    def log_info(self, *args, **kwargs):
        shown = self.dag.workflow.output_settings
        if Quietness.RULES in (shown.quiet or ()) and not shown.log_handler_settings:
            return None
        return build(self, *args, **kwargs)

    log_info.original = build
    Job.log_info = log_info


def conda_env_without_params() -> None:
    """Snakemake asks every job for its conda environment while it builds the DAG
    (DAG.update_conda_envs, with or without conda), and Job.conda_env_spec evaluates the job's
    params to pass them, though only a function given to `conda:` reads them: every parameter of
    every job made at planning, a sixth of a 20,000-cell `snakemake -n`. Here a rule's fixed
    environment (or none) is resolved without them; a function's gets them as before. A job's
    params are then made when it runs or is shown."""
    from snakemake.jobs import Job

    spec = Job.conda_env_spec.fget
    if getattr(spec, "original", None):
        return  # the Snakefile read twice in one process

    def conda_env_spec(self):
        if callable(self.rule._conda_env):
            return spec(self)
        if self._conda_env_spec is None:
            self._conda_env_spec = self.rule.expand_conda_env(self.wildcards_dict)
        return self._conda_env_spec

    conda_env_spec.original = spec
    Job.conda_env_spec = property(conda_env_spec)


def dry_run_gives_back_nothing() -> None:
    """A dry run's scheduler selects the jobs without taking their resources (Snakemake skips the
    knapsack then), yet gives each finished job's resources back, which evaluates every resource
    function of every job: a quarter of a 20,000-cell `snakemake -n` (benchmarks/planning_time.py).
    Nothing was taken, so a dry run gives nothing back here; a real run is unchanged."""
    give_back = JobScheduler._free_resources
    if getattr(give_back, "original", None):
        return  # the Snakefile read twice in one process

    def free_resources(self, job):
        if not self.dryrun:
            give_back(self, job)

    free_resources.original = give_back
    JobScheduler._free_resources = free_resources


# Snakemake's scheduler lines around each job ("Select jobs to execute...", "Execute N jobs...",
# "N of M steps (x%) done", "Finished jobid: N" with a timestamp): three quarters of a run's log
# beside its progress lines (log_each_finished_job), warnings and summary.
SCHEDULER_CHATTER = ("job_started", "progress", "job_finished")
SELECTING = "Select jobs to execute..."


def scheduler_chatter_off(output_settings) -> None:
    """Where the run is quiet about rules (the profiles' `quiet: [rules]`) and not --verbose,
    drop Snakemake's per-job scheduler lines from its log, terminal and log file alike; its
    warnings, errors, dry-run tables and our own lines stay. A logging filter, no patch."""
    import logging

    from snakemake.logging import logger
    from snakemake.settings.enums import Quietness

    if output_settings.verbose or Quietness.RULES not in (output_settings.quiet or ()):
        return
    if any(getattr(f, "chatter", False) for f in logger.filters):
        return  # the Snakefile read twice in one process

    class Chatter(logging.Filter):
        chatter = True

        def filter(self, record: logging.LogRecord) -> bool:
            if str(getattr(record, "event", "")) in SCHEDULER_CHATTER:
                return False
            return record.getMessage() != SELECTING

    logger.addFilter(Chatter())
