"""Small SYNTHETIC tidy tables for testing tables, figures and captions (never results).

`tidy(rows)` fills every column of results/tables/cells.csv around the given rows, so a family's
report tests (cp, sparse) can build the table they need; `kernel_table()` is a kernel grid with
every status, two heads settings and several lengths.
"""

from __future__ import annotations

import pandas as pd
from attnbench.report.collect import COLUMNS

ENV = {
    "device": "cuda",
    "device_name": "Test GPU 80GB",
    "dtype": "bfloat16",
    "head_dim": 128,
    "gpus": 1,
    "torch": "2.11.0+test",
    "triton": "3.5.0",
    "python": "3.11.7",
    "cuda": "12.8",
    "cudnn": "91002",
    "driver": "570.00",
    "host": "testhost",
    "git_commit": "0123456789abcdef",
    "git_dirty": False,
    "warmup": 5,
    "reps": 20,
    "samples": 2,
    "started_at": "2026-01-01T00:00:00+00:00",
    "finished_at": "2026-01-01T01:00:00+00:00",
    "mem_source": None,
}


def tidy(rows: list[dict], grid: str = "synthetic", family: str = "kernel") -> pd.DataFrame:
    full = []
    for r in rows:
        row = {**ENV, "grid": grid, "family": family, **r}
        timed = row["status"] in ("ok", "incorrect")
        row.setdefault("tflops", None)
        if not timed:
            row["tflops"] = row["tflops_p20"] = row["tflops_p80"] = None
        if timed or row["status"] == "oom":
            row.setdefault("peak_mem_bytes", None)
            row["mem_source"] = row.get("mem_source") or "cuda_allocator"
        else:
            row["peak_mem_bytes"] = None
        row.setdefault("library_version", f"{row['impl']}-lib 1.0")
        full.append(row)
    return pd.DataFrame(full).reindex(columns=COLUMNS)


KERNELS = ("naive", "flex", "fa2", "sdpa_flash")
MASKS = ("full", "causal", "share_question")
LENGTHS = (1024, 4096, 8192, 16384)
HEADS = ((64, 8), (64, 64))


def kernel_status(impl, mask, seqlen, heads, direction) -> str:
    """Every status appears: fa2 cannot express share_question; sdpa_flash is not installed;
    naive runs out of memory at 16K (and at 8K with 64 KV heads); flex disagrees with the
    reference once and has no backward for share_question."""
    if impl == "sdpa_flash":
        return "unavailable"
    if impl == "fa2" and mask == "share_question":
        return "unsupported"
    if impl == "flex" and mask == "share_question" and direction == "bwd":
        return "unsupported"
    if impl == "naive" and (seqlen == 16384 or (seqlen == 8192 and heads == (64, 64))):
        return "oom"
    if (
        impl == "flex"
        and mask == "causal"
        and seqlen == 4096
        and heads == (64, 8)
        and direction == "fwd"
    ):
        return "incorrect"
    return "ok"


def kernel_table(lengths=LENGTHS) -> pd.DataFrame:
    rows = []
    for i, impl in enumerate(KERNELS):
        for mask in MASKS:
            for s in lengths:
                for h in HEADS:
                    for d in ("fwd", "bwd"):
                        st = kernel_status(impl, mask, s, h, d)
                        tflops = 10.0 * (i + 1) + s / 1024  # arbitrary distinct numbers
                        rows.append(
                            {
                                "impl": impl,
                                "mask": mask,
                                "seqlen": s,
                                "heads_q": h[0],
                                "heads_kv": h[1],
                                "direction": d,
                                "status": st,
                                "tflops": tflops,
                                "tflops_p20": tflops - 0.5,
                                "tflops_p80": tflops + 0.5,
                                "peak_mem_bytes": float(s * h[1] * (i + 1) * 2**12),
                            }
                        )
    return tidy(rows)


def kernel_grid_config(lengths=LENGTHS) -> dict:
    return {
        "family": "kernel",
        "device": "cuda",
        "description": "synthetic test grid",
        "kernels": list(KERNELS),
        "masks": list(MASKS),
        "seqlen": list(lengths),
        "heads": [list(h) for h in HEADS],
        "direction": ["fwd", "bwd"],
    }
