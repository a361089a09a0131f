"""benchmarks/adapter_vs_library.py: its hand-written calls compute the mask they are given.

The GPU libraries are not here, so what is checked is what each hand-written call hands its library,
decoded by the library's documented semantics (FlashMask's column intervals, FFA's slice types,
FlashAttention's causal/window/cu_seqlens) against the mask's predicate; and the flex/SDPA
mask_mod, evaluated. The script itself runs once on the CPU (SDPA, the cheapest).
"""

import importlib.util
import sys

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.kernels.ffa import decode_ffa
from attnbench.kernels.flashmask import decode_encoding
from tinygrids import mask_params

CFG = mask_params(block=8, window=9, long_doc_range=[20, 40])


@pytest.fixture(scope="module")
def bench(repo):
    spec = importlib.util.spec_from_file_location(
        "adapter_vs_library", repo / "benchmarks/adapter_vs_library.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def draws(bench, name, histograms, lengths=(1, 2, 7, 96, 150, 200)):
    for s in lengths:
        for seed in range(4):
            try:
                m = M.sample_mask(name, s, CFG, np.random.default_rng(seed), histograms)
            except ValueError:
                continue
            yield m, bench.Draw(m.name, m.seqlen, m.params)


@pytest.mark.parametrize("name", M.STATIC_MASKS)
def test_docs_mask_mod_is_the_mask(bench, name, histograms):
    for m, draw in draws(bench, name, histograms):
        s = m.seqlen
        mod = bench.docs_mask_mod(draw, "cpu")
        i, j = torch.arange(s).view(-1, 1), torch.arange(s).view(1, -1)
        b = h = torch.zeros((), dtype=torch.long)  # noop_mask reads b
        assert torch.equal(mod(b, h, i, j).expand(s, s), m.dense()), (name, s)


@pytest.mark.parametrize("name", M.STATIC_MASKS)
def test_flashmask_columns_are_the_mask(bench, name, histograms):
    for m, draw in draws(bench, name, histograms):
        cols, causal = bench.flashmask_columns(draw)
        if cols is None:  # the window masks go in as FlashMask's own window_size
            assert name in ("sliding_window", "sliding_window_causal")
            continue
        n = cols.shape[-1]
        assert cols.dtype == np.int32 and cols.shape == (1, 1, m.seqlen, n)
        assert n in ((1, 2) if causal else (2, 4))
        vis = decode_encoding(torch.from_numpy(cols), causal, m.seqlen)
        assert torch.equal(vis, m.dense()), (name, m.seqlen)


@pytest.mark.parametrize("name", M.STATIC_MASKS)
def test_ffa_slices_are_the_mask_once(bench, name, histograms):
    for m, draw in draws(bench, name, histograms):
        sl = torch.tensor(bench.ffa_slices(draw), dtype=torch.int32).view(-1, 5)
        vis = decode_ffa(sl[:, 0:2], sl[:, 2:4], sl[:, 4], m.seqlen)
        assert torch.equal(vis, m.dense()), (name, m.seqlen)
        # disjoint: the slices' pairs add up to the mask's area
        count = sum(
            int(decode_ffa(x[None, 0:2], x[None, 2:4], x[None, 4], m.seqlen).sum()) for x in sl
        )
        assert count == m.area, (name, m.seqlen)


@pytest.mark.parametrize("name", M.REGULAR_MASKS)
@pytest.mark.parametrize("unbounded", [-1, None])
def test_flash_arguments_are_the_mask(bench, name, unbounded, histograms):
    """FlashAttention's rule: per document, causal keeps j <= i, window (l, r) keeps
    i - l <= j <= i + r (-1 / None: unbounded)."""
    for m, draw in draws(bench, name, histograms):
        kw = bench.flash_window(draw, unbounded)
        left, right = kw["window_size"]
        cu = draw.cu_seqlens("cpu").tolist()
        vis = torch.zeros(m.seqlen, m.seqlen, dtype=torch.bool)
        for a, b in zip(cu[:-1], cu[1:]):
            i, j = torch.arange(b - a).view(-1, 1), torch.arange(b - a).view(1, -1)
            keep = torch.ones(b - a, b - a, dtype=torch.bool)
            if kw["causal"]:
                keep &= j <= i
            if left not in (-1, None):
                keep &= j >= i - left
            if right not in (-1, None):
                keep &= j <= i + right
            vis[a:b, a:b] = keep
        assert torch.equal(vis, m.dense()), (name, m.seqlen)


def test_the_script_prints_a_table_on_the_cpu(bench, capsys):
    bench.main(
        [
            "--device",
            "cpu",
            "--seqlen",
            "128",
            "--kernels",
            "sdpa",
            "sdpa_flash",
            "--masks",
            "causal",
            "share_question",
            "--reps",
            "1",
            "--warmup",
            "0",
        ]
    )
    out = capsys.readouterr().out
    table = out[out.index("| kernel |") :].strip().splitlines()
    assert table[0].split("|")[1:-1] == [f" {h} " for h in bench.HEADER]
    rows = {(r.split("|")[1].strip(), r.split("|")[2].strip()): r.split("|") for r in table[2:]}
    assert set(rows) == {
        ("sdpa", "causal"),
        ("sdpa", "share_question"),
        ("sdpa_flash", "causal"),
        ("sdpa_flash", "share_question"),
    }
    assert float(rows["sdpa", "share_question"][7]) > 0  # a ratio
    assert float(rows["sdpa", "share_question"][8]) == 0  # the same mask, the same numbers
    assert "no cpu kernel" in rows["sdpa_flash", "causal"][9]
