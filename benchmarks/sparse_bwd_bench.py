"""The project's Triton block-sparse backward against the dense FlashAttention-2 backward at equal
visible area, for tuning the Triton backward in one GPU call (the target: at least 0.9x).

For every (length, block size, density, heads) it draws the grid's uniform block-sparse mask, times
the Triton kernel's backward (autograd.grad after one forward, the pipeline's protocol:
measure.time_ms, L2 flushed before each repetition) in each backward mode and launch setting asked
for, and the dense kernel's backward on the full mask at the length S' whose area S'^2 equals the
mask's kept area; TFLOP/s of both from the exact visible area (harness.flops), and their ratio.
Before timing, each Triton setting's gradients are checked against the split mode's default (the
one the correctness tests cover) at the same mask; a setting that disagrees is reported, not timed.

    python benchmarks/sparse_bwd_bench.py                      # 16K-64K, B 64/128, densities 0.2/0.5/0.8
    python benchmarks/sparse_bwd_bench.py --modes split atomic \\
        --config 'dkdv=64x64w8s2' --config 'dkdv=128x64w8s2,dq=128x64w8s2' --json out.json
    python benchmarks/sparse_bwd_bench.py --profile            # per-kernel CUDA time of one call
    TRITON_INTERPRET=1 python benchmarks/sparse_bwd_bench.py --device cpu --dtype float32 \
        --seqlen 256 --heads 4:2 --head-dim 16 --dense sdpa --blocks 64 --densities 0.5  # the script itself

A --config names backward launch settings (triton_bsa.BWD_CONFIG) for the blocks they divide:
`dq=MxNwWsS` (query tile M, key tile N, W warps, S stages) and `dkdv=NxMwWsS` (key tile N, query
tile M); parts not named keep the defaults; `default` is the defaults themselves, `tuned` the
tiles of triton_bsa_tuned.json (what the pipeline runs).

--write-tuned FILE keeps, per block size, the mode and setting with the best median ratio over the
points measured (among those that ran and agreed at every point of that block), with the
measurement beside it: the file the pipeline reads is workflow/attnbench/kernels/triton_bsa_tuned.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys

import numpy as np
import torch
from attnbench import masks as M
from attnbench.harness.flops import attention_flops
from attnbench.harness.inputs import make_inputs
from attnbench.harness.measure import quantiles, time_ms
from attnbench.kernels import catalog, triton_bsa
from attnbench.kernels.base import from_thd, load

TARGET = 0.9
CONFIG_PART = re.compile(r"^(dq|dkdv)=(\d+)x(\d+)w(\d+)s(\d+)$")


def parse_config(text: str) -> dict:
    """'dq=64x64w4s2,dkdv=64x64w8s2' -> {"dq": (64, 64, 4, 2), ...}; 'default' -> {};
    'tuned' -> {"tuned": True} (each block's tiles in triton_bsa.TUNED)."""
    if text == "default":
        return {}
    if text == "tuned":
        return {"tuned": True}
    out = {}
    for part in text.split(","):
        m = CONFIG_PART.match(part.strip())
        if not m:
            raise argparse.ArgumentTypeError(
                f"bad --config part {part!r}; expected dq=MxNwWsS or dkdv=NxMwWsS, e.g. dkdv=64x64w8s2"
            )
        out[m.group(1)] = tuple(int(g) for g in m.group(2, 3, 4, 5))
    return out


def config_name(config: dict) -> str:
    """The --config text of a parsed config (parse_config's inverse)."""
    if config.get("tuned"):
        return "tuned"
    return ",".join(f"{p}={m}x{n}w{w}s{s}" for p, (m, n, w, s) in config.items()) or "default"


def for_block(config: dict, block: int) -> dict | None:
    """The tiles a config sets at this block size; None where a tile does not divide the block
    (or `tuned` names no tiles for it)."""
    if config.get("tuned"):
        tuned = triton_bsa.TUNED.get(block)
        return (
            None if tuned is None else {p: tuned[p] for p in triton_bsa.TILE_PARTS if p in tuned}
        )
    if all(block % t[0] == 0 and block % t[1] == 0 for t in config.values()):
        return config
    return None


def equal_area_length(area_per_head: float, multiple: int = 64) -> int:
    return max(multiple, round(math.sqrt(area_per_head) / multiple) * multiple)


def bwd_call(fn, q, k, v, dout, layout):
    """() -> grads: the backward of one forward (the pipeline's bwd direction)."""
    leaves = [from_thd(x, layout).requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    grad_out = from_thd(dout, layout)
    return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)


def timed(call, warmup, reps, device) -> dict:
    q = quantiles(time_ms(call, warmup, reps, device))
    if device == "cuda":
        torch.cuda.empty_cache()
    return q


def tflops(area_all_heads, head_dim, ms) -> float:
    return attention_flops(area_all_heads, head_dim, "bwd") / (ms * 1e-3) / 1e12


def triton_fn(index, mode, head_dim):
    scale = 1.0 / math.sqrt(head_dim)
    return lambda q, k, v: triton_bsa.block_sparse_attention(q, k, v, index, scale, backward=mode)


def agrees(a, b, tol=2e-2) -> bool:
    """bf16 gradients of two orders of summation: relative Frobenius difference within tol."""
    return all(
        float((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30)) < tol
        for x, y in zip(a, b)
    )


def profile(call):
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--seqlen", type=int, nargs="+", default=[16384, 32768, 65536])
    ap.add_argument("--blocks", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--densities", type=float, nargs="+", default=[0.2, 0.5, 0.8])
    ap.add_argument("--heads", nargs="+", default=["64:8"], help="query:KV heads, e.g. 64:8 64:64")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument(
        "--modes", nargs="+", default=["split", "atomic"], choices=triton_bsa.BACKWARD_MODES
    )
    ap.add_argument("--config", type=parse_config, action="append", default=None)
    ap.add_argument("--dense", default="fa2", help="dense kernel of the reference (default fa2)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="per-kernel CUDA time of one call each")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--write-tuned", help="write the best setting per block here (module doc)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "sparse_bwd_bench.py needs a CUDA device (--device cpu runs it under TRITON_INTERPRET=1)"
        )
    dev, dtype = a.device, getattr(torch, a.dtype)
    with triton_bsa.interpreter_numpy24_fix() if dev == "cpu" else contextlib.nullcontext():
        rows = run(a, dev, dtype)
    summarise(rows, a.json)
    if a.write_tuned:
        write_tuned(rows, a.write_tuned, dev)


def run(a, dev, dtype) -> list[dict]:
    configs = a.config or [{}]
    dense_info = catalog.get(a.dense)
    if catalog.missing_module(dense_info):
        sys.exit(
            f"dense kernel {a.dense} is not installed ({catalog.missing_module(dense_info)}); try --dense sdpa_flash"
        )
    torch.manual_seed(0)
    rows, dense_ms = [], {}
    print(
        f"{'S':>6} {'B':>4} {'rho':>4} {'heads':>6} {'mode':>6} {'config':>28} {'ms':>9} {'TFLOP/s':>8} "
        f"{'dense S':>8} {'dense':>8} {'ratio':>6}"
    )
    for s in a.seqlen:
        for hq, hkv in (map(int, h.split(":")) for h in a.heads):
            q, k, v, dout = make_inputs(0, s, hq, hkv, a.head_dim, dtype, dev)
            for block in a.blocks:
                for rho in a.densities:
                    mask = M.sample_mask(
                        "block_sparse",
                        s,
                        {"block_size": block, "density": rho, "granularity": "kv_head"},
                        np.random.default_rng(0),
                        heads_q=hq,
                        heads_kv=hkv,
                    )
                    lay = mask.layout()
                    area = float(sum(mask.area_per_head))  # what the pipeline's FLOPs count
                    s_dense = equal_area_length(mask.area)
                    key = (s_dense, hq, hkv)
                    if key not in dense_ms:  # the dense reference, once per length and heads
                        dq_, dk_, dv_, do_ = make_inputs(
                            1, s_dense, hq, hkv, a.head_dim, dtype, dev
                        )
                        dense = load(
                            dense_info,
                            device=dev,
                            dtype=dtype,
                            heads_q=hq,
                            heads_kv=hkv,
                            head_dim=a.head_dim,
                        )
                        full = M.sample_mask(
                            "full", s_dense, {}, np.random.default_rng(0), heads_q=hq, heads_kv=hkv
                        )
                        call = bwd_call(dense.prepare(full), dq_, dk_, dv_, do_, dense.layout)
                        dense_ms[key] = (
                            timed(call, a.warmup, a.reps, dev),
                            float(sum(full.area_per_head)),
                        )
                        if a.profile:
                            profile(call)
                        del call, dq_, dk_, dv_, do_
                    dq_time, dense_area = dense_ms[key]
                    dense_tf = tflops(dense_area, a.head_dim, dq_time["median"])
                    index = triton_bsa.BlockIndex.from_layout(lay, block, dev)
                    triton_bsa.BWD_CONFIG[block] = {}  # the built-in defaults
                    reference = bwd_call(
                        triton_fn(index, "split", a.head_dim), q, k, v, dout, "bhsd"
                    )()
                    for mode in a.modes:
                        timed_tiles = []  # the atomic mode has no dQ kernel: its dq tiles change nothing
                        for config in configs:
                            name = config_name(config)
                            row = dict(
                                seqlen=s,
                                block=block,
                                density=rho,
                                heads=f"{hq}:{hkv}",
                                mode=mode,
                                config=name,
                                dense_kernel=a.dense,
                                dense_seqlen=s_dense,
                                dense_ms=dq_time["median"],
                                dense_tflops=dense_tf,
                            )
                            tiles = for_block(config, block)
                            if tiles is None:
                                continue
                            used = {
                                p: t for p, t in tiles.items() if mode == "split" or p == "dkdv"
                            }
                            if used in timed_tiles:
                                continue
                            timed_tiles.append(used)
                            row["tiles"] = {p: list(t) for p, t in tiles.items()}
                            triton_bsa.BWD_CONFIG[block] = tiles
                            try:
                                call = bwd_call(
                                    triton_fn(index, mode, a.head_dim), q, k, v, dout, "bhsd"
                                )
                                if not agrees(call(), reference):
                                    row["error"] = "gradients disagree with the split default"
                                else:
                                    t = timed(call, a.warmup, a.reps, dev)
                                    row.update(
                                        ms=t["median"],
                                        ms_p20=t["p20"],
                                        ms_p80=t["p80"],
                                        tflops=tflops(area, a.head_dim, t["median"]),
                                    )
                                    row["ratio"] = row["tflops"] / dense_tf
                                    if a.profile:
                                        profile(call)
                            except Exception as e:  # noqa: BLE001 - a setting that cannot compile or run is a row
                                row["error"] = (
                                    f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                                )
                            finally:
                                triton_bsa.BWD_CONFIG.pop(block, None)
                            rows.append(row)
                            shown = (
                                f"{row['ms']:9.2f} {row['tflops']:8.1f}"
                                if "ms" in row
                                else f"{row['error'][:18]:>18}"
                            )
                            print(
                                f"{s:>6} {block:>4} {rho:>4} {hq}:{hkv:<3} {mode:>6} {name:>28} {shown} "
                                f"{s_dense:>8} {dense_tf:8.1f} {row.get('ratio', float('nan')):6.3f}",
                                flush=True,
                            )
                    del reference
            del q, k, v, dout
    return rows


def summarise(rows, json_path):
    ok = [r for r in rows if "ratio" in r]
    if ok:
        best = {}
        for r in ok:
            k = (r["seqlen"], r["block"], r["density"], r["heads"])
            best[k] = max(best.get(k, 0.0), r["ratio"])
        low = min(best.values())
        print(
            f"best ratio per point: min {low:.3f}, median {float(np.median(list(best.values()))):.3f} "
            f"(target {TARGET}); {sum(v >= TARGET for v in best.values())} of {len(best)} points reach it"
        )
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)


def best_settings(rows) -> dict:
    """{block: (mode, config name, tiles, ratios)}: per block, the setting with the best median
    ratio among those that ran and agreed at every point measured at that block."""
    points, runs = {}, {}
    for r in rows:
        point = (r["seqlen"], r["density"], r["heads"])
        points.setdefault(r["block"], set()).add(point)
        if "ratio" in r:
            key = (r["block"], r["mode"], r["config"])
            runs.setdefault(key, {"tiles": r["tiles"], "ratios": {}})["ratios"][point] = r["ratio"]
    best = {}
    for (block, mode, name), run in runs.items():
        if set(run["ratios"]) != points[block]:
            continue
        ratios = list(run["ratios"].values())
        if block not in best or np.median(ratios) > np.median(best[block][3]):
            best[block] = (mode, name, run["tiles"], ratios)
    return best


def write_tuned(rows, path, dev):
    """The best setting per block (best_settings) with what it was measured on (module doc)."""
    import datetime

    import triton

    ok = [r for r in rows if "ratio" in r]
    blocks = {}
    for block, (mode, name, tiles, ratios) in sorted(best_settings(rows).items()):
        blocks[str(block)] = {
            "mode": mode,
            **{p: tiles[p] for p in sorted(tiles)},
            "config": name,
            "ratio_median": round(float(np.median(ratios)), 4),
            "ratio_min": round(float(min(ratios)), 4),
        }
    device = torch.cuda.get_device_name() if dev == "cuda" else dev
    doc = {
        "about": "backward settings of workflow/attnbench/kernels/triton_bsa.py per block size, "
        "chosen by benchmarks/sparse_bwd_bench.py --write-tuned: ratio = its TFLOP/s / the dense "
        "kernel's backward at equal visible area",
        "measured": {
            "device": device,
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "dense_kernel": ok[0]["dense_kernel"] if ok else None,
            "points": sorted({(r["seqlen"], r["density"], r["heads"]) for r in rows}),
        },
        "blocks": blocks,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(
        f"wrote {path}: "
        + "; ".join(f"B {b}: {s['mode']} {s['config']}" for b, s in blocks.items())
    )


if __name__ == "__main__":
    main()
