"""LoongTrain (double-ring attention): like USP, but the ring of R ranks is split into W windows
(W = the largest divisor of R that is <= sqrt(R) unless configured): an inner ring inside each
window, and an outer ring between windows that prefetches the next window's KV while the inner
ring computes. Backward mirrors it, with separate communicators for KV and dKV (ring.DoubleRing).

Padded documents: every step's chunk comes from the (query shard, key shard) pair through the
same zigzag rules as Ring P2P, whatever the window schedule, so the valid lengths cannot drift
(the reference's per-step lengths were wrong for padded documents when W > 1).
"""

from .hybrid import Hybrid


class LoongTrain(Hybrid):
    """Hybrid with the configured U, R = N/U and W windows."""
