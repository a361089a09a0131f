"""Snakemake end to end on a tiny grid in a temporary folder: failures, reruns, regeneration."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml
from attnbench import families
from attnbench.grid.spec import CellSpec
from commands import REPO, planned_jobs, tool_env
from tinygrids import config_running, kernel_grid, snakemake_on_copy, workflow_copy

TINY = kernel_grid(
    description="test grid",
    masks=["causal", "causal_document"],
    seqlen=[64, 128],
    also=[{"kernels": ["fa2"], "masks": ["causal"], "seqlen": [64]}],
)
N_CELLS = 2 * 2 * 2 + 1


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return workflow_copy(tmp_path_factory.mktemp("wf"), config_running({"tiny": TINY}))


def test_a_crashed_cell_is_recorded_the_rest_drawn_and_a_rerun_retries_only_it(workdir):
    crashed = workdir / "results/cells/tiny/kernel/naive/causal/s64-h2x1-d16-float32-fwd.json"
    p = snakemake_on_copy(workdir, env={"ATTNBENCH_CRASH_CELLS": "^naive/causal/s64-"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    records = list((workdir / "results/cells").rglob("*.json"))
    assert len(records) == N_CELLS  # the others finished, and the crash is a record
    record = json.loads(crashed.read_text())
    assert record["status"] == "crashed" and record["crash"]["exit_status"] == 1
    assert "its process exited with status 1 without writing a record" in record["status_reason"]
    assert any("crash injected" in line for line in record["crash"]["log_tail"])
    # what finished is drawn; the table, its captions and the closing summary name the crash
    df = pd.read_csv(workdir / "results/tables/cells.csv")
    assert dict(df["status"].value_counts()) == {"ok": 7, "crashed": 1, "unavailable": 1}
    assert (workdir / "results/figures/tiny/tflops_bars_fwd.png").stat().st_size > 0
    caption = (workdir / "results/tables/tiny/tflops.caption.rst").read_text()
    assert "1 crashed, not drawn: tiny/kernel/naive/causal/s64-h2x1-d16-float32-fwd.json" in (
        caption.replace("\\", "")
    )
    log = p.stdout + p.stderr
    assert (
        "1 crashed (the next run retries them):" in log
        and str(crashed.relative_to(workdir)) in log
    )

    p = snakemake_on_copy(workdir, "-n", "--printshellcmds")
    plan = planned_jobs(p)
    assert plan["kernel_cell"] == 1  # only the crashed cell, and what depends on it
    assert "/naive/causal/s64-" in p.stdout.split("rule collect")[0]
    assert "1 of 9 records on disk are outdated: 1 crashed" in p.stdout + p.stderr
    assert set(plan) == {
        "kernel_cell",
        "collect",
        "union",
        "tidy_table",
        "tables_tiny",
        "figures_tiny",
        "all",
    }

    p = snakemake_on_copy(workdir)
    assert p.returncode == 0, p.stderr[-3000:]
    df = pd.read_csv(workdir / "results/tables/cells.csv")
    assert len(df) == N_CELLS
    assert set(df["status"]) == {"ok", "unavailable"}
    assert (df[df["impl"] == "fa2"]["status"] == "unavailable").all()
    assert df["outdated"].isna().all()
    for f in (
        "tables/tiny/tflops.md",
        "tables/tiny/support.tex",
        "tables/tiny/support.caption.rst",
        "figures/tiny/tflops_bars_fwd.pdf",
        "figures/tiny/tflops_vs_seqlen_full_causal.png",
        "figures/tiny/tflops_vs_seqlen_document.png",
        "figures/tiny/memory_vs_seqlen_fwd.png",
        "figures/tiny/tflops_bars_fwd.caption.rst",
    ):
        assert (workdir / "results" / f).stat().st_size > 0
    assert planned_jobs(snakemake_on_copy(workdir, "-n")) == {}


def plan_after_edit(workdir, module, *args):
    """The dry-run plan after appending a comment to one module of the workflow's code copy."""
    return planned_jobs(dry_run_after_edit(workdir, module, *args))


