"""Ring P2P (ring attention): R steps; at step t a rank computes its queries against the KV shard
that started on ring rank (r - t) mod R while it sends its current KV to r+1 and receives the
next from r-1 (batched isend/irecv, double-buffered, a side stream on GPU).

Per-document zigzag sharding balances causal masks; the step rules (diagonal causal, lower rank:
all queries vs the first key chunk, higher rank: the second query chunk vs all keys) are in
chunks.ring_step_chunk. Backward is an explicit reverse ring (ring.DoubleRing with one window):
KV travels again and each shard's dK, dV accumulator travels with it back home. Its volume,
(R-1) KV shards forward, (R-1) KV + (R-1) dKV backward, ignores the mask.
"""

from .hybrid import Hybrid


class RingP2P(Hybrid):
    """Hybrid with U = 1, R = N, W = 1."""
