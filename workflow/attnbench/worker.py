"""A warm process per GPU that measures kernel cells one after another (grid key `worker_idle_s`).

Every kernel cell is still its own Snakemake job with its own record, and a rerun still runs only
the cells without a current one. What changes is where a cell's measurement runs: the job (`python
-m attnbench cell --worker-idle-s S ...`) claims its GPU as before (attnbench.launch), then hands
the cell to the worker process of that GPU, starting one if none is listening, and waits for its
answer. The worker keeps what a fresh process pays for again in every cell while holding the GPU
(the CUDA context, cuBLAS/cuDNN handles, the kernels' lazily loaded modules, the caching
allocator's pool), and ends after S seconds without a cell. What is measured does not change:
each cell runs the same run_cell, with Dynamo's compiled graphs reset and the allocator's cache
emptied between cells (so a FlexAttention cell compiles as in a fresh process, from the on-disk
caches), and what a cell may change in the process (threads, default dtype and device, matmul
precision, seeds, environment: harness.process_state) put back before the next; a record names
the settings its cell changed (worker.process_state_changed).

A worker runs only the code its records claim. It is keyed by the package's files and your own
kernel's, so a job finding other files starts another worker; and a job sends the hash of the
cell's code as it finds it, which the worker compares with the files as it imported them
(record.code): a worker that imported other code refuses the cell and ends, and a new one
measures it.

Failures keep their meaning. A cell that crashes the worker (an exception, a dead process) ends
its job without a record, which the launcher then writes as `crashed`, and the next cell starts a
new worker. A cell stopped at its time budget (the launcher kills the job) takes the worker with
it: the worker watches its client's connection and exits the moment the client is gone, so no
stale measurement holds the GPU.

Protocol: one JSON line each way over a Unix socket, plus an acknowledgement line when the worker
accepts a cell, so that a worker ending for idleness just as a cell arrives is told apart from a
worker dying in a cell (the first is retried with a new worker, the second ends the job).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from .harness.faults import CRASH_ENV, HANG_ENV

START_TIMEOUT_S = 300.0
FAULT_ENVS = (CRASH_ENV, HANG_ENV)


class WorkerError(RuntimeError):
    """The worker died running the cell, or could not be started: the job fails, no record."""


def own_code_key(kernel_class: str | None) -> str:
    """The hash of your own kernel's files ('module:Class' kernels; '' for a built-in one): part of
    its worker's key, as the package's code is."""
    if not kernel_class:
        return ""
    from .kernels.catalog import own_kernel_files
    from .record.code import cell_code

    return cell_code((), own_kernel_files(kernel_class)[1])["sha256"]


def socket_path(gpu: str, threads: int, own_code: str = "") -> Path:
    """One worker per GPU and per environment that would run the cell differently (interpreter,
    import path, the package's code and your own kernel's, Slurm job, threads); Unix socket paths
    are short, so a hash names it."""
    from .harness.environment import code_hash

    key = json.dumps(
        [
            sys.executable,
            os.environ.get("PYTHONPATH", ""),
            code_hash()["code_sha256"],
            own_code,
            os.environ.get("SLURM_JOB_ID", ""),
            gpu,
            threads,
        ]
    )
    folder = Path(f"/tmp/attnbench-workers-{os.getuid()}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.sock"


def _send(conn, obj) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


def _read_line(reader) -> dict | None:
    line = reader.readline()
    return json.loads(line) if line else None


# ---------------------------------------------------------------- the job's side


def run_in_worker(request: dict, gpu: str, threads: int, idle_s: float) -> dict:
    """Hand a cell to the worker of `gpu` (starting it if needed); return its answer. A worker
    whose code is not the code this job hashed (request["code_sha256"]) refuses the cell and ends;
    a new one measures it."""
    # the request's spec is a kernel cell's dict (grid.spec.CellSpec.to_dict)
    path = socket_path(gpu, threads, own_code_key(request["spec"].get("kernel_class")))
    for _attempt in range(4):
        conn = _connect_or_start(path, gpu, threads, idle_s)
        with conn, conn.makefile("r") as reader:
            _send(conn, request)
            try:
                ack = _read_line(reader)
            except OSError:
                ack = None
            if ack is None:
                continue  # the worker was ending for idleness as the cell came: a new one
            try:
                answer = _read_line(reader)
            except OSError as e:
                answer, reason = None, str(e)
            else:
                reason = "connection closed"
            if answer is None:
                raise WorkerError(
                    f"the worker (pid {ack.get('pid')}) died running this cell ({reason}); "
                    f"its log: {path.with_suffix('.log')}"
                )
            if "stale" in answer:
                print(
                    f"worker pid {ack.get('pid')}: {answer['stale']}; starting a new one",
                    flush=True,
                )
                _wait_gone(path)
                continue
            return answer
    raise WorkerError(f"no worker accepted the cell at {path} after 4 tries")


def _wait_gone(path: Path, limit_s: float = 30.0) -> None:
    """Until the worker that refused a cell has removed its socket (it is ending)."""
    deadline = time.monotonic() + limit_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _connect(path: Path):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    return conn


def _connect_or_start(path: Path, gpu: str, threads: int, idle_s: float):
    conn = _connect(path)
    if conn:
        return conn
    with open(path.with_suffix(".spawn"), "w") as spawn_lock:
        fcntl.flock(spawn_lock, fcntl.LOCK_EX)  # one job starts the worker; the others wait
        conn = _connect(path)
        if conn:
            return conn
        path.unlink(missing_ok=True)
        log = path.with_suffix(".log")
        with open(log, "a") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "attnbench.worker",
                    "--socket",
                    str(path),
                    "--idle-s",
                    str(idle_s),
                    "--threads",
                    str(threads),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives this job; not stopped with its process group
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = _connect(path)
            if conn:
                return conn
            if proc.poll() is not None:
                tail = log.read_text()[-2000:]
                raise WorkerError(f"the worker for GPU {gpu} exited at start:\n{tail}")
            time.sleep(0.05)
        proc.kill()
        raise WorkerError(f"the worker for GPU {gpu} did not listen within {START_TIMEOUT_S} s")


# ---------------------------------------------------------------- the worker's side


def _exit_when_client_leaves(conn, done: threading.Event) -> None:
    """The job waits for the answer until it ends; if it ends first (stopped at its time budget,
    killed), the cell it asked for is abandoned: end this process, releasing the GPU."""
    try:
        conn.recv(1)
    except OSError:
        pass
    if not done.is_set():
        os._exit(3)


class StaleCode(Exception):
    """The worker imported other code than the job hashed: it must not measure the cell."""


def _measure(request: dict, served: int, started: str, state) -> dict:
    import torch

    from .families import family
    from .families.kernel.cell import run_cell
    from .grid.spec import CellSpec
    from .harness.measure import release_memory
    from .harness.process_state import ProcessState
    from .record.record import write_record

    spec = CellSpec.from_dict(request["spec"])
    # the code as this process first read it (record.code hashes a file once per process, when
    # the file is first used, before it is imported), against the files as the job found them
    mine = family(spec.family).provenance(spec)["code"]["sha256"]
    if request.get("code_sha256") not in (None, mine):
        raise StaleCode(
            f"this worker runs code whose hash is {mine[:12]}, the job's files hash to "
            f"{request['code_sha256'][:12]} (edited since this worker imported them)"
        )
    state.restore()  # what the previous cell changed (threads, dtype, seeds, ...) is undone
    os.chdir(request["cwd"])  # the job's relative paths (record, peak), not the first job's
    for name in FAULT_ENVS:  # the job's fault injection (tests), not the first job's
        os.environ.pop(name, None)
        if name in request.get("env", {}):
            os.environ[name] = request["env"][name]
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


def serve(path: Path, idle_s: float, threads: int) -> bool:
    """Measure the cells sent to `path` until idle_s pass without one (False) or a cell fails
    (True)."""
    import torch

    from .harness.cpu_math import settle_vml
    from .harness.process_state import ProcessState
    from .record.record import now

    if threads:
        torch.set_num_threads(threads)
    settle_vml()
    state = ProcessState.capture()  # put back before every cell
    started = now()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)
    server.settimeout(idle_s)
    served = 0
    try:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return False
            conn.settimeout(None)
            fatal = False
            with conn, conn.makefile("r") as reader:
                request = _read_line(reader)
                if request is None:
                    continue
                served += 1
                print(f"{now()} pid {os.getpid()} cell {served}: {request['out']}", flush=True)
                _send(conn, {"pid": os.getpid(), "cell": served})
                done = threading.Event()
                threading.Thread(
                    target=_exit_when_client_leaves, args=(conn, done), daemon=True
                ).start()
                try:
                    answer, fatal = _measure(request, served, started, state), False
                except StaleCode as e:  # the job starts a new worker, which imports the files anew
                    answer, fatal = {"stale": str(e)}, True
                except Exception:  # noqa: BLE001 - the job reports it; the process state is suspect
                    answer, fatal = {"error": traceback.format_exc()}, True
                done.set()
                _send(conn, answer)
                conn.shutdown(socket.SHUT_RDWR)
            if fatal:
                return True
    finally:
        # unlink first: a job arriving now finds no socket and starts a new worker, while one that
        # connected a moment ago is refused when the socket closes, and retries
        path.unlink(missing_ok=True)
        server.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--socket", type=Path, required=True)
    p.add_argument("--idle-s", type=float, required=True)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args(argv)
    if serve(a.socket, a.idle_s, a.threads):
        # the process state is suspect: end now, not after an interpreter shutdown of unknown length
        sys.stdout.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
