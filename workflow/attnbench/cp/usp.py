"""USP (unified sequence parallelism): Ulysses all-to-all inside groups of U ranks, Ring P2P
across the R = N/U groups; each ring carries the KV heads of one Ulysses head group.

Paper default: U = min(N, 8), i.e. Ulysses inside an 8-GPU node. Which ranks form a Ulysses group
(`contiguous`: consecutive ranks, inside a node; `strided`: R ranks apart) is explicit and recorded.
"""

from .hybrid import Hybrid


class USP(Hybrid):
    """Hybrid with the configured U, R = N/U, W = 1."""
