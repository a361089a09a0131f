import pytest

import attnbench.masks as M
from attnbench.flops import attention_flops


def test_flops_formula():
    area = M.Mask("causal", 1024).area
    assert area == 1024 * 1025 // 2
    fwd = attention_flops(area * 64, 128, "fwd")
    assert fwd == 4 * area * 64 * 128
    assert attention_flops(area * 64, 128, "bwd") == 2.5 * fwd
    assert attention_flops(area * 64, 128, "fwdbwd") == 3.5 * fwd


def test_unknown_direction():
    with pytest.raises(ValueError, match="unknown direction 'up'; valid: fwd, bwd, fwdbwd"):
        attention_flops(1, 1, "up")
