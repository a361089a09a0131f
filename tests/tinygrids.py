"""Tiny CPU grids for the tests that run the workflow, the config that runs them, a folder to run
them in; and mask parameters for short test sequences."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml
from commands import REPO, snakemake_cmd, tool_env

# What the tiny grids share: a few heads in float32 on the CPU, one sample, no warm-up, 2 reps.
SMALL = {
    "device": "cpu",
    "heads": [[2, 1]],
    "head_dim": [16],
    "dtype": ["float32"],
    "direction": ["fwd"],
    "samples": {"document": 1, "single": 1},
    "warmup": 0,
    "reps": 2,
}


def kernel_grid(**fields) -> dict:
    """naive and sdpa on a causal mask of 64 tokens; fields add to it or replace."""
    return {
        "family": "kernel",
        **SMALL,
        "kernels": ["naive", "sdpa"],
        "masks": ["causal"],
        "seqlen": [64],
        **fields,
    }


def cp_grid(**fields) -> dict:
    """Ring P2P on 2 ranks of 32 tokens, causal, on the CPU flash kernel; fields add or replace."""
    return {
        "family": "cp",
        **SMALL,
        "methods": ["ring_p2p"],
        "masks": ["causal"],
        "tokens_per_gpu": [32],
        "gpus": [2],
        "check": {"max_seqlen": 512, "tolerance_factor": 5, "samples": 1},
        "cp": {"local_kernel": "cpu_flash", "timeout_s": 60},
        **fields,
    }


def measured(cell: dict) -> dict:
    """The record of a cell as a run makes it, in this process: on the threads the pipeline gives
    a cell (its grid's cpu_threads, default 1; attnbench.pipeline.currency judges them)."""
    import os

    import torch
    from attnbench.families.kernel.cell import run_cell
    from attnbench.grid.spec import CellSpec

    before = torch.get_num_threads()
    torch.set_num_threads(min(cell.get("cpu_threads", 1), os.cpu_count() or 1))
    try:
        return run_cell(CellSpec.from_dict(cell))
    finally:
        torch.set_num_threads(before)


def config_running(grids: dict, run=None) -> dict:
    """The repository's config.yaml with only these grids, running `run` (default: all of them)."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["run"] = run or list(grids)
    cfg["grids"] = grids
    return cfg


def workflow_copy(d: Path, cfg: dict) -> Path:
    """A copy of the workflow's code (and envs/) in d/code, so a test can edit it (the cells still
    run the installed package), and cfg as d/config.yaml."""
    (d / "code").mkdir()
    shutil.copy(REPO / "Snakefile", d / "code/Snakefile")
    shutil.copytree(
        REPO / "workflow", d / "code/workflow", ignore=shutil.ignore_patterns("__pycache__")
    )
    # the rules' conda environments: Snakemake records each job's, so the files must be there
    shutil.copytree(REPO / "envs", d / "code/envs")
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return d


def mask_params(block: int, window: int, long_doc_range, density=0.4, avg_block=16, min_block=8):
    """Every mask's parameters for a short sequence; `block` is both the block-causal mask's
    blocks and block_sparse's block size."""
    blocks = {"window": window, "block": block, "block_size": block}
    sparse = {"density": density, "avg_block": avg_block, "min_block": min_block}
    return {**blocks, **sparse, "long_doc_range": long_doc_range}


def snakemake_on_copy(workdir: Path, *args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """Snakemake on the workflow's code copy in workdir/code (see workflow_copy), two cores. A dry
    run (-n) shows Snakemake's block per job (--quiet host), which the profiles leave out: the
    tests read its plan from them."""
    quiet = ["--quiet", "host"] if "-n" in args else []
    cmd = snakemake_cmd(
        workdir, "--cores", "2", *args, *quiet, snakefile=workdir / "code/Snakefile"
    )
    return subprocess.run(
        cmd, capture_output=True, text=True, env=tool_env(**(env or {})), timeout=timeout
    )
