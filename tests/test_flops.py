"""FLOPs against facts that do not come from flops.py: cases worked by hand, and torch's own FLOP
counter on the matmuls of attention (docs/masks.md: forward 4 * area * Hq * D, backward 2.5 x
forward, forward+backward 3.5 x forward)."""

import attnbench.masks as M
import pytest
import torch
from attnbench.harness.flops import attention_flops
from torch.utils.flop_counter import FlopCounterMode


def test_a_small_causal_case_worked_by_hand():
    # S = 4, causal: the rows see 1, 2, 3, 4 keys, so 10 visible pairs per head.
    assert M.Mask("causal", 4).area == 10
    # Hq = 2, D = 3. Per visible pair and head: q.k is 3 multiply-adds (6 FLOPs) and p * v another 6,
    # so 12 FLOPs; 10 pairs x 2 heads x 12 = 240. Backward 2.5 x 240 = 600; both 840.
    assert attention_flops(10 * 2, 3, "fwd") == 240
    assert attention_flops(10 * 2, 3, "bwd") == 600
    assert attention_flops(10 * 2, 3, "fwdbwd") == 840


def test_gqa_counts_query_heads():
    # 64:8 heads, D 128, S 2 full: 4 pairs x 64 query heads x 4 x 128 = 131072, whatever Hkv is.
    assert M.Mask("full", 2).area == 4
    assert attention_flops(4 * 64, 128, "fwd") == 131072


def matmul_attention(q, k, v):
    return (q @ k.transpose(-1, -2)).softmax(-1) @ v


def test_full_mask_forward_is_what_torch_counts_for_the_two_matmuls():
    """torch's FLOP counter charges 2*m*n*k per matmul; on a full mask the kernel computes exactly
    those two matmuls, so its count is the forward FLOPs."""
    hq, s, d = 3, 16, 8
    q, k, v = (torch.randn(hq, s, d, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False) as fwd:
        out = matmul_attention(q, k, v)
    with FlopCounterMode(display=False) as bwd:
        out.backward(torch.ones_like(out))
    area = M.Mask("full", s).area * hq
    assert (
        attention_flops(area, d, "fwd") == fwd.get_total_flops() == 24576
    )  # 2 matmuls x 3 heads x 2*16*16*8
    # The backward's four gradient matmuls are 2 x forward; FlashAttention-style kernels also recompute
    # q k^T (half a forward), which is where the spec's 2.5 comes from.
    assert bwd.get_total_flops() == 2 * fwd.get_total_flops()
    assert attention_flops(area, d, "bwd") == bwd.get_total_flops() + fwd.get_total_flops() / 2


def test_unknown_direction():
    with pytest.raises(ValueError, match="unknown direction 'up'; valid: fwd, bwd, fwdbwd"):
        attention_flops(1, 1, "up")
