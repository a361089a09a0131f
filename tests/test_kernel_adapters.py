"""GPU-library adapters on a machine without them: `unavailable` records, and the arguments each
builds for its library's documented API, checked against the mask's own predicate."""

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.families import expand_cells, load_config
from attnbench.families.kernel import cell as C
from attnbench.grid.spec import CellSpec
from attnbench.kernels import catalog
from attnbench.kernels.ffa import decode_ffa, ffa_ranges
from attnbench.kernels.flash_attn import VARLEN_KEYWORDS, flash_call_args
from attnbench.kernels.flashmask import decode_encoding, flashmask_encoding
from attnbench.kernels.transformer_engine import te_arguments
from attnbench.kernels.varlen import varlen_kwargs
from attnbench.record.status import Unsupported

CFG = dict(window=9, block=8)
REGULAR = M.REGULAR_MASKS


def flash_semantics(kwargs, var_args, s):
    """What FlashAttention computes for (causal, window_size) per document: its documented rule."""
    cu = var_args[0].tolist() if var_args else [0, s]
    left, right = kwargs["window_size"]
    out = torch.zeros(s, s, dtype=torch.bool)
    for a, b in zip(cu[:-1], cu[1:]):
        i = torch.arange(b - a).view(-1, 1)
        j = torch.arange(b - a).view(1, -1)
        vis = torch.ones(b - a, b - a, dtype=torch.bool)
        if kwargs["causal"]:
            vis &= j <= i
        if left is not None and left >= 0:
            vis &= j >= i - left
        if right is not None and right >= 0:
            vis &= j <= i + right
        out[a:b, a:b] = vis
    return out


@pytest.mark.parametrize("mask_name", REGULAR)
@pytest.mark.parametrize("unbounded", [-1, None])  # FA2/FA3 use -1, FA4 None
def test_flash_arguments_compute_the_mask(mask_name, unbounded, histograms):
    for seed in range(4):
        m = M.sample_mask(mask_name, 150, CFG, np.random.default_rng(seed), histograms)
        kwargs, var_args = flash_call_args(m.native_form(), "cpu", unbounded)
        assert (var_args is None) == (len(m.native_form().doc_lengths) == 1)
        if var_args:
            assert var_args[0].dtype == torch.int32 and var_args[0][-1] == 150
            assert var_args[2] == max(m.doc_lengths)
        assert all(w is unbounded or w >= 0 for w in kwargs["window_size"])
        assert torch.equal(flash_semantics(kwargs, var_args, 150), m.dense())


# the leading parameters of each library's varlen function (flash-attn 2.8.3, fa3-fwd 0.0.3,
# flash-attn-4 4.0.0b36: FA4 puts qv fourth, where the others take cu_seqlens_q)
VARLEN_SIGNATURES = {
    "fa2": lambda q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, causal=False, window_size=(-1, -1): (
        0
    ),
    "fa3": lambda q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None, seqused_k=None, softmax_scale=None, causal=False, qv=None, window_size=(-1, -1): (
        0
    ),
    "fa4": lambda q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, causal=False, window_size=(None, None): (
        0
    ),
}


@pytest.mark.parametrize("library", sorted(VARLEN_SIGNATURES))
def test_flash_varlen_arguments_bind_by_name(library, histograms):
    import inspect

    for seed in range(20):  # a sample of more than one document
        m = M.sample_mask("causal_document", 150, CFG, np.random.default_rng(seed), histograms)
        kwargs, var_args = flash_call_args(m.native_form(), "cpu")
        if var_args:
            break
    bound = (
        inspect.signature(VARLEN_SIGNATURES[library])
        .bind("q", "k", "v", **dict(zip(VARLEN_KEYWORDS, var_args)), **kwargs)
        .arguments
    )
    assert bound["cu_seqlens_q"] is var_args[0] and bound["max_seqlen_k"] == var_args[3]
    assert bound.get("qv") is None


