# Config loading and validation, grid expansion, and the input functions every stage uses.
import json
import os
import sys
from pathlib import Path

# The package is installed in editable mode by the Makefile; this keeps a bare checkout working too.
sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from attnbench import families, launch, snakemake_fixes
from attnbench.codegraph import code_files
from attnbench.grid.config import ConfigError, cell_timeout_s, read_yaml, report_settings
from attnbench.grid.expand import cell_path
from attnbench.kernels import catalog
from attnbench.report import outputs

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

OUT = CFG["output_dir"].rstrip("/")
RUN = CFG["run"]
GRIDS = {g: CFG["grids"][g] for g in RUN}
CELLS = {f"{OUT}/{cell_path(c)}": c for c in families.expand_cells(CFG)}
PKG = str(Path(workflow.basedir) / "workflow" / "attnbench")


wildcard_constraints:
    grid=r"[A-Za-z0-9_\-]+",
    family="|".join(families.running_with("cell")),
    impl=r"[A-Za-z0-9_]+",
    mask=r"[A-Za-z0-9_]+",
    point=r"[A-Za-z0-9_.\-]+",


RECORDED = set()  # the run's record paths on disk, counted at the first finished cell


def cell_finished(job):
    """The line a finished cell's job logs: the cell, what it found, and how many of the run's
    cells have a record now (a long run's progress in cells, not in Snakemake's steps)."""
    from attnbench.record.record import outcome_details

    if job.rule.name not in ("kernel_cell", "cp_cell"):
        return None
    path = str(job.output[0])
    if not RECORDED:
        RECORDED.update(p for p in CELLS if os.path.exists(p))
    RECORDED.add(path)
    record = json.loads(Path(path).read_text())
    details = outcome_details(record)
    return (
        f"cell {path}: {record['status']}{f' ({details})' if details else ''}; "
        f"{len(RECORDED)} of {len(CELLS)} cells recorded"
    )


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


def run_priority(cell):
    """Higher runs first: the shorter the sequence, the sooner."""
    return 2**20 / cell["seqlen"]


def own_kernel_code(cell):
    """The files of a cell's own 'module:Class' kernel (none for a built-in one)."""
    if "kernel_class" not in cell:
        return []
    return list(catalog.own_kernel_files(cell["kernel_class"])[1])


def own_method_code(cell):
    """The files of a cell's own 'module:Class' CP method (none for a built-in one)."""
    from attnbench.cp import catalog as cp_catalog

    if "method_class" not in cell:
        return []
    return list(cp_catalog.own_method_files(cell["method_class"])[1])


def peak_file(cell):
    return f"{OUT}/device/{cell['device']}-{cell['dtype']}.json"


def grid_records(grid):
    return [p for p, c in CELLS.items() if c["grid"] == grid]


def table_files(grid):
    return [f"{OUT}/tables/{grid}/{n}" for n in families.table_names(GRIDS[grid])]


def figure_files(grid):
    return [
        f"{OUT}/figures/{grid}/{n}"
        for n in families.figure_names(GRIDS[grid], CFG["figures"]["formats"])
    ]


def rule_code(*modules):
    """The package's files a rule's command runs: `python -m attnbench`'s dispatcher and every
    module the given modules import, transitively (attnbench.codegraph). As the rule's inputs,
    editing any of them reruns exactly the rules that use it."""
    return [f"{PKG}/__main__.py", *code_files(*modules)]


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
    """Tables and captions; the Markdown of each table goes into `snakemake --report`."""
    out = [
        _for_report(f, grid, "tables", Path(f).stem) if f.endswith(".md") else f
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


def write_tidy_table(records, cells, samples, log):
    """The collect rule's work, in Python rather than a shell command: the records can be more
    than a command line holds. Writes the tidy table and the per-sample table."""
    from attnbench.report.collect import (
        RecordError,
        collect,
        collect_samples,
        read_records,
        write_cells,
    )

    try:
        read = read_records(records)
    except RecordError as e:
        raise WorkflowError(f"collect: {e}") from None
    df, per_sample = collect(records=read), collect_samples(read)
    write_cells(df, cells)
    write_cells(per_sample, samples)
    Path(log).write_text(
        f"{len(df)} cells, {len(per_sample)} samples from {len(records)} records\n"
    )


# The context-parallel cell rule's input functions (rules/context_parallel.smk).


def cp_cell_of(wc):
    return cell_of(wc, "cp")


def cp_library(kernel):
    from attnbench.cp import catalog as cp_catalog

    return cp_catalog.library_version(kernel)


def cp_ranks(wc):
    return cp_cell_of(wc)["gpus"]


def cp_placement(wc):
    cell = cp_cell_of(wc)
    return cell["cp"]["nodes"], cell["cp"]["nproc_per_node"], cell["device"]


def cp_launch_args(wc):
    nodes, nproc, device = cp_placement(wc)
    return f"--nodes {nodes} --nproc-per-node {nproc} --gpus-per-node {nproc if device == 'cuda' else 0}"


def cp_resource(name):
    """Slurm/local resources of a cp cell's nodes x ranks (attnbench.launch.resources)."""
    return lambda wc: launch.resources(*cp_placement(wc))[name]
