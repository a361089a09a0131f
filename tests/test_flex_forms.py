"""The flex adapter's mask_mod forms (kernels/flex_forms.py): each says its mask exactly, at every
index flex may call it with; the adapter runs the chosen one and names it in the record's notes;
the direct forms read no Python ints (which would recompile flex per draw).

FlexAttention has no backward on the CPU (torch 2.13 raises NotImplementedError), so the gradients
of these forms are checked on a GPU (tests/gpu/test_gpu_kernels.py); a mask_mod that equals the
predicate at every index gives the same gradients wherever flex runs. The forward of every mask
against float64 is tests/test_kernels_cpu.py's (it runs the chosen forms).
"""

import types

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.harness.reference import reference_attention, rel_err
from attnbench.kernels import catalog, flex, flex_forms
from attnbench.kernels.base import from_thd, load, to_thd
from attnbench.masks.predicates import padded_length
from tinygrids import mask_params

CFG = mask_params(block=8, window=9, long_doc_range=[20, 40])
MASKS = M.STATIC_MASKS + ("full_document_long", "causal_document_long")


def masks_of(name, histograms, lengths=(1, 7, 96, 200, 384), seeds=range(4)):
    for s in lengths:
        for seed in seeds:
            try:
                yield M.sample_mask(name, s, CFG, np.random.default_rng(seed), histograms)
            except ValueError:  # a length the pattern cannot have (block_causal_document: 8 | S)
                continue


@pytest.mark.parametrize("form", flex_forms.FORMS)
@pytest.mark.parametrize("name", MASKS)
def test_every_form_is_the_mask_at_every_index_flex_may_call(name, form, histograms):
    """Equal to the predicate on S x S, and defined on the padded indices of a cut last tile."""
    checked = 0
    for m in masks_of(name, histograms):
        mask_mod, _ = flex_forms.mask_mod_for(m, "cpu", form)
        s = m.seqlen
        i, j = torch.arange(s).view(-1, 1), torch.arange(s).view(1, -1)
        assert torch.equal(mask_mod(None, None, i, j).expand(s, s), m.dense()), (name, s, m.params)
        n = padded_length(s)  # past the end: must read inside its tables, not fail
        mask_mod(None, None, torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1))
        checked += 1
    assert checked >= 4


def test_the_document_masks_run_the_direct_form_and_global_sliding_window_its_predicate():
    direct = set(flex_forms.DIRECT_FORMS) - {"global_sliding_window"}
    for name in catalog.get("flex").masks:
        form = flex_forms.form_of(name)
        assert form.form == (flex_forms.DIRECT if name in direct else flex_forms.PREDICATE), name
        assert form.formula, name
    assert "doc[q] == doc[kv]" in flex_forms.form_of("causal_document").formula
    assert flex_forms.form_of("global_sliding_window").formula == "|q - kv| <= w | q < g | kv < g"


def closure_values(fn, seen=None):
    """Every value a function's closures hold, following nested functions."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    out = []
    for cell in fn.__closure__ or ():
        v = cell.cell_contents
        out += closure_values(v, seen) if isinstance(v, types.FunctionType) else [v]
    return out


@pytest.mark.parametrize("name", sorted(flex_forms.DIRECT_FORMS))
def test_direct_forms_read_tensors_only(name, histograms):
    """Dynamo guards on a closure's Python ints: one would recompile flex for every draw (the
    predicate of causal_blockwise did: 10 draws passed Dynamo's limit of 8)."""
    m = next(masks_of(name, histograms, lengths=(96,)))
    mask_mod, form = flex_forms.mask_mod_for(m, "cpu", flex_forms.DIRECT)
    assert form.form == flex_forms.DIRECT
    values = closure_values(mask_mod)
    assert values and all(isinstance(v, torch.Tensor) for v in values), (name, values)


