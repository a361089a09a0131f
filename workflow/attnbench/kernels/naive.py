"""Eager PyTorch attention: softmax(q k^T * scale + mask) v, materialising S x S per head."""

from __future__ import annotations

import math

import torch

from .base import Kernel


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
