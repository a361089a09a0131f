"""FLOPs of attention from the exact visible area (docs/masks.md).

forward = 4 * area * Hq * D (two matmuls of 2 FLOPs per multiply-add); backward = 2.5 x forward;
forward+backward = 3.5 x forward. GQA does not lower FLOPs; padding never counts.
"""

from __future__ import annotations

DIRECTION_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
DIRECTIONS = tuple(DIRECTION_FACTOR)


def attention_flops(area_all_heads: float, head_dim: int, direction: str) -> float:
    """`area_all_heads` is the visible (i, j) pairs summed over query heads."""
    try:
        factor = DIRECTION_FACTOR[direction]
    except KeyError:
        raise ValueError(
            f"unknown direction {direction!r}; valid: {', '.join(DIRECTIONS)}"
        ) from None
    return 4.0 * area_all_heads * head_dim * factor
