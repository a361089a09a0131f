"""The same kernel under another name, for the A/A test of the verdict rule (tests/test_verdict.py):
SDPA's default CPU kernel (the catalog's `sdpa`) subclassed as it is, with its own name, colour and
marker. A grid names it as `tests.twin_kernel:SDPATwin` beside `sdpa`; any verdict between the two
other than a tie is a false winner."""

import dataclasses

from attnbench.kernels.catalog import get
from attnbench.kernels.flash_attn import FA3
from attnbench.kernels.sdpa import SDPADefault


class SDPATwin(SDPADefault):
    info = dataclasses.replace(
        get("sdpa"),
        name="sdpa_twin",
        summary="SDPA, PyTorch's own backend choice (the same kernel as sdpa, another name)",
        impl="tests.twin_kernel:SDPATwin",
        colour="#fb9a99",
        marker="d",
    )


class FA3Twin(FA3):
    """FlashAttention-3 under another name: the A/A pair of a GPU grid (h100_calibration)."""

    info = dataclasses.replace(
        get("fa3"),
        name="fa3_twin",
        summary="FlashAttention-3 (the same kernel as fa3, another name)",
        impl="tests.twin_kernel:FA3Twin",
        colour="#ff9896",
        marker="H",
    )
