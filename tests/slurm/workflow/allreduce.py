"""A tiny torch.distributed job (gloo): every rank contributes rank + 1 to an all_reduce; rank 0
writes what each rank saw (its rank, world size, node, visible GPUs) and the reduced sum as JSON."""

import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main(out):
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    me = {
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
        "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "sum": total.item(),
    }
    seen = [None] * world
    dist.all_gather_object(seen, me)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {"world_size": world, "expected_sum": world * (world + 1) / 2, "ranks": seen},
                f,
                indent=1,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
