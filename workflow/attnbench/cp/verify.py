"""The correctness matrix of every method on the current job's ranks (CPU with gloo, GPU with NCCL).

    python -m attnbench.run.launch --nproc-per-node N -- python -m attnbench.cp.verify --device cpu --out F.jsonl

Every method x degrees x mask x local kernel that this world size admits (and the ones it does
not, which must say `unsupported`): GQA heads, documents whose lengths are not multiples of 2R,
out / lse / dq / dk / dv of every rank against the float64 reference, and the bytes each rank
counted against the schedule's formula. Rank 0 writes one JSON line per case and a summary.
A local kernel that is not installed gives `unavailable` lines; one whose backward's library is
missing (fa3's needs the full FA3 build, not fa3-fwd) is checked forward only (`backward: false`).
--dkv-comm-dtype input sends dK/dV around the ring in the inputs' dtype (give --dtype bfloat16 on
the CPU to see it round); the methods without a ring say `unsupported`. --split-documents (both
by default) adds the ring methods with documents kept whole where balance allows (cp/layout.py),
over the document masks of odd lengths and of short ones (every one whole: the ring local).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch.distributed as dist

from ..grid.spec import DKV_COMM_DTYPES, PLACEMENTS, SPLIT_DOCUMENTS
from ..harness.inputs import DTYPES
from ..masks import CP_MASKS, Mask
from ..terminal import bar
from . import catalog, run

DEFAULT_KERNELS = {
    "cpu": ("math", "cpu_flash"),
    "cuda": ("sdpa_flash", "sdpa_cudnn", "fa2", "fa3", "flex"),
}
# FlashAttention builds take head dims that are multiples of 8 (this project's wheel: 64 and 128)
DEFAULT_HEAD_DIM = {"cpu": 16, "cuda": 64}


def odd_documents(total: int, ring: int, rng) -> list[int]:
    """Random document lengths summing to `total`, at least one not a multiple of 2R."""
    out, left = [], total
    while left > 0:
        n = min(int(rng.integers(1, 48)), left)
        out.append(n)
        left -= n
    if ring > 1 and all(n % (2 * ring) == 0 for n in out):
        out[-1:] = [out[-1] - 1, 1] if out[-1] > 1 else out[-1:]
    return out


def masks_for(world: int, seqlen: int, seed: int):
    rng = np.random.default_rng([seed, world])
    out = []
    for name in CP_MASKS:
        params = {"doc_lengths": odd_documents(seqlen, world, rng)} if "document" in name else {}
        out.append(Mask(name, seqlen, params))
    return out


def short_documents(total: int) -> list[int]:
    """Documents of 4 tokens (and 1-token ones for the rest): `as_needed` keeps every one whole,
    so the ring is local (cp/layout.py)."""
    return [4] * (total // 4) + [1] * (total % 4)


def masks_of(deg, world: int, seqlen: int, seed: int) -> list:
    """The masks a configuration is checked on: every CP mask; with documents split as needed,
    the document masks, over the odd documents and over short ones."""
    out = masks_for(world, seqlen, seed)
    if deg.split_documents == "all":
        return out
    docs = [m for m in out if "document" in m.name]
    short = {"doc_lengths": short_documents(seqlen)}
    return docs + [Mask(m.name, seqlen, short) for m in docs]


def method_configs(world: int, device: str, splits=SPLIT_DOCUMENTS, methods=None):
    """(method, Degrees) pairs to run, read off each method's layout (catalog.Layout): the methods
    (default: every one registered) that run on `device` and on `world` ranks. Documents split as
    `all`: a method of a fixed layout at its own degrees, then one whose Ulysses degree the grid
    chooses at every factorisation U x R of the world, in both placements where both U and R are
    above 1 (its windows: the default). `as_needed`: the methods with a ring that shard with
    cp/layout.py (document masks only: main): a ring of every rank, and the grid-chosen layouts at
    U = 2 where the world is even and at least 4."""
    infos = [
        m
        for m in (methods or catalog.METHODS.values())
        if device in m.devices and (m.max_gpus is None or world <= m.max_gpus)
    ]
    fixed = [m for m in infos if m.layout.ulysses != "grid"]
    chosen = [m for m in infos if m.layout.ulysses == "grid"]
    if "all" in splits:
        for m in fixed:
            yield m.name, catalog.degrees(m.name, world)
        for u in (d for d in range(1, world + 1) if world % d == 0):
            two_d = 1 < u < world
            for placement in PLACEMENTS if two_d else ("contiguous",):
                for m in chosen:
                    yield m.name, catalog.degrees(m.name, world, u, placement=placement)
    if "as_needed" in splits and world > 1:
        splitting = [m for m in infos if m.layout.ring and m.shard_layout]
        for m in (m for m in splitting if m.layout.ulysses == "none"):
            yield m.name, catalog.degrees(m.name, world, split_documents="as_needed")
        if world >= 4 and world % 2 == 0:
            for m in (m for m in splitting if m.layout.ulysses == "grid"):
                yield m.name, catalog.degrees(m.name, world, 2, split_documents="as_needed")


def local_kernels_of(method: str, kernels) -> list[str]:
    """The local kernels (settings) a method is checked with: ours run under every one given;
    torch_cp under the SDPA backends among them, torch_cp_auto under SDPA's own choice."""
    if method == "torch_cp":
        return [k for k in kernels if k in catalog.TORCH_CP_BACKENDS]
    if method == "torch_cp_auto":
        return [catalog.AUTO]
    return list(kernels)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m attnbench.cp.verify",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", required=True, help="JSON lines, one per case (rank 0)")
    p.add_argument("--kernels", nargs="*", help="local kernels (default: the device's)")
    p.add_argument(
        "--methods",
        nargs="*",
        help="only these methods (default: all); your own as 'module:Class' (it is then checked "
        "alone unless built-in ones are named too)",
    )
    p.add_argument("--masks", nargs="*", help="only these masks (default: all CP masks)")
    p.add_argument("--heads", default="8:2", help="query:KV heads")
    p.add_argument("--head-dim", type=int, help="default 16 on CPU, 64 on GPU")
    p.add_argument(
        "--dkv-comm-dtype",
        default=DKV_COMM_DTYPES[0],
        choices=DKV_COMM_DTYPES,
        help="the dtype dK/dV travel the ring in (accumulator: float32)",
    )
    p.add_argument(
        "--split-documents",
        nargs="+",
        default=list(SPLIT_DOCUMENTS),
        choices=SPLIT_DOCUMENTS,
        help="as_needed: also the ring methods with documents kept whole where balance allows",
    )
    p.add_argument("--tokens-per-rank", type=int, default=40)
    p.add_argument(
        "--dtype", default=None, choices=DTYPES, help="default float32 on CPU, bfloat16 on GPU"
    )
    p.add_argument("--factor", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=int, default=120)
    a = p.parse_args(argv)
    device = run.init(a.device, a.timeout_s)
    session = run.Session(device)
    world = session.world
    hq, hkv = (int(x) for x in a.heads.split(":"))
    head_dim = a.head_dim or DEFAULT_HEAD_DIM[a.device]
    dtype = a.dtype or ("float32" if a.device == "cpu" else "bfloat16")
    seqlen = a.tokens_per_rank * world + 3  # never a multiple of 2R: the sequence itself is padded
    kernels = a.kernels or DEFAULT_KERNELS[a.device]
    # in the registry's order, your own last
    named = {catalog.resolve_method(m).name for m in a.methods or ()}
    methods = [m for n, m in catalog.METHODS.items() if not named or n in named]
    rows, t0 = [], time.perf_counter()
    configs = list(method_configs(world, a.device, a.split_documents, methods))
    shown = configs if session.rank else bar(configs, len(configs), "verify")  # rank 0's bar
    for method, deg in shown:
        torch_cp = not catalog.uses_local_kernel(method)
        # torch's context_parallel pads nothing: its sequence is a multiple of 2R
        length = seqlen - seqlen % (2 * world) if torch_cp else seqlen
        for kname in local_kernels_of(method, kernels):
            for mask in (
                m for m in masks_of(deg, world, length, a.seed) if not a.masks or m.name in a.masks
            ):
                # forward only where the kernel has no backward here (or its library is missing)
                backward = torch_cp or (
                    "bwd" in catalog.local_kernel(kname).directions.get(a.device, ())
                    and catalog.unavailable_reason(method, kname, a.device, "bwd") is None
                )
                unavailable = catalog.unavailable_reason(method, kname, a.device)
                row = {
                    "world": world,
                    "method": method,
                    "degrees": deg.to_json(),
                    "local_kernel": kname,
                    "mask": mask.name,
                    "seqlen": length,
                    "heads": [hq, hkv],
                    "dtype": dtype,
                    "backward": backward,
                    "dkv_comm_dtype": a.dkv_comm_dtype,
                    "split_documents": deg.split_documents,
                    "doc_lengths": mask.params.get("doc_lengths"),
                }
                unsupported = catalog.unsupported_reason(
                    method,
                    kname,
                    mask.name,
                    "bwd" if backward else "fwd",
                    a.device,
                    deg,
                    hq,
                    hkv,
                    a.dkv_comm_dtype,
                )
                if unavailable:
                    row.update(status="unavailable", reason=unavailable)
                elif unsupported:
                    row.update(status="unsupported", reason=unsupported)
                else:
                    case = run.MethodRun(
                        method, kname, deg, hq, hkv, head_dim, dtype, backward, a.dkv_comm_dtype
                    )
                    v = run.check_method(session, case, mask, a.seed, a.factor)
                    row.update(
                        status=v["status"],
                        reason=v.get("reason"),
                        errors=v.get("errors"),
                        passed=v.get("passed"),
                        every_row_once=v.get("every_row_once"),
                        bytes_match_analytic=v.get("bytes_match_analytic"),
                        bytes=[
                            {
                                **{k: b[k] for k in ("sent", "received")},
                                "by_kind": b["by_kind"],
                                "analytic_by_kind": b["analytic"]["by_kind"],
                            }
                            for b in v.get("bytes", [])
                        ],
                        work_pairs_total=v.get("work_pairs_total"),
                        mask_area_all_heads=v.get("mask_area_all_heads"),
                        rank_errors=[r["errors"] for r in v.get("ranks", [])],
                        tolerance=[r["tolerance"] for r in v.get("ranks", [])],
                    )
                rows.append(row)
    if session.rank == 0:
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        bad = [r for r in rows if r["status"] not in ("ok", "unsupported", "unavailable")]
        print(
            f"world {world}: {len(rows)} cases, {sum(r['status'] == 'ok' for r in rows)} ok, "
            f"{sum(r['status'] == 'unsupported' for r in rows)} unsupported, "
            f"{sum(r['status'] == 'unavailable' for r in rows)} unavailable, {len(bad)} failing; "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        for r in bad:
            print(
                f"  FAIL {r['method']} {r['degrees']} {r['mask']} {r['local_kernel']}: {r['status']} "
                f"{r.get('reason') or r.get('errors')}",
                flush=True,
            )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
