# Config loading and validation, grid expansion, and the input functions every stage uses.
import gc
import json
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

# The package is installed in editable mode by the Makefile; this keeps a bare checkout working too.
sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from attnbench import families, snakemake_fixes
from attnbench.pipeline import currency
from attnbench.run import launch
from attnbench.run import lock as run_lock
from attnbench.codegraph import code_files
from attnbench.grid.config import ConfigError, cell_timeout_s, read_yaml, report_settings
from attnbench.grid.expand import cell_path, point_id, stable_hash
from attnbench.grid.json_files import json_file, spec_file, write_json_files, write_spec_files
from attnbench.kernels import catalog
from attnbench.pipeline import tidy
from attnbench.pipeline.tidy import drawn_from, folder_grids
from attnbench.record.validate import RecordError
from attnbench.report import outputs
from attnbench.report.collect import samples_path

try:
    for _f in workflow.configfiles:
        read_yaml(_f)  # Snakemake's own reading would keep the last of a repeated key silently
    CFG = families.validate(config)
except ConfigError as e:
    raise WorkflowError(str(e))

# Snakemake's scheduler, changed before it is made (attnbench.snakemake_fixes says why).
snakemake_fixes.sigterm_without_deadlock()
if workflow.remote_exec:
    snakemake_fixes.keep_going_in_batches()
snakemake_fixes.log_each_finished_job(lambda job: cell_finished(job))
snakemake_fixes.group_readiness_in_group_time()
snakemake_fixes.function_params_read_once()
snakemake_fixes.job_info_only_when_shown()
snakemake_fixes.dry_run_gives_back_nothing()
snakemake_fixes.conda_env_without_params()
snakemake_fixes.scheduler_chatter_off(workflow.output_settings)
# A large grid's DAG is millions of objects, few of them in reference cycles: the collector's
# default passes over them took a fifth of its planning (benchmarks/planning_time.py).
gc.set_threshold(100_000, 20, 100)

OUT = CFG["output_dir"].rstrip("/")
RUN = CFG["run"]
GRIDS = {g: CFG["grids"][g] for g in RUN}
CELLS = {f"{OUT}/{cell_path(c)}": c for c in families.expand_cells(CFG)}
PKG = str(Path(workflow.basedir) / "workflow" / "attnbench")
# The cells this process starts end when it does, even killed (attnbench.run.launch watches it).
os.environ[run_lock.RUN_PID_ENV] = str(os.getpid())
LOCK = run_lock.RunLock(OUT)
JSON_FILES = {}  # what the rules' commands read from files (as_file), written when the run starts


wildcard_constraints:
    grid=r"[A-Za-z0-9_\-]+",
    family="|".join(families.running_with("cell")),
    impl=r"[A-Za-z0-9_]+",
    mask=r"[A-Za-z0-9_]+",
    point=r"[A-Za-z0-9_.\-]+",


CELL_RULES = ("kernel_cell", "point_record", "cp_cell")
PROGRESS = None  # attnbench.report.progress.Progress of this run, made at its first finished cell


def cell_finished(job):
    """The line a finished cell's job logs (attnbench.report.progress): the cell, its status and seconds,
    the counts so far by status, the time left."""
    global PROGRESS
    from attnbench.report.progress import Progress, report_seconds

    if job.rule.name not in CELL_RULES:
        return None
    if PROGRESS is None:
        try:  # the cells this run set out to make: its DAG's cell jobs
            todo = [str(j.output[0]) for j in job.dag.needrun_jobs() if j.rule.name in CELL_RULES]
        except Exception:  # noqa: BLE001 - without the DAG: the cells without a current record
            todo = records_not_on_disk() + [o.path for o in OUTDATED]
        PROGRESS = Progress(
            CELLS, todo or [str(job.output[0])], started=RUN_STARTED, report_s=report_seconds(OUT)
        )
    return PROGRESS.line(str(job.output[0]))


def cell_of(wc, family=None):
    """The cell behind a record's path (family: the rule's own when its path names it)."""
    path = f"{OUT}/cells/{wc.grid}/{family or wc.family}/{wc.impl}/{wc.mask}/{wc.point}.json"
    try:
        return CELLS[path]
    except KeyError:
        raise WorkflowError(
            f"{path} is not a cell of the grids {', '.join(RUN)} in this config"
        ) from None


