"""On a CUDA machine: the gate catches one head of out, dq, dk or dv scaled by 1.02 on every
available GPU kernel, in bf16 and (where the kernel takes it) fp32, while the same kernel unscaled
passes. The CPU counterpart is tests/test_gate_sensitivity.py. Skipped without CUDA."""

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.families.kernel import cell as C
from attnbench.harness import inputs as I
from attnbench.harness.perturb import SCALED, scaled_head
from attnbench.kernels import catalog
from attnbench.kernels.base import load

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

S, HQ, HKV, D = 1024, 8, 2, 128
CFG = dict(window=100, block=128, block_size=128, density=0.3, avg_block=256, min_block=128)
MUTATIONS = [("out", "fwd"), *((n, "bwd") for n in SCALED)]


def available():
    return [
        name
        for name, info in catalog.KERNELS.items()
        if "cuda" in info.devices and catalog.missing_module(info) is None
    ]


def first_mask(info):
    """The first of causal, full, block_sparse that the kernel claims."""
    return next(m for m in ("causal", "full", "block_sparse", *info.masks) if m in info.masks)


@pytest.mark.parametrize("impl", available())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_one_head_scaled_by_two_percent_is_incorrect_on_gpu(impl, dtype, histograms):
    torch._dynamo.config.recompile_limit = 64
    info = catalog.get(impl)
    mask_name = first_mask(info)
    cfg = CFG  # a block-sparse kernel at a block size it takes (FA2-sparse: 128, VSA: 64)
    if info.block_sizes and CFG["block_size"] not in info.block_sizes:
        cfg = {**CFG, "block_size": info.block_sizes[0]}
    hq, hkv = (HQ, HQ) if info.mha_only else (HQ, HKV)
    try:
        kernel = load(info, device="cuda", dtype=dtype, heads_q=hq, heads_kv=hkv, head_dim=D)
    except C.S.Unavailable as e:
        pytest.skip(f"{impl}: {e.reason}")
    mask = M.sample_mask(mask_name, S, cfg, np.random.default_rng(0), histograms, hq, hkv)
    q, k, v, dout = I.make_inputs(7, S, hq, hkv, D, dtype, "cuda")
    try:
        fn = kernel.prepare(mask)
    except (C.S.Unsupported, C.S.Unavailable) as e:  # fp32 on a bf16-only kernel, say
        pytest.skip(f"{impl} {dtype} {mask_name}: {e.reason}")
    ran = 0
    for which, direction in MUTATIONS:
        why = catalog.unsupported_reason(info, mask_name, direction, "cuda", hq, hkv, cfg)
        if why:
            continue
        try:
            right = C.check_correctness(kernel, fn, mask, q, k, v, dout, direction, 5)
        except C.S.Unsupported:  # a backend that refuses fp32 at its first call
            continue
        assert right["passed"], (impl, dtype, direction, right["head_scale"], right["errors"])
        wrong = scaled_head(fn, kernel.layout, which, head=1, factor=1.02)
        chk = C.check_correctness(kernel, wrong, mask, q, k, v, dout, direction, 5)
        assert not chk["passed"], (impl, dtype, which, direction, chk["head_scale"])
        assert chk["head_scale"][which] > chk["head_tolerance"][which]
        print(
            f"{impl} {dtype} {which} {direction}: head scale / tolerance "
            f"{chk['head_scale'][which] / chk['head_tolerance'][which]:.2f} (caught); "
            f"unscaled {right['head_scale'][which] / right['head_tolerance'][which]:.3f}"
        )
        ran += 1
    if not ran:
        pytest.skip(f"{impl} runs neither direction of {mask_name} in {dtype}")
