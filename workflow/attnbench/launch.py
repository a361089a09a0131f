"""Start a distributed cell the same way on a laptop, a GPU box and a Slurm allocation.

    python -m attnbench.launch --nodes N --nproc-per-node P -- python -m attnbench cp-cell ...

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
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys

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
        super().__init__(f"attnbench.launch: {message}")


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
        raise ValueError(f"nodes, nproc_per_node and cpus_per_rank must be >= 1, got {nodes}, {nproc_per_node}, {cpus_per_rank}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    cuda = device == "cuda"
    if nodes == 1:
        return {"nodes": 1, "gpu": nproc_per_node if cuda else None, "cpus_per_task": nproc_per_node * cpus_per_rank,
                "mpi": None, "tasks": None, "slurm_extra": None}
    extra = f"--ntasks-per-node={nproc_per_node}" + (f" --gpus-per-node={nproc_per_node}" if cuda else "")
    return {"nodes": nodes, "gpu": None, "cpus_per_task": cpus_per_rank, "mpi": "srun",
            "tasks": nodes * nproc_per_node, "slurm_extra": extra}


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
        raise LaunchError("several nodes need a Slurm allocation: SLURM_JOB_ID is not set "
                          "(run the workflow with --profile profiles/slurm, or inside sbatch/salloc)")
    job = _fields(_scontrol("show", "job", "-o", job_id))
    hosts = _scontrol("show", "hostnames", job["NodeList"]).split()
    node = _fields(_scontrol("show", "node", "-o", hosts[0]))
    return {"job_id": job_id, "hosts": hosts, "master_addr": node.get("NodeAddr") or hosts[0],
            "batch_host": job.get("BatchHost"), "cpus_per_task": int(job.get("CPUs/Task", "1") or 1)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def command(nodes: int, nproc: int, cmd: list[str], port: int | None = None) -> tuple[list[str], dict]:
    """The command line and extra environment that start nodes x nproc ranks of `cmd`."""
    if nodes == 1:
        # --no-python: the command is a whole command line (python -m ..., a binary), not a script.
        torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--no-python"]
        return [*torchrun, "--standalone", "--nnodes=1", *cmd], {}
    step = os.environ.get("SLURM_STEP_ID")
    if step is not None and step not in ("batch", "4294967294"):
        raise LaunchError(f"several nodes cannot be started from inside job step {step}: its srun would wait "
                          "for CPUs the step holds. Give the rule the `mpi` resource (see attnbench.launch."
                          "resources) so that the Slurm executor runs it in the batch step")
    alloc = slurm_allocation()
    if len(alloc["hosts"]) < nodes:
        raise LaunchError(f"the allocation has {len(alloc['hosts'])} nodes ({', '.join(alloc['hosts'])}); "
                          f"the cell needs {nodes}")
    if port is None:
        # Rank 0 (and its TCPStore) lives on the first node: a free port there, when we are there.
        here = socket.gethostname().split(".")[0]
        port = free_port() if alloc["batch_host"] in (alloc["hosts"][0], here) else 29500
    srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes * nproc}", f"--ntasks-per-node={nproc}",
            f"--cpus-per-task={alloc['cpus_per_task']}", "--kill-on-bad-exit=1", "--export=ALL"]
    env = {"MASTER_ADDR": alloc["master_addr"], "MASTER_PORT": str(port)}
    return [*srun, sys.executable, "-m", "attnbench.launch", "--slurm-task", "--", *cmd], env


def task_environment(env: dict) -> dict:
    """torch.distributed's variables for the srun task described by Slurm's variables in `env`."""
    missing = [v for v in TASK_ENV.values() if v not in env]
    if missing:
        raise LaunchError(f"--slurm-task runs inside an srun task; {', '.join(missing)} not set")
    out = {name: env[var] for name, var in TASK_ENV.items()}
    out["LOCAL_WORLD_SIZE"] = str(int(env["SLURM_NTASKS"]) // int(env.get("SLURM_NNODES", "1")))
    return out


def _run(full: list[str], extra_env: dict) -> int:
    """Run the launcher's child, passing on the signals that stop a job (scancel, Ctrl-C)."""
    proc = subprocess.Popen(full, env={**os.environ, **extra_env})

    def forward(signum, _frame):
        proc.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    return proc.wait()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m attnbench.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--nproc-per-node", type=int)
    p.add_argument("--port", type=int, help="rendezvous port on the first node (default: a free one)")
    p.add_argument("--slurm-task", action="store_true", help="internal: one srun task becomes one torch rank")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command every rank runs")
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("no command given after --")
    if a.slurm_task:
        env = task_environment(os.environ)
        os.environ.update(env)
        os.execvp(cmd[0], cmd)
    if a.nproc_per_node is None or a.nproc_per_node < 1 or a.nodes < 1:
        p.error("--nproc-per-node (>= 1) is required, and --nodes must be >= 1")
    full, env = command(a.nodes, a.nproc_per_node, cmd, a.port)
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    print("launch:", (shown + " " if shown else "") + shlex.join(full), flush=True)
    sys.exit(_run(full, env))


if __name__ == "__main__":
    main()
