"""Ulysses (DeepSpeed-Ulysses): all-to-all from sequence to head sharding, one local attention
over the whole (padded) sequence with Hq/U query heads, all-to-all back.

The sequence is split contiguously over U = N ranks (padded at its tail to a multiple of U).
Needs U to divide Hq; KV heads are split when U <= Hkv and replicated U/Hkv times when U > Hkv
(the extra volume is recorded); otherwise `unsupported`. Its volume does not depend on the mask.
"""

from .hybrid import Hybrid


class Ulysses(Hybrid):
    """Hybrid with U = N, R = 1 (checked by catalog.degrees)."""