def test_varlen_keywords_follow_the_installed_signature(histograms):
    import inspect

    m = M.sample_mask("sliding_window_causal", 64, CFG, np.random.default_rng(0), histograms)
    new = inspect.signature(
        lambda q, k, v, a, b, c, d, *, window_size=(-1, -1), enable_gqa=False: 0
    ).parameters
    old = inspect.signature(lambda q, k, v, a, b, c, d, *, is_causal=False: 0).parameters
    bare = inspect.signature(lambda q, k, v, a, b, c, d: 0).parameters
    assert varlen_kwargs(new, m.native_form(), gqa=True) == (
        {"enable_gqa": True, "window_size": (9, 0)},
        None,
    )
    assert (
        varlen_kwargs(old, m.native_form(), gqa=False)[1]
        == "this varlen_attn has no window_size (sliding windows)"
    )
    assert varlen_kwargs(old, M.Mask("causal", 8).native_form(), gqa=False) == (
        {"is_causal": True},
        None,
    )
    assert "causal masks" in varlen_kwargs(bare, M.Mask("causal", 8).native_form(), gqa=False)[1]
    assert "GQA" in varlen_kwargs(old, M.Mask("full", 8).native_form(), gqa=True)[1]


def test_transformer_engine_arguments(histograms):
    m = M.sample_mask("causal_document", 300, CFG, np.random.default_rng(1), histograms)
    ctor, call = te_arguments(m.native_form(), 8, 2, 64, "cpu")
    assert ctor["attn_mask_type"] == "padding_causal" and ctor["qkv_format"] == "thd"
    assert ctor["num_gqa_groups"] == 2 and ctor["window_size"] == (-1, 0)
    assert call["cu_seqlens_q"].tolist() == [0, *np.cumsum(m.doc_lengths).tolist()]
    ctor, _ = te_arguments(
        M.Mask("sliding_window", 100, {"window": 7}).native_form(), 8, 8, 64, "cpu"
    )
    assert ctor["attn_mask_type"] == "padding" and ctor["window_size"] == (7, 7)


def sampled_masks(mask_name, histograms):
    """(length, seed, mask) of the mask sampled at four lengths, three seeds each (lengths the
    mask's parameters do not allow are left out)."""
    for s in (1, 7, 64, 130):
        for seed in range(3):
            try:
                yield (
                    s,
                    seed,
                    M.sample_mask(mask_name, s, CFG, np.random.default_rng(seed), histograms),
                )
            except ValueError:
                continue


@pytest.mark.parametrize("mask_name", M.STATIC_MASKS)
def test_flashmask_encoding_is_exact(mask_name, histograms):
    """Every static mask is two row intervals per column; the encoding decodes to the predicate."""
    for s, seed, m in sampled_masks(mask_name, histograms):
        indices, causal = flashmask_encoding(m)
        assert indices.dtype == torch.int32 and indices.shape[:3] == (1, 1, s)
        assert torch.equal(decode_encoding(indices, causal, s), m.dense()), (mask_name, s, seed)


def test_flashmask_refuses_what_it_cannot_encode():
    # three visible runs in one column: not expressible as two row intervals
    m = M.Mask(
        "block_sparse",
        256,
        {"block_size": 64, "density": 0.5, "groups": 1, "heads_q": 1, "seed": 3},
    )
    with pytest.raises(Unsupported, match="flashmask"):
        flashmask_encoding(m)


@pytest.mark.parametrize("mask_name", M.STATIC_MASKS)
def test_ffa_slices_are_exact(mask_name, histograms):
    """FFA's (q_ranges, k_ranges, attn_type_map) of every static mask, read by FFA's documented
    semantics, is the mask's predicate, and no pair is covered twice (one slice list computes
    each pair once)."""
    for s, seed, m in sampled_masks(mask_name, histograms):
        q, k, types = ffa_ranges(m)
        assert q.dtype == k.dtype == types.dtype == torch.int32 and q.shape == k.shape
        assert torch.equal(decode_ffa(q, k, types, s), m.dense()), (mask_name, s, seed)
        assert M.total_area(m.slices()) == int(m.dense().sum())


