"""Start a distributed cell the same way on a laptop, a GPU box and a Slurm allocation.

    python -m attnbench.run.launch --nodes N --nproc-per-node P -- python -m attnbench cp-cell ...

One node: `torchrun --standalone` (a free port, no rendezvous server), inside whatever the process
may use: the whole machine, or the Slurm job step the executor plugin started for the rule.

Several nodes (inside a Slurm allocation only): `srun` starts one task per rank, N nodes x P tasks,
each re-entering this module as `--slurm-task`, which turns Slurm's task identity into torch's
(RANK, LOCAL_RANK, WORLD_SIZE, ...) and execs the command. The rendezvous address (the first node's
NodeAddr and a free port there) and the allocation (node list, CPUs per task) are read from
`scontrol` inside the job, because snakemake-executor-plugin-slurm removes most SLURM_* variables
from a rule's environment. The rule must carry the `mpi` resource so that the plugin does not wrap
its shell command in `srun` itself (an srun inside an srun step waits forever for busy CPUs):
`resources()` below returns the resources a rule needs, under the names the plugin reads.

GPUs on one machine without Slurm (`--gpus-per-node G`): Snakemake only counts GPU jobs, it does not
assign devices, so the launcher claims G of the visible GPUs with one lock file per device (held
for the command's lifetime; the kernel releases it when the process ends, however it ends) and sets
CUDA_VISIBLE_DEVICES. Under Slurm the job's CUDA_VISIBLE_DEVICES already names its own GPUs.
Without --nproc-per-node the command runs once: `python -m attnbench.run.launch --gpus-per-node 1 --
python -m attnbench cell ...` is how a kernel cell gets its own GPU.

A time budget (`--time-limit-s S`, the grid's cell_timeout_s): the launcher waits for the command,
and when it still runs after S seconds it stops it and everything it started (SIGTERM, then SIGKILL
after a grace period), then runs the command once more as a single process with `--timed-out-after S`
appended; `python -m attnbench cell` and `cp-cell` then only write the cell's `timeout` record.
The launcher then exits with that command's status (0: the job succeeds, the run goes on).

The record (`--record PATH`, with `--log PATH`, the job's log): a command that ends without having
written it (an exception, a segfault, `os._exit`, a rank killed, the warm worker dying) is run once
more with `--crashed JSON` appended (how it ended, the log's last lines), and writes the cell's
`crashed` record; the job succeeds, and the next run retries the cell (attnbench.pipeline.currency). A
launcher told to stop (SIGTERM, SIGINT) records nothing.

The run (run_lock.RUN_PID_ENV, Snakemake's process): where it is an ancestor of the launcher, the
launcher looks every second whether it still is, and stops the command, recording nothing, when
the run is gone (killed with SIGKILL, its cells would otherwise keep measuring, beside the next
run's).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .lock import ancestors, run_to_watch

# Slurm's per-task identity -> the variables torch.distributed's env:// initialisation reads.
TASK_ENV = {
    "RANK": "SLURM_PROCID",
    "LOCAL_RANK": "SLURM_LOCALID",
    "WORLD_SIZE": "SLURM_NTASKS",
    "GROUP_RANK": "SLURM_NODEID",
    "NODE_RANK": "SLURM_NODEID",
}


class LaunchError(SystemExit):
    """A launch that cannot work here; the message says why and what to change."""

    def __init__(self, message: str):
        super().__init__(f"attnbench.run.launch: {message}")


def resources(nodes: int, nproc_per_node: int, device: str, cpus_per_rank: int = 1) -> dict:
    """Snakemake resources (snakemake-executor-plugin-slurm names) for a cell of nodes x nproc_per_node
    ranks; None means 'leave the resource out' (Snakemake drops None-valued resources).

    One node: the plugin runs the rule in one job step holding all ranks' CPUs (`cpus_per_task`) and
    GPUs (`gpu`, also what the local profile counts); torchrun starts the ranks inside it. Several
    nodes: `mpi` keeps the plugin from wrapping the rule in srun; `tasks` and `--ntasks-per-node` shape
    the allocation as one task per rank, `--gpus-per-node` gives each node its GPUs (the plugin's
    `gpu` would ask for GPUs in total and add --ntasks-per-gpu, not per node).
    """
    if nodes < 1 or nproc_per_node < 1 or cpus_per_rank < 1:
        raise ValueError(
            f"nodes, nproc_per_node and cpus_per_rank must be >= 1, got {nodes}, {nproc_per_node}, {cpus_per_rank}"
        )
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    cuda = device == "cuda"
    if nodes == 1:
        return {
            "nodes": 1,
            "gpu": nproc_per_node if cuda else None,
            "cpus_per_task": nproc_per_node * cpus_per_rank,
            "mpi": None,
            "tasks": None,
            "slurm_extra": None,
        }
    extra = f"--ntasks-per-node={nproc_per_node}" + (
        f" --gpus-per-node={nproc_per_node}" if cuda else ""
    )
    return {
        "nodes": nodes,
        "gpu": None,
        "cpus_per_task": cpus_per_rank,
        "mpi": "srun",
        "tasks": nodes * nproc_per_node,
        "slurm_extra": extra,
    }


RESOURCE_NAMES = tuple(resources(1, 1, "cpu"))


def _scontrol(*args: str) -> str:
    try:
        out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise LaunchError("several nodes need Slurm, and `scontrol` is not on PATH") from None
    if out.returncode != 0:
        raise LaunchError(f"`scontrol {' '.join(args)}` failed: {out.stderr.strip()}")
    return out.stdout


def _fields(one_line: str) -> dict:
    """`scontrol show ... -o` prints one record as space-separated Key=Value pairs."""
    return dict(tok.split("=", 1) for tok in one_line.split() if "=" in tok)


def slurm_allocation() -> dict:
    """The job this process runs in: node names, first node's address, CPUs per task, batch host."""
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    if not job_id:
        raise LaunchError(
            "several nodes need a Slurm allocation: SLURM_JOB_ID is not set "
            "(run the workflow with --profile profiles/slurm, or inside sbatch/salloc)"
        )
    job = _fields(_scontrol("show", "job", "-o", job_id))
    hosts = _scontrol("show", "hostnames", job["NodeList"]).split()
    node = _fields(_scontrol("show", "node", "-o", hosts[0]))
    return {
        "job_id": job_id,
        "hosts": hosts,
        "master_addr": node.get("NodeAddr") or hosts[0],
        "batch_host": job.get("BatchHost"),
        "cpus_per_task": int(job.get("CPUs/Task", "1") or 1),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def command(
    nodes: int, nproc: int, cmd: list[str], port: int | None = None
) -> tuple[list[str], dict]:
    """The command line and extra environment that start nodes x nproc ranks of `cmd`."""
    if nodes == 1:
        # --no-python: the command is a whole command line (python -m ..., a binary), not a script.
        torchrun = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            "--no-python",
        ]
        return [*torchrun, "--standalone", "--nnodes=1", *cmd], {}
    step = os.environ.get("SLURM_STEP_ID")
    if step is not None and step not in ("batch", "4294967294"):
        raise LaunchError(
            f"several nodes cannot be started from inside job step {step}: its srun would wait "
            "for CPUs the step holds. Give the rule the `mpi` resource (see attnbench.run.launch."
            "resources) so that the Slurm executor runs it in the batch step"
        )
    alloc = slurm_allocation()
    if len(alloc["hosts"]) < nodes:
        raise LaunchError(
            f"the allocation has {len(alloc['hosts'])} nodes ({', '.join(alloc['hosts'])}); "
            f"the cell needs {nodes}"
        )
    if port is None:
        # Rank 0 (and its TCPStore) lives on the first node, where this batch step normally runs:
        # a port free there; else one derived from the job id.
        port = (
            free_port()
            if alloc["batch_host"] == alloc["hosts"][0]
            else 29500 + int(alloc["job_id"]) % 1000
        )
    srun = [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes * nproc}",
        f"--ntasks-per-node={nproc}",
        f"--cpus-per-task={alloc['cpus_per_task']}",
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]
    env = {"MASTER_ADDR": alloc["master_addr"], "MASTER_PORT": str(port)}
    return [*srun, sys.executable, "-m", "attnbench.run.launch", "--slurm-task", "--", *cmd], env


