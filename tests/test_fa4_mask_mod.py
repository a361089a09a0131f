"""FA4 mask_mods (kernels/fa4_mask_mod.py) on the CPU: each is its mask's predicate, exactly, on
the full index grid; the aux tensors cover the padded tiles the kernel reads; the block-sparse
lists partition the visible tiles as FA4 expects."""

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.kernels import fa4_mask_mod as F

CFG = dict(window=9, block=8)
LENGTHS = (1, 7, 64, 130, 256, 300)


def sampled_masks(name, histograms, seeds=range(4)):
    """Every length the mask's parameters allow (block_causal_document: multiples of the block)."""
    for s in LENGTHS:
        for seed in seeds:
            try:
                yield M.sample_mask(name, s, CFG, np.random.default_rng(seed), histograms)
            except ValueError:
                assert name == "block_causal_document" and s % CFG["block"]
                break


def test_every_irregular_static_mask_has_a_mask_mod():
    assert set(F.MASK_MODS) == set(M.STATIC_MASKS) - set(M.REGULAR_MASKS)


@pytest.mark.parametrize("name", sorted(F.MASK_MODS))
def test_mask_mod_is_the_predicate(name, histograms):
    n = 0
    for m in sampled_masks(name, histograms):
        spec = F.mask_mod_for(m)
        s, end = m.seqlen, m.seqlen + F.PAD
        assert all(t.dtype == torch.int32 and t.shape == (end,) for t in spec.aux_tensors)
        assert all(type(v) is int for v in spec.aux_scalars)
        # the whole padded grid: an aux read past its end would raise here
        got = spec.visible(torch.arange(end).view(-1, 1), torch.arange(end).view(1, -1))
        assert got.shape == (end, end) and got.dtype == torch.bool
        assert torch.equal(got[:s, :s], m.dense()), (name, s, m.params)
        n += 1
    assert n >= 8  # block_causal_document: 2 lengths x 4 seeds


def test_a_wrong_mask_mod_is_caught(histograms):
    """The comparison can fail: causal_blockwise with the last document's start one token late."""
    for seed in range(20):  # a sample of more than one document
        m = M.sample_mask("causal_blockwise", 130, CFG, np.random.default_rng(seed), histograms)
        if len(m.doc_lengths) > 1:
            break
    spec = F.mask_mod_for(m)
    late = F.Fa4MaskMod(spec.mask_mod, spec.aux_tensors, (spec.aux_scalars[0] + 1,))
    q, k = torch.arange(130).view(-1, 1), torch.arange(130).view(1, -1)
    assert torch.equal(spec.visible(q, k), m.dense())
    assert not torch.equal(late.visible(q, k), m.dense())


def test_numpy_indices(histograms):
    m = M.sample_mask("prefix_lm_document", 64, CFG, np.random.default_rng(1), histograms)
    spec = F.mask_mod_for(m)
    aux = tuple(t.numpy() for t in spec.aux_tensors)
    got = F.Fa4MaskMod(spec.mask_mod, aux, spec.aux_scalars).visible(
        np.arange(64)[:, None], np.arange(64)[None, :]
    )
    assert np.array_equal(got, m.dense().numpy())


def test_compile_hash_is_set_and_distinct():
    hashes = {f.__cute_hash__ for f in F.MASK_MODS.values()}
    assert len(hashes) == len(F.MASK_MODS)


def _from_lists(count, index, rows, cols):
    out = torch.zeros(rows, cols, dtype=torch.bool)
    for r in range(rows):
        c = int(count[0, 0, r])
        idx = index[0, 0, r, :c].long()
        assert torch.all(idx[1:] > idx[:-1])  # ascending: FA4 takes the last as the sequence end
        out[r, idx] = True
    return out


@pytest.mark.parametrize("name", sorted(F.MASK_MODS))
def test_block_sparse_lists_partition_the_tiles(name, histograms):
    tile = 16
    for m in sampled_masks(name, histograms, seeds=range(2)):
        nb = -(-m.seqlen // tile)
        d = torch.nn.functional.pad(m.dense(), (0, nb * tile - m.seqlen, 0, nb * tile - m.seqlen))
        seen = d.view(nb, tile, nb, tile).sum(dim=(1, 3))
        fwd, bwd = F.block_sparse_tensors(m, "cpu", tile)
        for fields, want in ((fwd, seen), (bwd, seen.T)):
            assert fields["mask_block_idx"].shape == (1, 1, nb, nb)
            assert all(t.dtype == torch.int32 for t in fields.values())
            part = _from_lists(fields["mask_block_cnt"], fields["mask_block_idx"], nb, nb)
            full = _from_lists(fields["full_block_cnt"], fields["full_block_idx"], nb, nb)
            assert torch.equal(full, want == tile * tile)
            assert torch.equal(part, (want > 0) & (want < tile * tile))


def test_fa4_takes_every_static_mask_in_exactly_one_form(histograms):
    """The adapter's choice: the native form where the mask has one, else its mask_mod."""
    from attnbench.kernels.catalog import get

    assert set(get("fa4").masks) == set(M.STATIC_MASKS)
    for name in M.STATIC_MASKS:
        for m in sampled_masks(name, histograms, seeds=range(2)):
            assert (m.native_form() is not None) != (name in F.MASK_MODS), name


def test_mask_mod_keywords_carry_both_directions_tile_lists(histograms, monkeypatch):
    import sys
    import types
    from collections import namedtuple

    # the CuTe DSL (GPU only) makes the scalars run-time Int32 values; here they stay ints
    monkeypatch.setitem(sys.modules, "cutlass", types.SimpleNamespace(Int32=int))

    from attnbench.kernels.flash_attn import mask_mod_kwargs

    # FA4's BlockSparseTensorsTorch takes these fields by name (flash-attn-4 4.0.0b36)
    fields = ("mask_block_cnt", "mask_block_idx", "full_block_cnt", "full_block_idx", "block_size")
    tensors = namedtuple("BlockSparseTensorsTorch", fields)
    for name in F.MASK_MODS:
        m = max(sampled_masks(name, histograms, seeds=[0]), key=lambda m: m.seqlen)
        kw = mask_mod_kwargs(m, "cpu", tensors)
        assert kw["causal"] is False and "window_size" not in kw
        assert kw["mask_mod"] is F.MASK_MODS[name]
        assert kw["aux_scalars"] == (tuple(F.mask_mod_for(m).aux_scalars) or None)
        tiles = -(-m.seqlen // F.TILE)
        for key in ("block_sparse_tensors", "block_sparse_tensors_bwd"):
            t = kw[key]
            assert t.block_size == (F.TILE, F.TILE)
            assert t.mask_block_cnt.shape == (1, 1, tiles) and t.mask_block_idx.shape == (
                1,
                1,
                tiles,
                tiles,
            )
        fwd, bwd = kw["block_sparse_tensors"], kw["block_sparse_tensors_bwd"]
        # every visible tile is listed once, in the forward by query tile, in the backward by key tile
        assert int(fwd.mask_block_cnt.sum() + fwd.full_block_cnt.sum()) == int(
            bwd.mask_block_cnt.sum() + bwd.full_block_cnt.sum()
        )
