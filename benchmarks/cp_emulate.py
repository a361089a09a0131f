"""The compute of every rank of a CP world on one device (attnbench.cp.emulate), beside the bare
local kernel over the same documents; a profile of one rank's schedule; and the emulation against
the committed 2-GPU records' compute-only times. Never a distributed
measurement: no transfer is timed.

    # per-rank fwd/bwd times, the slowest rank's TFLOP/s, the spread, and the bare kernel's
    python benchmarks/cp_emulate.py --method ring_p2p --mask causal_document --world 8 \\
        --tokens-per-rank 65536 --local-kernel fa3
    # ... and a torch.profiler run over the slowest rank's schedule: time per kind of kernel
    python benchmarks/cp_emulate.py ... --profile
    # several methods, masks and worlds (every combination) in one process
    python benchmarks/cp_emulate.py --method ring_p2p ulysses usp --mask full_document --world 2 4 8
    # every committed h200_cp 2-GPU cell: the emulated world-2 compute time vs its measured
    # compute-only time (the record's own documents, inputs, local kernel and repetitions)
    python benchmarks/cp_emulate.py --validate results/h200 --json pairs.json

The documents: a cell's first timed sample at the world's total length (the grid's seed 0 and the
document-length histogram it would use; tokens_per_rank x world tokens). The bare kernel
(`local`, one call over every document) runs over the same documents at the same total length;
where that does not fit on the device, over the documents of the first tokens_per_rank tokens
(the same per-rank share), and the output says which.

Numbers printed per direction:
  rank_ms          each rank's median (ms), timed alone, its transfers off (compute-only)
  slowest          the slowest rank and its median; spread = slowest / mean over ranks
  tflops_per_gpu   global FLOPs / (per-repetition max over ranks x world): a CP cell's number
  slowest_rank_tflops  that rank's own visible pairs' FLOPs / its own median time
  local_tflops     the bare local kernel's TFLOP/s over the same documents; share = the ratio of
                   tflops_per_gpu to it (the target: >= 90% on document masks, >= 95% on full and causal)
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from attnbench import families  # noqa: E402
from attnbench.cp import catalog, emulate  # noqa: E402
from attnbench.cp.run import MethodRun  # noqa: E402
from attnbench.grid.expand import histograms_for  # noqa: E402
from attnbench.grid.spec import (  # noqa: E402
    DKV_COMM_DTYPES,
    EMULATE_CONTENTS,
    SPLIT_DOCUMENTS,
    CellSpec,
    Problem,
)
from attnbench.harness.flops import attention_flops  # noqa: E402
from attnbench.harness.inputs import data_seed, input_seed, mask_rng  # noqa: E402
from attnbench.harness.measure import quantiles, release_memory, synchronize  # noqa: E402
from attnbench.harness.samples import spec_mask  # noqa: E402
from attnbench.masks import Mask  # noqa: E402
from attnbench.record.status import is_oom  # noqa: E402

DIRECTIONS = ("fwd", "bwd")


# ---------------------------------------------------------------- one world


def draw_mask(mask_name, seqlen, hq, hkv, d, dtype, seed=0):
    """The first timed sample's mask of a cell at this length (the grid's draw)."""
    cfg = families.validate(yaml.safe_load((REPO / "config.yaml").read_text()))
    hist = histograms_for(cfg, mask_name, seqlen)
    # the data seed is the same in every direction
    problem = Problem(mask_name, {}, seqlen, hq, hkv, d, dtype, "fwd", seed, hist)
    return spec_mask(problem, seqlen, mask_rng(data_seed(problem))), data_seed(problem)


def share_of(mask: Mask, tokens: int) -> Mask:
    """The documents of the first `tokens` tokens (the last one cut there)."""
    docs = mask.params.get("doc_lengths")
    if not docs:
        return Mask(mask.name, tokens, {}, heads_q=mask.heads_q)
    out, left = [], tokens
    for n in docs:
        if left <= 0:
            break
        out.append(min(n, left))
        left -= out[-1]
    return Mask(mask.name, tokens, {**mask.params, "doc_lengths": out}, heads_q=mask.heads_q)


def time_world(method, deg, kernel, mask, seed, a, direction, device, profile_ranks=()):
    """Emulate the world once for `direction`: per-rank times, their summary, each rank's
    visible pairs, and the profiles asked for."""
    world, inputs, failed = primed_world(method, deg, kernel, mask, seed, a, direction, device)
    if failed[0] is not None:
        return {"status": failed[0], "reason": failed[1]}
    times = emulate.time_ranks(world, inputs, direction, a.warmup, a.reps)
    failed = world.agree("timing")
    if failed[0] is not None:
        return {"status": failed[0], "reason": failed[1]}
    out = {"status": "ok", "contents": world.contents, **emulate.summary(times), "times": times}
    out["work_pairs"] = [m.work() for m in world.methods]
    profiles = {}
    for r in profile_ranks if profile_ranks != "slowest" else [out["slowest_rank"]]:
        profiles[r] = profile_rank(world, inputs, direction, r, a.profile_reps)
    out["profiles"] = profiles
    return out


def time_world_or_oom(method, deg, kernel, mask, seed, a, direction, device, profile_ranks=()):
    """time_world, an out-of-memory reported as such (the next run goes on), the world's memory
    given back either way."""
    try:
        res = time_world(method, deg, kernel, mask, seed, a, direction, device, profile_ranks)
    except Exception as e:  # noqa: BLE001 - only an oom; anything else is raised again
        if not is_oom(e):
            raise
        res = {"status": "oom", "reason": str(e).splitlines()[0]}
    release_memory()
    return res


def report_world(name, res, mask, a, world_size, direction):
    if res["status"] != "ok":
        print(f"  {name} {direction}: {res['status']}: {res['reason']}")
        return None
    flops = attention_flops(sum(mask.area_per_head), a.head_dim, direction)
    tmax = quantiles(res["max_over_ranks_ms"])["median"]
    per_gpu = flops / (tmax * 1e-3) / 1e12 / world_size
    r = res["slowest_rank"]
    own = attention_flops(res["work_pairs"][r], a.head_dim, direction)
    slowest_tf = own / (res["slowest_rank_ms"] * 1e-3) / 1e12
    ranks = " ".join(f"{t:.3f}" for t in res["rank_ms_median"])
    print(
        f"  {name} {direction}: rank_ms [{ranks}]  slowest rank {r} {res['slowest_rank_ms']:.3f} ms"
        f"  spread {res['rank_spread']:.3f}  tflops_per_gpu {per_gpu:.4g}"
        f"  slowest_rank_tflops {slowest_tf:.4g}"
        + ("  (each rank alone: synthetic contents)" if res["contents"] == "synthetic" else "")
    )
    return {
        "rank_ms_median": res["rank_ms_median"],
        "slowest_rank": r,
        "slowest_rank_ms": res["slowest_rank_ms"],
        "rank_spread": res["rank_spread"],
        "tflops_per_gpu": per_gpu,
        "slowest_rank_tflops": slowest_tf,
        "profiles": res["profiles"],
        "contents": res["contents"],
    }


def local_baseline(kernel, mask, per_rank_tokens, seed, a, direction, device):
    """The bare local kernel over the same documents (the whole length, else the per-rank share)."""
    deg = catalog.degrees(catalog.BARE_KERNEL, 1)
    for which, m in (("same total length", mask), ("per-rank share", None)):
        m = m or share_of(mask, per_rank_tokens)
        res = time_world_or_oom(catalog.BARE_KERNEL, deg, kernel, m, seed, a, direction, device)
        if res["status"] == "ok":
            flops = attention_flops(sum(m.area_per_head), a.head_dim, direction)
            tf = flops / (res["slowest_rank_ms"] * 1e-3) / 1e12
            print(
                f"  local {direction} ({which}, {m.seqlen} tokens): {res['slowest_rank_ms']:.3f} ms"
                f"  local_tflops {tf:.4g}"
            )
            return {"over": which, "tokens": m.seqlen, "ms": res["slowest_rank_ms"], "tflops": tf}
        print(f"  local {direction} ({which}): {res['status']}: {res['reason']}")
    return None


# ---------------------------------------------------------------- profile

FAMILIES = (
    (
        "attention bwd",
        r"(flash|fmha|attn|attention|sdpa|cudnn|flex|triton_tem).*(bwd|bprop|backward|dq|dkv|dot_do|preprocess|postprocess)",
    ),
    ("attention fwd", r"flash|fmha|attn|attention|sdpa|cudnn|flex|triton_tem"),
    (
        "copies / gathers",
        r"copy|memcpy|\bcat\b|cat_|catarray|index|gather|scatter|stack|contiguous|clone",
    ),
    ("fills", r"fill|memset|zero"),
    (
        "merges / elementwise",
        r"elementwise|vectorized|reduce|exp|log|where|add|mul|sub|div|max|sum|isinf|softplus|sigmoid|neg|unrolled",
    ),
)


def kernel_family(name: str) -> str:
    low = name.lower()
    for fam, pattern in FAMILIES:
        if re.search(pattern, low):
            return fam
    return "others"


def profile_rank(world, inputs, direction, rank, reps) -> dict:
    """torch.profiler over `reps` calls of one rank's schedule (its transfers off): time per
    kind of kernel (device time on GPU, self CPU time of the aten ops on the CPU), per call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn = emulate.calls(world, inputs, direction)[rank]
    rc, dev = world.rcs[rank], world.device
    rc.comm.enabled = False
    try:
        fn()
        synchronize(dev)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(reps):
                fn()
            synchronize(dev)
    finally:
        rc.comm.enabled = True
    by = {}
    for ev in prof.key_averages():
        if dev.type == "cuda":
            # the kernels themselves: an aten op's self device time is its kernels' time again
            is_kernel = ev.device_type == DeviceType.CUDA
            t = (getattr(ev, "self_device_time_total", 0) or 0) if is_kernel else 0
        else:
            t = ev.self_cpu_time_total if ev.key.startswith("aten::") else 0
        if t <= 0:
            continue
        fam = kernel_family(ev.key)
        entry = by.setdefault(fam, {"ms": 0.0, "calls": 0, "top": {}})
        entry["ms"] += t / 1e3 / reps
        entry["calls"] += ev.count // reps
        entry["top"][ev.key] = entry["top"].get(ev.key, 0.0) + t / 1e3 / reps
    for entry in by.values():
        entry["top"] = dict(sorted(entry["top"].items(), key=lambda kv: -kv[1])[:3])
    return dict(sorted(by.items(), key=lambda kv: -kv[1]["ms"]))


