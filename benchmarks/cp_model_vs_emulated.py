"""The CP model's compute term beside the one-GPU emulation of every rank's compute
(benchmarks/cp_emulate.py --json files), at the worlds the emulation ran (2, 4, 8): for each run,
the model's compute time (the slowest rank per step, summed, with the per-call terms fitted on
the committed h200_cp cells of the same local kernel) against the emulated slowest rank
(median over repetitions of the max over ranks, as its per-GPU TFLOP/s counts it). Prints a markdown table; runs no kernel.

    python benchmarks/cp_model_vs_emulated.py results/h200/cp_emulate/before_after/after_*.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO / "benchmarks"))

from attnbench.cp_model.predict import Setting, predict  # noqa: E402
from attnbench.cp_model.run import (  # noqa: E402
    calibration_network,
    fitted_kernel,
    model_config,
    read_records,
)
from attnbench.families import load_config  # noqa: E402
from attnbench.harness.flops import attention_flops  # noqa: E402
from cp_emulate import draw_mask, read_runs  # noqa: E402

CAL_GRID = "h200_cp"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="benchmarks/cp_emulate.py --json outputs")
    p.add_argument("--results", default=str(REPO / "results" / "h200"))
    p.add_argument("--heads", default="64:8")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args(argv)
    hq, hkv = (int(x) for x in a.heads.split(":"))
    s = Setting(hq, hkv, a.head_dim, a.dtype)
    cfg = load_config(REPO / "config.yaml")
    mc = {"mask_samples": 1, "max_ring_ranks": 64, "seed": 0, **model_config(cfg, CAL_GRID)}
    recs = read_records(Path(a.results), [CAL_GRID, *mc["kernel_grids"]])
    fits = {}
    print("| method | mask | world | dir | emulated ms | model compute ms | model / emulated |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for r in read_runs(a.files):
        if r["degrees"].get("split_documents", "all") != "all":
            continue  # the model's layout is the zigzag of every document (cp_model/geometry.py)
        k = r["local_kernel"]
        if k not in fits:
            net = calibration_network(cfg, CAL_GRID, [CAL_GRID], s, k)
            fits[k] = fitted_kernel(recs, k, s, [CAL_GRID], net, mc)[:2]
        kt, net = fits[k]
        mask, _ = draw_mask(
            r["mask"], r["tokens_per_rank"] * r["world"], hq, hkv, a.head_dim, a.dtype
        )
        deg = r["degrees"]
        for d in ("fwd", "bwd"):
            emu = (r.get(d) or {}).get("emulated")
            if not emu:
                continue
            got = predict(
                r["method"],
                r["world"],
                mask,
                s,
                d,
                kt,
                net,
                mc["max_ring_ranks"],
                ulysses_degree=deg["ulysses"],
                windows=deg["windows"],
            )
            # the per-repetition max over ranks, as its tflops_per_gpu counts it
            flops = attention_flops(sum(mask.area_per_head), a.head_dim, d)
            emu_ms = flops / (emu["tflops_per_gpu"] * 1e12 * r["world"]) * 1e3
            model_ms = got.compute_s * 1e3
            ratios.append(model_ms / emu_ms)
            print(
                f"| {r['method']} | {r['mask']} | {r['world']} | {d} | {emu_ms:.2f} | {model_ms:.2f}"
                f" | {model_ms / emu_ms:.3f} |"
            )
    if ratios:
        err = np.abs(np.array(ratios) - 1)
        print(
            f"\n{len(ratios)} runs: median |model/emulated - 1| {100 * np.median(err):.1f}%, "
            f"worst {100 * (ratios[int(np.argmax(err))] - 1):+.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
