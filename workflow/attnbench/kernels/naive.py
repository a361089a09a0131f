"""Eager PyTorch attention: softmax(q k^T * scale + mask) v, materialising S x S per head; and the
same explicit computation as the CP local kernel `math` (local_kernel.py), with its backward."""

from __future__ import annotations

import math

import torch

from .base import Kernel
from .local_kernel import LocalKernel, RecomputeBackward
from .lse import finite_lse


def naive_attention(q, k, v, visible, scale=None):
    """q [B, Hq, S, D], k/v [B, Hkv, S, D], visible broadcastable to [B, Hq, S, S]."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class Naive(Kernel):
    layout = "bhsd"

    def prepare(self, mask):
        visible = mask.dense(self.device)  # [S, S] or [Hq, S, S]; broadcasts over batch and heads
        return lambda q, k, v: naive_attention(q, k, v, visible)


# ---------------------------------------------------------------- the CP local kernel


def _groups(x, hkv):
    """[S, Hq, D] -> [Hkv, g, S, D] (query heads of one KV head together)."""
    s, hq, d = x.shape
    return x.view(s, hkv, hq // hkv, d).permute(1, 2, 0, 3)


def _ungroup(x):
    """[Hkv, g, S, D] -> [S, Hq, D]."""
    hkv, g, s, d = x.shape
    return x.permute(2, 0, 1, 3).reshape(s, hkv * g, d)


class MathLocal(LocalKernel):
    """softmax(q k^T * scale) v over the chunk's painted matrix, in float32 (float64 for
    float64 inputs), and the textbook backward. Memory Hq x ql x kl: small sizes only."""

    def _scores(self, q, k, chunk):
        hkv = k.shape[1]
        qg = _groups(q.to(self.acc), hkv)
        kf = k.to(self.acc).permute(1, 0, 2)
        s = torch.einsum("hgqd,hkd->hgqk", qg, kf) * self.scale
        return qg, s.masked_fill(~chunk.visible(q.device), float("-inf"))

    def _forward(self, q, k, v, chunk):
        _, s = self._scores(q, k, chunk)
        # logsumexp of a row of -inf has a NaN gradient: take it over zeros there, then set -inf.
        has = chunk.rows_with_keys(q.device).view(1, 1, -1, 1)
        lse = torch.logsumexp(torch.where(has, s, torch.zeros_like(s)), dim=-1).masked_fill(
            ~has[..., 0], float("-inf")
        )
        p = torch.exp(s - finite_lse(lse).unsqueeze(-1))
        out = torch.einsum("hgqk,hkd->hgqd", p, v.to(self.acc).permute(1, 0, 2))
        return _ungroup(out).to(q.dtype), lse.reshape(-1, q.shape[0])

    def _backward(self, dout, q, k, v, out, lse, chunk):
        hkv = k.shape[1]
        qg, s = self._scores(q, k, chunk)
        lse_g = lse.to(self.acc).view(hkv, -1, q.shape[0])
        p = torch.exp(s - lse_g.unsqueeze(-1))
        do = _groups(dout.to(self.acc), hkv)
        vf = v.to(self.acc).permute(1, 0, 2)
        dp = torch.einsum("hgqd,hkd->hgqk", do, vf)
        delta = (do * _groups(out.to(self.acc), hkv)).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        dq = torch.einsum("hgqk,hkd->hgqd", ds, k.to(self.acc).permute(1, 0, 2)) * self.scale
        dk = torch.einsum("hgqk,hgqd->khd", ds, qg) * self.scale
        dv = torch.einsum("hgqk,hgqd->khd", p, do)
        return _ungroup(dq), dk, dv


class MathRecompute(RecomputeBackward, MathLocal):
    """The math kernel with the recomputation backward (tests the recomputation on CPU)."""

    def differentiable_forward(self, q, k, v, chunk):
        return MathLocal._forward(self, q, k, v, chunk)
