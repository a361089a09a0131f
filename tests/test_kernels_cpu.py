"""Each CPU kernel against the float64 reference, for every mask it claims, forward and backward."""

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.harness.reference import reference_attention, rel_err
from attnbench.kernels import catalog
from attnbench.kernels.base import from_thd, load, to_thd
from attnbench.record.status import Unsupported
from tinygrids import mask_params

CFG = mask_params(block=8, window=9, long_doc_range=[20, 40])
S, HQ, HKV, D = 96, 4, 2, 16
CPU_KERNELS = [k for k, info in catalog.KERNELS.items() if "cpu" in info.devices]


def inputs(seed=0, s=S):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(sh, generator=g) for sh in [(s, HQ, D), (s, HKV, D), (s, HKV, D), (s, HQ, D)]
    ]


def run(kernel, fn, q, k, v, dout, backward):
    leaves = [from_thd(x, kernel.layout).requires_grad_(backward) for x in (q, k, v)]
    if not backward:
        with torch.no_grad():
            return to_thd(fn(*leaves), kernel.layout), None
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, from_thd(dout, kernel.layout))
    return to_thd(out.detach(), kernel.layout), [to_thd(g, kernel.layout) for g in grads]


def test_cpu_kernels_are_the_required_four():
    assert set(CPU_KERNELS) == {"naive", "sdpa", "sdpa_math", "flex"}


@pytest.mark.parametrize("impl", CPU_KERNELS)
@pytest.mark.parametrize("mask_name", catalog.DENSE_MASKS)
def test_kernel_matches_float64_reference(impl, mask_name, histograms):
    torch._dynamo.config.recompile_limit = 64  # one process compiles flex for every mask here
    info = catalog.get(impl)
    if mask_name not in info.masks:
        pytest.skip(f"{impl} does not claim {mask_name}")
    kernel = load(info, device="cpu", dtype=torch.float32, heads_q=HQ, heads_kv=HKV, head_dim=D)
    for seed in range(2):
        mask = M.sample_mask(mask_name, S, CFG, np.random.default_rng(seed), histograms, HQ, HKV)
        q, k, v, dout = inputs(seed)
        fn = kernel.prepare(mask)
        for direction in info.directions["cpu"]:
            if direction == "fwdbwd":
                continue
            backward = direction == "bwd"
            ref_out, _, ref_grads = reference_attention(q, k, v, mask, dout if backward else None)
            out, grads = run(kernel, fn, q, k, v, dout, backward)
            assert rel_err(out, ref_out) < 2e-6, (impl, mask_name, direction)
            if backward:
                for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
                    assert rel_err(g, r) < 5e-6, (impl, mask_name, name)


def test_flex_block_mask_equals_flex_own_builder(histograms):
    """Our O(block x S) BlockMask builder gives the same tiles as create_block_mask."""
    from attnbench.kernels.flex import block_mask_from_counts
    from torch.nn.attention.flex_attention import create_block_mask

    for name in M.STATIC_MASKS:
        for s in (128, 200, 384):
            try:
                m = M.sample_mask(name, s, CFG, np.random.default_rng(3), histograms)
            except ValueError:
                continue
            ours = block_mask_from_counts(m, 64, "cpu")
            theirs = create_block_mask(
                m.mask_mod(), None, None, s, s, device="cpu", BLOCK_SIZE=64, _compile=False
            )
            assert torch.equal(ours.to_dense(), theirs.to_dense()), (name, s)
            # and the full/partial split: full tiles skip the mask_mod, so they must really be full
            assert torch.equal(ours.full_kv_num_blocks, theirs.full_kv_num_blocks), (name, s)


def test_sparse_flex_block_mask_is_built_from_indices():
    from attnbench.kernels.flex import block_mask_from_layout

    m = M.sample_mask(
        "block_sparse",
        1024,
        {"block_size": 64, "density": 0.25},
        np.random.default_rng(0),
        None,
        8,
        2,
    )
    bm = block_mask_from_layout(m, "cpu")
    dense_blocks = bm.to_dense()[0]  # [Hq, nb, nb]
    keep = m.layout().keep.repeat_interleave(4, dim=0)
    assert torch.equal(dense_blocks.bool(), keep)


def test_flash_backend_refuses_document_masks_instead_of_computing_another_mask(histograms):
    """A kernel that cannot express a mask raises Unsupported: never a silently different computation."""
    from attnbench.kernels.sdpa import SDPAFlash

    k = SDPAFlash(
        catalog.get("sdpa_flash"),
        device="cpu",
        dtype=torch.float32,
        heads_q=HQ,
        heads_kv=HKV,
        head_dim=D,
    )
    mask = M.sample_mask("causal_document", S, CFG, np.random.default_rng(0), histograms)
    with pytest.raises(Unsupported, match="cannot run causal_document"):
        k.prepare(mask)


def test_block_mask_at_48k_never_materialises_s_by_s(histograms):
    """The BlockMask comes from the predicate one row of tiles at a time: O(tile x S), not S x S."""
    from attnbench.harness.measure import peak_memory
    from attnbench.kernels.flex import block_mask_from_counts

    s = 49152
    m = M.sample_mask("causal_document", s, CFG, np.random.default_rng(0), histograms)
    out = {}
    mem = peak_memory(lambda: out.setdefault("bm", block_mask_from_counts(m, 128, "cpu")), "cpu")
    if mem["peak_mem_increment_bytes"] is not None:
        assert mem["peak_mem_increment_bytes"] < 2**29  # S x S bools would be 2.25 GiB
    bm = out["bm"]
    assert bm.shape[-2:] == (s, s)
    # spot-check a few tiles against the predicate
    dense_tiles = bm.to_dense()[0, 0]
    for i in (0, 100, 383):
        rows = m.dense(rows=(i * 128, (i + 1) * 128)).view(128, 384, 128).any(dim=(0, 2))
        assert torch.equal(dense_tiles[i].bool(), rows)


def test_cpu_peak_memory_increment_is_never_negative_when_memory_is_freed_before_the_call(
    monkeypatch,
):
    """The process' RSS can fall between reading a baseline and resetting the high-water mark
    (another thread freeing memory): the baseline is read from the mark after its reset, so the
    increment counts only what the call added. Here 256 MiB are freed just before the reset."""
    import attnbench.harness.measure as measure

    if not measure._reset_peak_rss():
        pytest.skip("no /proc/self/clear_refs: CPU memory is not measured here")
    held = {"buffer": torch.ones(64 * 2**20)}  # 256 MiB, touched
    reset = measure._reset_peak_rss

    def freed_then_reset():
        held.clear()
        return reset()

    monkeypatch.setattr(measure, "_reset_peak_rss", freed_then_reset)
    mem = measure.peak_memory(lambda: torch.ones(1024).sum(), "cpu")
    assert mem["mem_source"] == "process_rss"
    assert 0 <= mem["peak_mem_increment_bytes"] < 2**26, mem
