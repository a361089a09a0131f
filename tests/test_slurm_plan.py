"""`check-config --profile slurm`: the sbatch jobs a Slurm run would submit for the cells still to
run, the GPU-hours their records estimate, and the profile's settings still unset."""

from __future__ import annotations

import json
import subprocess
import sys

from attnbench.families import expand_cells, validate
from attnbench.grid.expand import cell_path
from attnbench.pipeline.slurm_plan import slurm_plan
from attnbench.record.record import write_record
from commands import REPO, package_env
from tinygrids import config_running, cp_grid, kernel_grid, measured

SLURM = REPO / "profiles" / "slurm"


def test_jobs_follow_the_rules_and_the_profiles_batch_size(tmp_path):
    """A GPU grid measured side by side is a job per point; CPU kernel cells are batched by the
    profile's group-components (20); a CP cell is a job of its own; one job for the report."""
    gpu = kernel_grid(
        device="cuda", dtype=["bfloat16"], kernels=["sdpa", "sdpa_math"], seqlen=[64, 128]
    )
    cpu = kernel_grid(seqlen=[64, 128, 256], masks=["causal", "full"], direction=["fwd", "bwd"])
    cfg = validate(config_running({"g": gpu, "c": cpu, "p": cp_grid()}))
    cfg["output_dir"] = str(tmp_path / "results")
    plan = slurm_plan(cfg, SLURM, environ={})
    cells = expand_cells(cfg)
    assert plan.cells == len(cells)
    assert plan.points == 2  # two lengths, each point's two kernels in one job
    assert (plan.batch_size, plan.batches) == (20, 2)  # 24 CPU kernel cells
    assert plan.cp_cells == 1 and plan.jobs == 2 + 2 + 1 + 1
    assert plan.gpu_cells == 4 and plan.informed == 0 and plan.gpu_hours == 0
    assert [u.split(" ")[0] for u in plan.unset] == ["slurm_partition", "slurm_account"]
    set_both = {"ATTNBENCH_SLURM_PARTITION": "gpu", "ATTNBENCH_SLURM_ACCOUNT": "me"}
    assert slurm_plan(cfg, SLURM, environ=set_both).unset == ()
    # a cell with a current record is not submitted again
    cpu_cell = next(c for c in cells if c["grid"] == "c")
    write_record(measured(cpu_cell), tmp_path / "results" / cell_path(cpu_cell))
    again = slurm_plan(cfg, SLURM, environ={})
    assert again.cells == len(cells) - 1 and again.batches == 2


def test_check_config_prints_the_plan_and_refuses_an_unknown_profile(tmp_path):
    cfg = config_running({"c": kernel_grid()})
    cfg["output_dir"] = str(tmp_path / "results")
    (tmp_path / "mine.yaml").write_text(json.dumps(cfg))
    env = {k: v for k, v in package_env().items() if not k.startswith("ATTNBENCH_SLURM_")}

    def check(profile):
        return subprocess.run(
            [sys.executable, "-m", "attnbench", "check-config", "--configfile"]
            + [str(tmp_path / "mine.yaml"), "--profile", profile],
            cwd=REPO, capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip

    p = check("slurm")
    assert p.returncode == 0, p.stderr
    assert "slurm (profiles/slurm): 2 sbatch jobs for 2 cells to run" in p.stdout
    assert "GPU-hours: 0 (CPU grids only)" in p.stdout
    assert "unset: slurm_partition (ATTNBENCH_SLURM_PARTITION)" in p.stdout
    p = check("nosuch")
    assert p.returncode == 1
    assert "--profile nosuch: no nosuch/config.yaml; valid --profile" in p.stderr
    assert "local, slurm" in p.stderr
