"""Log-sum-exps of partial attention results: merging them (float32 or better), and the forms a
local kernel (local_kernel.py) takes and returns.

For two partial results over disjoint key sets, with lse_a >= lse_b (say):
    lse = lse_a + log1p(exp(lse_b - lse_a)),   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b.
Rows that saw nothing in both keep lse = -inf and out = 0 (never NaN).
"""

from __future__ import annotations

import torch


def accumulator_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def new_accumulator(rows: int, heads: int, head_dim: int, dtype, device):
    """out [rows, heads, head_dim] zeros and lse [heads, rows] -inf, in the accumulation dtype."""
    acc = accumulator_dtype(dtype)
    return (
        torch.zeros(rows, heads, head_dim, dtype=acc, device=device),
        torch.full((heads, rows), float("-inf"), dtype=acc, device=device),
    )


def merge_into(out, lse, out_t, lse_t):
    """out, lse (accumulators, updated in place) <- merged with the partial out_t [rows, H, D], lse_t [H, rows]."""
    lse_t = lse_t.to(lse.dtype)
    hi = torch.maximum(lse, lse_t)
    lo = torch.minimum(lse, lse_t)
    seen = torch.isfinite(hi)
    safe_hi = torch.where(seen, hi, torch.zeros_like(hi))
    new = torch.where(seen, safe_hi + torch.log1p(torch.exp(lo - safe_hi)), hi)
    safe_new = torch.where(seen, new, torch.zeros_like(new))
    w_old = torch.exp(lse - safe_new)  # exp(-inf) = 0 where a side saw nothing
    w_new = torch.exp(lse_t - safe_new)
    out.mul_(w_old.transpose(0, 1).unsqueeze(-1)).add_(
        out_t.to(out.dtype) * w_new.transpose(0, 1).unsqueeze(-1)
    )
    lse.copy_(new)


def finite_lse(lse):
    """The final LSE as backward kernels take it: rows that saw nothing get 0 (their keys are all
    masked, so every P is exp(-inf) = 0 either way) instead of -inf (which gives NaN)."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).contiguous()


def lse_rows(lse, heads: int, rows: int, library: str):
    """A library's LSE as [Hq, rows]: (b=1, h, s), (b=1, h, s, 1) (cuDNN) and (h, total) (varlen)
    all hold the same numbers; anything else (a padded LSE) is refused, naming the library."""
    if lse.numel() != heads * rows:
        raise RuntimeError(
            f"{library}: expected an LSE of {heads} heads x {rows} rows, got shape {tuple(lse.shape)}"
        )
    return lse.reshape(heads, rows)
