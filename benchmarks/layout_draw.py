"""Seconds to draw one block-sparse layout on the host, as a GPU cell does before it measures
(masks/sparse.py: uniform scores from the seed, top-k per row block, the fingerprint), beside the
formula the committed records were drawn with (`topk(k).indices.sort()`), which gives the same
blocks. Prints one line per density.

    python benchmarks/layout_draw.py --seqlen 131072 --groups 64 --block 64 --threads 4
"""

from __future__ import annotations

import argparse
import time

import torch
from attnbench.masks.sparse import SPARSE_PATTERNS, top_k_blocks


def seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqlen", type=int, default=32768)
    p.add_argument("--groups", type=int, default=64, help="64 for MHA 64:64, 8 for GQA 64:8")
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--densities", type=float, nargs="+", default=[0.2, 0.5, 0.8])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    n = a.seqlen // a.block
    print(f"S {a.seqlen}, block {a.block}, {a.groups} groups, {a.threads} threads")
    for density in a.densities:
        params = {"block_size": a.block, "density": density, "groups": a.groups, "seed": 1}
        whole = seconds(
            lambda: SPARSE_PATTERNS["block_sparse"].generate(a.seqlen, params).fingerprint()
        )
        k = max(1, int(density * n))
        scores = torch.rand(a.groups, n, n, generator=torch.Generator().manual_seed(1))
        now = seconds(lambda: top_k_blocks(scores, k))
        before = seconds(lambda: scores.topk(k, dim=-1).indices.sort(dim=-1).values)
        print(
            f"density {density}: layout and fingerprint {whole:.1f} s; of it the top-k "
            f"{now:.1f} s (the records' topk + sort: {before:.1f} s)"
        )


if __name__ == "__main__":
    main()
