"""Independent check of the pipeline's GPU timings with triton.testing.do_bench.

For a few cells of a finished GPU grid (default: sdpa_cudnn, sdpa_flash and flex, causal, 16K,
fwd and bwd) this rebuilds the exact first sample of each record (same mask parameters, same
seeded inputs, same kernel preparation), times the same call with do_bench (its own warm-up,
its own L2 flush, median), and prints both numbers side by side with their ratio.

The record was timed in its own process, at another moment of the GPU's clocks and temperature;
so the same call is also timed here once more with the pipeline's protocol (measure.time_ms, the
record's warm-up and repetitions), next to do_bench: `ratio_now` separates a difference of
protocol (it stays) from one of the machine's state (only `ratio` shows it). A pause before each
timing lets the GPU return to its idle clocks, as between the pipeline's one-cell processes.

    python benchmarks/do_bench_compare.py --cells results/h200/tables/cells.csv
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from attnbench.grid.spec import CellSpec
from attnbench.harness import inputs as I
from attnbench.harness.measure import time_ms
from attnbench.kernels import catalog
from attnbench.kernels.base import from_thd, load
from attnbench.masks import Mask


def rebuild_call(record):
    """The timed call of a record's first sample, exactly as the cell built it."""
    spec, sample = CellSpec.from_dict(record["cell"]), record["samples"][0]
    p = spec.problem
    dtype = I.torch_dtype(p.dtype)
    kernel = load(
        catalog.get(spec.impl),
        device="cuda",
        dtype=dtype,
        heads_q=p.heads_q,
        heads_kv=p.heads_kv,
        head_dim=p.head_dim,
    )
    mask = Mask(p.mask, p.seqlen, sample["mask_params"], heads_q=p.heads_q)
    q, k, v, dout = I.make_inputs(
        I.input_seed(record["data_seed"], 0, p.seqlen),
        p.seqlen,
        p.heads_q,
        p.heads_kv,
        p.head_dim,
        dtype,
        "cuda",
    )
    fn = kernel.prepare(mask)
    backward = p.backward
    leaves = [from_thd(x, kernel.layout).requires_grad_(backward) for x in (q, k, v)]
    dout_l = from_thd(dout, kernel.layout)
    if p.direction == "fwd":

        def call():
            with torch.no_grad():
                return fn(*leaves)
    elif p.direction == "bwd":
        out = fn(*leaves)

        def call():
            return torch.autograd.grad(out, leaves, dout_l, retain_graph=True)
    else:

        def call():
            return torch.autograd.grad(fn(*leaves), leaves, dout_l)

    return call


def protocol_variants(call, warmup: int, reps: int) -> dict:
    """Median ms of the same call under variations of the pipeline's protocol, to locate a gap
    with do_bench: no host synchronisation between repetitions (do_bench enqueues them all and
    waits once), and do_bench's 256 MB cache flush instead of 2 x L2."""
    from attnbench.harness.measure import L2Flush

    def timed(sync_each: bool, flush_bytes: int | None):
        flush = L2Flush("cuda")
        if flush_bytes:
            flush.buf = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda")
        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
        events = []
        for _ in range(reps):
            flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            if sync_each:
                end.synchronize()
            events.append((start, end))
        torch.cuda.synchronize()
        return float(np.median([a.elapsed_time(b) for a, b in events]))

    return {
        "sync_each_ms": timed(True, None),
        "no_sync_ms": timed(False, None),
        "flush256_ms": timed(True, 256 * 2**20),
        "no_sync_flush256_ms": timed(False, 256 * 2**20),
    }


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cells", required=True, help="the tidy table of a GPU run")
    p.add_argument("--impls", nargs="*", default=["sdpa_cudnn", "sdpa_flash", "flex"])
    p.add_argument("--mask", default="causal")
    p.add_argument("--seqlen", type=int, default=16384)
    p.add_argument("--grid", help="only this grid's cells")
    p.add_argument("--pause-s", type=float, default=2.0, help="idle seconds before each timing")
    p.add_argument(
        "--variants",
        action="store_true",
        help="also time variations of the protocol (protocol_variants)",
    )
    p.add_argument("--out", help="also write the comparison as CSV here")
    a = p.parse_args(argv)
    from triton.testing import do_bench

    df = pd.read_csv(a.cells)
    sel = df[
        df["impl"].isin(a.impls)
        & (df["mask"] == a.mask)
        & (df["seqlen"] == a.seqlen)
        & (df["status"] == "ok")
        & (df["device"] == "cuda")
        & (df["heads_q"] != df["heads_kv"])
        & ((df["grid"] == a.grid) if a.grid else True)
    ]
    rows = []
    for _, r in sel.sort_values(["impl", "direction"]).iterrows():
        record = json.loads(Path(r["record"]).read_text())
        pipeline_ms = record["samples"][0]["time_ms_median"]
        call = rebuild_call(record)
        time.sleep(a.pause_s)
        ms = do_bench(call, warmup=25, rep=100, return_mode="median")
        time.sleep(a.pause_s)
        now = time_ms(
            call, warmup=record["cell"]["warmup"], reps=record["cell"]["reps"], device="cuda"
        )
        now_ms = float(np.median(now))
        rows.append(
            {
                "impl": r["impl"],
                "mask": a.mask,
                "seqlen": a.seqlen,
                "direction": r["direction"],
                "pipeline_ms": pipeline_ms,
                "do_bench_ms": ms,
                "ratio": pipeline_ms / ms,
                "pipeline_now_ms": now_ms,
                "ratio_now": now_ms / ms,
            }
        )
        if a.variants:
            rows[-1].update(
                protocol_variants(call, record["cell"]["warmup"], max(record["cell"]["reps"], 20))
            )
        del call
        torch.cuda.empty_cache()
    out = pd.DataFrame(rows)
    if out.empty:
        raise SystemExit(f"no ok cuda cells for {a.impls} / {a.mask} / {a.seqlen} in {a.cells}")
    print(out.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if a.out:
        out.to_csv(a.out, index=False)


if __name__ == "__main__":
    main()