def dry_run_after_edit(workdir, module, *args):
    code = workdir / "code/workflow/attnbench" / module
    original = code.read_text()
    code.write_text(original + "\n# an edit\n")
    try:
        return snakemake_on_copy(workdir, "-n", *args)
    finally:
        code.write_text(original)
        os.utime(code, (0, 0))  # older than the outputs again, as before the edit


def cells_planned(p) -> list[str]:
    """The records a dry run (--printshellcmds) would make, below results/cells/tiny/kernel/
    (not the cells' spec files, .attnbench/specs/cells/...)."""
    cells = p.stdout.split("rule collect")[0]
    return sorted(set(re.findall(r"(?<!specs/)cells/tiny/kernel/(\S+)\.json", cells)))


def test_what_reruns_on_which_edit(workdir):
    """docs/architecture.md, "What reruns when": a cell reruns when a file it imports changes
    (its kernel's adapter, the harness, the gate's naive kernel) and when its config changes;
    nothing else reruns it, and `outdated_records: keep` keeps it. (A raised time budget:
    test_failures.py; your own kernel: test_custom_kernel.py; a library: below.)"""
    if not (workdir / "results/tables/cells.csv").exists():
        pytest.skip("needs the run of the first test")
    everything = {
        "kernel_cell",
        "collect",
        "union",
        "tidy_table",
        "tables_tiny",
        "figures_tiny",
        "all",
    }
    # a kernel adapter: exactly that kernel's cells (the unavailable fa2 cell runs no adapter
    # code but its own; naive's adapter is also the gate's reference, so it is in every cell)
    p = dry_run_after_edit(workdir, "kernels/sdpa.py", "--printshellcmds")
    assert [c for c in cells_planned(p)] == [
        "sdpa/causal/s128-h2x1-d16-float32-fwd",
        "sdpa/causal/s64-h2x1-d16-float32-fwd",
        "sdpa/causal_document/s128-h2x1-d16-float32-fwd",
        "sdpa/causal_document/s64-h2x1-d16-float32-fwd",
    ]
    assert "kernels/sdpa.py edited" in p.stdout + p.stderr
    assert planned_jobs(p)["kernel_cell"] == 4
    assert plan_after_edit(workdir, "kernels/naive.py")["kernel_cell"] == N_CELLS
    # the harness: every cell
    for module in ("harness/measure.py", "harness/gate.py", "kernels/catalog.py"):
        plan = plan_after_edit(workdir, module)
        assert set(plan) == everything and plan["kernel_cell"] == N_CELLS, module
    # code no cell imports: none
    # (the paired answers: the advice table, and the winner map and speedups it draws)
    assert plan_after_edit(workdir, "report/advice.py") == {
        "tables_tiny": 1,
        "figures_tiny": 1,
        "all": 1,
    }
    # the warm worker and the entry are code a cell's processes run: every cell; the rest of
    # the command line is not
    assert plan_after_edit(workdir, "run/worker.py")["kernel_cell"] == N_CELLS
    assert "kernel_cell" not in plan_after_edit(workdir, "cli/tables.py")
    # a config value: the cells it changes
    (workdir / "reps.yaml").write_text(yaml.safe_dump({"grids": {"tiny": {"reps": 3}}}))
    configs = [str(workdir / "config.yaml"), str(workdir / "reps.yaml")]
    p = snakemake_on_copy(workdir, "-n", "--configfile", *configs)
    assert planned_jobs(p)["kernel_cell"] == N_CELLS
    said = p.stdout + p.stderr
    assert f"{N_CELLS} of {N_CELLS} records on disk are outdated: {N_CELLS} config" in said
    assert "config: reps 2 -> 3" in said
    # ... and check-config says the same before any of it runs
    check = subprocess.run(
        [sys.executable, "-m", "attnbench", "check-config", "reps.yaml"],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=tool_env(),
        timeout=300,
    )
    assert check.returncode == 0 and f"{N_CELLS} config" in check.stdout, check.stderr
    # keep: the outdated records stay, named by the tidy table's `outdated` column and the captions
    (workdir / "keep.yaml").write_text(yaml.safe_dump({"outdated_records": "keep"}))
    keep = [*configs, str(workdir / "keep.yaml")]
    p = snakemake_on_copy(workdir, "--configfile", *keep)
    assert p.returncode == 0 and "kernel_cell" not in p.stdout + p.stderr, p.stderr[-3000:]
    assert f"{N_CELLS} config" in p.stdout + p.stderr and "kept as they are" in p.stdout + p.stderr
    df = pd.read_csv(workdir / "results/tables/cells.csv")
    assert (df["outdated"] == "config: reps 2 -> 3").all()
    caption = (workdir / "results/tables/tiny/tflops.caption.rst").read_text().replace("\\", "")
    assert f"{N_CELLS} of {N_CELLS} records are outdated relative to the current config" in caption
    # back to the config the records were made with: current again, and the table says so
    p = snakemake_on_copy(workdir)
    assert p.returncode == 0 and "kernel_cell" not in p.stdout + p.stderr, p.stderr[-3000:]
    assert pd.read_csv(workdir / "results/tables/cells.csv")["outdated"].isna().all()


