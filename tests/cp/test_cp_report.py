"""The CP tables' derived columns, from tidy-table rows."""

import pandas as pd

from attnbench.cp_report import breakdown_table, vs_single_gpu_table


def row(impl, gpus, tflops, time_ms=100.0, comp=None, comm=None, ratio=None, tpg=4096, mask="full"):
    return {"impl": impl, "mask": mask, "direction": "fwd", "tokens_per_gpu": tpg, "gpus": gpus, "status": "ok",
            "tflops": tflops, "time_ms_median": time_ms, "compute_only_ms": comp, "comm_only_ms": comm,
            "overlap_ratio": ratio, "ulysses_degree": 1, "ring_degree": gpus, "windows": 1, "placement": "contiguous",
            "load_balance": 1.0, "bytes_sent_max": 0, "bytes_match_analytic": True, "peak_mem_bytes": 2**30}


def test_share_of_one_gpu_is_per_length_and_blank_without_a_reference():
    df = pd.DataFrame([row("ulysses", 1, 200.0), row("ring_p2p", 2, 150.0), row("ring_p2p", 2, 90.0, tpg=8192)])
    t = vs_single_gpu_table(df).reset_index()
    assert list(t["share of 1 GPU"]) == ["75%", ""]  # 8192 tokens per GPU has no 1-GPU cell
    assert t["1 GPU (TFLOP/s)"].iloc[0] == "200 (ulysses)"


def test_overlap_is_shown_only_where_communication_is_not_negligible():
    df = pd.DataFrame([row("ring_p2p", 2, 1.0, time_ms=105.0, comp=100.0, comm=20.0, ratio=0.75),
                       row("ulysses", 2, 1.0, time_ms=109.0, comp=100.0, comm=1.0, ratio=-8.0)])
    t = breakdown_table(df).reset_index().set_index("method")
    assert t.loc["ring_p2p", "overlap"] == "0.75" and t.loc["ulysses", "overlap"] == "(comm 1.0%)"
    assert t.loc["ulysses", "measured / compute-only"] == "1.090"
