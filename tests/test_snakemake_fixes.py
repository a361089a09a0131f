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


def test_a_group_is_ready_as_snakemake_says_counting_over_its_members_only():
    """DAG._ready, changed to count a member's dependencies inside its group over the group's
    members: the same answer as Snakemake's scan of every dependency (the report group's collect
    job depends on every record), for a group and for a job of none."""
    from collections import defaultdict

    import snakemake.api  # noqa: F401 - before snakemake.dag, as Snakemake imports them
    from snakemake.dag import DAG

    def snakemakes(dag, job):  # Snakemake 9's own, as it was
        group = dag._group.get(job, None)
        if group is None:
            return dag._n_until_ready[job] == 0
        internal = {j: sum(dag._group.get(dep) == group for dep in dag._dependencies[j]) for j in group}  # fmt: skip
        return all((dag._n_until_ready[j] - internal[j]) == 0 for j in group)

    snakemake_fixes.group_readiness_in_group_time()
    snakemake_fixes.group_readiness_in_group_time()  # a second reading of the Snakefile changes nothing
    records = [f"record{i}" for i in range(1000)]
    report = frozenset({"collect", "tidy", "tables"})  # equal by members, as a GroupJob
    dag = DAG.__new__(DAG)
    dag._group = {j: report for j in report}
    dag._dependencies = defaultdict(dict)
    dag._dependencies.update(
        collect={r: set() for r in records}, tidy={"collect": set()}, tables={"tidy": set()}
    )
    for left in (0, 1, 1000):  # records not yet made
        dag._n_until_ready = {"collect": left, "tidy": 1, "tables": 1, "record0": left}
        for job in ("collect", "tidy", "tables", "record0"):
            assert dag._ready(job) == snakemakes(dag, job) == (left == 0), (job, left)


def test_a_functions_parameters_are_read_once():
    """Snakemake's get_function_params, read once per function: the same parameters as
    inspect.signature, a bound method's from its function (a new object at each access)."""
    import inspect

    import snakemake.common
    import snakemake.rules

    snakemake_fixes.function_params_read_once()
    snakemake_fixes.function_params_read_once()  # a second reading of the Snakefile changes nothing
    params = snakemake.rules.get_function_params
    assert params is snakemake.common.get_function_params and params.read_once

    class Resource:
        def evaluate(self, *args, **kwargs):
            pass

    f = lambda wildcards, attempt: 1  # noqa: E731
    assert params(f) is params(f) and list(params(f)) == ["wildcards", "attempt"]
    one, other = Resource().evaluate, Resource().evaluate
    assert params(one) is params(other) == inspect.signature(one).parameters
    join = str.join  # no weak reference to it
    assert list(params(join)) == list(inspect.signature(join).parameters)


def _job(quiet, plugins=None):
    """A job as Job.log_info reads it, counting how often its shell command is formatted."""
    from types import SimpleNamespace

    from snakemake.settings.enums import Quietness

    settings = SimpleNamespace(
        quiet={Quietness.RULES} if quiet else set(), log_handler_settings=plugins or {}
    )
    workflow = SimpleNamespace(output_settings=settings, dryrun=True, is_local=lambda rule: True)
    dag = SimpleNamespace(
        workflow=workflow, jobid=lambda job: 1, reason=lambda job: "missing output"
    )
    rule = SimpleNamespace(name="kernel_cell", is_checkpoint=False, is_handover=False)

    class Job:
        formatted = 0
        priority, benchmark, message, input, output, log = 0, None, None, [], [], []
        wildcards_dict, resources, threads = {}, {}, 1

        @property
        def shellcmd(self):
            Job.formatted += 1
            return "python -m attnbench cell"

    job = Job()
    job.dag, job.rule = dag, rule
    return job


def test_a_jobs_block_is_built_only_where_it_is_shown():
    """Under --quiet rules (the profiles') no job block is built; without it, or with a logger
    plugin enabled, Snakemake's own log_info runs."""
    import snakemake.jobs

    snakemake_fixes.job_info_only_when_shown()
    snakemake_fixes.job_info_only_when_shown()  # a second reading of the Snakefile changes nothing
    log_info = snakemake.jobs.Job.log_info
    assert log_info.original and not getattr(log_info.original, "original", None)
    quiet, shown, plugin = _job(quiet=True), _job(quiet=False), _job(quiet=True, plugins={"x": 1})
    log_info(quiet)
    assert type(quiet).formatted == 0
    log_info(shown), log_info(plugin)
    assert type(shown).formatted > 0 and type(plugin).formatted > 0