def test_plotting_code_or_style_reruns_only_figures(workdir):
    if not (workdir / "results/tables/cells.csv").exists():
        pytest.skip("needs the run of the previous test")
    # The figure rule's code files (what its command imports) are inputs: edited plotting code
    # reruns only the figures.
    for module in (
        "families/kernel/figures.py",
        "report/figures.py",
        "report/plotting.py",
        "report/style.py",
    ):
        assert set(plan_after_edit(workdir, module)) == {"figures_tiny", "all"}, module
    # ... and edited table code only the tables; the shared names and captions both, never a cell.
    for module in ("families/kernel/tables.py", "report/tables.py"):
        assert set(plan_after_edit(workdir, module)) == {"tables_tiny", "all"}, module
    for module in ("report/labels.py", "report/captions.py", "report/outputs.py"):
        assert set(plan_after_edit(workdir, module)) == {"figures_tiny", "tables_tiny", "all"}, (
            module
        )
    # the tidy table's code reruns it and everything read from it
    assert set(plan_after_edit(workdir, "report/collect.py")) == {
        "collect",
        "union",
        "tidy_table",
        "figures_tiny",
        "tables_tiny",
        "all",
    }
    # another family's code is no input here (a kernel grid)
    assert plan_after_edit(workdir, "families/cp/tables.py") == {}
    # A style setting is a parameter of the figure rule only.
    for style in ("figures: {dpi: 80}", "figures: {bar_seqlen: 64}"):
        (workdir / "style.yaml").write_text(style + "\n")
        plan = planned_jobs(
            snakemake_on_copy(
                workdir,
                "-n",
                "--configfile",
                str(workdir / "config.yaml"),
                str(workdir / "style.yaml"),
            )
        )
        assert set(plan) == {"figures_tiny", "all"}, style
    # What a cell may use is no parameter of any rule: more time or memory reruns nothing.
    resources = {"runtime_min": 11, "mem_mb": 3000, "worker_idle_s": 5}
    (workdir / "resources.yaml").write_text(yaml.safe_dump({"grids": {"tiny": resources}}))
    configs = [str(workdir / "config.yaml"), str(workdir / "resources.yaml")]
    assert planned_jobs(snakemake_on_copy(workdir, "-n", "--configfile", *configs)) == {}
    # Threads are part of what a CPU cell times: other threads than its records ran on (capped at
    # the cores) rerun the kernel cells and what is read from them (pipeline/currency.py).
    (workdir / "resources.yaml").write_text(
        yaml.safe_dump({"grids": {"tiny": {"cpu_threads": 2}}})
    )
    plan = planned_jobs(snakemake_on_copy(workdir, "-n", "--configfile", *configs))
    if (os.cpu_count() or 1) > 1:
        assert plan.get("kernel_cell") == 8 and {"figures_tiny", "tables_tiny"} <= set(plan), plan
    else:
        assert plan == {}
    # The named target regenerates figures and tables without running a cell.
    p = snakemake_on_copy(
        workdir, "figures", "tables", "--forcerun", "figures_tiny", "tables_tiny"
    )
    assert p.returncode == 0 and "kernel_cell" not in p.stdout + p.stderr


