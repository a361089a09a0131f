"""The mask library: one predicate per pattern, and every derived form beside it.

mask = sample_mask("causal_document", 4096, cfg, rng, histograms, heads_q=8, heads_kv=2)
mask.dense()        # [S, S] (or [Hq, S, S] for block-sparse) bool, for references
mask.mask_mod(dev)  # FlexAttention mask_mod, the same predicate
mask.area           # exact visible pairs per head, from the range form
mask.native_form()  # documents / causal / window for varlen kernels, or None
mask.fa4_mask_mod()  # FlashAttention-4's mask_mod form where there is no native one, or None
"""

from __future__ import annotations

from functools import cached_property

from .patterns import CP_PATTERNS, STATIC_PATTERNS, MaskMod, NativeForm, Pattern  # noqa: F401
from .ranges import Slice, total_area  # noqa: F401
from .sparse import SPARSE_PATTERNS, BlockLayout  # noqa: F401

PATTERNS = {**STATIC_PATTERNS, **SPARSE_PATTERNS, **CP_PATTERNS}
STATIC_MASKS = tuple(STATIC_PATTERNS)
# The static masks with a native (documents, causal, window) form: what FlashAttention-2/3,
# varlen and cuDNN run; the others have FlashAttention-4's mask_mod form.
REGULAR_MASKS = tuple(n for n, p in STATIC_PATTERNS.items() if p.regular)
FA4_MASK_MOD_MASKS = tuple(n for n, p in STATIC_PATTERNS.items() if p.has_fa4_mask_mod)
SPARSE_MASKS = tuple(SPARSE_PATTERNS)
CP_MASKS = ("full", "causal", "full_document", "causal_document", *CP_PATTERNS)
ALL_MASKS = tuple(PATTERNS)


def pattern(name: str):
    try:
        return PATTERNS[name]
    except KeyError:
        raise ValueError(f"unknown mask {name!r}; valid masks: {', '.join(ALL_MASKS)}") from None


def is_sparse(name: str) -> bool:
    return name in SPARSE_PATTERNS


class Mask:
    """One realised mask: a pattern, a length and the parameters it was drawn with."""

    def __init__(self, name: str, seqlen: int, params: dict | None = None, heads_q: int = 1):
        self.name, self.seqlen, self.params = name, int(seqlen), dict(params or {})
        self.pattern = pattern(name)
        self.heads_q = int(self.params.get("heads_q", heads_q))

    @property
    def sparse(self) -> bool:
        return is_sparse(self.name)

    def predicate(self, device="cpu"):
        """visible(h, q, k) over broadcastable index tensors."""
        if self.sparse:
            return self.pattern.predicate_h(self.seqlen, self.params, device)
        pred = self.pattern.predicate(self.seqlen, self.params, device)
        return lambda h, q, k: pred(q, k)

    def mask_mod(self, device="cpu"):
        pred = self.predicate(device)
        return lambda b, h, q_idx, kv_idx: pred(h, q_idx, kv_idx)

    def dense(self, device="cpu", rows=None):
        """Bool [S, S] ([Hq, S, S] for block-sparse); `rows` limits it to a range of query rows."""
        import torch

        r0, r1 = rows if rows is not None else (0, self.seqlen)
        q = torch.arange(r0, r1, device=device).view(-1, 1)
        k = torch.arange(self.seqlen, device=device).view(1, -1)
        if self.sparse:
            h = torch.arange(self.heads_q, device=device).view(-1, 1, 1)
            return self.predicate(device)(h, q.unsqueeze(0), k.unsqueeze(0))
        return self.predicate(device)(None, q, k).expand(r1 - r0, self.seqlen)

    def slices(self, group: int | None = None) -> list[Slice]:
        if self.sparse:
            return self.pattern.slices_for_group(self.seqlen, self.params, group or 0)
        return self.pattern.slices(self.seqlen, self.params)

    @cached_property
    def area_per_head(self) -> list[int]:
        """Exact visible (i, j) pairs of each query head, from the range form."""
        if self.sparse:
            return self.pattern.area_per_head(self.seqlen, self.params)
        return [total_area(self.slices())] * self.heads_q

    @property
    def area(self) -> float:
        """Visible pairs per head (the mean over query heads for block-sparse)."""
        a = self.area_per_head
        return sum(a) / len(a)

    def layout(self) -> BlockLayout:
        if not self.sparse:
            raise ValueError(f"mask {self.name!r} has no block layout (not block-sparse)")
        return self.pattern.layout(self.seqlen, self.params)

    def native_form(self) -> NativeForm | None:
        return None if self.sparse else self.pattern.native_form(self.seqlen, self.params)

    def fa4_mask_mod(self) -> MaskMod | None:
        return None if self.sparse else self.pattern.fa4_mask_mod(self.seqlen, self.params)

    @property
    def doc_lengths(self):
        return self.params.get("doc_lengths")

    def block_counts(self, block: int, device="cpu"):
        """Visible pairs in every (query block, key block) tile: [H or 1, nqb, nkb].

        Built from the predicate one row of blocks at a time: memory O(block x S), never S x S.
        """
        import torch

        s, nb = self.seqlen, -(-self.seqlen // block)
        heads = self.heads_q if self.sparse else 1
        out = torch.zeros(heads, nb, nb, dtype=torch.int32, device=device)
        pad = nb * block - s
        for i in range(nb):
            rows = self.dense(device, rows=(i * block, min(s, (i + 1) * block)))
            rows = rows.view(heads, rows.shape[-2], s)
            if pad:
                rows = torch.nn.functional.pad(rows, (0, pad))
            out[:, i] = rows.view(heads, rows.shape[1], nb, block).sum(
                dim=(1, 3), dtype=torch.int32
            )
        return out

    def to_json(self) -> dict:
        return {"name": self.name, "seqlen": self.seqlen, "params": self.params}


def check_mask(name: str, seqlen: int, cfg: dict):
    """Raise ValueError naming the problem when `name` cannot be built at `seqlen` with `cfg`."""
    pattern(name).check(seqlen, cfg)


def sample_mask(name, seqlen, cfg, rng, histograms=None, heads_q=1, heads_kv=1) -> Mask:
    """Draw one realised mask from the seeded numpy Generator `rng`."""
    pat = pattern(name)
    if seqlen < 1:
        raise ValueError(f"seqlen must be >= 1, got {seqlen}")
    if is_sparse(name):
        params = pat.sample(seqlen, cfg, rng, heads_q, heads_kv)
    else:
        pat.check(seqlen, cfg)
        if pat.uses_documents and not histograms:
            raise ValueError(f"mask {name!r} needs document-length histograms")
        params = pat.sample(seqlen, cfg, rng, histograms)
    return Mask(name, seqlen, params, heads_q=heads_q)
