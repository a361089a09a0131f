"""The control calls: a fixed bf16 matrix product and one fixed causal SDPA call, timed before and
after a point's contenders in the same job (docs/measurement.md, "Drift control"). The same calls on the
same GPU take the same time unless the machine moved under the job (clocks, power, temperature,
another tenant): the attention control moving more than DRIFT_LIMIT flags every record of the job.
The matrix product is kept and reported, not judged: it runs at the GPU's power limit, and on an
H200 (700 W) it read 14-19% slower at the end of every job than at its start while the SDPA control
moved within 1.3% and the cells repeated within 1.1% (results/h200/calibration.md): it flagged a
drift the attention kernels did not show.
Torch is imported where a call is made: the answers read DRIFT_LIMIT without it.
"""

from __future__ import annotations

DRIFT_LIMIT = 0.03
# The controls whose move flags a job (see above); the others are reported in `moved` only.
JUDGED = ("sdpa_causal_ms",)
REPS = 10
# Fixed shapes: a GPU-sized pair, and a small one a CPU times in well under a second.
SHAPES = {
    "cuda": {"gemm_n": 8192, "sdpa": (8192, 32, 8, 128)},
    "cpu": {"gemm_n": 512, "sdpa": (1024, 4, 2, 64)},
}


def _calls(device) -> dict:
    """name -> zero-argument call."""
    import torch

    dev = torch.device(device)
    shape = SHAPES[dev.type]
    gen = torch.Generator(device=dev).manual_seed(0)
    dtype = torch.bfloat16
    n = shape["gemm_n"]
    a = torch.randn(n, n, device=dev, generator=gen).to(dtype)
    b = torch.randn(n, n, device=dev, generator=gen).to(dtype)
    s, hq, hkv, d = shape["sdpa"]
    q = torch.randn(1, hq, s, d, device=dev, generator=gen).to(dtype)
    k = torch.randn(1, hkv, s, d, device=dev, generator=gen).to(dtype)
    v = torch.randn(1, hkv, s, d, device=dev, generator=gen).to(dtype)

    def sdpa():
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True
            )

    return {"gemm": lambda: a @ b, "sdpa_causal": sdpa}


# A job's GPU is brought to its steady state before the first control: the control product back
# to back until the last half second runs within 1% of the half second before it (a per-window
# settle, harness.measure.settle, sees two successive 50 ms batches agree while the clocks still
# sink towards the power limit: on an H100 the controls of a job started from idle moved 9-20%).
MACHINE_SETTLE_MIN_S = 2.0
MACHINE_SETTLE_MAX_S = 10.0
MACHINE_SETTLE_WINDOW_S = 0.5


def settle_machine(device) -> dict | None:
    """Back-to-back control products until the GPU's per-call time holds over a second (see
    above); what it took. None on a CPU (no clocks to settle)."""
    import time

    import torch

    if torch.device(device).type != "cuda":
        return None
    gemm = _calls(device)["gemm"]
    t0, per_batch, means = time.perf_counter(), [], []
    while True:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            gemm()
        end.record()
        end.synchronize()
        per_batch.append((time.perf_counter(), start.elapsed_time(end) / 20))
        elapsed = per_batch[-1][0] - t0
        last = [ms for t, ms in per_batch if t > per_batch[-1][0] - MACHINE_SETTLE_WINDOW_S]
        before = [
            ms
            for t, ms in per_batch
            if per_batch[-1][0] - 2 * MACHINE_SETTLE_WINDOW_S
            < t
            <= per_batch[-1][0] - MACHINE_SETTLE_WINDOW_S
        ]
        if before:
            means = [sum(before) / len(before), sum(last) / len(last)]
        settled = bool(means) and abs(means[1] / means[0] - 1) <= 0.01
        if (settled and elapsed >= MACHINE_SETTLE_MIN_S) or elapsed >= MACHINE_SETTLE_MAX_S:
            return {
                "seconds": round(elapsed, 2),
                "settled": settled,
                "gemm_ms_last_windows": means,
            }


def time_controls(device) -> dict:
    """Each control call's median time (ms) over REPS repetitions, timed as cells are."""
    import torch

    from .measure import time_call

    out = {}
    for name, fn in _calls(device).items():
        timing = time_call(fn, warmup=3, reps=REPS, device=device)
        out[f"{name}_ms"] = float(torch.tensor(timing.device_ms).median())
    shape = SHAPES[torch.device(device).type]
    out["shapes"] = {"gemm": [shape["gemm_n"]] * 3, "sdpa_causal": list(shape["sdpa"])}
    return out


def drift(before: dict | None, after: dict | None) -> dict | None:
    """How far each control moved over the job (after / before - 1), the largest move of the
    JUDGED controls, and whether it passed DRIFT_LIMIT; None where either end is missing."""
    if not before or not after:
        return None
    moved = {k: after[k] / before[k] - 1 for k in before if k.endswith("_ms") and before[k]}
    worst = max((moved[k] for k in JUDGED if k in moved), key=abs)
    return {
        "moved": moved,
        "judged": list(JUDGED),
        "worst": worst,
        "limit": DRIFT_LIMIT,
        "drifted": abs(worst) > DRIFT_LIMIT,
    }