def test_report_has_a_caption_per_figure_and_table_from_the_records(workdir):
    if not (workdir / "results/tables/cells.csv").exists():
        pytest.skip("needs the run of the first test")
    p = snakemake_on_copy(workdir, "--report", str(workdir / "report.html"))
    assert p.returncode == 0, p.stderr[-3000:]
    html = (workdir / "report.html").read_text()
    df = pd.read_csv(workdir / "results/tables/cells.csv")
    figures = sorted((workdir / "results/figures/tiny").glob("*.png"))
    # each table as its page (HTML: shown inline; its Markdown would be a download link)
    tables = sorted((workdir / "results/tables/tiny").glob("*.html"))
    assert [f.stem for f in tables] == ["advice", "memory", "support", "tflops"]
    assert len(figures) == len(families.figure_stems(TINY))
    for f in figures + tables:
        assert f'"{f.name}"' in html, f.name  # each is in the report ...
    assert not re.search(r'"[a-z_]+\.md"', html)  # ... and no Markdown file
    # ... with a caption naming the machine and software of the records
    assert html.count("Machine:</th>") == len(figures) + len(tables)
    assert html.count(f"torch {df['torch'].iloc[0]}") >= len(figures) + len(tables)
    assert df["device_name"].iloc[0] in html
    assert "System Message" not in html  # no reStructuredText error in any caption


def _report_tool():
    """tools/report_screenshot.py: the report in headless Chromium."""
    spec = importlib.util.spec_from_file_location(
        "report_screenshot", REPO / "tools/report_screenshot.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reports_tables_show_in_a_browser(workdir, tmp_path):
    """The report as a reader opens it, in a real headless Chromium: click the grid, its tables,
    a table's view button; the table's page is shown and a cell's text is visible (drawn in the
    viewport, the topmost element at its place)."""
    if not (workdir / "results/tables/cells.csv").exists():
        pytest.skip("needs the run of the first test")
    tool = _report_tool()
    if tool.chromium() is None:
        pytest.skip("no Chromium to open the report in (Debian: apt-get install chromium)")
    report = workdir / "report.html"
    if not report.exists():
        assert snakemake_on_copy(workdir, "--report", str(report)).returncode == 0
    with tool.Browser(1200, 800) as b:
        tool.show_table(b, report, "tiny", "support")
        shot = b.screenshot(tmp_path / "report.png")
        assert isinstance(tool.cell_visible(b, "support", "naive"), list)
        assert tool.cell_visible(b, "support", "no such kernel") == "no cell"
    pixels = plt.imread(shot)
    assert pixels.shape[:2] == (800, 1200)
    # a page drawn, not a blank one: the menu's dark and the table's white, and text between
    assert len(np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0)) > 50


def test_regenerate_rewrites_tables_figures_and_report_from_records(workdir):
    """`make figures` / `make report`: everything again from the records, in seconds, no cell run."""
    if not (workdir / "results/tables/cells.csv").exists():
        pytest.skip("needs the run of the first test")
    promised = [
        workdir / "results" / f
        for f in (
            "tables/tiny/support.md",
            "figures/tiny/tflops_bars_fwd.png",
            "figures/tiny/tflops_bars_fwd.caption.rst",
        )
    ]
    for f in promised:
        f.unlink()
    records = sorted((workdir / "results/cells").rglob("*.json"))
    before = [r.stat().st_mtime for r in records]
    # the record of another grid in the same output folder is a row too (the table is the union)
    from attnbench.families import expand_cells, validate
    from attnbench.families.kernel.cell import run_cell
    from attnbench.grid.expand import cell_path
    from attnbench.record.record import write_record

    (other,) = expand_cells(validate(config_running({"other": kernel_grid(kernels=["naive"])})))
    other_record = workdir / "results" / cell_path(other)
    write_record(run_cell(CellSpec.from_dict(other)), other_record)
    table = workdir / "results/tables/cells.csv"
    original = table.read_text()
    env = tool_env()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnbench",
            "regenerate",
            "--configfile",
            "config.yaml",
            "--report",
            "--snakefile",
            str(workdir / "code/Snakefile"),
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    print(p.stdout)  # the phases and their seconds
    assert all(f.stat().st_size > 0 for f in promised)
    assert "Machine:</th>" in (workdir / "results/report.html").read_text()
    assert re.search(r"regenerated in [0-9.]+ s", p.stdout)
    assert [r.stat().st_mtime for r in records] == before  # no record rewritten, no cell run
    after = pd.read_csv(table)
    assert (after["grid"] == "other").sum() == 1 and (after["grid"] == "tiny").sum() == N_CELLS
    assert "and 1 rows of other grids' records there" in p.stdout
    shutil.rmtree(other_record.parents[3])
    table.write_text(original)


