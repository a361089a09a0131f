"""Every mask: range form == predicate, area exact, derived forms consistent, edge cases."""

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.masks.ranges import Slice, dense_from_slices
from tinygrids import mask_params

CFG = mask_params(block=4, window=7, long_doc_range=[5, 20], density=0.5, avg_block=8, min_block=4)
LENGTHS = [1, 2, 3, 5, 7, 8, 12, 16, 31, 64, 100, 128]


def dense_count_by_rows(mask):
    return int(mask.dense().sum())


def masks_over_seeds(name, lengths=LENGTHS, seeds=range(6), cfg=CFG, histograms=None):
    for s in lengths:
        for seed in seeds:
            try:
                yield M.sample_mask(
                    name, s, cfg, np.random.default_rng(seed), histograms, heads_q=4, heads_kv=2
                )
            except ValueError:
                # Only S not a multiple of a block size, or shorter than a block, may refuse.
                assert name in ("block_causal_document", "block_sparse", "variable_block_sparse")


@pytest.mark.parametrize("name", M.STATIC_MASKS + M.CP_MASKS[4:])
def test_static_ranges_equal_predicate(name, histograms):
    n = 0
    for m in masks_over_seeds(name, histograms=histograms):
        dense = m.dense()
        assert torch.equal(dense_from_slices(m.slices(), m.seqlen), dense), (
            name,
            m.seqlen,
            m.params,
        )
        assert m.area == int(dense.sum())
        n += 1
    assert n >= 30


@pytest.mark.parametrize("name", M.SPARSE_MASKS)
def test_sparse_ranges_equal_predicate(name):
    n = 0
    for m in masks_over_seeds(name, lengths=[8, 16, 32, 64, 96]):
        dense = m.dense()  # [Hq, S, S]
        assert dense.shape == (4, m.seqlen, m.seqlen)
        for h in range(4):
            assert m.area_per_head[h] == int(dense[h].sum())
        for g in range(m.layout().groups):
            assert torch.equal(dense_from_slices(m.slices(g), m.seqlen), dense[g * 2])
        n += 1
    assert n >= 20


@pytest.mark.parametrize("name", M.STATIC_MASKS + M.SPARSE_MASKS)
def test_mask_mod_is_the_predicate_under_vmap(name, histograms):
    """FlexAttention calls mask_mod on scalar indices under vmap: it must give the dense matrix."""
    from torch.func import vmap

    for m in masks_over_seeds(
        name,
        lengths=[16, 33] if "sparse" not in name else [16, 32],
        seeds=range(3),
        histograms=histograms,
    ):
        mod = m.mask_mod()
        s = m.seqlen
        q, k = torch.arange(s), torch.arange(s)
        heads = range(m.heads_q) if m.sparse else [0]
        for h in heads:
            f = vmap(
                vmap(lambda qi, ki: mod(torch.tensor(0), torch.tensor(h), qi, ki), (None, 0)),
                (0, None),
            )
            got = f(q, k)
            want = m.dense()[h] if m.sparse else m.dense()
            assert torch.equal(got, want), (name, h)


@pytest.mark.parametrize("name", M.STATIC_MASKS)
def test_block_counts_match_dense(name, histograms):
    for m in masks_over_seeds(name, lengths=[16, 33, 64], seeds=range(2), histograms=histograms):
        for tile in (4, 8, 16):
            counts = m.block_counts(tile)[0]
            d = torch.nn.functional.pad(m.dense(), (0, -m.seqlen % tile, 0, -m.seqlen % tile))
            nb = d.shape[0] // tile
            want = d.view(nb, tile, nb, tile).sum(dim=(1, 3))
            assert torch.equal(counts, want.to(counts.dtype))