def cell_env(cell):
    """The conda environment of the cell's device, relative to workflow/rules/ (envs/cpu.yaml,
    envs/cuda.yaml)."""
    return f"../../envs/{cell['device']}.yaml"


def cells_env(cell_of_job):
    """A cell rule's conda environment: where the run's cells share one device, its file (which
    Snakemake then resolves once, not once per job), else each job's cell's (cell_of_job(wc))."""
    devices = {c["device"] for c in CELLS.values()}
    if len(devices) == 1:
        return cell_env({"device": devices.pop()})
    return lambda wc: cell_env(cell_of_job(wc))


def run_priority(cell):
    """Higher runs first: the shorter the sequence, the sooner."""
    return 2**20 / cell["seqlen"]


def as_file(obj):
    """The path of the file a command reads `obj` from (grid.json_files: named by its hash, never
    on the command line, where a large histogram or description would not fit)."""
    path = json_file(OUT, obj)
    JSON_FILES[path] = obj
    return path


# Records a run would not make as they are (attnbench.pipeline.currency), judged once, by the process that
# runs the workflow, from the records themselves. Their cells list OUTDATED_LIST as an input, newer
# than their record: Snakemake makes them again. Every other cell lists it too, as ancient (its
# time is not compared), so that the set of a cell's inputs never changes.
OUTDATED_LIST = f"{OUT}/.attnbench/outdated.txt"
# A dry run writes nothing under OUT (a read-only folder; a live run's list): it writes its list
# in Snakemake's temporary folder, gone when it ends, and its cells of outdated records name that
# copy, newer than their records as the list is; the others name the list, or the copy where no
# run has written one yet.
DRY_RUN = bool(workflow.output_settings and workflow.output_settings.dryrun)
WRITTEN_LIST = f"{workflow.snakemake_tmp_dir}/outdated.txt" if DRY_RUN else OUTDATED_LIST
# KEPT: outdated records a run keeps (outdated_records: keep; records this environment cannot run)
OUTDATED, KEPT = [], []
if workflow.is_main_process:
    try:  # a record that contradicts itself stops the run before any cell, naming all of them
        OUTDATED = currency.judge(CELLS, currency.limits(CFG, RUN))
    except RecordError as e:
        raise WorkflowError(str(e)) from None
    KEEP_OUTDATED = CFG["outdated_records"] == "keep"
    if OUTDATED:
        logger.warning(
            currency.summary(OUTDATED, sum(os.path.exists(p) for p in CELLS), KEEP_OUTDATED)
        )
    OUTDATED, KEPT = currency.to_make_again(OUTDATED, KEEP_OUTDATED)
    Path(WRITTEN_LIST).parent.mkdir(parents=True, exist_ok=True)
    Path(WRITTEN_LIST).write_text(
        f"# {datetime.now(timezone.utc).isoformat()} {len(OUTDATED) + len(KEPT)} outdated "
        f"records; {len(OUTDATED)} made again, {len(KEPT)} kept\n"
        + "".join(f"{o.line()}\n" for o in OUTDATED)
        + "".join(f"kept: {o.line()}\n" for o in KEPT)
    )
RERUN = {o.path for o in OUTDATED}
if DRY_RUN and not os.path.exists(OUTDATED_LIST):
    OUTDATED_LIST = WRITTEN_LIST


def record_of(wc, family=None):
    return f"{OUT}/cells/{wc.grid}/{family or wc.family}/{wc.impl}/{wc.mask}/{wc.point}.json"


def outdated_input(wc, family=None):
    return WRITTEN_LIST if record_of(wc, family) in RERUN else ancient(OUTDATED_LIST)


def outdated_input_of(family=None):
    """A cell rule's input `outdated` (outdated_input); where no record is to be made again, the
    list, ancient, for every job: no function called per job (a large grid's planning)."""
    if not RERUN:
        return ancient(OUTDATED_LIST)
    return lambda wc: outdated_input(wc, family)