def print_profile(rank, prof):
    total = sum(e["ms"] for e in prof.values())
    print(f"    profile of rank {rank} (per call, {total:.3f} ms of kernels):")
    for fam, e in prof.items():
        top = "; ".join(f"{k[:60]} {v:.3f}" for k, v in e["top"].items())
        print(
            f"      {fam:22s} {e['ms']:9.3f} ms {100 * e['ms'] / total:5.1f}%  {e['calls']:5d} calls  [{top}]"
        )


def bench_all(a, device):
    """Every (mask, world, method) asked for, in one process; the bare kernel once per mask,
    world and direction. One result, or a list of them."""
    outs = previous_runs(a) if a.resume else []
    baselines = {  # a kept run's bare kernel stands for its mask, world and direction
        (o["mask"], o["world"], d): o[d]["local"]
        for o in outs
        for d in a.directions
        if o[d]["local"]
    }
    for mask_name in a.mask:
        for world, method, split in itertools.product(a.world, a.method, a.split_documents):
            try:
                deg = catalog.degrees(
                    method,
                    world,
                    a.ulysses_degree,
                    a.windows,
                    a.placement,
                    gpus_per_node=max(world, 8),
                    split_documents=split,
                )
            except ValueError as e:  # e.g. USP at 2 ranks: no split of both degrees
                print(f"{method} {mask_name} world {world}: skipped: {e}")
                continue
            if split != "all" and deg.ring == 1:
                print(f"{method} {mask_name} world {world} split {split}: skipped: ring degree 1")
                continue
            if any(same_run(o, method, deg, mask_name, world, a) for o in outs):
                print(f"{method} {mask_name} world {world}: kept from {a.json}")
                continue
            outs.append(bench(a, device, method, deg, mask_name, world, baselines))
            if a.json:  # after each one: what a call's time limit cuts off is lost alone
                write_json(a.json, outs[0] if len(outs) == 1 else outs)
    return outs[0] if len(outs) == 1 else outs