def native_dense(form, s):
    """What a varlen/window kernel computes for (documents, causal, window)."""
    out = torch.zeros(s, s, dtype=torch.bool)
    left, right = form.window
    a = 0
    for n in form.doc_lengths:
        i = torch.arange(n).view(-1, 1)
        j = torch.arange(n).view(1, -1)
        vis = torch.ones(n, n, dtype=torch.bool)
        if form.causal:
            vis &= j <= i
        if left >= 0:
            vis &= j >= i - left
        if right >= 0:
            vis &= j <= i + right
        out[a : a + n, a : a + n] = vis
        a += n
    return out


@pytest.mark.parametrize("name", M.STATIC_MASKS)
def test_native_form_matches_predicate(name, histograms):
    regular = {
        "full",
        "causal",
        "full_document",
        "causal_document",
        "sliding_window",
        "sliding_window_causal",
    }
    for m in masks_over_seeds(name, seeds=range(3), histograms=histograms):
        form = m.native_form()
        if name not in regular:
            assert form is None
            continue
        assert sum(form.doc_lengths) == m.seqlen
        assert torch.equal(native_dense(form, m.seqlen), m.dense())


def test_edge_cases_one_document_and_tiny_lengths():
    one = M.Mask("causal_document", 9, {"doc_lengths": [9]})
    assert one.area == M.Mask("causal", 9).area == 45
    assert M.Mask("causal", 1).area == 1 and M.Mask("full", 1).area == 1
    # S smaller than the window: the window covers everything (pitfall 2: never all-masked).
    assert M.Mask("sliding_window_causal", 5, {"window": 1024}).area == 15
    assert M.Mask("sliding_window", 5, {"window": 1024}).area == 25
    assert M.Mask("sliding_window", 1, {"window": 0}).area == 1


def test_two_sided_window_is_twice_the_one_sided_band():
    """Pitfall 1: the two-sided window's FLOPs must not be computed from the causal window."""
    s, w = 4096, 256
    two = M.Mask("sliding_window", s, {"window": w}).area
    one = M.Mask("sliding_window_causal", s, {"window": w}).area
    assert two == 2 * one - s
    # exact closed form: sum over rows of min(S-1, i+w) - max(0, i-w) + 1
    assert two == sum(min(s - 1, i + w) - max(0, i - w) + 1 for i in range(s))


def test_prefix_has_exactly_p_bidirectional_columns():
    """Pitfall 4: the prefix is j < P, not j <= P."""
    m = M.Mask("prefix_lm_causal", 10, {"prefix": 3})
    d = m.dense()
    assert d[0, :3].all() and not d[0, 3]
    assert d[5, :6].all() and not d[5, 6]


def test_global_sliding_window_area_counts_globals():
    """Pitfall 3: the range form describes the same mask the kernels run, globals included."""
    m = M.Mask("global_sliding_window", 60, {"window": 5, "global_tokens": 10})
    d = m.dense()
    assert d[:10].all() and d[:, :10].all()
    assert m.area == int(d.sum())


def test_slice_area_formulas():
    assert Slice(0, 4, 0, 4, "causal").area() == 10
    assert Slice(0, 2, 0, 5, "causal").area() == 2 * 5 - 1  # bottom-right aligned
    assert Slice(0, 5, 0, 2, "causal").area() == 3
    assert Slice(0, 3, 0, 5, "bi_causal").area() == 9
    assert Slice(0, 5, 0, 3, "bi_causal").area() == 0
    assert Slice(0, 3, 0, 5, "inv_causal").area() == 5 + 4 + 3  # c >= r: rows see 5, 4, 3 columns


def test_unknown_mask_names_choices():
    with pytest.raises(ValueError, match="unknown mask 'cauzal'.*valid masks: full, causal"):
        M.pattern("cauzal")


def test_block_sizes_must_divide_seqlen():
    with pytest.raises(ValueError, match="not a multiple of mask_params.block=64"):
        M.sample_mask("block_causal_document", 100, {"block": 64}, np.random.default_rng(0))
    with pytest.raises(ValueError, match="not a multiple of mask_params.block_size=64"):
        M.sample_mask(
            "block_sparse", 100, {"block_size": 64, "density": 0.5}, np.random.default_rng(0)
        )