# Kernel cells measured side by side (grid key side_by_side: the cell spec's `side_by_side`): one
# job per grid point measures them all (rule kernel_point) into one file of their records, which
# rule point_record takes apart; the other kernel cells are a job each (rule kernel_cell).
POINTS = {}  # the point's file of records -> its cells' record paths
POINT_OF = {}  # a side-by-side cell's record path -> its point's file
for _path, _c in CELLS.items():
    if _c.get("side_by_side"):
        _point = f"{OUT}/points/{_c['grid']}/{_c['family']}/{_c['mask']}/{point_id(_c)}.json"
        POINTS.setdefault(_point, []).append(_path)
        POINT_OF[_path] = _point
SIDE_BY_SIDE_GRIDS = sorted({CELLS[p]["grid"] for p in POINT_OF})


def one_of(names):
    """A wildcard's pattern matching exactly these names (none: nothing)."""
    return f"(?:{'|'.join(map(re.escape, names)) or '(?!)'})"


# the grid wildcard of each cell rule: the run's grids only (the records of other grids in the
# output folder are their tidy tables' inputs, made by no rule), side by side or one by one
SIDE_BY_SIDE_GRID = one_of(SIDE_BY_SIDE_GRIDS)
SINGLE_CELL_GRID = one_of([g for g in RUN if g not in SIDE_BY_SIDE_GRIDS])
RUN_GRID = one_of(RUN)


def point_file(wc):
    return f"{OUT}/points/{wc.grid}/{wc.family}/{wc.mask}/{wc.point}.json"


def point_cells(wc):
    """The cells of the point a point job measures (their specs), in the grid's kernel order."""
    return [CELLS[p] for p in POINTS[point_file(wc)]]


def point_outdated_input(wc):
    """A point is measured again, all its contenders side by side, when any of its records is
    outdated (attnbench.pipeline.currency) or missing (deleted to measure it again)."""
    cells = POINTS[point_file(wc)]
    again = any(p in RERUN or not os.path.exists(p) for p in cells)
    return WRITTEN_LIST if again and os.path.exists(point_file(wc)) else ancient(OUTDATED_LIST)


def point_record_input(wc):
    """The point's file of records a record is taken from; none where the point has no such file
    and each of its records is on disk and current or kept (made before point jobs, or on
    another machine: attnbench.pipeline.currency): those stay as they are, never measured again here.
    """
    point = POINT_OF[record_of(wc)]
    if os.path.exists(point):
        return point
    again = any(p in RERUN or not os.path.exists(p) for p in POINTS[point])
    return point if again else []


def point_needs_gpu(wc):
    return int(any(catalog.needs_device(catalog.get(c["impl"]), c) for c in point_cells(wc)))


def _point_contents():
    """What each point job reads (families/kernel/point.py): its cells' specs, records, budgets."""
    from attnbench.families.kernel.point import Contender, point_file_content
    from attnbench.grid.spec import CellSpec

    return {
        point: point_file_content(
            point_id(CELLS[paths[0]]),
            [
                Contender(CellSpec.from_dict(CELLS[p]), p, cell_timeout_s(GRIDS[CELLS[p]["grid"]]))
                for p in paths
            ],
        )
        for point, paths in POINTS.items()
    }


POINT_FILES = _point_contents()


def point_spec_file(wc):
    return spec_file(OUT, point_file(wc))


def cell_spec_file(wc, family=None):
    """The file the cell reads its spec from (grid.json_files: named by the record, so that this
    parameter never changes: whether a record is current is attnbench.pipeline.currency's to say).
    """
    cell_of(wc, family)  # a path of no cell of this config is an error here, naming the grids
    return spec_file(OUT, record_of(wc, family))


def peak_file(cell):
    return f"{OUT}/device/{cell['device']}-{cell['dtype']}.json"


def peak_input(cell_of_job):
    """A cell rule's input `peak`, ancient (measuring the ceiling again must not rerun every cell):
    where the run's cells share one, its path, else each job's cell's (cell_of_job(wc)): no
    function called per job where none is needed (a large grid's planning)."""
    peaks = {peak_file(c) for c in CELLS.values()}
    if len(peaks) == 1:
        return ancient(peaks.pop())
    return lambda wc: ancient(peak_file(cell_of_job(wc)))


def grid_records(grid):
    return [p for p, c in CELLS.items() if c["grid"] == grid]


