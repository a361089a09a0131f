"""The gate's sensitivity matrix: mask x one-token perturbation (and one head x1.02) x dtype ->
flagged or not.

    PYTHONPATH=workflow python benchmarks/gate_sensitivity.py --seqlen 4096 --window 1024

A real kernel (SDPA by default) runs on a mask wrong by one token (attnbench.harness.perturb) and the
gate (attnbench.harness.gate, via cell.check_correctness) judges it against the true mask, forward and
backward; so does the kernel with one head of out, dq, dk or dv scaled by 1.02 (perturb.scaled_head).
Each line: the gate's verdict, the largest per-row error / tolerance of out, dq, dk, dv, the
largest head scale / its tolerance, and the relative Frobenius error of out (what the first gate
looked at). The unperturbed kernel's line comes first for each mask: it must pass.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

import attnbench.masks as M  # noqa: E402
from attnbench.families.kernel.cell import check_correctness  # noqa: E402
from attnbench.harness.cpu_math import settle_vml  # noqa: E402
from attnbench.harness.inputs import make_inputs  # noqa: E402
from attnbench.harness.perturb import SCALED, perturbations, scaled_head  # noqa: E402
from attnbench.kernels import catalog  # noqa: E402
from attnbench.kernels.base import load  # noqa: E402
from attnbench.masks.lengths import packaged_histograms  # noqa: E402

CP_ONLY = tuple(m for m in M.CP_MASKS if m not in M.STATIC_MASKS)


def rows(
    kernel_name,
    mask_names,
    seqlen,
    cfg,
    heads,
    head_dim,
    dtypes,
    directions,
    factor,
    seed,
    histograms,
):
    hq, hkv = heads
    for name in mask_names:
        mask = M.sample_mask(name, seqlen, cfg, np.random.default_rng(seed), histograms, hq, hkv)
        for dtype in dtypes:
            kernel = load(
                catalog.get(kernel_name),
                device="cpu",
                dtype=dtype,
                heads_q=hq,
                heads_kv=hkv,
                head_dim=head_dim,
            )
            q, k, v, dout = make_inputs(seed, seqlen, hq, hkv, head_dim, dtype, "cpu")
            right = kernel.prepare(mask)
            wrongs = [("(none)", lambda d: right)]
            wrongs += [(w.label, lambda d, w=w: kernel.prepare(w)) for w in perturbations(mask)]
            wrongs += [
                (f"{n} head 0 x1.02", lambda d, n=n: scaled_head(right, kernel.layout, n))
                for n in SCALED
            ]
            for label, fn_of in wrongs:
                for direction in directions:
                    if direction == "fwd" and label.startswith(("dq ", "dk ", "dv ")):
                        continue  # a gradient's bug has no forward
                    chk = check_correctness(
                        kernel, fn_of(direction), mask, q, k, v, dout, direction, factor
                    )
                    yield name, label, str(dtype).split(".")[-1], direction, chk


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--block", type=int, default=1024, help="block_causal_document's block")
    p.add_argument("--heads", default="4:2", help="query:KV heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--kernel", default="sdpa", help="the real kernel run on the perturbed mask")
    p.add_argument("--masks", nargs="*", default=[*M.STATIC_MASKS, *CP_ONLY])
    p.add_argument("--dtypes", nargs="*", default=["bfloat16", "float32"])
    p.add_argument("--directions", nargs="*", default=["fwd", "bwd"])
    p.add_argument("--factor", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    settle_vml()  # its checks run on the CPU
    histograms = packaged_histograms()
    cfg = {"window": a.window, "block": a.block, "long_doc_range": [a.seqlen // 4, a.seqlen // 2]}
    heads = tuple(int(x) for x in a.heads.split(":"))
    dtypes = [getattr(torch, d) for d in a.dtypes]
    print(
        f"S {a.seqlen}, heads {a.heads}, D {a.head_dim}, window {a.window}, block {a.block}, kernel {a.kernel}, "
        f"factor {a.factor}; per quantity: largest per-row error / tolerance (flagged when > 1)"
    )
    print(
        "| mask | perturbation | dtype | dir | flagged | out | dq | dk | dv | head scale "
        "| out, Frobenius |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    t0, missed = time.perf_counter(), 0
    for name, label, dt, direction, chk in rows(
        a.kernel,
        a.masks,
        a.seqlen,
        cfg,
        heads,
        a.head_dim,
        dtypes,
        a.directions,
        a.factor,
        a.seed,
        histograms,
    ):
        flagged = not chk["passed"]
        if flagged == (label == "(none)"):
            missed += 1
        ratio = {n: chk["errors"][n] / chk["tolerance"][n] for n in chk["errors"]}
        cells = [f"{ratio[n]:.2f}" if n in ratio else "" for n in ("out", "dq", "dk", "dv")]
        heads = max(chk["head_scale"][n] / chk["head_tolerance"][n] for n in chk["head_scale"])
        print(
            f"| {name} | {label} | {dt} | {direction} | {'yes' if flagged else 'NO'} | {' | '.join(cells)} | "
            f"{heads:.2f} | {chk['frobenius_errors']['out']:.4f} |",
            flush=True,
        )
    print(f"{missed} wrong verdicts; {time.perf_counter() - t0:.0f} s")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
