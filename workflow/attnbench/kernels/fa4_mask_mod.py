"""FlashAttention-4 `mask_mod` forms of the six static masks that FA4's causal/window/varlen form
cannot express: share_question, causal_blockwise, prefix_lm_causal, prefix_lm_document,
global_sliding_window and block_causal_document. The fa4 adapter (flash_attn.py) calls them for
those masks and keeps the native form for the other six.

What flash-attn-4 4.0.0b36 takes (read from its sources, flash_attn/cute/):
- `flash_attn_func(q, k, v, ..., mask_mod=, aux_tensors=, aux_scalars=, block_sparse_tensors=,
  block_sparse_tensors_bwd=)`. `flash_attn_varlen_func` takes block_sparse_tensors for its forward
  only: its backward runs without them, and `_flash_attn_bwd` refuses varlen with block sparsity.
  With a mask_mod, FA4 drops causal/window in the forward but not in the backward, so pass
  causal=False and no window.
- mask_mod(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors[, aux_scalars]) -> bool, called
  once per score (SM90 allows no `__vec_size__`). The indices are one-element Int32 TensorSSAs,
  local to the sequence. aux_tensors are the caller's tensors as cute.Tensors in global memory.
  aux_scalars are run-time Int32 values, so a new parameter value does not recompile.
- The compile key holds the mask_mod's hash: its source and closure values, or `__cute_hash__`
  where set (set below from this file's text, so an edit here also invalidates FA4's disk cache).
- Without block_sparse_tensors, every tile is computed and masked (the cost of full attention).
  With them, empty tiles are skipped and full ones are not masked. `block_sparse_tensors()` builds
  them from the mask's own tile counts.

Each mask_mod is plain arithmetic (<, <=, ==, !=, &, |, +, -) on the indices, on Python-int or
Int32 scalars, and on aux entries read through `_at`. So the same function evaluates on the CPU
with torch/numpy integer index arrays (see `Fa4MaskMod.visible`). On the GPU, the DSL 4.8.1
TensorSSA defines these operators and broadcasts a Python int or Int32 scalar operand
(cutlass/cute/tensor.py, TensorSSA._apply_op). `_at` reads an aux entry the way FA4's own tests
do: `scalar_to_ssa(aux[idx[0]], Int32)`.

On the H200 (2026-12-03, flash-attn-4 4.0.0b36, DSL 4.8.1): the DSL traces these plain functions
and the Int32 aux_scalars work in the forward and the backward; every mask here passes the float64
GPU test (GQA 8:2 and MHA at 1K, GQA at 1,000 tokens: the last tile cut by the sequence end).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# The aux tensors cover indices up to S + PAD - 1. In the forward, a tile run without
# sequence-length masking still calls the mask_mod for the rows >= S of the last query tile
# (tile_m <= 192 on SM90). Those reads come before the rows are dropped
PAD = 256


def _at(aux, idx):
    """aux[idx]: elementwise for CPU index arrays. In the CuTe DSL, idx is a one-element TensorSSA
    and aux a cute.Tensor, read as a scalar and made a TensorSSA again."""
    if isinstance(idx, (torch.Tensor, np.ndarray)):
        return aux[idx]
    import cutlass
    from flash_attn.cute import utils

    return utils.scalar_to_ssa(aux[idx[0]], cutlass.Int32)


# Every mask_mod keeps the index (a TensorSSA on the GPU) on the left of each operator, so that
# TensorSSA's own operators handle the scalar operand.


def share_question(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars=None):
    """(doc(j) == 0 and doc(i) != 0) or (doc(i) == doc(j) and j <= i)"""
    dq, dk = _at(aux_tensors[0], q), _at(aux_tensors[0], kv)
    return ((dk == 0) & (dq != 0)) | ((dq == dk) & (kv <= q))


def causal_blockwise(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """(doc(i) == n-1 and j < c) or (doc(i) == doc(j) and j <= i), where c is the last
    document's start. doc(i) == n-1 is i >= c for i < S."""
    c = aux_scalars[0]
    same = _at(aux_tensors[0], q) == _at(aux_tensors[0], kv)
    return ((q >= c) & (kv < c)) | (same & (kv <= q))


