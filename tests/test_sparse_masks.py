"""Block-sparse masks: exact area from the kept blocks, FLOPs from it, realised density, exact
rebuild from the seed, and the O(blocks) forms (tile counts, transposed lists, Flex BlockMask)."""

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.families.kernel import cell as C
from attnbench.grid.spec import CellSpec
from attnbench.harness.flops import attention_flops

HQ, HKV = 4, 2
CFGS = {
    "block_sparse": [
        dict(block_size=16, density=0.5),
        dict(block_size=32, density=0.3),
        dict(block_size=16, density=0.8, granularity="head"),
    ],
    "variable_block_sparse": [
        dict(avg_block=32, min_block=16, density=0.5),
        dict(avg_block=48, min_block=16, density=0.3, granularity="head"),
    ],
}


def masks(name, lengths=(96, 160, 256), seeds=range(4)):
    for cfg in CFGS[name]:
        for s in lengths:
            for seed in seeds:
                try:
                    yield M.sample_mask(
                        name, s, cfg, np.random.default_rng(seed), heads_q=HQ, heads_kv=HKV
                    )
                except ValueError:
                    assert name == "block_sparse" and s % cfg["block_size"]


@pytest.mark.parametrize("name", M.SPARSE_MASKS)
def test_realised_area_is_the_dense_count_and_flops_use_it(name):
    n = 0
    for m in masks(name):
        dense = m.dense()  # [Hq, S, S] from the predicate
        per_head = [int(dense[h].sum()) for h in range(HQ)]
        assert m.area_per_head == per_head
        lay = m.layout()
        assert int(lay.area_per_group().sum()) * (HQ // lay.groups) == int(dense.sum())
        p = m.params
        assert p["kept_blocks"] == int(lay.keep.sum()) and p["total_blocks"] == lay.keep.numel()
        assert p["realised_density"] == pytest.approx(p["kept_blocks"] / p["total_blocks"])
        if name == "block_sparse":  # equal blocks: the realised density is the visible fraction
            assert p["realised_density"] == pytest.approx(dense.sum().item() / (HQ * m.seqlen**2))
        assert attention_flops(sum(m.area_per_head), 64, "fwd") == 4 * int(dense.sum()) * 64
        n += 1
    assert n >= 20


def test_flops_are_from_kept_blocks_not_nominal_density():
    # 160 / 32 = 5 key blocks: density 0.5 keeps floor(2.5) = 2 of them, a realised 0.4.
    m = M.sample_mask(
        "block_sparse",
        160,
        dict(block_size=32, density=0.5),
        np.random.default_rng(0),
        None,
        HQ,
        HKV,
    )
    assert m.params["realised_density"] == pytest.approx(0.4)
    assert m.area == 5 * 2 * 32 * 32 != 0.5 * 160**2


def test_cell_record_flops_and_realised_density(repo):
    from attnbench.families import expand_grid, load_config

    cells = expand_grid(load_config(repo / "config.yaml"), "smoke_sparse")
    spec = next(c for c in cells if c["impl"] == "naive" and c["mask"] == "variable_block_sparse")
    r = C.run_cell(CellSpec.from_dict(spec))
    assert r["status"] == "ok", r["status_reason"]
    for s in r["samples"]:
        m = M.Mask(spec["mask"], spec["seqlen"], s["mask_params"])
        assert s["flops"] == 4 * int(m.dense().sum()) * spec["head_dim"]
        assert s["mask_params"]["realised_density"] == m.params["realised_density"]


@pytest.mark.parametrize("name", M.SPARSE_MASKS)
def test_rebuilding_from_the_recorded_params_is_exact(name):
    for m in masks(name, lengths=(128,), seeds=range(3)):
        params = dict(m.params)
        rebuilt = M.Mask(name, m.seqlen, params)  # what a reader of the record does
        assert rebuilt.layout().fingerprint() == params["layout_sha256"]
        assert torch.equal(rebuilt.dense(), m.dense())
        rebuilt.pattern.verify(m.seqlen, params)
        with pytest.raises(ValueError, match="rebuilds layout"):
            rebuilt.pattern.verify(m.seqlen, {**params, "seed": params["seed"] + 1})


def test_same_seed_same_blocks_other_seed_other_blocks():
    cfg = dict(block_size=16, density=0.5)
    a, b, c = (
        M.sample_mask("block_sparse", 256, cfg, np.random.default_rng(s), None, HQ, HKV)
        for s in (7, 7, 8)
    )
    assert a.params == b.params and a.params["layout_sha256"] != c.params["layout_sha256"]


def test_layouts_are_kept_for_the_next_cell_and_the_oldest_go_first(monkeypatch):
    """A warm worker meets the same layout in every kernel and direction of a grid point: it is
    generated once, then served from memory, least recently used out first beyond the budget."""
    from attnbench.masks import sparse as SP

    monkeypatch.setattr(SP, "_LAYOUTS", SP.OrderedDict())
    calls = []
    generate = SP.BlockSparse.generate
    monkeypatch.setattr(
        SP.BlockSparse,
        "generate",
        staticmethod(lambda s, p: calls.append(p["seed"]) or generate(s, p)),
    )
    params = [dict(block_size=16, density=0.5, groups=2, seed=s) for s in (1, 2, 3)]
    one = SP.SPARSE_PATTERNS["block_sparse"].layout(256, params[0]).nbytes
    monkeypatch.setattr(SP, "LAYOUT_CACHE_BYTES", 2 * one)  # room for two
    pattern = SP.SPARSE_PATTERNS["block_sparse"]
    first = pattern.layout(256, params[0])
    assert pattern.layout(256, params[0]) is first and calls == [1]
    pattern.layout(256, params[1])
    pattern.layout(256, params[0])  # now the most recent
    pattern.layout(256, params[2])  # evicts seed 2, the least recent
    assert calls == [1, 2, 3]
    assert pattern.layout(256, params[0]) is first and calls == [1, 2, 3]
    fresh = generate(256, params[1])
    assert pattern.layout(256, params[1]).fingerprint() == fresh.fingerprint()
    assert calls == [1, 2, 3, 2]
    assert fresh.fingerprint() == fresh._hash()  # the kept hash is the hash


@pytest.mark.parametrize("name", M.SPARSE_MASKS)
def test_tile_counts_from_the_layout_equal_the_predicate(name):
    for m in masks(name, lengths=(96, 160), seeds=range(2)):
        lay = m.layout()
        for tile in (8, 16, 24, 64, 128):
            counts = lay.tile_counts(tile, m.seqlen).repeat_interleave(HQ // lay.groups, dim=0)
            assert torch.equal(counts, m.block_counts(tile)), (m.params, tile)


@pytest.mark.parametrize("name", M.SPARSE_MASKS)
def test_key_block_lists_are_the_transpose(name):
    for m in masks(name, lengths=(160,), seeds=range(2)):
        lay = m.layout()
        offsets, rows = lay.key_block_lists()
        g, nrb, ncb = lay.keep.shape
        assert offsets[-1] == lay.keep.sum() == rows.numel()  # O(kept blocks)
        back = torch.zeros_like(lay.keep)
        for i in range(g * ncb):
            r = rows[offsets[i] : offsets[i + 1]]
            assert (r.diff() > 0).all()
            back[i // ncb, r, i % ncb] = True
        assert torch.equal(back, lay.keep)


@pytest.mark.parametrize("name", M.SPARSE_MASKS)
def test_flex_block_masks_equal_flex_own_builder(name):
    """Our BlockMasks (from indices, or from tile counts) match create_block_mask over the mask_mod,
    including which tiles are full (those skip the mask_mod, so they must really be full)."""
    from attnbench.kernels.flex import block_mask_from_layout, block_mask_from_layout_tiles
    from torch.nn.attention.flex_attention import create_block_mask

    for m in masks(name, lengths=(128, 256), seeds=range(2)):
        theirs128 = create_block_mask(
            m.mask_mod(), 1, HQ, m.seqlen, m.seqlen, device="cpu", BLOCK_SIZE=128, _compile=False
        )
        ours = block_mask_from_layout_tiles(m, 128, "cpu")
        assert torch.equal(ours.to_dense(), theirs128.to_dense())
        assert torch.equal(ours.full_kv_num_blocks, theirs128.full_kv_num_blocks)
        if name == "block_sparse":
            b = m.params["block_size"]
            theirs = create_block_mask(
                m.mask_mod(), 1, HQ, m.seqlen, m.seqlen, device="cpu", BLOCK_SIZE=b, _compile=False
            )
            ours = block_mask_from_layout(m, "cpu")
            assert torch.equal(ours.to_dense(), theirs.to_dense())
            assert torch.equal(ours.full_kv_num_blocks, theirs.full_kv_num_blocks)


def test_variable_blocks_with_per_head_partitions():
    m = M.sample_mask(
        "variable_block_sparse",
        512,
        dict(avg_block=64, min_block=32, density=0.5, granularity="head"),
        np.random.default_rng(3),
        heads_q=4,
        heads_kv=1,
    )
    lay = m.layout()
    assert lay.groups == 4
    assert len({tuple(b) for b in lay.row_bounds.tolist()}) == 4  # each head its own partition
    assert (lay.row_bounds.diff(dim=1) >= 32).all() and (lay.col_bounds[:, -1] == 512).all()


@pytest.mark.parametrize(
    "ncb, k", [(512, 4), (512, 8), (512, 100), (512, 256), (512, 410), (64, 1)]
)
@pytest.mark.parametrize("distinct", [2**24, 16, 3])
def test_top_k_blocks_is_the_sorted_topk_the_records_were_drawn_with(ncb, k, distinct):
    """The layouts of the committed records came from `topk(k).indices.sort()`: the faster form
    keeps exactly those blocks, also where scores tie at the k-th (few distinct values), on both
    of torch's CPU topk paths (partial sort for k x 64 <= n, selection above)."""
    from attnbench.masks.sparse import top_k_blocks

    gen = torch.Generator().manual_seed(ncb + k + distinct)
    scores = torch.randint(0, distinct, (3, 40, ncb), generator=gen).float() / distinct
    keep, idx = top_k_blocks(scores, k)
    drawn = scores.topk(k, dim=-1).indices.sort(dim=-1).values
    assert torch.equal(idx, drawn)
    assert torch.equal(keep, torch.zeros_like(keep).scatter_(-1, drawn, True))


def test_the_h200_records_layouts_rebuild_from_their_seeds():
    """Every committed H200 block-sparse layout up to 32K (one per grid point: the kernels share
    it) is rebuilt, bit for bit, from its record's seed by today's generator."""
    import json
    from pathlib import Path

    cells = Path(__file__).resolve().parents[1] / "results/h200/cells/h200_sparse/sparse"
    seen = {}
    for f in sorted(cells.glob("*/block_sparse/s*.json")):
        rec = json.loads(f.read_text())
        if rec["cell"]["seqlen"] > 32768 or not rec.get("samples"):
            continue
        params = rec["samples"][0]["mask_params"]
        seen[params["layout_sha256"]] = (rec["cell"]["seqlen"], params)
    assert len(seen) >= 12, sorted(seen)  # B 64/128 x 3 densities x 2 head layouts at 32K
    for seqlen, params in seen.values():
        M.SPARSE_PATTERNS["block_sparse"].verify(seqlen, params)
