"""Start a distributed cell the same way on a laptop, a GPU box and a Slurm allocation.

    python -m attnbench.launch --nodes N --nproc-per-node P -- python -m attnbench cp-cell ...

One node: torchrun --standalone (a free port, no rendezvous server). Several nodes: inside a Slurm
allocation, srun starts one torchrun per node with a c10d rendezvous on the first node; ranks and
the address are discovered inside the job, never configured by hand.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys


def slurm_hosts() -> list[str]:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist and os.environ.get("SLURM_JOB_ID"):
        out = subprocess.run(["scontrol", "show", "job", os.environ["SLURM_JOB_ID"]], capture_output=True, text=True)
        for field in out.stdout.split():
            if field.startswith("NodeList="):
                nodelist = field.split("=", 1)[1]
    if not nodelist:
        raise SystemExit("several nodes need a Slurm allocation (no SLURM_JOB_ID / node list in the environment)")
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def command(nodes: int, nproc: int, cmd: list[str], port: int = 29500) -> list[str]:
    # --no-python: CMD runs as given (e.g. `python -m attnbench cp-cell ...`), not as a script path
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--no-python", f"--nproc-per-node={nproc}"]
    if nodes == 1:
        return [*torchrun, "--standalone", "--nnodes=1", *cmd]
    hosts = slurm_hosts()
    if len(hosts) < nodes:
        raise SystemExit(f"the allocation has {len(hosts)} nodes ({', '.join(hosts)}); the cell needs {nodes}")
    job = os.environ.get("SLURM_JOB_ID", "attnbench")
    return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *torchrun,
            f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={hosts[0]}:{port}", f"--rdzv-id={job}", *cmd]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m attnbench.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--nproc-per-node", type=int, required=True)
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command every rank runs")
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("no command given after --")
    full = command(a.nodes, a.nproc_per_node, cmd, a.port)
    print("launch:", shlex.join(full), flush=True)
    sys.exit(subprocess.run(full).returncode)


if __name__ == "__main__":
    main()