def previous_runs(a) -> list:
    """--resume: the runs already in --json with numbers in every direction (one cut off by a time
    limit never got there; one that ended out of memory runs again)."""
    if not a.json or not Path(a.json).exists():
        return []
    runs = read_runs([a.json])
    return [o for o in runs if all((o.get(d) or {}).get("emulated") for d in a.directions)]


def same_run(o, method, deg, mask_name, world, a) -> bool:
    here = (method, deg.to_json(), mask_name, world, a.tokens_per_rank, a.local_kernel)
    keys = ("method", "degrees", "mask", "world", "tokens_per_rank", "local_kernel")
    return tuple(o[k] for k in keys) == here


def run_label(r) -> str:
    """A run's method as the tables name it: with `[split as_needed]` where it kept documents
    whole (--split-documents)."""
    split = r.get("degrees", {}).get("split_documents", "all")
    return r["method"] + ("" if split == "all" else f" [split {split}]")


def emulated_runs(files) -> dict:
    """(method label, mask, world, direction) -> (the emulated numbers, the bare kernel's TFLOP/s
    over the same documents: the run's own, else another run's of the same mask, world and
    direction, as where a run was made with --no-local)."""
    got, bare = {}, {}
    for r in read_runs(files):
        for d in DIRECTIONS:
            emu, local = ((r.get(d) or {}).get(k) for k in ("emulated", "local"))
            if local:
                bare[(r["mask"], r["world"], d)] = local["tflops"]
            if emu:
                got[(run_label(r), r["mask"], r["world"], d)] = emu
    return {k: (emu, bare.get(k[1:])) for k, emu in got.items()}