GPU_ONLY = [k for k, info in catalog.KERNELS.items() if "cpu" not in info.devices]


@pytest.mark.parametrize("impl", GPU_ONLY)
def test_gpu_kernels_are_unavailable_here(impl, repo):
    cfg = load_config(repo / "config.yaml")
    spec = next(
        c for c in expand_cells(cfg, ["smoke"]) if c["impl"] == "naive" and c["mask"] == "causal"
    )
    r = C.run_cell(CellSpec.from_dict({**spec, "impl": impl}))
    assert r["status"] == "unavailable" and "runs only on cuda" in r["status_reason"]
    on_cuda = C.run_cell(
        CellSpec.from_dict({**spec, "impl": impl, "device": "cuda", "dtype": "bfloat16"})
    )
    assert on_cuda["status"] == "unavailable"
    missing = catalog.missing_module(catalog.get(impl))
    if missing:
        assert f"needs the Python module {missing.split('|')[0]!r}" in on_cuda["status_reason"]
    elif not torch.cuda.is_available():
        assert on_cuda["status_reason"] == "no CUDA device is visible"


def test_every_kernel_declares_its_support():
    assert {
        "naive",
        "sdpa",
        "sdpa_math",
        "sdpa_flash",
        "sdpa_efficient",
        "sdpa_cudnn",
        "flex",
        "varlen",
        "fa2",
        "fa3",
        "fa4",
        "cudnn_te",
        "flashmask",
        "ffa",
    } <= set(catalog.KERNELS)
    for info in catalog.KERNELS.values():
        assert info.masks and info.directions and info.summary
        assert all(set(d) <= set(catalog.ALL_DIRECTIONS) for d in info.directions.values())


def _install_fa3_fwd(tmp_path, monkeypatch, flags):
    """A stand-in for PyPI fa3-fwd's two pure-Python files, as its wheel lays them out: the
    interface module and fa3_fwd_config.CONFIG['build_flags'] (the build's own record)."""
    (tmp_path / "fa3_fwd_interface.py").write_text("")
    (tmp_path / "fa3_fwd_config.py").write_text(f"CONFIG = {{'build_flags': {flags!r}}}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "fa3_fwd_config", raising=False)


def test_fa3_forward_only_build_limits_come_from_its_build_flags(tmp_path, monkeypatch):
    info = catalog.get("fa3")
    assert catalog.missing_module(info) == "flash_attn_interface|fa3_fwd_interface"
    _install_fa3_fwd(
        tmp_path,
        monkeypatch,
        {"FLASHATTENTION_DISABLE_BACKWARD": True, "FLASHATTENTION_DISABLE_LOCAL": True},
    )
    assert catalog.missing_module(info) is None
    why = lambda mask, d: catalog.unsupported_reason(info, mask, d, "cuda", 64, 8)  # noqa: E731
    assert "FLASHATTENTION_DISABLE_BACKWARD" in why("causal", "bwd")
    assert "FLASHATTENTION_DISABLE_BACKWARD" in why("full_document", "fwdbwd")
    assert "FLASHATTENTION_DISABLE_LOCAL" in why("sliding_window_causal", "fwd")
    for mask in ("full", "causal", "full_document", "causal_document"):
        assert why(mask, "fwd") is None
    assert "share_question" in why("share_question", "fwd")  # not a FlashAttention mask at all


def test_fa3_build_with_backward_and_windows_has_no_limits(tmp_path, monkeypatch):
    _install_fa3_fwd(
        tmp_path,
        monkeypatch,
        {"FLASHATTENTION_DISABLE_BACKWARD": False, "FLASHATTENTION_DISABLE_LOCAL": False},
    )
    info = catalog.get("fa3")
    assert catalog.unsupported_reason(info, "sliding_window_causal", "bwd", "cuda", 64, 8) is None


def test_a_missing_alternative_is_named_in_the_record():
    assert "'flash_attn_interface' or 'fa3_fwd_interface'" in C.availability_reason(
        catalog.get("fa3"), "cuda"
    )
