"""On a CUDA machine: every available GPU kernel against float64, forward and backward, for every
mask it claims; OOM as a record; the GPU timing protocol. Skipped without CUDA."""

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.families.kernel import cell as C
from attnbench.grid.spec import CellSpec
from attnbench.harness import inputs as I
from attnbench.kernels import catalog
from attnbench.kernels.base import load
from attnbench.kernels.fa4_mask_mod import MASK_MODS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CFG = dict(window=100, block=128, block_size=64, density=0.3, avg_block=256, min_block=128)
S, HQ, HKV, D = 1024, 8, 2, 128


def available():
    out = []
    for name, info in catalog.KERNELS.items():
        if "cuda" in info.devices and catalog.missing_module(info) is None:
            out.append(name)
    return out


@pytest.mark.parametrize("impl", available())
def test_gpu_kernel_matches_float64(impl, histograms):
    torch._dynamo.config.recompile_limit = 64
    info = catalog.get(impl)
    cfg = CFG  # a block-sparse kernel at a block size it takes (FA2-sparse: 128 only)
    if info.block_sizes and CFG["block_size"] not in info.block_sizes:
        cfg = {**CFG, "block_size": info.block_sizes[0]}
    ran = 0
    # GQA and MHA: some backends (SDPA's efficient one) refuse GQA, so they are checked at MHA
    for hq, hkv in ((HQ, HKV), (HQ, HQ)):
        try:
            kernel = load(
                info, device="cuda", dtype=torch.bfloat16, heads_q=hq, heads_kv=hkv, head_dim=D
            )
        except C.S.Unavailable as e:  # installed, but cannot load here (vsa's wheel wants CUDA 12)
            pytest.skip(f"{impl}: {e.reason}")
        for mask_name in info.masks:
            if mask_name in M.CP_PATTERNS:
                continue
            mask = M.sample_mask(mask_name, S, cfg, np.random.default_rng(0), histograms, hq, hkv)
            q, k, v, dout = I.make_inputs(7, S, hq, hkv, D, torch.bfloat16, "cuda")
            for direction in ("fwd", "bwd"):
                why = catalog.unsupported_reason(info, mask_name, direction, "cuda", hq, hkv, cfg)
                if why:  # what the cells would record as unsupported (a forward-only build, say)
                    print(f"{impl} {hq}:{hkv} {mask_name} {direction}: unsupported ({why})")
                    continue
                try:
                    fn = kernel.prepare(mask)
                    chk = C.check_correctness(kernel, fn, mask, q, k, v, dout, direction, 5)
                except C.S.Unavailable as e:  # vsa imports its binary in prepare (on the GPU only)
                    pytest.skip(f"{impl}: {e.reason}")
                except C.S.Unsupported as e:
                    print(f"{impl} {hq}:{hkv} {mask_name} {direction}: unsupported ({e.reason})")
                    continue
                assert chk["passed"], (
                    impl,
                    hq,
                    hkv,
                    mask_name,
                    direction,
                    chk["errors"],
                    chk["tolerance"],
                )
                ran += 1
    assert ran > 0


# A length that is no multiple of a tile (FA4's 128, FFA's 128 x 128 forward tiles): the last tile
# is cut by the sequence end. FA4's mask_mod masks, and every mask FFA claims.
OFF_TILE = {"fa4": tuple(MASK_MODS), "ffa": M.STATIC_MASKS}


@pytest.mark.parametrize("impl", [k for k in OFF_TILE if k in available()])
def test_gpu_mask_kernel_at_a_length_off_the_tiles(impl, histograms):
    info, s = catalog.get(impl), 1000
    kernel = load(info, device="cuda", dtype=torch.bfloat16, heads_q=HQ, heads_kv=HKV, head_dim=D)
    q, k, v, dout = I.make_inputs(11, s, HQ, HKV, D, torch.bfloat16, "cuda")
    for mask_name in OFF_TILE[impl]:
        cfg = {**CFG, "block": 40}  # block_causal_document's blocks divide the length
        mask = M.sample_mask(mask_name, s, cfg, np.random.default_rng(1), histograms, HQ, HKV)
        fn = kernel.prepare(mask)
        for direction in ("fwd", "bwd"):
            chk = C.check_correctness(kernel, fn, mask, q, k, v, dout, direction, 5)
            assert chk["passed"], (impl, mask_name, direction, chk["errors"], chk["tolerance"])


def test_oom_is_a_record_and_the_next_cell_runs(histograms):
    base = dict(
        grid="t",
        family="kernel",
        mask="full",
        mask_params={},
        heads_q=64,
        heads_kv=8,
        head_dim=128,
        dtype="bfloat16",
        direction="fwd",
        gpus=1,
        device="cuda",
        samples={"document": 1, "single": 1},
        warmup=1,
        reps=2,
        seed=0,
        check={"max_seqlen": 2048, "tolerance_factor": 5, "samples": 1},
        histograms=None,
    )
    free = torch.cuda.mem_get_info()[0]
    s = 1024
    while 64 * s * s * 2 < 2 * free:  # naive scores alone exceed twice the free memory
        s *= 2
    r = C.run_cell(
        CellSpec.from_dict(
            {**base, "impl": "naive", "seqlen": s, "check": {**base["check"], "samples": 0}}
        )
    )
    assert r["status"] == "oom", r.get("status_reason")
    r = C.run_cell(CellSpec.from_dict({**base, "impl": "sdpa_flash", "seqlen": 4096}))
    assert r["status"] == "ok" and r["tflops"] > 0
    assert r["peak_mem_increment_bytes"] > 0 and r["mem_source"] == "cuda_allocator"


def test_block_mask_at_128k_never_materialises_s_by_s(histograms):
    from attnbench.kernels.flex import block_mask_from_counts

    s = 131072
    m = M.sample_mask("causal_document", s, CFG, np.random.default_rng(0), histograms)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    bm = block_mask_from_counts(m, 128, "cuda")
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < 2**30  # S x S bools would be 16 GiB
    assert bm.shape[-2:] == (s, s)
