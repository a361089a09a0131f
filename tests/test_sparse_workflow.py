"""Snakemake end to end on a tiny block-sparse grid in a temporary folder: records with realised
densities and identical masks across kernels, the sparse tables and figures, dense references."""

import json
from pathlib import Path

import pandas as pd
import pytest
from attnbench import families as outputs
from commands import planned_jobs
from tinygrids import config_running, kernel_grid, snakemake_on_copy, workflow_copy

REPO = Path(__file__).resolve().parents[1]
# The tiny kernel grid's device, kernels, shapes and repetitions, over the two sparse masks.
TINY_SPARSE = kernel_grid(
    description="tiny block-sparse test grid",
    family="sparse",
    masks=["block_sparse", "variable_block_sparse"],
    seqlen=[128, 256],
    block_size=[32],
    avg_block=[64],
    density=[0.5],
    mask_params={"min_block": 32},
    samples={"document": 1, "single": 2},
    also=[
        {"density": [0.25], "seqlen": [256]},
        {
            "kernels": ["triton_block_sparse", "flashinfer"],
            "masks": ["block_sparse"],
            "seqlen": [128],
        },
        # a dense reference whose area equals the density-0.5 masks' at 256: 181^2 ~ 0.5 x 256^2
        {"kernels": ["sdpa"], "masks": ["full"], "seqlen": [181]},
    ],
)
N_CELLS = 2 * 2 * 2 + 2 * 2 + 2 + 1


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = workflow_copy(
        tmp_path_factory.mktemp("wf_sparse"), config_running({"tiny_sparse": TINY_SPARSE})
    )
    p = snakemake_on_copy(d)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return d


def test_tiny_sparse_grid_records_tables_and_figures(run):
    res = run / "results"
    df = pd.read_csv(res / "tables/cells.csv")
    assert len(df) == N_CELLS
    assert set(df[df["impl"] == "triton_block_sparse"]["status"]) == {"unavailable"}  # GPU-only
    assert set(df[df["impl"] == "flashinfer"]["status"]) == {"unavailable"}
    measured = df[df["impl"].isin(["naive", "sdpa"])]
    assert set(measured["status"]) == {"ok"} and measured["check_passed"].all()
    sparse = measured[measured["mask"] != "full"]
    assert sparse["realised_density"].between(0.2, 0.5).all()
    for f in outputs.table_names(TINY_SPARSE):
        assert (res / "tables/tiny_sparse" / f).stat().st_size > 0
    for f in outputs.figure_names(TINY_SPARSE, ["png", "pdf"]):
        assert (res / "figures/tiny_sparse" / f).stat().st_size > 0
    table = (res / "tables/tiny_sparse/sparse_tflops.md").read_text()
    assert "B=32" in table and "var A=64" in table and "naive fwd" in table and "n/a" in table
    ratio = (res / "tables/tiny_sparse/sparse_vs_dense.md").read_text()
    assert "sdpa (full, S=181)" in ratio  # the equal-area dense reference was found
    assert planned_jobs(snakemake_on_copy(run, "-n")) == {}


def test_kernels_of_a_grid_point_got_the_same_masks(run):
    cells = run / "results/cells/tiny_sparse/sparse"
    for mask in ("block_sparse", "variable_block_sparse"):
        for point in (cells / "naive" / mask).glob("*.json"):
            a = json.loads(point.read_text())
            b = json.loads((cells / "sdpa" / mask / point.name).read_text())
            pa = [s["mask_params"] for s in a["samples"]]
            assert pa == [s["mask_params"] for s in b["samples"]] and len(pa) == 2
            assert all("layout_sha256" in p and "realised_density" in p for p in pa)
            assert pa[0]["seed"] != pa[1]["seed"]


def test_editing_the_sparse_report_reruns_only_its_tables_and_figures(run):
    code = run / "code/workflow/attnbench/families/sparse/tables.py"
    original = code.read_text()
    code.write_text(original + "\n# an edit\n")
    try:
        plan = planned_jobs(snakemake_on_copy(run, "-n"))
    finally:
        code.write_text(original)
    assert set(plan) == {"tables_tiny_sparse", "figures_tiny_sparse", "all"}


def test_cpu_threads_reach_the_cell_and_changing_them_reruns_its_cpu_cells(run):
    """Grid key cpu_threads: the cell's Snakemake threads and torch threads (`--threads`). On a
    CPU the threads are part of what is timed, so a CPU cell timed on other threads than a run
    here would give it (the grid's cpu_threads, at most the machine's cores) runs again, saying
    why; no table or figure setting changes."""
    import os

    import yaml

    cfg_file = run / "config.yaml"
    original = cfg_file.read_text()
    cfg = yaml.safe_load(original)
    ran = cfg["grids"]["tiny_sparse"].get("cpu_threads", 1)
    cfg["grids"]["tiny_sparse"]["cpu_threads"] = 2
    cells = sorted((run / "results/cells/tiny_sparse").rglob("*.json"))
    records = {c: c.read_bytes() for c in cells}
    try:
        cfg_file.write_text(yaml.safe_dump(cfg))
        p = snakemake_on_copy(run, "-n", "-p")
        if min(2, os.cpu_count() or 1) == ran:  # a one-core machine: the same threads
            assert "kernel_cell" not in planned_jobs(p)
        else:
            timed = [
                c
                for c in cells
                if json.loads(records[c])["status"] in ("ok", "incorrect", "implausible")
            ]
            assert planned_jobs(p)["kernel_cell"] == len(timed) > 0
            assert f"cpu_threads {ran} -> 2" in p.stdout + p.stderr
            assert "--threads 2 " in p.stdout + p.stderr
    finally:
        cfg_file.write_text(original)
        for c, b in records.items():
            c.write_bytes(b)