# Each grid's tidy tables (attnbench.pipeline.tidy): the run's grids' from their cells' records,
# and those of the other grids with records in the output folder, from the records on disk; the
# output folder's tidy tables are their union.
TABLED = {
    g: (
        grid_records(g)
        if g in GRIDS
        else sorted(str(p) for p in Path(OUT, "cells", g).rglob("*.json"))
    )
    for g in sorted({*RUN, *folder_grids(OUT)})
}
TABLED_GRID = one_of(TABLED)
UNION_TABLE = str(tidy.union_table(OUT))
# Their code: the rows (report.collect) and this stage's module. Whether a record is outdated
# (pipeline.currency) reaches them through the records and the kept ones' list (collect's params).
TIDY_CODE = [*code_files("attnbench.report.collect"), f"{PKG}/pipeline/tidy.py"]
_KEPT_BY_GRID = {}
for _o in KEPT:
    _KEPT_BY_GRID.setdefault(CELLS[_o.path]["grid"], []).append(_o.line())
KEPT_HASH = {g: stable_hash(sorted(lines)) for g, lines in _KEPT_BY_GRID.items()}


def grid_table(grid):
    return str(tidy.grid_table(OUT, grid))


def grid_samples(grid):
    return str(samples_path(tidy.grid_table(OUT, grid)))


def figure_tables(grid):
    """The tidy tables a grid's figures read (attnbench.pipeline.tidy.drawn_from)."""
    return [str(t) for t in drawn_from(CFG, OUT, grid, TABLED)]


def table_files(grid):
    return [f"{OUT}/tables/{grid}/{n}" for n in families.table_names(GRIDS[grid])]


def figure_files(grid):
    return [
        f"{OUT}/figures/{grid}/{n}"
        for n in families.figure_names(GRIDS[grid], CFG["figures"]["formats"])
    ]


def rule_code(*modules):
    """The package's files a rule's command runs: `python -m attnbench`'s dispatcher and its
    command line (the cli/ package's files alone: its commands import their modules when run)
    and every module the given modules import, transitively (attnbench.codegraph). As the rule's
    inputs, editing any of them reruns exactly the rules that use it."""
    cli = sorted(str(p) for p in Path(PKG, "cli").glob("*.py"))
    return [f"{PKG}/__main__.py", *cli, *code_files(*modules)]


def report_code(grid, part):
    """The code of a grid's table (part 'TABLES') or figure ('FIGURES') rule."""
    return rule_code(*families.command_modules(GRIDS[grid]["family"], part))


def caption_files(grid, kind):
    """The report caption written beside each table (kind 'tables') or figure ('figures')."""
    names = (
        families.table_caption_names(GRIDS[grid])
        if kind == "tables"
        else families.figure_caption_names(GRIDS[grid])
    )
    return [f"{OUT}/{kind}/{grid}/{n}" for n in names]


def _for_report(path, grid, kind, stem):
    # The caption is generated next to the file; absolute, because Snakemake resolves caption
    # paths against the rule file's folder.
    caption = os.path.abspath(f"{OUT}/{kind}/{grid}/{stem}{outputs.CAPTION_SUFFIX}")
    what = "figure" if kind == "figures" else "table"
    return report(path, caption=caption, category=grid, subcategory=kind, labels={what: stem})


def table_outputs(grid):
    """Tables and captions; the HTML page of each table goes into `snakemake --report`."""
    out = [
        _for_report(f, grid, "tables", Path(f).stem) if f.endswith(outputs.REPORT_TABLE) else f
        for f in table_files(grid)
    ]
    return out + caption_files(grid, "tables")


def figure_outputs(grid):
    """Figures and captions; one format of each figure (PNG where made) goes into the report."""
    shown = outputs.report_format(CFG["figures"]["formats"])
    out = [
        _for_report(f, grid, "figures", Path(f).stem) if f.endswith(f".{shown}") else f
        for f in figure_files(grid)
    ]
    return out + caption_files(grid, "figures")


def report_outputs():
    return [f"{OUT}/tables/cells.csv", f"{OUT}/tables/samples.csv"] + [
        f
        for g in RUN
        for f in table_files(g)
        + figure_files(g)
        + caption_files(g, "tables")
        + caption_files(g, "figures")
    ]


