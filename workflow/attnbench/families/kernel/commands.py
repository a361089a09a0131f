"""The kernel family's commands, run by its cells' own processes: `cell` (one cell, here or in the
GPU's warm worker), `point` (a grid point's contenders side by side: point.py) and `point-child`
(its measuring process). `python -m attnbench` hands them here before it reads any other command
(attnbench/__main__.py), so a cell's process runs only the files its record lists."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..cell_entry import (
    cell_options,
    cell_spec,
    claim_gpu_after_start,
    record_not_run,
    run_command,
    say_outcome,
)
from .provenance import provenance


def skeleton(spec) -> dict:
    """The family's record_skeleton, imported only where a record of a cell that did not run is
    written (this module imports neither torch nor the family's package)."""
    from .cell import record_skeleton

    return record_skeleton(spec)


COMMANDS = ("cell", "point", "point-child")


# A warm worker gets this share of the time left before the launcher stops the job: one that has
# not answered by then is killed, and the job measures the cell itself with the rest, so that a
# hung worker costs a rerun, not a false `timeout`.
WORKER_SHARE = 0.5


def worker_deadline() -> float | None:
    """When the job stops waiting for its worker (time.time()), from the launcher's deadline."""
    from ...run.launch import DEADLINE_ENV

    stop = os.environ.get(DEADLINE_ENV)
    if not stop:
        return None
    now = time.time()
    return now + max(0.0, float(stop) - now) * WORKER_SHARE


def cell_in_worker(spec, a) -> bool:
    """--worker-idle-s: claim the GPU, then let the GPU's warm worker measure (attnbench.run.worker,
    running warm.measure): True. False where the worker missed its deadline (killed): the caller
    measures the cell in this process."""
    from ... import STARTED
    from ...run import launch
    from ...run.worker import WorkerLate, passed_env, run_in_worker
    from .warm import RUNNER, own_code_key

    gpu = "cpu"
    if spec.device == "cuda":
        gpu = ",".join(launch.claim_from_environment()) or os.environ.get(
            "CUDA_VISIBLE_DEVICES", ""
        )
    request = {
        "spec": spec.to_dict(),
        # the code as this job finds it: a worker that imported other code refuses the cell
        "code_sha256": provenance(spec)["code"]["sha256"],
        "peak": a.peak,
        "out": a.out,
        "cwd": os.getcwd(),  # the worker may have been started by a run in another folder
        "client_started": STARTED,
        "gpu_wait_s": launch.CLAIM_WAIT_S,
        "env": passed_env(os.environ),  # the rest are the worker's key
    }
    own_code = own_code_key(request["spec"].get("kernel_class"))
    try:
        answer = run_in_worker(
            request, RUNNER, gpu, a.threads or 0, a.worker_idle_s, own_code, worker_deadline()
        )
    except WorkerLate as e:
        print(f"{e}; measuring the cell in this process", flush=True)
        return False
    if "error" in answer:
        sys.exit(f"the cell failed in the worker:\n{answer['error']}")
    print(answer["output"], end="")
    say_outcome(answer, a.out)
    return True


def cmd_cell(a):
    from ...harness.cpu_math import settle_vml
    from ...record.record import write_record
    from .cell import ends_without_gpu, run_cell

    spec = cell_spec(a)
    if a.timed_out_after is not None or a.crashed is not None:
        return record_not_run(spec, a, skeleton)
    provenance(spec)  # the code its record names, hashed before the cell imports it
    measures = not ends_without_gpu(spec)
    if measures and a.worker_idle_s and cell_in_worker(spec, a):
        return  # the worker sets its threads; this process needs no torch
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    if measures:
        settle_vml()
        claim_gpu_after_start(spec.device, spec.entry)
    peak = json.loads(Path(a.peak).read_text()) if a.peak else None
    record = run_cell(spec, peak, measure=measures)
    write_record(record, a.out)
    say_outcome(record, a.out)


def cmd_point(a):
    """A grid point's contenders side by side in one job (families/kernel/point.py): one file of
    their records, which the workflow's per-cell rule takes apart."""
    from ...record.record import write_json
    from ...run import launch
    from .point import read_point, run_point

    try:
        point, contenders = read_point(a.point)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"point: --point {a.point}: {e}")
    claim_gpu_after_start(contenders[0].spec.device)
    records = run_point(a.point, a.peak, a.threads, lambda: launch.log_tail(a.log))
    launch.release_gpus()
    write_json(
        {"point": point, "records": records}, a.out
    )  # each record checked where written alone (point.py)
    for out, record in records.items():
        say_outcome(record, out)


def cmd_point_child(a):
    from .point import child_main

    child_main(a.point, json.loads(a.remaining), a.peak, a.progress, a.threads)


def add_parsers(sub) -> None:
    c = sub.add_parser("cell", help="run one kernel cell and write its JSON record")
    cell_options(c, "where the cell's record is written")
    c.add_argument("--threads", type=int, help="CPU threads for torch (Snakemake's threads)")
    c.add_argument(
        "--worker-idle-s",
        type=float,
        default=0,
        help="measure in this GPU's warm worker process, which ends after this many idle "
        "seconds (attnbench.run.worker); 0: in this process",
    )
    c.set_defaults(fn=cmd_cell)
    c = sub.add_parser(
        "point", help="measure a grid point's kernel cells side by side; write their records"
    )
    c.add_argument(
        "--point", required=True, help="the point's file: its contenders' specs and records"
    )
    c.add_argument("--peak", help="JSON file with the device's matmul ceiling")
    c.add_argument("--out", required=True, help="the file of the point's records")
    c.add_argument("--threads", type=int, help="CPU threads for torch (Snakemake's threads)")
    c.add_argument("--log", help="the job's log, whose last lines a `crashed` record keeps")
    c.set_defaults(fn=cmd_point)
    c = sub.add_parser("point-child", help=argparse.SUPPRESS)  # point's measuring process
    c.add_argument("--point", required=True)
    c.add_argument("--remaining", required=True, help="JSON list of the record paths to measure")
    c.add_argument("--progress", required=True)
    c.add_argument("--peak")
    c.add_argument("--threads", type=int)
    c.set_defaults(fn=cmd_point_child)


def main(argv) -> None:
    """`python -m attnbench cell|point|point-child ...` (attnbench/__main__.py)."""
    run_command(argv, add_parsers)
