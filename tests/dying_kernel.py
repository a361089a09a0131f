"""A kernel whose process dies in its second draw, as a segfaulting extension's would (os._exit: no
exception, no record): the side-by-side tests' crash (tests/test_side_by_side.py)."""

import dataclasses
import os

from attnbench.kernels.catalog import get
from attnbench.kernels.sdpa import SDPADefault


class DiesOnSecondDraw(SDPADefault):
    info = dataclasses.replace(
        get("sdpa"),
        name="dies_on_second_draw",
        summary="SDPA whose process dies when it prepares its second draw",
        impl="tests.dying_kernel:DiesOnSecondDraw",
        colour="#6a3d9a",
        marker="v",
    )
    prepared = 0

    def prepare(self, mask):
        DiesOnSecondDraw.prepared += 1
        if DiesOnSecondDraw.prepared == 2:
            os._exit(11)
        return super().prepare(mask)
