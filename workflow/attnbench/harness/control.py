"""The control calls: a fixed bf16 matrix product and one fixed causal SDPA call, timed before and
after a point's contenders in the same job (docs/measurement.md, "Drift"). The same calls on the
same GPU take the same time unless the machine moved under the job (clocks, power, temperature,
another tenant): a control that moved more than DRIFT_LIMIT flags every record of the job.
"""

from __future__ import annotations

import torch

from .measure import time_call

DRIFT_LIMIT = 0.03
REPS = 10
# Fixed shapes: a GPU-sized pair, and a small one a CPU times in well under a second.
SHAPES = {
    "cuda": {"gemm_n": 8192, "sdpa": (8192, 32, 8, 128)},
    "cpu": {"gemm_n": 512, "sdpa": (1024, 4, 2, 64)},
}


def _calls(device) -> dict:
    """name -> (zero-argument call, warm-up calls)."""
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
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    return {"gemm": lambda: a @ b, "sdpa_causal": sdpa}


def time_controls(device) -> dict:
    """Each control call's median time (ms) over REPS repetitions, timed as cells are."""
    out = {}
    for name, fn in _calls(device).items():
        timing = time_call(fn, warmup=3, reps=REPS, device=device)
        out[f"{name}_ms"] = float(torch.tensor(timing.device_ms).median())
    shape = SHAPES[torch.device(device).type]
    out["shapes"] = {"gemm": [shape["gemm_n"]] * 3, "sdpa_causal": list(shape["sdpa"])}
    return out


def drift(before: dict | None, after: dict | None) -> dict | None:
    """How far each control moved over the job (after / before - 1), the largest, and whether it
    passed DRIFT_LIMIT; None where either end is missing."""
    if not before or not after:
        return None
    moved = {k: after[k] / before[k] - 1 for k in before if k.endswith("_ms") and before[k]}
    worst = max(moved.values(), key=abs)
    return {"moved": moved, "worst": worst, "limit": DRIFT_LIMIT, "drifted": abs(worst) > DRIFT_LIMIT}