def compare(before_files, after_files) -> str:
    """A markdown table of the runs in both sets of --json files (same method, mask, world and
    direction): per-GPU TFLOP/s before and after, and the after run's share of the bare kernel."""
    before, after = emulated_runs(before_files), emulated_runs(after_files)
    lines = [
        "| method | mask | world | dir | before TFLOP/s per GPU | after | after/before"
        " | bare kernel TFLOP/s | share before | share after | slowest rank's spread after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(before.keys() & after.keys()):
        (b, _), (a, local) = before[key], after[key]
        bt, at = b["tflops_per_gpu"], a["tflops_per_gpu"]
        shares = ["-", "-"] if not local else [f"{100 * t / local:.1f}%" for t in (bt, at)]
        lines.append(
            f"| {' | '.join(map(str, key))} | {bt:.1f} | {at:.1f} | {at / bt:.2f}x"
            f" | {f'{local:.1f}' if local else '-'} | {shares[0]} | {shares[1]}"
            f" | {a['rank_spread']:.3f} |"
        )
    return "\n".join(lines)


# issue 33's target: the share of the bare kernel a method keeps, per mask
TARGET = {"full_document": 0.90, "causal_document": 0.90, "full": 0.95, "causal": 0.95}


def target_table(files) -> str:
    """A markdown table of every emulated run in these --json files against the target: per-GPU
    TFLOP/s of the slowest rank's repetitions, its share of the bare kernel, met or not."""
    lines = [
        "| world | mask | dir | method | TFLOP/s per GPU | bare kernel TFLOP/s | share | target"
        " | slowest rank's spread |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {m: i for i, m in enumerate(TARGET)}
    runs = emulated_runs(files)
    for key in sorted(runs, key=lambda k: (k[2], order.get(k[1], 9), k[3] != "fwd", k[0])):
        (emu, local), (method, mask, world, d) = runs[key], key
        t, goal = emu["tflops_per_gpu"], TARGET.get(mask)
        share = t / local if local else None
        met = "-" if share is None or goal is None else ("met" if share >= goal else "not met")
        lines.append(
            f"| {world} | {mask} | {d} | {method} | {t:.1f} | {f'{local:.1f}' if local else '-'}"
            f" | {f'{100 * share:.1f}%' if share else '-'} | {met} | {emu['rank_spread']:.3f} |"
        )
    return "\n".join(lines)


def read_runs(files):
    """Every run of these --json files (each one run, or a list of them)."""
    for f in files:
        data = json.loads(Path(f).read_text())
        yield from data if isinstance(data, list) else [data]


def write_json(path, out):
    Path(path).write_text(json.dumps(out, indent=1, default=str))


def bench(a, device, method, deg, mask_name, world, baselines) -> dict:
    seqlen = a.tokens_per_rank * world
    mask, dseed = draw_mask(mask_name, seqlen, a.hq, a.hkv, a.head_dim, a.dtype)
    seed = input_seed(dseed, 0, seqlen)
    print(
        f"{method} {deg.to_json()} {mask_name} world {world} x {a.tokens_per_rank} tokens "
        f"({len(mask.params.get('doc_lengths', [seqlen]))} documents), local kernel {a.local_kernel}, "
        f"heads {a.hq}:{a.hkv}, d {a.head_dim}, {a.dtype}, {device}; EMULATED (compute only)"
    )
    out = {
        "method": method,
        "degrees": deg.to_json(),
        "mask": mask_name,
        "world": world,
        "tokens_per_rank": a.tokens_per_rank,
        "local_kernel": a.local_kernel,
        "emulated": True,
    }
    for direction in a.directions:
        prof = "slowest" if a.profile else ()
        res = time_world_or_oom(
            method, deg, a.local_kernel, mask, seed, a, direction, device, prof
        )
        if res["status"] == "oom" and a.contents == "auto":
            print(f"  {method} {direction}: the lockstep world ran out of memory; each rank alone")
            alone = argparse.Namespace(**{**vars(a), "contents": "synthetic"})
            res = time_world_or_oom(
                method, deg, a.local_kernel, mask, seed, alone, direction, device, prof
            )
        got = report_world(method, res, mask, a, world, direction)
        for r, p in (got or {}).get("profiles", {}).items():
            print_profile(r, p)
        key = (mask_name, world, direction)
        if not a.no_local and key not in baselines:
            baselines[key] = local_baseline(
                a.local_kernel, mask, a.tokens_per_rank, seed, a, direction, device
            )
        base = baselines.get(key)
        if got and base:
            got["share_of_local"] = got["tflops_per_gpu"] / base["tflops"]
            print(f"  share of the bare kernel ({direction}): {100 * got['share_of_local']:.1f}%")
        out[direction] = {"emulated": got, "local": base}
    return out


# ---------------------------------------------------------------- validation against the 2-GPU records


def validation_records(root: Path):
    for p in sorted((root / "cells" / "h200_cp" / "cp").glob("*/*/*.json")):
        r = json.loads(p.read_text())
        spec = CellSpec.from_dict(r["cell"])
        if r.get("status") != "ok" or spec.gpus != 2 or not r["samples"]:
            continue
        if not catalog.uses_local_kernel(spec.impl) or spec.impl == catalog.BARE_KERNEL:
            continue
        if r["samples"][0].get("compute_only_ms_median") is None:
            continue
        yield p, r, spec


def validate(a, device) -> list[dict]:
    """Each committed 2-GPU cell rebuilt (its first sample's documents and inputs, its local
    kernel, degrees, warm-up and repetitions) and emulated at world 2: the emulated compute time
    (median of the per-repetition max over ranks) beside the record's measured compute-only."""
    rows = []
    for path, r, spec in validation_records(Path(a.validate)):
        if a.cells and not re.search(a.cells, str(path)):
            continue
        p, sample = spec.problem, r["samples"][0]
        deg = spec.cp.degrees
        mask = Mask(p.mask, p.seqlen, sample["mask_params"], heads_q=p.heads_q)
        seed = input_seed(r["data_seed"], 0, p.seqlen)
        a.hq, a.hkv, a.head_dim, a.dtype = p.heads_q, p.heads_kv, p.head_dim, p.dtype
        a.warmup, a.reps = spec.measurement.warmup, spec.measurement.reps
        kernel = r["kernel"]["local_kernel"]
        world_args = dict(dkv=spec.cp.dkv_comm_dtype)  # the record's dK/dV dtype
        res = _time_record(spec.impl, deg, kernel, mask, seed, a, p.direction, device, world_args)
        measured = sample["compute_only_ms_median"]
        row = {
            "cell": str(path.relative_to(a.validate)),
            "method": spec.impl,
            "mask": p.mask,
            "tokens_per_gpu": spec.tokens_per_gpu,
            "direction": p.direction,
            "local_kernel": kernel,
            "measured_compute_only_ms": measured,
            "status": res["status"],
        }
        if res["status"] == "ok":
            emu = quantiles(res["max_over_ranks_ms"])["median"]
            row.update(emulated_ms=emu, ratio=emu / measured, rank_ms=res["rank_ms_median"])
        else:
            row["reason"] = res["reason"]
        rows.append(row)
        ratio = f"{row['ratio']:.3f}" if "ratio" in row else row["status"]
        print(
            f"{row['cell']:90s} measured {measured:9.3f}  emulated "
            f"{row.get('emulated_ms', float('nan')):9.3f}  ratio {ratio}",
            flush=True,
        )
        release_memory()
    ok = [x["ratio"] for x in rows if "ratio" in x]
    if ok:
        within = sum(abs(x - 1) <= 0.10 for x in ok)
        print(
            f"{len(ok)} pairs: ratio median {np.median(ok):.3f}, min {min(ok):.3f}, "
            f"max {max(ok):.3f}; {within} of {len(ok)} within 10%"
        )
    return rows


def primed_world(method, deg, kernel, mask, seed, a, direction, device, dkv=DKV_COMM_DTYPES[0]):
    """The world set up and run once in lockstep (every buffer as the real run leaves it):
    (world, inputs, (status, reason)), status None when every rank got there."""
    contents = EMULATE_CONTENTS[0] if a.contents == "auto" else a.contents
    run = MethodRun(method, kernel, deg, a.hq, a.hkv, a.head_dim, a.dtype, direction != "fwd", dkv)
    world = emulate.World(run, device, contents)
    world.load(mask)
    inputs = world.inputs(seed)
    failed = world.agree("setup")
    if failed[0] is None:
        emulate.prime(world, inputs, direction)
        failed = world.agree("the lockstep run")
    return world, inputs, failed


def _time_record(method, deg, kernel, mask, seed, a, direction, device, world_args):
    world, inputs, failed = primed_world(
        method, deg, kernel, mask, seed, a, direction, device, world_args["dkv"]
    )
    if failed[0] is None:
        # the distributed cell timed its compute-only variant with one warm-up call
        times = emulate.time_ranks(world, inputs, direction, 1, a.reps)
        failed = world.agree("timing")
    if failed[0] is not None:
        return {"status": failed[0], "reason": failed[1]}
    return {"status": "ok", **emulate.summary(times)}


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # several of each: every combination, one after the other in this process
    p.add_argument(
        "--method",
        nargs="+",
        default=["ring_p2p"],
        choices=[m for m in catalog.METHODS if catalog.uses_local_kernel(m)],
    )
    p.add_argument("--mask", nargs="+", default=["causal_document"])
    p.add_argument("--world", nargs="+", type=int, default=[2])
    p.add_argument("--tokens-per-rank", type=int, default=65536)
    p.add_argument("--local-kernel", default=None, help="default: fa3 on cuda, cpu_flash on cpu")
    p.add_argument("--ulysses-degree", default="auto")
    p.add_argument("--windows", default="auto")
    p.add_argument("--placement", default="contiguous")
    p.add_argument(
        "--split-documents",
        nargs="+",
        default=[SPLIT_DOCUMENTS[0]],
        choices=SPLIT_DOCUMENTS,
        help="which documents the ring cuts (cp.split_documents); several: each in turn",
    )
    p.add_argument("--heads", default="64:8")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    p.add_argument(
        "--directions", nargs="+", default=list(DIRECTIONS), choices=["fwd", "bwd", "fwdbwd"]
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--contents",
        default="auto",
        choices=(*EMULATE_CONTENTS, "auto"),
        help="peers: lockstep world (N ranks' memory); synthetic: each rank alone; "
        "auto: peers, each rank alone where that runs out of memory (the output says so)",
    )
    p.add_argument("--no-local", action="store_true", help="skip the bare-kernel baseline")
    p.add_argument("--profile", action="store_true", help="torch.profiler over the slowest rank")
    p.add_argument("--profile-reps", type=int, default=3)
    p.add_argument(
        "--validate", metavar="RESULTS", help="e.g. results/h200: every h200_cp 2-GPU cell"
    )
    p.add_argument("--cells", help="--validate: only the cells whose path matches this regex")
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="comma-separated --json files of two code versions: print their table, run nothing",
    )
    p.add_argument(
        "--table",
        metavar="FILES",
        help="comma-separated --json files: their runs against the target, run nothing",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="write the numbers here too")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs already in --json that have numbers in every direction, run the others",
    )
    a = p.parse_args(argv)
    if a.compare:
        print(compare(*(x.split(",") for x in a.compare)))
        return 0
    if a.table:
        print(target_table(a.table.split(",")))
        return 0
    device = torch.device(a.device)
    a.hq, a.hkv = (int(x) for x in a.heads.split(":"))
    a.dtype = a.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    a.local_kernel = a.local_kernel or ("fa3" if device.type == "cuda" else "cpu_flash")
    for key in ("ulysses_degree", "windows"):
        v = getattr(a, key)
        setattr(a, key, v if v == "auto" else int(v))
    if a.validate and device.type != "cuda":
        p.error("--validate rebuilds GPU records (their local kernels): run it on a GPU")
    out = validate(a, device) if a.validate else bench_all(a, device)
    if a.json:
        write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