def test_the_schedulers_chatter_is_off_where_rules_are_quiet_and_not_verbose():
    """Under --quiet rules (the profiles'), not --verbose: Snakemake's per-job scheduler lines are
    dropped, its other lines and ours kept; --verbose or another quiet setting keeps them all."""
    import logging
    from types import SimpleNamespace

    from snakemake.logging import logger
    from snakemake.settings.enums import Quietness

    def record(msg, event=None):
        r = logging.LogRecord("snakemake", logging.INFO, __file__, 1, msg, None, None)
        if event:
            r.event = event
        return r

    chatter = [
        record("Select jobs to execute..."),
        record("Execute 2 jobs...", "job_started"),
        record("", "progress"),
        record("Finished jobid: 3 (Rule: kernel_cell)", "job_finished"),
    ]
    kept = [record("c: sdpa/causal/s64: ok in 0.4 s"), record("Job stats:", "run_info")]
    before = list(logger.filters)
    try:
        for settings in (
            SimpleNamespace(verbose=True, quiet={Quietness.RULES}),
            SimpleNamespace(verbose=False, quiet={Quietness.HOST}),
        ):
            snakemake_fixes.scheduler_chatter_off(settings)
            assert logger.filters == before
        quiet = SimpleNamespace(verbose=False, quiet={Quietness.RULES})
        snakemake_fixes.scheduler_chatter_off(quiet)
        snakemake_fixes.scheduler_chatter_off(quiet)  # a second reading changes nothing
        (added,) = [f for f in logger.filters if f not in before]
        assert [added.filter(r) for r in chatter + kept] == [False] * 4 + [True] * 2
    finally:
        logger.filters[:] = before


# ---------------------------------------------------------------- each patch still needed, still allowed


def _target(patch):
    import importlib

    import snakemake.api  # noqa: F401 - imports Snakemake's modules in an order that works

    module, _, path = patch.target.partition(":")
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "original", obj)  # what Snakemake has, patched here or not


def test_the_installed_snakemake_is_one_the_patches_were_checked_on():
    from importlib.metadata import version

    installed = version("snakemake")
    assert installed in snakemake_fixes.CHECKED_ON, (
        f"Snakemake {installed} is installed; attnbench/snakemake_fixes.py was checked on "
        f"{', '.join(snakemake_fixes.CHECKED_ON)}: check each of PATCHES on it (is it still "
        "needed, is its target still there) and add the version to CHECKED_ON"
    )


@pytest.mark.parametrize("patch", snakemake_fixes.PATCHES, ids=lambda p: p.name)
def test_each_patch_names_its_upstream_report_and_its_target_exists(patch):
    assert callable(getattr(snakemake_fixes, patch.name))
    assert patch.upstream
    assert callable(_target(patch)), f"{patch.target} is gone: {patch.name} no longer applies"


def test_unpatched_snakemake_still_takes_the_scheduler_lock_in_its_sigterm_handler():
    """Still needed: Snakemake's own handler waits for the lock (held here by another thread)."""
    (patch,) = [p for p in snakemake_fixes.PATCHES if p.name == "sigterm_without_deadlock"]
    handler = _target(patch)
    scheduler = JobScheduler.__new__(JobScheduler)
    scheduler._lock, scheduler._open_jobs = threading.Lock(), threading.Semaphore(0)
    scheduler._user_kill = None
    scheduler._lock.acquire()
    try:
        t = threading.Thread(target=handler, args=(scheduler,), daemon=True)
        t.start()
        t.join(1.0)
        assert t.is_alive(), "Snakemake's SIGTERM handler no longer waits for the scheduler lock"
    finally:
        scheduler._lock.release()
    t.join(5.0)
    assert scheduler._user_kill == "graceful"


def test_unpatched_snakemake_still_reads_a_functions_parameters_at_each_call(monkeypatch):
    """Still needed: Snakemake computes the signature anew each time."""
    import inspect

    (patch,) = [p for p in snakemake_fixes.PATCHES if p.name == "function_params_read_once"]
    read = _target(patch)
    calls = []
    signature = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda f: calls.append(f) or signature(f))

    def f(wildcards, input):
        return None

    read(f), read(f)
    assert len(calls) == 2, "Snakemake now keeps a function's parameters: the patch can go"


def test_unpatched_snakemake_still_builds_a_jobs_block_under_quiet_rules():
    """Still needed: Snakemake's log_info formats the shell command even where the logger drops
    the block."""
    (patch,) = [p for p in snakemake_fixes.PATCHES if p.name == "job_info_only_when_shown"]
    job = _job(quiet=True)
    _target(patch)(job)
    assert type(job).formatted > 0, (
        "Snakemake now skips a block it does not show: the patch can go"
    )


