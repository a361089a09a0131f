"""What a Slurm run of a config would submit, before it is submitted (`check-config --profile
slurm`): the sbatch jobs of the cells still to run, the GPU-hours their records estimate, and the
profile's settings that are still unset.

The jobs follow the workflow's rules (workflow/rules/common.smk, kernels.smk): a side-by-side grid
point is one job (rule kernel_point), the other kernel and sparse cells are batched up to the
profile's `group-components` per job (group `cells`), a CP cell is a job of its own; the report
adds one job (group `report`)."""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..families.estimate import estimate
from ..grid.expand import point_id
from .plan import cells_to_run

# A profile setting read from the environment when the profile is read: where it is unset, what
# Slurm does instead.
UNSET_MEANS = {
    "ATTNBENCH_SLURM_PARTITION": (
        "slurm_partition",
        "every job goes to the cluster's default partition, which may have no GPUs",
    ),
    "ATTNBENCH_SLURM_ACCOUNT": (
        "slurm_account",
        "jobs are charged to your default account, where the cluster has one",
    ),
}


@dataclass(frozen=True)
class SlurmPlan:
    cells: int  # cells to run (missing or outdated)
    points: int  # jobs of side-by-side grid points
    batches: int  # jobs of batched kernel cells
    cp_cells: int  # CP jobs, one per cell
    batch_size: int
    gpu_hours: float  # estimated from records, over the informed cells
    informed: int  # cells a record of the same point estimates
    gpu_cells: int  # cells that need a GPU
    unset: tuple[str, ...]  # lines: a setting, and what happens without it

    @property
    def jobs(self) -> int:
        return self.points + self.batches + self.cp_cells + (1 if self.cells else 0)

    def lines(self, profile: str) -> list[str]:
        if not self.cells:
            return [f"slurm ({profile}): no cells to run, no jobs to submit"]
        out = [
            f"slurm ({profile}): {self.jobs} sbatch jobs for {self.cells} cells to run: "
            f"{self.points} grid points measured side by side, {self.batches} batches of up to "
            f"{self.batch_size} kernel cells (group-components), {self.cp_cells} CP cells, "
            "1 for the tables and figures"
        ]
        if self.gpu_cells:
            rest = self.gpu_cells - self.informed
            out.append(
                f"  GPU-hours: {self.gpu_hours:.1f} estimated for {self.informed} of the "
                f"{self.gpu_cells} GPU cells from records of the same points"
                + (f"; {rest} have no record to estimate from" if rest else "")
            )
        else:
            out.append("  GPU-hours: 0 (CPU grids only)")
        out += [f"  unset: {line}" for line in self.unset]
        return out


def batch_size(profile_dir: Path) -> int:
    """The profile's group-components for the `cells` group (1: no batching)."""
    text = (profile_dir / "config.yaml").read_text()
    settings = yaml.safe_load(text) or {}
    return int((settings.get("group-components") or {}).get("cells", 1))


def unset_settings(environ=os.environ) -> tuple[str, ...]:
    return tuple(
        f"{setting} ({variable}): {means}"
        for variable, (setting, means) in UNSET_MEANS.items()
        if not environ.get(variable)
    )


def slurm_plan(cfg: dict, profile_dir: Path, environ=os.environ) -> SlurmPlan:
    cells = cells_to_run(cfg)
    size = batch_size(profile_dir)
    kinds = Counter()
    points = set()
    for c in cells:
        if c["family"] == "cp":
            kinds["cp"] += 1
        elif c.get("side_by_side"):
            points.add((c["grid"], c["family"], c["mask"], point_id(c)))
        else:
            kinds["batched"] += 1
    gpu = [c for c in cells if c["device"] == "cuda"]
    by_gpus: dict[int, list[dict]] = {}
    for c in gpu:  # a CP cell holds all its GPUs for its time
        by_gpus.setdefault(int(c.get("gpus", 1)), []).append(c)
    hours, informed = 0.0, 0
    for gpus, group in by_gpus.items():
        e = estimate(group, Path(cfg["output_dir"]))
        hours += e.seconds * gpus / 3600
        informed += e.informed
    return SlurmPlan(
        cells=len(cells),
        points=len(points),
        batches=math.ceil(kinds["batched"] / size),
        cp_cells=kinds["cp"],
        batch_size=size,
        gpu_hours=hours,
        informed=informed,
        gpu_cells=len(gpu),
        unset=unset_settings(environ),
    )
