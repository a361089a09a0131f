"""A warm process per GPU that measures kernel cells one after another (grid key `worker_idle_s`).

Every kernel cell is still its own Snakemake job with its own record, and a rerun still runs only
the cells without a current one. What changes is where a cell's measurement runs: the job (`python
-m attnbench cell --worker-idle-s S ...`) claims its GPU as before (attnbench.run.launch), then hands
the cell to the worker process of that GPU, starting one if none is listening, and waits for its
answer. The worker keeps what a fresh process pays for again in every cell while holding the GPU
(the CUDA context, cuBLAS/cuDNN handles, the kernels' lazily loaded modules, the caching
allocator's pool), and ends after S seconds without a cell. What is measured does not change:
each cell runs the same run_cell, with Dynamo's compiled graphs reset and the allocator's cache
emptied between cells (so a FlexAttention cell compiles as in a fresh process, from the on-disk
caches), and what a cell may change in the process (threads, default dtype and device, matmul
precision, seeds, environment: harness.process_state) put back before the next; a record names
the settings its cell changed (worker.process_state_changed).

A worker runs only the code, libraries and settings its records claim. It is keyed by the
package's files and your own kernel's, the installed versions of the libraries a record names,
the interpreter, and every environment variable a library reads when it loads or picks a kernel
(KEYED_ENV: threads, the CPU's instruction set, CUDA, cuDNN, cuBLAS, NCCL, Triton, Inductor, the
import and library paths), so a job that differs in any of them starts another worker. Every
other variable is the job's own: sent with the cell and set for it alone. A job also sends the
hash of the cell's code as it finds it, which the worker compares with the files as it imported
them (record.code): a worker that imported other code refuses the cell and ends, and a new one
measures it.

A worker that is stopped (SIGSTOP, a debugger) or gone while a job waits for it is killed, and
the job's cell goes to a new worker, once: a frozen worker never turns later cells into false
timeouts.

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
import enum
import fcntl
import hashlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

START_TIMEOUT_S = 300.0
# A worker seen stopped this long while a job waits for it is taken as frozen.
STOPPED_LIMIT_S = 5.0
# Environment variables (by prefix) that change what a cell measures and are read when a library
# loads (so they cannot be set per cell): part of the worker's key. The list is data: add a
# prefix here when a library reads another one (docs/running.md, "Warm workers").
KEYED_ENV = (
    "ATEN_",  # ATEN_CPU_CAPABILITY: the CPU kernels' instruction set
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "CUDA_",  # CUDA_VISIBLE_DEVICES, CUDA_LAUNCH_BLOCKING, CUDA_MODULE_LOADING, ...
    "CUBLAS",  # CUBLAS_WORKSPACE_CONFIG, CUBLASLT_*
    "CUDNN_",
    "NCCL_",
    "NVIDIA_",  # NVIDIA_TF32_OVERRIDE
    "TRITON_",
    "TORCH",  # TORCH_*, TORCHINDUCTOR_*, TORCHDYNAMO_*
    "PYTORCH_",
    "LD_",  # LD_LIBRARY_PATH, LD_PRELOAD: which libraries load
    "PYTHON",  # PYTHONPATH, PYTHONHASHSEED, ...
    "SLURM_JOB_ID",  # a worker belongs to one allocation
)


def keyed_env(env) -> dict:
    """The variables of `env` in the worker's key (KEYED_ENV)."""
    return {k: env[k] for k in sorted(env) if k.startswith(KEYED_ENV)}


def passed_env(env) -> dict:
    """The variables of `env` a job sends with its cell: every one not in the key."""
    return {k: v for k, v in env.items() if not k.startswith(KEYED_ENV)}


class WorkerError(RuntimeError):
    """The worker died running the cell, or could not be started: the job fails, no record."""


