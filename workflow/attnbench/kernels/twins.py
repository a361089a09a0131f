"""Kernels entered twice: the same class under another name, colour and marker, for the A/A test
of the verdict rule (an identical pair must come out a tie). A grid names one beside its original,
as your own kernel (`module:Class`): `attnbench.kernels.twins:SDPATwin` beside `sdpa` (the CPU
test, tests/test_verdict.py), `attnbench.kernels.twins:FA3Twin` beside `fa3` (the GPU grids'
pair); any verdict between the two other than a tie is a false winner."""

import dataclasses

from .catalog import get
from .flash_attn import FA3
from .sdpa import SDPADefault


class SDPATwin(SDPADefault):
    info = dataclasses.replace(
        get("sdpa"),
        name="sdpa_twin",
        summary="SDPA, PyTorch's own backend choice (the same kernel as sdpa, another name)",
        impl="attnbench.kernels.twins:SDPATwin",
        colour="#fb9a99",
        marker="d",
    )


class FA3Twin(FA3):
    """FlashAttention-3 under another name: the A/A pair of a GPU grid (h100_calibration)."""

    info = dataclasses.replace(
        get("fa3"),
        name="fa3_twin",
        summary="FlashAttention-3 (the same kernel as fa3, another name)",
        impl="attnbench.kernels.twins:FA3Twin",
        colour="#ff9896",
        marker="H",
    )