def test_cells_missing_after_a_partial_regenerate_are_still_run(workdir):
    """A tidy table from a partial run (regenerate, or committed results in a fresh clone) must not
    hide the cells without a record: the next run plans exactly those."""
    if not (workdir / "results/tables/cells.csv").exists():
        pytest.skip("needs the run of the first test")
    record = workdir / "results/cells/tiny/kernel/sdpa/causal/s128-h2x1-d16-float32-fwd.json"
    aside = workdir / "aside.json"
    shutil.move(record, aside)
    env = tool_env()
    regenerate = [sys.executable, "-m", "attnbench", "regenerate", "--configfile", "config.yaml"]
    try:
        p = subprocess.run(
            regenerate, cwd=workdir, capture_output=True, text=True, env=env, timeout=600
        )
        assert p.returncode == 0 and "1 of 9 cells have no record yet" in p.stdout, (
            p.stdout + p.stderr
        )
        assert len(pd.read_csv(workdir / "results/tables/cells.csv")) == N_CELLS - 1
        p = snakemake_on_copy(workdir, "-n", "--printshellcmds")
        assert planned_jobs(p) == {
            "kernel_cell": 1,
            "collect": 1,
            "union": 1,
            "tidy_table": 1,
            "tables_tiny": 1,
            "figures_tiny": 1,
            "all": 1,
        }
        assert "/sdpa/causal/s128-" in p.stdout
    finally:
        shutil.move(aside, record)
        subprocess.run(
            regenerate, cwd=workdir, capture_output=True, env=env, timeout=600, check=True
        )


def test_installing_a_missing_library_reruns_exactly_its_cells(workdir, tmp_path):
    if not (workdir / "results/tables/cells.csv").exists():
        pytest.skip("needs the run of the first test")
    # A distribution's metadata is what identifies an installed library version.
    site = tmp_path / "site"
    dist = site / "flash_attn-2.8.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.8.3\n")
    env = {"PYTHONPATH": f"{site}:{os.environ.get('PYTHONPATH', '')}"}
    p = snakemake_on_copy(workdir, "-n", "--printshellcmds", env=env)
    plan = planned_jobs(p)
    assert plan["kernel_cell"] == 1
    assert "/fa2/causal/" in p.stdout and "/naive/" not in p.stdout.split("rule collect")[0]


def test_bad_config_fails_before_any_job(workdir, tmp_path):
    cfg = config_running({"tiny": {**TINY, "kernels": ["naive", "flashy"]}})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    shutil.copytree(workdir / "code", tmp_path / "code")
    p = snakemake_on_copy(tmp_path, "-n")
    assert p.returncode != 0
    assert "grids.tiny.kernels[1]: unknown kernel 'flashy'; valid kernels:" in p.stdout + p.stderr
    # a grid given twice (plain YAML would keep the second silently)
    text = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(
        text.replace(
            "\ngrids:\n", "\ngrids:\n  tiny: {kernels: [naive]}\n", 1
        )  # the top-level key
    )
    p = snakemake_on_copy(tmp_path, "-n")
    assert p.returncode != 0 and "key 'tiny' appears twice in one mapping" in p.stdout + p.stderr
