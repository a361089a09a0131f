"""Snakemake end to end on a tiny CP grid: records through torchrun, the tidy table, CP tables and figures."""

import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from bounded import run_bounded

REPO = Path(__file__).resolve().parents[2]
TINY = {
    "family": "cp",
    "device": "cpu",
    "methods": ["ring_p2p", "ulysses", "torch_cp"],
    "masks": ["causal"],
    "tokens_per_gpu": [24],
    "gpus": [2],
    "heads": [[3, 1]],
    "head_dim": [8],
    "dtype": ["float32"],
    "direction": ["bwd"],
    "samples": {"document": 1, "single": 1},
    "warmup": 0,
    "reps": 2,
    "check": {"max_seqlen": 256, "tolerance_factor": 5, "samples": 1},
    "runtime_min": 5,
    "mem_mb": 2000,
    "cp": {"local_kernel": "cpu_flash", "timeout_s": 60},
    "also": [{"methods": ["local"], "gpus": [1]}],
}  # the bare kernel on 1 GPU: cp_vs_single_gpu's baseline


@pytest.mark.slow
def test_snakemake_runs_a_cp_grid(tmp_path):
    shutil.copy(REPO / "Snakefile", tmp_path / "Snakefile")
    shutil.copytree(
        REPO / "workflow", tmp_path / "workflow", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(
        REPO / "envs", tmp_path / "envs"
    )  # the rules' conda environments (recorded per job)
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["run"] = ["tinycp"]
    cfg["grids"] = {"tinycp": TINY}
    cfg["figures"] = {"formats": ["png", "pdf"], "dpi": 60}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    p = run_bounded(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(tmp_path / "Snakefile"),
            "-d",
            str(tmp_path),
            "--configfile",
            str(tmp_path / "config.yaml"),
            "--cores",
            "2",
        ],
        600,
        env=env,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = tmp_path / "results"
    records = sorted((res / "cells/tinycp/cp").rglob("*.json"))
    assert [r.relative_to(res / "cells/tinycp/cp").as_posix() for r in records] == [
        "local/causal/s24-h3x1-d8-float32-bwd-g1.json",
        "ring_p2p/causal/s48-h3x1-d8-float32-bwd-g2.json",
        "torch_cp/causal/s48-h3x1-d8-float32-bwd-g2.json",
        "ulysses/causal/s48-h3x1-d8-float32-bwd-g2.json",
    ]
    df = pd.read_csv(res / "tables/cells.csv")
    one = df[df["gpus"] == 1]
    assert (
        list(one["impl"]) == ["local"]
        and list(one["status"]) == ["ok"]
        and one["check_passed"].all()
    )
    df = df[df["gpus"] == 2]
    assert dict(zip(df["impl"], df["status"])) == {
        "ring_p2p": "ok",
        "ulysses": "unsupported",
        "torch_cp": "unavailable",
    }
    ring = df[df["impl"] == "ring_p2p"].iloc[0]
    assert (
        ring["tflops_per_gpu"] == ring["tflops"] > 0
        and ring["ring_degree"] == 2
        and ring["bytes_match_analytic"]
    )
    for f in (
        "tables/tinycp/cp_tflops.md",
        "tables/tinycp/cp_breakdown.tex",
        "figures/tinycp/cp_tflops_vs_gpus.png",
        "figures/tinycp/cp_breakdown.pdf",
    ):
        assert (res / f).stat().st_size > 0
    md = (res / "tables/tinycp/cp_tflops.md").read_text()
    assert "unsup." in md and "n/a" in md and "dtype: float32" in md
    share = (res / "tables/tinycp/cp_vs_single_gpu.md").read_text()
    ring2 = df[df["impl"] == "ring_p2p"].iloc[0]
    assert (
        f"{ring2['tflops'] / one['tflops'].iloc[0]:.0%}" in share
        and "1 GPU, bare kernel (TFLOP/s)" in share
    )
    assert "none (no local cell)" not in share.split("\n\n", 1)[1]  # the table, not its caption
