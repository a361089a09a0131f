"""FlexAttention, compiled, with a BlockMask built from the mask's own forms.

Called as FlexAttention's documentation and its authors' benchmark (attention-gym's
examples/benchmark.py) call it: `torch.compile(flex_attention, dynamic=False)`, a BlockMask of
128 x 128 tiles (flex's default block size) built once per draw in `prepare` and reused by every
call of that draw, and the default kernel options (no max-autotune).

The BlockMask is never made from an S x S matrix: static masks classify tiles from the
predicate one row of tiles at a time; uniform block-sparse masks pass their kept block
indices directly (O(blocks)); variable block-sparse masks count each tile's visible pairs
from the block boundaries and kept blocks (O(tiles x blocks)). The mask_mod, applied in partial
tiles, is each mask's fastest correct form (flex_forms.py: the document masks on global positions,
`doc[q] == doc[kv]` plus the causal/prefix/block term); the record's notes name it
(`flex_mask_mod`).

The CP local kernel `flex` (FlexLocal, local_kernel.py's protocol) builds its BlockMask from a
chunk's rectangles instead, returns the LSE, and runs its backward by recomputation.
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from ..record.status import Unsupported
from .base import Kernel, bhsd_view, to_thd
from .flex_forms import mask_mod_for
from .local_kernel import LocalKernel, RecomputeBackward

# flex's default BLOCK_SIZE (_DEFAULT_SPARSE_BLOCK_SIZE), what its docs and benchmarks use
TILE = 128


def _compile_failing_past(recompile_limit: int):
    """flex_attention compiled once per shape and mask_mod closure. Past the recompile limit
    Dynamo would run flex eagerly (a different computation): fail instead."""
    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, recompile_limit
    )
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def compiled_flex():
    # A heterogeneous mask compiles once per draw, and 10 draws passed Dynamo's default limit of
    # 8 (causal_blockwise, h200_paired).
    return _compile_failing_past(64)


def _indices(select):
    """Bool [..., n] -> (count [...], indices [..., n]) with the selected columns first, in order."""
    num = select.sum(-1, dtype=torch.int32)
    order = torch.argsort((~select).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, order


def block_mask_from_counts(mask, tile, device, counts=None, mask_mod=None) -> BlockMask:
    """Tiles with every pair visible are 'full' (no mask_mod call); partly visible ones are partial.
    A tile cut by the sequence end is partial, as in create_block_mask (flex masks the overhang).
    `mask_mod` (default: the mask's predicate) must say the same mask: it runs in partial tiles."""
    s = mask.seqlen
    counts = mask.block_counts(tile, device) if counts is None else counts  # [H or 1, nb, nb]
    full = counts == tile * tile
    partial = (counts > 0) & ~full
    pn, pi = _indices(partial)
    fn, fi = _indices(full)
    return BlockMask.from_kv_blocks(
        pn[None],
        pi[None],
        fn[None],
        fi[None],
        BLOCK_SIZE=tile,
        mask_mod=mask.mask_mod(device) if mask_mod is None else mask_mod,
        seq_lengths=(s, s),
    )


def block_mask_from_layout_tiles(mask, tile, device) -> BlockMask:
    """Block-sparse masks on `tile`-sized tiles: tile counts from the layout's block boundaries and
    kept blocks (never the predicate over S x S); tiles the kept blocks cover entirely are full,
    the others partial (the mask_mod masks them exactly)."""
    lay = mask.layout()
    per = mask.heads_q // lay.groups
    counts = lay.tile_counts(tile, mask.seqlen, device).repeat_interleave(
        per, dim=0
    )  # [Hq, nt, nt]
    return block_mask_from_counts(mask, tile, device, counts)


def block_mask_from_layout(mask, device) -> BlockMask:
    """Uniform block-sparse: the kept block indices are the BlockMask (all tiles full)."""
    lay = mask.layout()
    per = mask.heads_q // lay.groups
    idx = lay.kv_indices.to(device=device, dtype=torch.int32).repeat_interleave(
        per, dim=0
    )  # [Hq, nb, k]
    num = torch.full(idx.shape[:-1], idx.shape[-1], dtype=torch.int32, device=device)
    nb = lay.keep.shape[-1]
    pad = torch.zeros(*idx.shape[:-1], nb - idx.shape[-1], dtype=torch.int32, device=device)
    full_idx = torch.cat([idx, pad], dim=-1)
    empty = torch.zeros_like(num)
    return BlockMask.from_kv_blocks(
        empty[None],
        torch.zeros_like(full_idx)[None],
        num[None],
        full_idx[None],
        BLOCK_SIZE=mask.params["block_size"],
        mask_mod=mask.mask_mod(device),
        seq_lengths=(mask.seqlen, mask.seqlen),
    )


class Flex(Kernel):
    layout = "bhsd"
    # The mask_mod form to run (flex_forms.FORMS); None: each mask's chosen one (flex_forms.CHOSEN).
    # Benchmarks set it to time another form on the same BlockMask.
    mask_mod_form: str | None = None

    @classmethod
    def preload(cls):
        import torch._inductor.compile_fx  # noqa: F401 - torch.compile's backend, imported at the first call

    def build_block_mask(self, mask) -> BlockMask:
        if mask.name == "block_sparse":
            # Blocks smaller than 128 tokens run as 128-token tiles, masked exactly (the kernel's
            # notes in every record). CUDA: torch's default Hopper flex tiles are 128 x 64 (fwd) and
            # 64/128 (bwd); without max-autotune no backward config divides a 64-token block.
            # CPU: inductor's C++ flex kernel (torch 2.13) walks the BlockMask in BLOCK_SIZE steps
            # and is wrong when compiled for AVX2 at some small block sizes (8 and 24 with head dim
            # <= 16: NaN or relative error ~1-3 on every row; AVX-512 is right), so it only ever gets
            # 128-token tiles (tests/test_flex_isa.py).
            if mask.params["block_size"] % TILE == 0:
                return block_mask_from_layout(mask, self.device)
            return block_mask_from_layout_tiles(mask, TILE, self.device)
        if mask.name == "variable_block_sparse":
            return block_mask_from_layout_tiles(mask, TILE, self.device)
        mask_mod, form = mask_mod_for(mask, self.device, self.mask_mod_form)
        self.load_notes["flex_mask_mod"] = form.note()
        return block_mask_from_counts(mask, TILE, self.device, mask_mod=mask_mod)

    def prepare(self, mask):
        # once per draw: every timed call of the draw reuses this BlockMask (and its mask_mod)
        block_mask = self.build_block_mask(mask)
        flex = compiled_flex()
        kwargs = {"enable_gqa": True} if self.gqa else {}
        return lambda q, k, v: flex(q, k, v, block_mask=block_mask, **kwargs)


# ---------------------------------------------------------------- the CP local kernel


@functools.cache
def compiled_flex_local():
    # A few compilations per ring (chunk shapes, mask_mod closures): room for a long ring.
    return _compile_failing_past(256)


class FlexLocal(RecomputeBackward, LocalKernel):
    """FlexAttention with the LSE; the BlockMask comes from the chunk's rectangles (segment ids
    per row, causal offset per row). Compiled on GPU; eager on CPU (forward only there)."""

    def _block_mask(self, chunk, device):
        cache = chunk.__dict__.setdefault("_flex", {})
        if str(device) in cache:
            return cache[str(device)]
        from torch.nn.attention.flex_attention import create_block_mask

        q_seg = torch.full((chunk.ql,), -1, dtype=torch.int32, device=device)
        k_seg = torch.full((chunk.kl,), -2, dtype=torch.int32, device=device)
        q_off = torch.zeros(chunk.ql, dtype=torch.int32, device=device)
        k_off = torch.zeros(chunk.kl, dtype=torch.int32, device=device)
        for i, s in enumerate(chunk.segments):
            q_seg[s.q0 : s.q1] = i
            k_seg[s.k0 : s.k1] = i
            q_off[s.q0 : s.q1] = torch.arange(s.ql, device=device, dtype=torch.int32) + (
                s.kl - s.ql
            )
            k_off[s.k0 : s.k1] = torch.arange(s.kl, device=device, dtype=torch.int32)
        causal = chunk.causal

        def mask_mod(b, h, qi, ki):
            same = q_seg[qi] == k_seg[ki]
            return same & (k_off[ki] <= q_off[qi]) if causal else same

        bm = create_block_mask(mask_mod, None, None, chunk.ql, chunk.kl, device=device)
        cache[str(device)] = bm
        return bm

    def differentiable_forward(self, q, k, v, chunk):
        from torch.nn.attention.flex_attention import flex_attention

        fn = compiled_flex_local() if q.device.type == "cuda" else flex_attention
        out, lse = fn(
            bhsd_view(q),
            bhsd_view(k),
            bhsd_view(v),
            block_mask=self._block_mask(chunk, q.device),
            scale=self.scale,
            enable_gqa=q.shape[1] != k.shape[1],
            return_lse=True,
        )
        lse = lse[0].to(self.acc).masked_fill(~chunk.rows_with_keys(q.device), float("-inf"))
        return to_thd(out, "bhsd"), lse

    def _forward(self, q, k, v, chunk):
        with torch.no_grad():
            return self.differentiable_forward(q, k, v, chunk)

    def _backward(self, dout, q, k, v, out, lse, chunk):
        if q.device.type != "cuda":
            raise Unsupported("FlexAttention has no backward on CPU")
        return RecomputeBackward._backward(self, dout, q, k, v, out, lse, chunk)