def prefix_lm_causal(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """j < P or j <= i"""
    return (kv < aux_scalars[0]) | (kv <= q)


def prefix_lm_document(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """doc(i) == doc(j) and (pos(j) < P or j <= i). pos(j) < len(doc), so pos(j) < P is
    pos(j) < min(P, len(doc))."""
    doc, pos = aux_tensors
    return (_at(doc, q) == _at(doc, kv)) & ((_at(pos, kv) < aux_scalars[0]) | (kv <= q))


def global_sliding_window(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars):
    """|i - j| <= w or i < g or j < g"""
    w, g = aux_scalars
    return ((q - kv <= w) & (kv - q <= w)) | (q < g) | (kv < g)


def block_causal_document(b, h, q, kv, seqlen_info, aux_tensors, aux_scalars=None):
    """doc(i) == doc(j) and blk(j) <= blk(i), where blk = pos // b. It is precomputed, so the
    kernel needs no division."""
    doc, blk = aux_tensors
    return (_at(doc, q) == _at(doc, kv)) & (_at(blk, kv) <= _at(blk, q))


MASK_MODS = {
    f.__name__: f
    for f in (
        share_question,
        causal_blockwise,
        prefix_lm_causal,
        prefix_lm_document,
        global_sliding_window,
        block_causal_document,
    )
}

# FA4 keys its compile caches (in memory and on disk) by this value where it is set. Otherwise the
# key would be the mask_mod's source alone, which misses a change to `_at`
_FILE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
for _f in MASK_MODS.values():
    _f.__cute_hash__ = f"attnbench.fa4_mask_mod.{_f.__name__}.{_FILE_HASH}"


@dataclass(frozen=True)
class Fa4MaskMod:
    mask_mod: object  # one of MASK_MODS
    aux_tensors: tuple  # int32 tensors of S + PAD entries; may be empty
    aux_scalars: tuple  # Python ints; may be empty

    def fa4_kwargs(self) -> dict:
        """FA4's keywords (on the GPU: imports cutlass, whose Int32 makes the scalars run-time
        values, as in FA4's tests)."""
        import cutlass

        return {
            "mask_mod": self.mask_mod,
            "aux_tensors": list(self.aux_tensors) or None,
            "aux_scalars": tuple(cutlass.Int32(v) for v in self.aux_scalars) or None,
        }

    def visible(self, q, kv):
        """The mask_mod on CPU index arrays (broadcastable, below S + PAD)."""
        scalars = self.aux_scalars or None
        return self.mask_mod(None, None, q, kv, None, list(self.aux_tensors), scalars)


def _documents(doc_lengths, seqlen):
    """doc(i) and pos(i) = i - start(doc(i)) for i < S + PAD (the padding: one more document)."""
    if sum(doc_lengths) != seqlen:
        raise ValueError(f"document lengths sum to {sum(doc_lengths)}, not the length {seqlen}")
    lengths = torch.tensor([*doc_lengths, PAD])
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    pos = torch.arange(len(doc)) - (torch.cumsum(lengths, 0) - lengths)[doc]
    return doc, pos


def mask_mod_for(mask, device="cpu") -> Fa4MaskMod:
    """The FA4 mask_mod, aux tensors and scalars that compute `mask` (one of MASK_MODS)."""
    if mask.name not in MASK_MODS:
        raise ValueError(f"no FA4 mask_mod for {mask.name!r}; have {', '.join(MASK_MODS)}")
    p, s = mask.params, mask.seqlen
    tensors, scalars = (), ()
    if "doc_lengths" in p:
        doc, pos = _documents(p["doc_lengths"], s)
    if mask.name == "share_question":
        tensors = (doc,)
    elif mask.name == "causal_blockwise":
        tensors, scalars = (doc,), (s - p["doc_lengths"][-1],)
    elif mask.name == "prefix_lm_causal":
        scalars = (p["prefix"],)
    elif mask.name == "prefix_lm_document":
        tensors, scalars = (doc, pos), (p["prefix"],)
    elif mask.name == "global_sliding_window":
        scalars = (p["window"], p["global_tokens"])
    elif mask.name == "block_causal_document":
        tensors = (doc, torch.div(pos, p["block"], rounding_mode="floor"))
    tensors = tuple(t.to(device=device, dtype=torch.int32).contiguous() for t in tensors)
    return Fa4MaskMod(MASK_MODS[mask.name], tensors, tuple(int(v) for v in scalars))


def _lists(select):
    """Bool [rows, n] -> FA4's (count [1, 1, rows], indices [1, 1, rows, n]): the selected columns
    first, ascending. FA4 takes the highest as the sequence-end tile."""
    count = select.sum(-1, dtype=torch.int32)
    order = torch.argsort((~select).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return count[None, None].contiguous(), order[None, None].contiguous()


# The sparse block, in tokens, of the tile lists: FA4's SM90 tiles at head dim <= 128 (below)
TILE = 128


def block_sparse_tensors(mask, device, tile=TILE) -> tuple[dict, dict]:
    """(forward, backward) fields of FA4's BlockSparseTensorsTorch for `tile` x `tile` tiles. The
    forward has each query tile's key tiles; the backward has each key tile's query tiles.

    A tile is full when all its pairs are visible, partial (masked by the mask_mod) when some are.
    A tile cut by the sequence end is never full. They are built from mask.block_counts, never
    S x S.
    128 fits FA4's SM90 tiles at head dim <= 128: forward 128 x 128, backward 64 or 128 rows x 128
    (a 128-row sparse block is two 64-row tiles)."""
    counts = mask.block_counts(tile, device)[0]  # [query tiles, key tiles]
    full = counts == tile * tile
    partial = (counts > 0) & ~full

    def fields(part, whole):
        mc, mi = _lists(part)
        fc, fi = _lists(whole)
        return {
            "mask_block_cnt": mc,
            "mask_block_idx": mi,
            "full_block_cnt": fc,
            "full_block_idx": fi,
        }

    return fields(partial, full), fields(partial.T, full.T)
