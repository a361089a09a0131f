"""The kernel family's side of the warm worker (attnbench.run.worker): what a worker process runs
for each kernel cell a job hands it, and the part of the worker's key that is your own kernel's code."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

from ...run.worker import keyed_env

RUNNER = f"{__name__}:measure"  # what a job asks its worker to run (run.worker.run_in_worker)


def own_code_key(kernel_class: str | None) -> str:
    """The hash of your own kernel's files ('module:Class' kernels; '' for a built-in one): part of
    its worker's key, as the package's code is."""
    if not kernel_class:
        return ""
    from ...kernels.libraries import own_kernel_files
    from ...record.code import cell_code

    return cell_code((), own_kernel_files(kernel_class)[1])["sha256"]


def measure(request: dict, served: int, started: str, state) -> dict:
    """Measure one kernel cell in the worker (run.worker.serve calls it with the job's request):
    its record written, its outcome answered; {"stale": why} where this process imported other
    code than the job found."""
    import torch

    from ...grid.spec import CellSpec
    from ...harness.measure import release_memory
    from ...harness.process_state import ProcessState
    from ...record.record import write_record
    from .cell import run_cell
    from .provenance import provenance

    spec = CellSpec.from_dict(request["spec"])
    # the code as this process first read it (record.code hashes a file once per process, when
    # the file is first used, before it is imported), against the files as the job found them
    mine = provenance(spec)["code"]["sha256"]  # a worker serves kernel cells
    if request.get("code_sha256") not in (None, mine):  # it must not measure the cell
        return {
            "stale": f"this worker runs code whose hash is {mine[:12]}, the job's files hash to "
            f"{request['code_sha256'][:12]} (edited since this worker imported them)"
        }
    state.restore()  # what the previous cell changed (threads, dtype, seeds, ...) is undone
    os.chdir(request["cwd"])  # the job's relative paths (record, peak), not the first job's
    own = keyed_env(
        os.environ
    )  # the job's other variables, not the first job's (fault injection too)
    os.environ.clear()
    os.environ.update({**request.get("env", {}), **own})
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()  # compile as a fresh process would (and no recompile limit carried over)
    peak = json.loads(Path(request["peak"]).read_text()) if request.get("peak") else None
    output = io.StringIO()
    before = ProcessState.capture()
    with contextlib.redirect_stdout(output):
        record = run_cell(spec, peak)
    changed = ProcessState.capture().changes_since(before)
    record.update(
        process_s=time.time() - request["client_started"],
        gpu_wait_s=request["gpu_wait_s"],
        worker={"pid": os.getpid(), "cell": served, "started_at": started},
    )
    if changed:  # the cell ran with them; the next cell will not (restored before it)
        record["worker"]["process_state_changed"] = changed
    write_record(record, request["out"])
    del record["samples"]
    release_memory()
    return {
        "status": record["status"],
        "status_reason": record.get("status_reason"),
        "tflops": record.get("tflops"),
        "output": output.getvalue(),
    }