def test_block_causal_document_keeps_its_predicate_where_documents_are_not_whole_blocks():
    m = M.Mask("block_causal_document", 24, {"block": 8, "doc_lengths": [5, 19]})
    mask_mod, _ = flex_forms.mask_mod_for(m, "cpu", flex_forms.DIRECT)
    i, j = torch.arange(24).view(-1, 1), torch.arange(24).view(1, -1)
    assert torch.equal(mask_mod(None, None, i, j), m.dense())


def test_the_adapter_records_its_form_and_builds_one_block_mask_per_draw(histograms, monkeypatch):
    """prepare(mask) builds the BlockMask once; every call of the draw reuses it."""
    torch._dynamo.config.recompile_limit = 64
    S, HQ, HKV, D = 200, 4, 2, 16
    kernel = load(
        catalog.get("flex"),
        device="cpu",
        dtype=torch.float32,
        heads_q=HQ,
        heads_kv=HKV,
        head_dim=D,
    )
    built = []
    real = flex.block_mask_from_counts
    monkeypatch.setattr(
        flex, "block_mask_from_counts", lambda *a, **k: built.append(1) or real(*a, **k)
    )
    m = M.sample_mask("share_question", S, CFG, np.random.default_rng(5), histograms, HQ, HKV)
    fn = kernel.prepare(m)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(S, h, D, generator=g) for h in (HQ, HKV, HKV))
    ref = reference_attention(q, k, v, m)[0]
    with torch.no_grad():
        for _ in range(3):
            out = to_thd(fn(*(from_thd(x, "bhsd") for x in (q, k, v))), "bhsd")
            assert rel_err(out, ref) < 2e-6
    assert built == [1]
    assert kernel.load_notes["flex_mask_mod"] == flex_forms.form_of("share_question").note()
    assert kernel.load_notes["flex_mask_mod"].startswith("direct: ")


def flex_reference(q, k, v, block_mask, hq, hkv):
    """FlexAttention's own eager implementation (its higher-order op's math path, which autograd
    differentiates on the CPU), on [1, H, S, D] leaves; K/V repeated to the query heads."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_op
    from torch.nn.attention.flex_attention import _identity

    k, v = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v))
    options = {"OUTPUT_LOGSUMEXP": True, "OUTPUT_MAX": False}
    return flex_op(q, k, v, _identity, block_mask.as_tuple(), q.shape[-1] ** -0.5, options)[0]


@pytest.mark.parametrize("name", MASKS)
def test_chosen_form_gradients_match_float64_through_flex_eager(name, histograms):
    """The compiled CPU kernel has no backward, so the chosen form's gradients are checked through
    flex's eager op: the BlockMask and mask_mod the adapter builds, run by flex's own math."""
    S, HQ, HKV, D = 200, 4, 2, 16
    kernel = load(
        catalog.get("flex"),
        device="cpu",
        dtype=torch.float32,
        heads_q=HQ,
        heads_kv=HKV,
        head_dim=D,
    )
    for seed in range(2):
        m = M.sample_mask(name, S, CFG, np.random.default_rng(seed), histograms, HQ, HKV)
        block_mask = kernel.build_block_mask(m)
        g = torch.Generator().manual_seed(seed)
        q, k, v, dout = (torch.randn(S, h, D, generator=g) for h in (HQ, HKV, HKV, HQ))
        leaves = [from_thd(x, "bhsd").requires_grad_() for x in (q, k, v)]
        try:
            out = flex_reference(*leaves, block_mask, HQ, HKV)
        except (TypeError, KeyError) as e:  # a private op: another torch may take other arguments
            pytest.skip(f"torch {torch.__version__}'s flex_attention op differs: {e}")
        grads = torch.autograd.grad(out, leaves, from_thd(dout, "bhsd"))
        ref_out, _, ref_grads = reference_attention(q, k, v, m, dout)
        assert rel_err(to_thd(out.detach(), "bhsd"), ref_out) < 2e-6, (name, seed)
        for which, got, ref in zip(("dq", "dk", "dv"), grads, ref_grads):
            assert rel_err(to_thd(got, "bhsd"), ref) < 5e-6, (name, seed, which)