def test_unpatched_snakemake_still_scans_every_dependency_of_a_group_member():
    """Still needed: DAG._ready goes over all of a member's dependencies (a group's collect job
    depends on every record), not over the group's members."""
    (patch,) = [p for p in snakemake_fixes.PATCHES if p.name == "group_readiness_in_group_time"]
    ready = _target(patch)

    class Counting(set):
        iterated = 0

        def __iter__(self):
            Counting.iterated += 1
            return super().__iter__()

    dag = type("FakeDAG", (), {})()
    member = "collect"
    dag._group = {member: (member,)}
    dag._dependencies = {member: Counting(range(1000))}
    dag._n_until_ready = {member: 0}
    ready(dag, member)
    assert Counting.iterated >= 1, "DAG._ready no longer scans every dependency: the patch can go"


def test_unpatched_snakemake_still_keeps_going_only_as_its_settings_say():
    """Still needed: a scheduler's keep-going comes from the execution settings, which a Slurm
    batch's Snakemake makes without the profile's --keep-going."""
    import inspect

    (patch,) = [p for p in snakemake_fixes.PATCHES if p.name == "keep_going_in_batches"]
    source = inspect.getsource(_target(patch))
    assert "self.keepgoing = self.workflow.execution_settings.keep_going" in source, (
        "JobScheduler.__init__ no longer sets keepgoing from the settings: check the patch"
    )


class _Finished:
    """A finished job whose resources count how often they are read."""

    read = 0

    @property
    def scheduler_resources(self):
        _Finished.read += 1
        return {"_cores": 1, "mem_mb": 100}


def _scheduler(dryrun: bool):
    scheduler = JobScheduler.__new__(JobScheduler)
    scheduler.dryrun = dryrun
    scheduler.resources = {"_cores": 1, "mem_mb": 1000}
    return scheduler


def test_a_dry_run_gives_back_no_resources_and_a_run_gives_back_what_its_job_took():
    snakemake_fixes.dry_run_gives_back_nothing()
    snakemake_fixes.dry_run_gives_back_nothing()  # a second reading of the Snakefile changes nothing
    free = JobScheduler._free_resources
    assert free.original and not getattr(free.original, "original", None)
    _Finished.read = 0
    dry, run = _scheduler(dryrun=True), _scheduler(dryrun=False)
    free(dry, _Finished())
    assert _Finished.read == 0 and dry.resources == {"_cores": 1, "mem_mb": 1000}
    free(run, _Finished())
    assert _Finished.read == 1 and run.resources == {"_cores": 2, "mem_mb": 1100}


def test_unpatched_snakemake_still_reads_every_jobs_resources_in_a_dry_run():
    """Still needed: Snakemake's _free_resources reads the job's resources in a dry run too, where
    the scheduler took none."""
    (patch,) = [p for p in snakemake_fixes.PATCHES if p.name == "dry_run_gives_back_nothing"]
    _Finished.read = 0
    dry = _scheduler(dryrun=True)
    _target(patch)(dry, _Finished())
    assert _Finished.read == 1, "a dry run no longer gives back resources: the patch can go"


class _Job:
    """A job as Job.conda_env_spec reads it, counting how often its params are made."""

    made = 0

    def __init__(self, conda_env):
        from types import SimpleNamespace

        self.wildcards_dict, self.input, self._conda_env_spec = {"grid": "g"}, [], None
        self.rule = SimpleNamespace(_conda_env=conda_env, expand_conda_env=self.expand)

    @property
    def params(self):
        type(self).made += 1
        return {"spec": "x.json"}

    def expand(self, wildcards, params=None, input=None):
        return f"env of {self.rule._conda_env}" if self.rule._conda_env else None


def test_a_jobs_fixed_conda_env_is_resolved_without_making_its_params():
    """A rule's fixed `conda:` file (or none) is resolved without the job's params; a function
    given to `conda:` still gets them."""
    import snakemake.jobs

    snakemake_fixes.conda_env_without_params()
    snakemake_fixes.conda_env_without_params()  # a second reading of the Snakefile changes nothing
    spec = snakemake.jobs.Job.conda_env_spec.fget
    assert spec.original and not getattr(spec.original, "original", None)
    _Job.made = 0
    assert spec(_Job("../../envs/cpu.yaml")) == "env of ../../envs/cpu.yaml"
    assert spec(_Job(None)) is None
    assert _Job.made == 0
    spec(_Job(lambda wildcards, params: "../../envs/cpu.yaml"))
    assert _Job.made == 1


def test_unpatched_snakemake_still_makes_a_jobs_params_for_its_conda_env():
    """Still needed: Snakemake's conda_env_spec makes the job's params for a fixed `conda:` file."""
    (patch,) = [p for p in snakemake_fixes.PATCHES if p.name == "conda_env_without_params"]
    _Job.made = 0
    _target(patch)(_Job("../../envs/cpu.yaml"))
    assert _Job.made == 1, (
        "Snakemake no longer makes params for a fixed conda env: the patch can go"
    )
