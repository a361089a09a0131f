"""The flex adapter's mask_mod forms timed against each other on the same BlockMask and inputs.

kernels/flex_forms.py writes a mask's mask_mod in two forms: `predicate` (the mask's own predicate;
document masks in document-local coordinates) and `direct` (global positions, doc[q] == doc[kv]);
the adapter runs the faster (flex_forms.CHOSEN). This times both through the adapter itself (same
BlockMask, only the mask_mod differs), with adapter_vs_library.py's timing routine (do_bench median
on CUDA; on the CPU perf_counter medians, the two forms' calls taking turns), and prints one Markdown row per mask, length and
direction: each form's milliseconds and predicate / direct (above 1: direct is faster).

    python benchmarks/flex_mask_mod_forms.py --device cpu --seqlen 1024 2048
    python benchmarks/flex_mask_mod_forms.py --seqlen 8192 32768 --directions fwd bwd   # a GPU
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from adapter_vs_library import direction_call, mask_cfg, time_calls
from attnbench.harness.inputs import make_inputs
from attnbench.kernels import catalog, flex_forms
from attnbench.kernels.base import from_thd, load
from attnbench.masks import sample_mask
from attnbench.masks.lengths import packaged_histograms

# The masks whose two forms differ (the others have only their predicate)
MASKS = tuple(m for m in flex_forms.DIRECT_FORMS if not m.endswith("_long"))


def forms_ms(kernel, mask, q, k, v, dout, direction, args) -> list[float]:
    """Milliseconds of each form (flex_forms.FORMS order), on the same BlockMask."""
    calls = []
    for form in flex_forms.FORMS:
        kernel.mask_mod_form = form
        fn = kernel.prepare(mask)
        leaves = [from_thd(x, "bhsd").requires_grad_(direction != "fwd") for x in (q, k, v)]
        calls.append(direction_call(fn, leaves, from_thd(dout, "bhsd"), direction))
        calls[-1]()  # compiles
    kernel.mask_mod_form = None
    return time_calls(calls, args.device, args.warmup, args.reps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seqlen", type=int, nargs="+", default=[1024])
    ap.add_argument("--masks", nargs="+", default=list(MASKS), choices=MASKS)
    ap.add_argument("--directions", nargs="+", default=None, choices=("fwd", "bwd", "fwdbwd"))
    ap.add_argument("--heads", default=None, help="HQ:HKV; default 64:8 on CUDA, 8:2 on the CPU")
    ap.add_argument("--head-dim", type=int, default=None)
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--block", type=int, default=None)
    ap.add_argument(
        "--draws", type=int, default=1, help="draws per mask and length (seeds 0..n-1)"
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    gpu = args.device == "cuda"
    directions = args.directions or (["fwd", "bwd"] if gpu else ["fwd"])
    hq, hkv = map(int, (args.heads or ("64:8" if gpu else "8:2")).split(":"))
    d = args.head_dim or (128 if gpu else 64)
    dtype = torch.bfloat16 if gpu else torch.float32
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1000)
    kernel = load(
        catalog.get("flex"), device=args.device, dtype=dtype, heads_q=hq, heads_kv=hkv, head_dim=d
    )
    lines = [
        "| mask | S | draw | direction | predicate ms | direct ms | predicate / direct |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in args.seqlen:
        q, k, v, dout = make_inputs(0, s, hq, hkv, d, dtype, args.device)
        for name in args.masks:
            for seed in range(args.draws):
                mask = sample_mask(
                    name,
                    s,
                    mask_cfg(s, args),
                    np.random.default_rng(seed),
                    packaged_histograms(),
                    hq,
                    hkv,
                )
                for direction in directions:
                    old, new = forms_ms(kernel, mask, q, k, v, dout, direction, args)
                    lines.append(
                        f"| {name} | {s} | {seed} | {direction} | {old:.3f} | {new:.3f} | "
                        f"{old / new:.2f} |"
                    )
                    print(lines[-1], flush=True)
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
