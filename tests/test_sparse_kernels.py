"""Every kernel of a grid point receives the identical mask; FlexAttention on block-sparse masks
matches the float64 reference (CPU forward; on a GPU forward and backward)."""

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.families import expand_grid, load_config
from attnbench.families.kernel import cell as C
from attnbench.grid.spec import CellSpec
from attnbench.harness.reference import reference_attention, rel_err
from attnbench.kernels import base, catalog
from attnbench.kernels.naive import Naive


class Recorder(Naive):
    """Whatever kernel the cell asked for: record the mask handed to prepare, compute naively."""

    seen = []

    def prepare(self, mask):
        Recorder.seen.append((self.info.name, mask))
        return super().prepare(mask)


@pytest.fixture(scope="module")
def grid_cells(repo):
    return expand_grid(load_config(repo / "config.yaml"), "paper_sparse")


@pytest.mark.parametrize("mask_name", M.SPARSE_MASKS)
def test_every_kernel_of_a_grid_point_receives_the_identical_mask(
    grid_cells, monkeypatch, mask_name
):
    # One point of the paper's grid (shrunk to CPU size), every kernel and direction at it.
    specs = [
        c
        for c in grid_cells
        if c["mask"] == mask_name
        and c["seqlen"] == 16384
        and c["heads_kv"] == 8
        and c["mask_params"].get("density") == 0.5
        and c["mask_params"].get("block_size", 128) == 128
        and c["mask_params"].get("avg_block", 256) == 256
    ]
    kernels = {c["impl"] for c in specs}
    assert kernels == {"flex", "flashinfer"} | (
        {"triton_block_sparse", "vsa", "vsa_triton", "fa2_sparse"}
        if mask_name == "block_sparse"
        else set()
    )
    small = {
        "seqlen": 1024,
        "heads_q": 4,
        "heads_kv": 2,
        "head_dim": 16,
        "dtype": "float32",
        "device": "cpu",
        "warmup": 0,
        "reps": 1,
        "samples": {"document": 1, "single": 2},
        "check": {**specs[0]["check"], "samples": 0},
    }
    monkeypatch.setattr(C, "availability_reason", lambda info, spec: None)
    monkeypatch.setattr(catalog, "unsupported_reason", lambda *a, **k: None)
    monkeypatch.setattr(base, "load", lambda info, **kw: Recorder(info, **kw))
    Recorder.seen = []
    records = {}
    for spec in specs:
        r = C.run_cell(CellSpec.from_dict({**spec, **small}))
        assert r["status"] == "ok", r["status_reason"]
        records[(spec["impl"], spec["direction"])] = r
    assert {name for name, _ in Recorder.seen} == kernels and len(Recorder.seen) == 2 * len(specs)
    by_sample = [Recorder.seen[i::2] for i in range(2)]  # two samples per cell
    for seen in by_sample:
        first = seen[0][1]
        for name, mask in seen[1:]:
            assert mask.params == first.params, name
            assert torch.equal(mask.layout().keep, first.layout().keep), name
            assert torch.equal(mask.layout().row_bounds, first.layout().row_bounds), name
    assert by_sample[0][0][1].params["seed"] != by_sample[1][0][1].params["seed"]  # samples differ
    params = {k: [s["mask_params"] for s in r["samples"]] for k, r in records.items()}
    assert all(p == next(iter(params.values())) for p in params.values())
    assert len({r["data_seed"] for r in records.values()}) == 1
    # and what the library adapters would build from it is the same mask for all of them
    from attnbench.kernels.fa2_sparse import call_arguments
    from attnbench.kernels.flashinfer_sparse import plan_arguments
    from attnbench.kernels.vsa_sparse import vsa_arguments

    mask = by_sample[0][0][1]
    per_head = mask.layout().keep.repeat_interleave(2, dim=0)
    assert torch.equal(
        plan_arguments(mask, 4, 2, 16, torch.float32)["block_mask_map"].repeat_interleave(2, 0),
        per_head,
    )
    if mask_name == "block_sparse":
        assert torch.equal(vsa_arguments(mask)[0][0], per_head)
        assert torch.equal(call_arguments(mask, 4)["base_blockmask"][0], per_head)


FLEX_CASES = [
    ("block_sparse", dict(block_size=64, density=0.5)),
    ("block_sparse", dict(block_size=128, density=0.3, granularity="head")),
    ("variable_block_sparse", dict(avg_block=96, min_block=48, density=0.5)),
    ("variable_block_sparse", dict(avg_block=128, min_block=64, density=0.4, granularity="head")),
]


@pytest.mark.parametrize("name,cfg", FLEX_CASES)
def test_flex_on_block_sparse_matches_float64_reference(name, cfg):
    torch._dynamo.config.recompile_limit = 64
    s, hq, hkv, d = 384 if name == "variable_block_sparse" else 512, 4, 2, 16
    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = catalog.get("flex")
    kernel = base.load(
        info, device=device, dtype=torch.float32, heads_q=hq, heads_kv=hkv, head_dim=d
    )
    mask = M.sample_mask(name, s, cfg, np.random.default_rng(0), heads_q=hq, heads_kv=hkv)
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = [
        torch.randn(sh, generator=g).to(device)
        for sh in [(s, hq, d), (s, hkv, d), (s, hkv, d), (s, hq, d)]
    ]
    fn = kernel.prepare(mask)
    for direction in info.directions[device]:
        if direction == "fwdbwd":
            continue
        backward = direction == "bwd"
        out, grads = C.run_kernel(kernel, fn, q, k, v, dout, direction)
        ref_out, _, ref_grads = reference_attention(q, k, v, mask, dout if backward else None)
        assert rel_err(out, ref_out) < 5e-6
        if backward:
            for n, gr, r in zip(("dq", "dk", "dv"), grads, ref_grads):
                assert rel_err(gr, r) < 5e-6, n
