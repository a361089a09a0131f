"""Range form of a mask: rectangles of (query range, key range, kind).

This is the form FLOPs and varlen kernels want. Every pattern derives its slices from its
definition, and tests check them against the predicate (same dense matrix, same area).
Kinds, for local row r in [0, ql) and column c in [0, kl):
  full        always visible
  causal      c <= r + (kl - ql)   (bottom-right aligned)
  inv_causal  c >= r
  bi_causal   c >= r and c <= r + (kl - ql)
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("full", "causal", "inv_causal", "bi_causal")


def check_block_multiple(mask, cfg, key, seqlen) -> int:
    """The block size mask_params[key] of a mask that tiles the sequence in equal blocks; a
    ValueError unless it is >= 1 and divides seqlen."""
    b = int(cfg.get(key, 0))
    if b < 1:
        raise ValueError(f"{mask} needs mask_params.{key} >= 1, got {cfg.get(key)!r}")
    if seqlen % b:
        raise ValueError(f"{mask}: seqlen {seqlen} is not a multiple of mask_params.{key}={b}")
    return b


@dataclass(frozen=True)
class Slice:
    q0: int
    q1: int
    k0: int
    k1: int
    kind: str = "full"

    @property
    def ql(self) -> int:
        return self.q1 - self.q0

    @property
    def kl(self) -> int:
        return self.k1 - self.k0

    def area(self) -> int:
        ql, kl = self.ql, self.kl
        if ql <= 0 or kl <= 0:
            return 0
        if self.kind == "full":
            return ql * kl
        if self.kind in ("causal", "inv_causal"):
            h = min(ql, kl)
            return (2 * kl - h + 1) * h // 2
        if self.kind == "bi_causal":
            return (kl - ql + 1) * ql if kl >= ql else 0
        raise ValueError(f"unknown slice kind {self.kind!r}; valid kinds: {', '.join(KINDS)}")


def nonempty(slices) -> list[Slice]:
    return [s for s in slices if s.area() > 0]


def total_area(slices) -> int:
    return sum(s.area() for s in slices)


def dense_from_slices(slices, seqlen: int):
    """A dense boolean [S, S] matrix painted from slices (for tests; O(S^2))."""
    import torch

    out = torch.zeros(seqlen, seqlen, dtype=torch.bool)
    for s in slices:
        if s.ql <= 0 or s.kl <= 0:
            continue
        r = torch.arange(s.ql).unsqueeze(1)
        c = torch.arange(s.kl).unsqueeze(0)
        if s.kind == "full":
            vis = torch.ones(s.ql, s.kl, dtype=torch.bool)
        elif s.kind == "causal":
            vis = c <= r + (s.kl - s.ql)
        elif s.kind == "inv_causal":
            vis = c >= r
        elif s.kind == "bi_causal":
            vis = (c >= r) & (c <= r + (s.kl - s.ql))
        else:
            raise ValueError(f"unknown slice kind {s.kind!r}")
        out[s.q0 : s.q1, s.k0 : s.k1] |= vis
    return out