def task_environment(env: dict) -> dict:
    """torch.distributed's variables for the srun task described by Slurm's variables in `env`."""
    missing = [v for v in TASK_ENV.values() if v not in env]
    if missing:
        raise LaunchError(f"--slurm-task runs inside an srun task; {', '.join(missing)} not set")
    out = {name: env[var] for name, var in TASK_ENV.items()}
    # srun --ntasks-per-node sets SLURM_NTASKS_PER_NODE; tasks are spread evenly over the step's nodes.
    out["LOCAL_WORLD_SIZE"] = env.get("SLURM_NTASKS_PER_NODE") or str(
        int(env["SLURM_NTASKS"])
        // int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES", "1"))
    )
    return out


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else all that nvidia-smi lists."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [d.strip() for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [
        str(i) for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))
    ]


# How often a cell waiting for a GPU looks again: a GPU left idle between two cells is lost time
# (at 1 s, about a tenth of a sweep of short cells went to this wait).
CLAIM_POLL_S = 0.02


def claim_gpus(n: int, lock_dir: Path, wait_s: float = 600.0) -> tuple[list[str], list[int]]:
    """Lock n free GPUs of this machine; returns their ids and the open lock files (inheritable
    descriptors: the locks last as long as this process or the command it execs)."""
    gpus = visible_gpus()
    if n > len(gpus):
        raise LaunchError(
            f"{n} GPUs asked for, {len(gpus)} visible ({', '.join(gpus) or 'none'}; "
            "CUDA_VISIBLE_DEVICES or nvidia-smi -L)"
        )
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        held: list[tuple[str, int]] = []
        for gpu in gpus:
            fd = os.open(lock_dir / f"gpu-{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append((gpu, fd))
            if len(held) == n:
                for _, fd in held:
                    os.set_inheritable(fd, True)
                return [g for g, _ in held], [fd for _, fd in held]
        for _, fd in held:
            os.close(fd)
        if time.monotonic() > deadline:
            raise LaunchError(
                f"no {n} free GPUs among {', '.join(gpus)} after {wait_s:.0f} s; other processes hold "
                f"their locks in {lock_dir} (limit Snakemake's `gpu` resource to the GPUs present)"
            )
        time.sleep(CLAIM_POLL_S)


CLAIM_ENV = "ATTNBENCH_CLAIM_GPUS"
# With --time-limit-s: when (time.time()) the launcher will stop the child, as its child sees it.
DEADLINE_ENV = "ATTNBENCH_CELL_DEADLINE"
CLAIM_WAIT_S = None  # seconds this process waited for its GPUs (claim_from_environment)
CLAIMED_LOCKS: list[int] = []  # the lock files claim_from_environment holds (release_gpus)


def lock_dir() -> Path:
    return Path(
        os.environ.get("ATTNBENCH_GPU_LOCK_DIR", f"/tmp/attnbench-gpu-locks-{os.getuid()}")
    )


def claim_from_environment() -> list[str]:
    """For a command started with --claim-after-import: claim the GPUs now (call it after the slow
    imports and before anything touches CUDA), so that cells waiting for a GPU have already spent
    their start-up; the locks are held until this process exits."""
    global CLAIM_WAIT_S
    n = int(os.environ.pop(CLAIM_ENV, "0") or 0)
    if not n:
        return []
    t0 = time.monotonic()
    gpus, locks = claim_gpus(n, lock_dir())
    CLAIMED_LOCKS.extend(locks)
    CLAIM_WAIT_S = time.monotonic() - t0
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    print(f"claimed GPU {','.join(gpus)} after start-up", flush=True)
    return gpus


def release_gpus() -> None:
    """Give the GPUs claim_from_environment took back once this process' device work is done, so
    that the next cell starts measuring while this one writes its record and exits. Its cached
    device memory is returned first; what stays (the CUDA context, well under a GiB) cannot
    disturb the next cell's timings, as nothing runs on the device any more."""
    if not CLAIMED_LOCKS:
        return
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    while CLAIMED_LOCKS:
        os.close(CLAIMED_LOCKS.pop())


TIMED_OUT_FLAG = "--timed-out-after"
CRASHED_FLAG = "--crashed"
# Seconds between SIGTERM and SIGKILL when a command is stopped at its time budget.
STOP_GRACE_S = 10.0
# How often the launcher looks whether the run that started it still lives.
WATCH_S = 1.0
# Lines of the job's log a crashed record keeps.
LOG_TAIL_LINES = 30


def how_it_ended(returncode: int) -> dict:
    """A child's end in words: its exit status, or the signal that killed it."""
    if returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else "?"
        return {"how": f"was killed by signal {-returncode} ({sig})", "signal": sig}
    return {"how": f"exited with status {returncode}", "exit_status": returncode}


def log_tail(log: str | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    if not log:
        return []
    try:
        text = Path(log).read_bytes()[-64 * 1024 :].decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def _run(
    full: list[str],
    extra_env: dict,
    limit_s: float | None = None,
    cmd: list[str] | None = None,
    record: str | None = None,
    log: str | None = None,
) -> int:
    """Run the launcher's child, passing on the signals that stop a job (scancel, Ctrl-C). With
    limit_s: past it, stop the child's whole process tree and record the timeout with `cmd`. With
    record: a child that ends without writing it (a crash, a kill, an exit) gets a `crashed` record
    from `cmd`, with how it ended and the last lines of `log`. The child stops, and nothing is
    recorded, when this launcher is told to stop or when the run that started it is gone."""
    if limit_s is not None:  # when this launcher stops the child (a warm worker's job reads it)
        extra_env = {**extra_env, DEADLINE_ENV: f"{time.time() + limit_s:.3f}"}
    proc = subprocess.Popen(full, env={**os.environ, **extra_env})
    told_to_stop = []

    def forward(signum, _frame):
        told_to_stop.append(signum)
        proc.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    run = run_to_watch()
    deadline = None if limit_s is None else time.monotonic() + limit_s
    while True:
        wait_s = WATCH_S if run else None
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            wait_s = left if wait_s is None else min(wait_s, left)
        try:
            returncode = proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            pass
        if run and run not in ancestors():
            print(
                f"launch: the run that started this cell (pid {run}) has ended: stopping the cell",
                flush=True,
            )
            stop_tree(proc, STOP_GRACE_S)
            return 1
        if deadline is not None and time.monotonic() >= deadline:
            print(
                f"launch: still running after {limit_s:g} s, the cell's time budget: stopping it",
                flush=True,
            )
            stop_tree(proc, STOP_GRACE_S)
            return _record_with(cmd, [TIMED_OUT_FLAG, f"{limit_s:g}"])
    if record is None or told_to_stop:
        return returncode
    if run and run not in ancestors():  # the cell ended with its run (run_lock.end_with_run)
        return returncode
    if Path(record).exists():
        if returncode:
            print(
                f"launch: the command {how_it_ended(returncode)['how']} after writing {record}; "
                "the record is kept",
                flush=True,
            )
        return 0  # a record on disk is complete (written to a .tmp file, then renamed)
    ended = how_it_ended(returncode)
    crash = {**ended, "log": log, "log_tail": log_tail(log)}  # the cell's lines, before ours
    print(f"launch: the command {ended['how']} without writing {record}", flush=True)
    return _record_with(cmd, [CRASHED_FLAG, json.dumps(crash)])


def _record_with(cmd: list[str], flag: list[str]) -> int:
    """Run the cell's command once more, as one process and without a GPU, with a flag telling it
    to write only the record of how its cell ended (timeout, crashed)."""
    record = [*cmd, *flag]
    _show({}, record[: len(cmd) + 1])
    env = {k: v for k, v in os.environ.items() if k != CLAIM_ENV}  # writing a record needs no GPU
    return subprocess.run(record, env=env).returncode


def descendants(pid: int) -> list[int]:
    """Every process below pid, from /proc (Linux): torchrun's ranks, a compiler's workers."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the name field may hold spaces and parentheses: the fields after the last ')' are fixed
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Still running: an exited process not yet reaped (a zombie) is not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal_all(pids, sig):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_tree(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the child and every process below it (found before any of them dies, as their
    parents' deaths re-parent them), SIGKILL to those still alive after grace_s."""
    tree = [proc.pid, *descendants(proc.pid)]
    _signal_all(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (proc.poll() is None or any(alive(p) for p in tree[1:])):
        time.sleep(0.1)
    survivors = [p for p in tree if alive(p)]
    _signal_all(survivors + [d for p in survivors for d in descendants(p)], signal.SIGKILL)
    proc.wait()


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m attnbench.run.launch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument(
        "--nproc-per-node",
        type=int,
        help="ranks per node (absent: run the command once, no torchrun)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=0,
        help="GPUs the command uses on each node; without Slurm they are claimed on this machine",
    )
    p.add_argument(
        "--port", type=int, help="rendezvous port on the first node (default: a free one)"
    )
    p.add_argument(
        "--slurm-task", action="store_true", help="internal: one srun task becomes one torch rank"
    )
    p.add_argument(
        "--claim-after-import",
        action="store_true",
        help="one process: let the command claim its GPUs itself once it has started (more cells than "
        "GPUs may then start at once, each waiting for a GPU only after its imports)",
    )
    p.add_argument(
        "--time-limit-s",
        type=float,
        help="stop the command after this many seconds and run it once more with "
        f"{TIMED_OUT_FLAG} SECONDS appended (it writes the cell's timeout record)",
    )
    p.add_argument(
        "--record",
        help="the record the command writes: if it ends without one, run the command once more "
        f"with {CRASHED_FLAG} JSON appended (it writes the cell's `crashed` record)",
    )
    p.add_argument("--log", help="the job's log, whose last lines a `crashed` record keeps")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command every rank runs")
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("no command given after --")
    if a.slurm_task:
        env = task_environment(os.environ)
        os.environ.update(env)
        os.execvp(cmd[0], cmd)
    if (
        a.nodes < 1
        or a.gpus_per_node < 0
        or (a.nproc_per_node is not None and a.nproc_per_node < 1)
    ):
        p.error("--nodes and --nproc-per-node must be >= 1, --gpus-per-node >= 0")
    if a.nodes > 1 and a.nproc_per_node is None:
        p.error("several nodes need --nproc-per-node")
    if a.claim_after_import and a.nproc_per_node is not None:
        p.error("--claim-after-import is for one process (no --nproc-per-node)")
    if a.time_limit_s is not None and a.time_limit_s <= 0:
        p.error(f"--time-limit-s must be > 0, got {a.time_limit_s:g}")
    env = {}
    if a.gpus_per_node and not os.environ.get("SLURM_JOB_ID"):
        if a.nodes > 1:
            p.error("several nodes need Slurm, which assigns their GPUs")
        if visible_gpus() and a.claim_after_import:
            env[CLAIM_ENV] = str(a.gpus_per_node)  # the command calls claim_from_environment()
        elif visible_gpus():
            gpus, _locks = claim_gpus(a.gpus_per_node, lock_dir())
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        else:
            # A CUDA cell on a machine without GPUs still runs: its record says it is unavailable.
            print("launch: no GPU visible here; the command runs without one", flush=True)
    if a.nproc_per_node is None and a.time_limit_s is None and a.record is None:
        _show(env, cmd)
        os.environ.update(env)
        os.execvp(cmd[0], cmd)
    full, more = (
        (cmd, {}) if a.nproc_per_node is None else command(a.nodes, a.nproc_per_node, cmd, a.port)
    )
    env.update(more)
    _show(env, full)
    sys.exit(_run(full, env, a.time_limit_s, cmd, a.record, a.log))


def _show(env: dict, cmd: list[str]) -> None:
    """The launched command line, first in the log of the cell."""
    print("launch:", *[f"{k}={v}" for k, v in env.items()], shlex.join(cmd), flush=True)


if __name__ == "__main__":
    main()
