"""The float64 reference: plain attention over the mask's dense form, forward and backward.

Layout thd: q [S, Hq, D], k and v [S, Hkv, D]. Rows that see no key give output 0 and
LSE -inf (never NaN). One KV-head group at a time, so memory is (Hq/Hkv) x S x S.
"""

from __future__ import annotations

import math

import torch


def _group_attention(q, k, v, visible, scale):
    """q [g, S, D], k/v [Skv, D], visible [g or 1, S, Skv] -> out [g, S, D], lse [g, S]."""
    s = (q @ k.transpose(0, 1)) * scale
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - finite.unsqueeze(-1))
    return p @ v, lse


def reference_attention(q, k, v, mask=None, dout=None, scale=None, visible=None):
    """Float64 attention. Returns (out, lse [Hq, S], grads or None); grads = (dq, dk, dv).

    `mask` is a Mask (its dense form is used) or `visible` a bool [S, Skv] / [Hq, S, Skv].
    """
    seq, hq, d = q.shape
    hkv = k.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads {hq} are not a multiple of KV heads {hkv}")
    g = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if visible is None:
        visible = mask.dense(q.device)
    visible = visible.to(q.device)
    q64, k64, v64 = (t.detach().to(torch.float64) for t in (q, k, v))
    out = torch.empty_like(q64)
    lse = torch.empty(hq, seq, dtype=torch.float64, device=q.device)
    grads = None
    if dout is not None:
        dout64 = dout.detach().to(torch.float64)
        grads = (torch.empty_like(q64), torch.empty_like(k64), torch.empty_like(v64))
    for j in range(hkv):
        heads = slice(j * g, (j + 1) * g)
        vis = visible[heads] if visible.dim() == 3 else visible.unsqueeze(0)
        qj = q64[:, heads].transpose(0, 1)
        kj, vj = k64[:, j], v64[:, j]
        if dout is None:
            o, group_lse = _group_attention(qj, kj, vj, vis, scale)
        else:
            qj, kj, vj = (t.clone().requires_grad_() for t in (qj, kj, vj))
            with torch.enable_grad():
                o, group_lse = _group_attention(qj, kj, vj, vis, scale)
                dq, dk, dv = torch.autograd.grad(o, (qj, kj, vj), dout64[:, heads].transpose(0, 1))
            grads[0][:, heads] = dq.transpose(0, 1)
            grads[1][:, j], grads[2][:, j] = dk, dv
            o, group_lse = o.detach(), group_lse.detach()
        out[:, heads] = o.transpose(0, 1)
        lse[heads] = group_lse
    return out, lse, grads


def rel_err(x, ref) -> float:
    """Relative Frobenius error ||x - ref|| / ||ref||; NaN or Inf anywhere gives inf."""
    x64, r64 = x.detach().to(torch.float64), ref.detach().to(torch.float64)
    if not torch.isfinite(x64).all():
        return float("inf")
    denom = torch.linalg.vector_norm(r64).item()
    num = torch.linalg.vector_norm(x64 - r64).item()
    return num / denom if denom > 0 else num


def unit_roundoff(dtype) -> float:
    return {
        torch.float64: 2.0**-53,
        torch.float32: 2.0**-24,
        torch.float16: 2.0**-11,
        torch.bfloat16: 2.0**-8,
    }[dtype]
