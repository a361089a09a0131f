"""FlashAttention-4 runs a static mask with no causal/window/varlen form (share_question,
causal_blockwise, prefix_lm_causal, prefix_lm_document, global_sliding_window and
block_causal_document) as a `mask_mod`. Each mask's mask_mod lives with its pattern
(masks/patterns/: Pattern.fa4_mask_mod, a masks.MaskMod); this module makes FA4's arguments
from it: the aux tensors over the padded length, the run-time scalars, the compile hash and the
tile lists. The fa4 adapter (flash_attn.py) uses it for those masks and keeps the native form for
the others.

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
  where set (set below from the text of this file and of masks/patterns/, so an edit to either
  also invalidates FA4's disk cache).
- Without block_sparse_tensors, every tile is computed and masked (the cost of full attention).
  With them, empty tiles are skipped and full ones are not masked. `block_sparse_tensors()` builds
  them from the mask's own tile counts.

Each mask_mod is plain arithmetic (<, <=, ==, !=, &, |, +, -) on the indices, on Python-int or
Int32 scalars, and on aux entries read through masks/patterns/base.py's `at`. So the same function evaluates on the CPU
with torch/numpy integer index arrays (see `Fa4MaskMod.visible`). On the GPU, the DSL 4.8.1
TensorSSA defines these operators and broadcasts a Python int or Int32 scalar operand
(cutlass/cute/tensor.py, TensorSSA._apply_op). `at` reads an aux entry the way FA4's own tests
do: `scalar_to_ssa(aux[idx[0]], Int32)`.

On the H200 (2026-12-03, flash-attn-4 4.0.0b36, DSL 4.8.1): the DSL traces these plain functions
and the Int32 aux_scalars work in the forward and the backward; every mask here passes the float64
GPU test (GQA 8:2 and MHA at 1K, GQA at 1,000 tokens: the last tile cut by the sequence end).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from ..masks import FA4_MASK_MOD_MASKS, STATIC_PATTERNS, patterns

# The aux tensors cover indices up to S + PAD - 1. In the forward, a tile run without
# sequence-length masking still calls the mask_mod for the rows >= S of the last query tile
# (tile_m <= 192 on SM90). Those reads come before the rows are dropped
PAD = 256


# Each mask's mask_mod function (its pattern's fa4_mod), by mask name
MASK_MODS = {name: STATIC_PATTERNS[name].fa4_mod for name in FA4_MASK_MOD_MASKS}

# FA4 keys its compile caches (in memory and on disk) by this value where it is set. Otherwise the
# key would be the mask_mod's source alone, which misses a change to `at` (masks/patterns/base.py) or to
# how the arguments are made here
_PATTERN_FILES = sorted(Path(patterns.__file__).parent.glob("*.py"))
_FILE_HASH = hashlib.sha256(
    b"".join(p.read_bytes() for p in _PATTERN_FILES) + Path(__file__).read_bytes()
).hexdigest()[:16]
for _name, _f in MASK_MODS.items():
    _f.__cute_hash__ = f"attnbench.fa4_mask_mod.{_name}.{_FILE_HASH}"


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
    """The FA4 mask_mod, aux tensors and scalars that compute `mask` (its pattern's MaskMod)."""
    form = mask.fa4_mask_mod()
    if form is None:
        raise ValueError(f"no FA4 mask_mod for {mask.name!r}; have {', '.join(MASK_MODS)}")
    tensors = ()
    if form.aux is not None:
        doc, pos = _documents(mask.doc_lengths or [mask.seqlen], mask.seqlen)
        tensors = tuple(
            t.to(device=device, dtype=torch.int32).contiguous() for t in form.aux(doc, pos)
        )
    return Fa4MaskMod(form.fn, tensors, tuple(int(v) for v in form.scalars))


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
