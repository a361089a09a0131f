"""The static mask patterns of docs/masks.md, one module per figure family (the masks the paper
draws in one figure: full_causal.py, document.py, sliding_window.py, prefix_lm.py, blockwise.py,
share_question.py); what every pattern shares is in base.py. Each says how it samples its
parameters, its one predicate, its range form, and the forms kernels take where it has them: the
native form (documents, causal, window) of the varlen/window kernels, else FlashAttention-4's
mask_mod. Block-sparse patterns live in masks/sparse.py.

`params` are the realised parameters of one sample (JSON-able); the mask can be rebuilt from
them exactly. `cfg` holds the grid's fixed settings (window, block, long-document mix), the keys
each pattern reads in its `cfg_keys` (the only mask_params a grid may set: grid.expand).
"""

from __future__ import annotations

from .base import CheckShape, MaskMod, NativeForm, Pattern  # noqa: F401
from .blockwise import BlockCausalDocument, CausalBlockwise
from .document import CausalDocument, CausalDocumentLong, FullDocument, FullDocumentLong
from .full_causal import Causal, Full
from .prefix_lm import PrefixLMCausal, PrefixLMDocument
from .share_question import ShareQuestion
from .sliding_window import GlobalSlidingWindow, SlidingWindow, SlidingWindowCausal

STATIC_PATTERNS = {
    p.name: p
    for p in (
        Full(),
        Causal(),
        FullDocument(),
        CausalDocument(),
        SlidingWindow(),
        SlidingWindowCausal(),
        ShareQuestion(),
        CausalBlockwise(),
        PrefixLMCausal(),
        PrefixLMDocument(),
        GlobalSlidingWindow(),
        BlockCausalDocument(),
    )
}
CP_PATTERNS = {p.name: p for p in (FullDocumentLong(), CausalDocumentLong())}

# The figure families (a pattern's figure_family) in the order of the figures, with their titles;
# a family not here follows them, in the order of STATIC_PATTERNS, titled by its name.
FAMILY_TITLES = {
    "full_causal": "full and causal masks",
    "document": "document masks",
    "sliding_window": "sliding-window masks",
    "prefix_lm": "prefix-LM masks",
    "blockwise": "blockwise masks",
    "share_question": "shared-question mask",
}


def figure_families(patterns: dict) -> dict[str, tuple[str, ...]]:
    """{family: its masks}: the families of FAMILY_TITLES first, then the others; the masks of
    each in the order of `patterns`; patterns of no family (figure_family None) left out."""
    named = [p.figure_family for p in patterns.values() if p.figure_family]
    order = [
        *(f for f in FAMILY_TITLES if f in named),
        *(f for f in named if f not in FAMILY_TITLES),
    ]
    return {
        fam: tuple(n for n, p in patterns.items() if p.figure_family == fam)
        for fam in dict.fromkeys(order)
    }


FIGURE_FAMILIES = figure_families(STATIC_PATTERNS)