def test_block_sparse_density_and_determinism():
    cfg = {"block_size": 64, "density": 0.3}
    a = M.sample_mask("block_sparse", 4096, cfg, np.random.default_rng(5), heads_q=8, heads_kv=2)
    b = M.sample_mask("block_sparse", 4096, cfg, np.random.default_rng(5), heads_q=8, heads_kv=2)
    assert a.params == b.params and torch.equal(a.layout().keep, b.layout().keep)
    n = 4096 // 64
    k = int(0.3 * n)
    assert a.params["kept_blocks"] == 2 * n * k  # kv_head granularity: 2 groups
    assert a.params["realised_density"] == pytest.approx(k / n)
    assert a.area == pytest.approx(n * k * 64 * 64)  # FLOPs from kept blocks, not rho * S^2
    # heads of one KV group share their blocks
    keep = a.layout().keep
    assert keep.shape[0] == 2


def test_variable_block_sizes():
    cfg = {"avg_block": 256, "min_block": 128, "density": 0.5}
    m = M.sample_mask(
        "variable_block_sparse", 4096, cfg, np.random.default_rng(2), heads_q=4, heads_kv=4
    )
    lay = m.layout()
    sizes = lay.row_bounds.diff(dim=1)
    assert (sizes >= 128).all() and (sizes.sum(1) == 4096).all()
    assert lay.groups == 4 and len(set(map(tuple, sizes.tolist()))) > 1  # per head


# Small masks written out by hand from the definitions in docs/masks.md (row i = query, column
# j = key), with the visible pairs counted by hand: independent of the predicates, ranges and
# dense builders.
HAND_MASKS = [
    (
        "causal_document",
        6,
        {"doc_lengths": [2, 3, 1]},
        10,
        """
        100000
        110000
        001000
        001100
        001110
        000001""",
    ),
    (
        "full_document",
        6,
        {"doc_lengths": [2, 3, 1]},
        14,
        """
        110000
        110000
        001110
        001110
        001110
        000001""",
    ),
    (
        "sliding_window",
        6,
        {"window": 1},
        16,
        """
        110000
        111000
        011100
        001110
        000111
        000011""",
    ),
    (
        "sliding_window_causal",
        6,
        {"window": 2},
        15,
        """
        100000
        110000
        111000
        011100
        001110
        000111""",
    ),
    (
        "share_question",
        6,
        {"doc_lengths": [2, 2, 2]},
        17,
        """
        100000
        110000
        111000
        111100
        110010
        110011""",
    ),
    (
        "causal_blockwise",
        6,
        {"doc_lengths": [2, 2, 2]},
        17,
        """
        100000
        110000
        001000
        001100
        111110
        111111""",
    ),
    (
        "prefix_lm_causal",
        6,
        {"prefix": 2},
        22,
        """
        110000
        110000
        111000
        111100
        111110
        111111""",
    ),
    (
        "prefix_lm_document",
        6,
        {"doc_lengths": [3, 3], "prefix": 2},
        14,
        """
        110000
        110000
        111000
        000110
        000110
        000111""",
    ),
    (
        "global_sliding_window",
        6,
        {"window": 1, "global_tokens": 2},
        30,
        """
        111111
        111111
        111100
        111110
        110111
        110011""",
    ),
    (
        "block_causal_document",
        6,
        {"block": 2, "doc_lengths": [4, 2]},
        16,
        """
        110000
        110000
        111100
        111100
        000011
        000011""",
    ),
]


@pytest.mark.parametrize("name,s,params,area,rows", HAND_MASKS, ids=[m[0] for m in HAND_MASKS])
def test_small_masks_written_out_by_hand(name, s, params, area, rows):
    hand = torch.tensor([[c == "1" for c in line.strip()] for line in rows.strip().splitlines()])
    assert int(hand.sum()) == area  # the hand count agrees with the drawing
    m = M.Mask(name, s, params)
    assert torch.equal(m.dense(), hand), f"{name}:\n{m.dense().int()}"
    assert m.area == area