def records_not_on_disk():
    """Records still missing, as direct targets: Snakemake does not look upstream of an existing,
    up-to-date file, so a tidy table made from a partial run (`attnbench regenerate`, or committed
    results in a fresh clone) would otherwise hide the cells that never ran."""
    return [p for p in CELLS if not os.path.exists(p)]


def records_behind_a_table():
    """The records still missing of the grids whose tidy table exists (records_not_on_disk): a
    grid without one has its collect job run, which needs every record of it (listing them here
    too would only lengthen a large grid's planning)."""
    tabled = {g for g in RUN if os.path.exists(grid_table(g))}
    return [p for p in records_not_on_disk() if CELLS[p]["grid"] in tabled]


def write_grid_table(grid, cells, log):
    """The collect rule's work, in this process (attnbench.pipeline.tidy): a grid's tidy tables
    from its records, one row per record with the `outdated` column, and one per record and
    sample (what the paired answers read)."""
    from attnbench.pipeline.tidy import write_grid_tables

    ours = {p: c for p, c in CELLS.items() if c["grid"] == grid} if grid in GRIDS else None
    try:
        made = write_grid_tables(CFG, OUT, grid, ours, Path(cells))
    except RecordError as e:
        raise WorkflowError(f"collect: {e}") from None
    Path(log).write_text(f"{grid}: {made.cells} cells, {made.samples} samples\n")


def write_union_table(tables, cells, log):
    """The union rule's work: every grid's tidy tables, one after another (attnbench.pipeline.tidy)."""
    from attnbench.pipeline.tidy import write_union

    rows, samples = write_union(tables, Path(cells))
    others = [g for g in TABLED if g not in GRIDS]
    Path(log).write_text(
        f"{rows} cells, {samples} samples of {len(TABLED)} grids"
        + (f" ({', '.join(others)}: not run, from their records on disk)" if others else "")
        + "\n"
    )


# The context-parallel cell rule's input functions (rules/context_parallel.smk).


def cp_cell_of(wc):
    return cell_of(wc, "cp")


def cp_ranks(wc):
    return cp_cell_of(wc)["gpus"]


def cp_placement(wc):
    cell = cp_cell_of(wc)
    return cell["cp"]["nodes"], cell["cp"]["nproc_per_node"], cell["device"]


def cp_launch_args(wc):
    nodes, nproc, device = cp_placement(wc)
    return f"--nodes {nodes} --nproc-per-node {nproc} --gpus-per-node {nproc if device == 'cuda' else 0}"


def cp_resource(name):
    """Slurm/local resources of a cp cell's nodes x ranks (attnbench.run.launch.resources)."""
    return lambda wc: launch.resources(*cp_placement(wc))[name]


# ---------------------------------------------------------------- the run's start and end


RUN_STARTED = (
    time.monotonic()
)  # the time left is counted from the start (attnbench.report.progress)


def start_run():
    """Before the first job: take the output folder's lock (refused, naming the holder, while
    another run writes there), then write the files the jobs read their parameters from."""
    try:
        left = LOCK.acquire()
    except run_lock.RunLocked as e:
        raise WorkflowError(str(e)) from None
    if left is not None:
        logger.warning(run_lock.taken_over_note(OUT, left))
    write_json_files(OUT, JSON_FILES.values())
    write_spec_files(OUT, CELLS)
    write_spec_files(OUT, POINT_FILES)


def end_run(ok):
    """After the last job: where the run did not finish, draw what did (the tidy table, tables and
    figures from the records on disk, their captions listing the missing cells); then the closing
    summary (every crashed and missing cell), and the lock is released."""
    from attnbench.report.progress import closing_summary, keep_report_seconds

    try:
        if not ok:
            draw_what_finished()
        elif PROGRESS is not None:  # the tables and figures took the time since the last cell
            keep_report_seconds(OUT, PROGRESS)
        for line in closing_summary(CELLS, OUT):
            logger.info(line)
    finally:
        LOCK.release()


def draw_what_finished():
    from attnbench.pipeline.regenerate import regenerate

    logger.info("some jobs failed: drawing the tables and figures of the records on disk")
    try:
        regenerate(CFG, RUN, say=logger.info)
    except Exception as e:  # noqa: BLE001 - the run has failed already; say why this failed too
        logger.warning(f"drawing what finished failed: {type(e).__name__}: {e}")
