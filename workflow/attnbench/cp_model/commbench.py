"""A small communication benchmark: all-to-all, ring send/recv and all-gather across message sizes.

    python -m attnbench.run.launch --nproc-per-node N -- python -m attnbench.cp_model.commbench \
        --device cpu|cuda --out comm.json [--sizes-mib 1 4 16 64]

NCCL on GPUs, gloo on the CPU (the same code). Bytes per rank are counted as cp/comm.py counts
them (what the model's Transfer.nbytes holds); rank 0 writes, per pattern, the median time per
size and a least-squares latency + bytes/bandwidth fit: the numbers a cp_model network preset takes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..cp.run import init


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_op(op, device, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        op()
    _sync(device)
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        _sync(device)
        times.append(time.perf_counter() - t0)
    # the slowest rank's median: every pattern ends when its last rank does
    t = torch.tensor([float(np.median(times))], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def patterns(nbytes: int, device, rank: int, world: int) -> dict:
    """op, and the bytes one rank sends, per pattern, for a per-rank buffer of `nbytes`."""
    n = nbytes // 4 // world * world
    buf, out = torch.ones(n, device=device), torch.empty(n, device=device)
    gathered = torch.empty(n * world, device=device)
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def p2p():
        ops = [dist.P2POp(dist.isend, buf, nxt), dist.P2POp(dist.irecv, out, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    return {
        "all_to_all": (lambda: dist.all_to_all_single(out, buf), n * 4 * (world - 1) // world),
        "p2p": (p2p, n * 4),
        "all_gather": (lambda: dist.all_gather_into_tensor(gathered, buf), n * 4 * (world - 1)),
    }


def fit(sizes, times) -> dict:
    """time = latency + bytes / bandwidth, least squares."""
    a = np.stack([np.ones(len(sizes)), np.asarray(sizes, float)], axis=1)
    (lat, inv_bw), *_ = np.linalg.lstsq(a, np.asarray(times, float), rcond=None)
    return {
        "latency_us": float(lat * 1e6),
        "gbytes_per_s": float(1 / inv_bw / 1e9) if inv_bw > 0 else None,
    }


def run(device_name: str, sizes_mib, reps: int, warmup: int, timeout_s: float) -> dict:
    device = init(device_name, timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    res = {"device": device_name, "world": world, "backend": dist.get_backend(), "patterns": {}}
    for size in sizes_mib:
        for name, (op, sent) in patterns(int(size * 2**20), device, rank, world).items():
            res["patterns"].setdefault(name, []).append(
                {
                    "buffer_mib": size,
                    "bytes_sent": sent,
                    "seconds": time_op(op, device, reps, warmup),
                }
            )
    for name, pts in res["patterns"].items():
        res.setdefault("fit", {})[name] = fit(
            [p["bytes_sent"] for p in pts], [p["seconds"] for p in pts]
        )
    dist.destroy_process_group()
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", required=True)
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=300)
    a = p.parse_args(argv)
    if min(a.sizes_mib) <= 0:
        raise SystemExit(f"--sizes-mib must be positive, got {a.sizes_mib}")
    res = run(a.device, a.sizes_mib, a.reps, a.warmup, a.timeout_s)
    if int(os.environ.get("RANK", 0)) == 0:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