def socket_path(runner: str, gpu: str, threads: int, own_code: str = "") -> Path:
    """One worker per cell runner, GPU and environment that would run the cell differently
    (interpreter, the package's code and your own kernel's, the libraries' installed versions, the
    KEYED_ENV variables, threads); Unix socket paths are short, so a hash names it."""
    from ..harness.environment import code_hash, library_versions

    key = json.dumps(
        [
            runner,
            sys.executable,
            keyed_env(os.environ),
            code_hash()["code_sha256"],
            own_code,
            library_versions(),
            gpu,
            threads,
        ]
    )
    folder = Path(f"/tmp/attnbench-workers-{os.getuid()}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.sock"


def _now() -> str:
    """As records write their times (record.record.now, a stage this one does not import)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _send(conn, obj) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


def _read_line(reader) -> dict | None:
    line = reader.readline()
    return json.loads(line) if line else None


# ---------------------------------------------------------------- the job's side


def run_in_worker(
    request: dict,
    runner: str,
    gpu: str,
    threads: int,
    idle_s: float,
    own_code: str = "",
    deadline: float | None = None,
) -> dict:
    """Hand a cell to the worker of `gpu` that measures cells with `runner` ('module:function',
    which takes the request and returns the answer), starting it if needed; return its answer.
    `own_code`: the hash of your own kernel's files, part of the worker's key. A worker whose code
    is not the code this job hashed (request["code_sha256"]) refuses the cell and ends; a new one
    measures it. `deadline` (time.time()): a worker that has not answered by then is killed and
    WorkerLate raised, so that the job measures the cell in a fresh process instead."""
    path = socket_path(runner, gpu, threads, own_code)
    frozen = 0
    for _attempt in range(4):
        conn = _connect_or_start(path, runner, gpu, threads, idle_s)
        with conn, conn.makefile("r") as reader:
            _send(conn, request)
            pid = _worker_pid(path)
            if _answers(conn, pid) is not Wait.ANSWERED:
                frozen += 1
                _kill_frozen(path, pid, frozen)
                continue  # its queued cell goes to a new worker
            try:
                ack = _read_line(reader)
            except OSError:
                ack = None
            if ack is None:
                continue  # the worker was ending for idleness as the cell came: a new one
            answered = _answers(conn, ack["pid"], deadline)
            if answered is Wait.LATE:  # busy past the deadline: hung, or far slower
                _kill_late(path, ack["pid"])
            if answered is Wait.STOPPED:  # stopped in this cell: measured again, once
                frozen += 1
                _kill_frozen(path, ack["pid"], frozen)
                continue
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


def _worker_pid(path: Path) -> int | None:
    try:
        return int(path.with_suffix(".pid").read_text())
    except (OSError, ValueError):
        return None


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (state T or t in /proc; not on Linux: never)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


class Wait(enum.Enum):
    """How waiting for a worker's answer ended (_answers)."""

    ANSWERED = "answered"
    STOPPED = "stopped"  # seen stopped (SIGSTOP) for STOPPED_LIMIT_S
    LATE = "late"  # no answer by the job's deadline


def _answers(conn, pid: int | None, deadline: float | None = None) -> Wait:
    """Wait until the worker has written to `conn` (ANSWERED); STOPPED where it is seen stopped
    for STOPPED_LIMIT_S meanwhile (a busy worker may take as long as its cell takes, up to the
    deadline); LATE at the deadline."""
    stopped_since = None
    while not select.select([conn], [], [], 1.0)[0]:
        if deadline is not None and time.time() >= deadline:
            return Wait.LATE
        if pid is None or not _stopped(pid):
            stopped_since = None
        elif stopped_since is None:
            stopped_since = time.monotonic()
        elif time.monotonic() - stopped_since >= STOPPED_LIMIT_S:
            return Wait.STOPPED
    return Wait.ANSWERED


class WorkerLate(WorkerError):
    """The worker did not answer by the job's deadline: killed; the job measures the cell itself."""


def _kill_late(path: Path, pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    raise WorkerLate(f"the worker (pid {pid}) had not answered by the job's deadline: killed")


def _kill_frozen(path: Path, pid: int, times: int) -> None:
    """Kill a worker found stopped and remove its socket, so that the next try starts another;
    the second frozen worker for one cell fails the job (no record: the launcher writes it)."""
    print(f"worker pid {pid} is stopped: killed; the cell goes to a new worker", flush=True)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    if times > 1:
        raise WorkerError(f"a second worker (pid {pid}) was stopped running this cell")


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


def _connect_or_start(path: Path, runner: str, gpu: str, threads: int, idle_s: float):
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
                    "attnbench.run.worker",
                    "--runner",
                    runner,
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


def serve(path: Path, runner: str, idle_s: float, threads: int) -> bool:
    """Measure the cells sent to `path` with `runner` until idle_s pass without one (False) or a
    cell fails (True)."""
    import torch

    from ..harness.cpu_math import settle_vml
    from ..harness.process_state import ProcessState

    if threads:
        torch.set_num_threads(threads)
    settle_vml()
    module, function = runner.split(":")
    measure = getattr(importlib.import_module(module), function)  # a family's, named as data
    state = ProcessState.capture()  # put back before every cell
    started = _now()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.with_suffix(".pid").write_text(str(os.getpid()))  # for a job that finds it stopped
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
                print(f"{_now()} pid {os.getpid()} cell {served}: {request['out']}", flush=True)
                _send(conn, {"pid": os.getpid(), "cell": served})
                done = threading.Event()
                threading.Thread(
                    target=_exit_when_client_leaves, args=(conn, done), daemon=True
                ).start()
                try:
                    answer = measure(request, served, started, state)
                    # {"stale": why}: this process imported other code than the job hashed; the
                    # job starts a new worker, which imports the files anew
                    fatal = "stale" in answer
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
    p.add_argument("--runner", required=True, help="module:function measuring one request")
    p.add_argument("--socket", type=Path, required=True)
    p.add_argument("--idle-s", type=float, required=True)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args(argv)
    if serve(a.socket, a.runner, a.idle_s, a.threads):
        # the process state is suspect: end now, not after an interpreter shutdown of unknown length
        sys.stdout.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
