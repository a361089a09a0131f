"""The library adapters (VSA, FlashInfer, MIT Block-Sparse-Attention): `unavailable` where the
library is absent, and the arguments each builds from a Mask, checked against the library's
documented API and against the mask itself (expanded back to tokens, it is the same mask)."""

import importlib.metadata
import inspect
import os

import attnbench.masks as M
import numpy as np
import pytest
import torch
from attnbench.families.kernel import cell as C
from attnbench.grid.spec import CellSpec
from attnbench.kernels import catalog
from attnbench.kernels.base import load
from attnbench.kernels.fa2_sparse import FA2_SPARSE_BLOCK, call_arguments
from attnbench.kernels.flashinfer_sparse import plan_arguments
from attnbench.kernels.vsa_sparse import vsa_arguments
from attnbench.record.status import Unsupported

LIBRARIES = {
    "vsa": "vsa",
    "vsa_triton": "vsa",
    "flashinfer": "flashinfer",
    "fa2_sparse": "block_sparse_attn",
}

# The documented signatures (vsa 0.0.4 block_sparse_wrapper; flashinfer.sparse
# VariableBlockSparseAttentionWrapper.plan; block_sparse_attn.block_sparse_attn_func).
FLASHINFER_PLAN = (
    "block_mask_map",
    "block_row_sz",
    "block_col_sz",
    "num_qo_heads",
    "num_kv_heads",
    "head_dim",
    "causal",
    "pos_encoding_mode",
    "use_fp16_qk_reduction",
    "logits_soft_cap",
    "sm_scale",
    "rope_scale",
    "rope_theta",
    "non_blocking",
    "q_data_type",
    "kv_data_type",
)
FA2_SPARSE_FUNC = (
    "cu_seqlens_q",
    "cu_seqlens_k",
    "head_mask_type",
    "streaming_info",
    "base_blockmask",
    "max_seqlen_q_",
    "max_seqlen_k_",
    "p_dropout",
    "deterministic",
    "softmax_scale",
    "is_causal",
    "exact_streaming",
    "return_attn_probs",
)


def uniform(s, block, hq, hkv, density=0.5, seed=0, granularity="kv_head"):
    return M.sample_mask(
        "block_sparse",
        s,
        dict(block_size=block, density=density, granularity=granularity),
        np.random.default_rng(seed),
        heads_q=hq,
        heads_kv=hkv,
    )


def expand_blocks(block_map, row_sizes, col_sizes):
    """[..., R, C] block map with block sizes -> token-level [..., S, S] (the test's own expansion)."""
    out = block_map.repeat_interleave(row_sizes, dim=-2)
    return out.repeat_interleave(col_sizes, dim=-1)


@pytest.mark.parametrize("impl", list(LIBRARIES))
def test_absent_library_gives_an_unavailable_record(impl, repo):
    if catalog.missing_module(catalog.get(impl)) is None:
        pytest.skip(f"{LIBRARIES[impl]} is installed here")
    from attnbench.families import expand_grid, load_config

    cfg = load_config(repo / "config.yaml")
    spec = next(
        c for c in expand_grid(cfg, "h200_sparse") if c["impl"] == impl and c["direction"] == "fwd"
    )
    r = C.run_cell(CellSpec.from_dict(spec))
    assert r["status"] == "unavailable"
    assert f"needs the Python module {LIBRARIES[impl]!r}" in r["status_reason"]
    assert r["samples"] == [] and r["kernel"]["library_version"] == "missing"


# What each library documents (docs/kernels.md's table, from the libraries' READMEs and the paper):
# (masks, directions, block sizes, GQA). Written out here, not read from the catalog.
# FA2-sparse's README documents its backward too (released 2024/10); the paper timed its forward.
DOCUMENTED = {
    "vsa": (("block_sparse",), ("fwd", "bwd"), (64,), False),
    "vsa_triton": (("block_sparse",), ("fwd", "bwd"), (64,), False),
    "fa2_sparse": (("block_sparse",), ("fwd", "bwd"), (128,), True),
    "flashinfer": (("block_sparse", "variable_block_sparse"), ("fwd",), None, True),
}


@pytest.mark.parametrize("impl", list(DOCUMENTED))
def test_sparse_kernels_accept_exactly_what_their_libraries_document(impl):
    masks, directions, blocks, gqa = DOCUMENTED[impl]
    info = catalog.get(impl)
    assert "cpu" not in info.devices  # GPU libraries
    for mask in M.SPARSE_MASKS:
        for direction in ("fwd", "bwd"):
            for block in (64, 128):
                for hq, hkv in ((64, 64), (64, 8)):
                    why = catalog.unsupported_reason(
                        info, mask, direction, "cuda", hq, hkv, {"block_size": block}
                    )
                    documented = (
                        mask in masks
                        and direction in directions
                        and (blocks is None or block in blocks)
                        and (gqa or hq == hkv)
                    )
                    assert (why is None) == documented, (
                        impl,
                        mask,
                        direction,
                        block,
                        hq,
                        hkv,
                        why,
                    )


def test_vsa_arguments_encode_the_mask():
    m = uniform(256, 64, 4, 4)
    block_map, sizes = vsa_arguments(m)
    assert block_map.shape == (1, 4, 4, 4) and block_map.dtype == torch.bool
    assert sizes.dtype == torch.int32 and sizes.tolist() == [64] * 4
    assert torch.equal(expand_blocks(block_map[0], sizes, sizes), m.dense())


def test_vsa_refuses_what_it_cannot_run_before_importing_it():
    k = load(
        catalog.get("vsa"), device="cpu", dtype=torch.bfloat16, heads_q=4, heads_kv=4, head_dim=32
    )
    with pytest.raises(Unsupported, match="64-token blocks"):
        k.prepare(uniform(256, 128, 4, 4))
    k = load(
        catalog.get("vsa"), device="cpu", dtype=torch.float16, heads_q=4, heads_kv=4, head_dim=32
    )
    with pytest.raises(Unsupported, match="bfloat16 only"):
        k.prepare(uniform(256, 64, 4, 4))


@pytest.mark.parametrize("variable", [False, True])
def test_flashinfer_plan_arguments_encode_the_mask(variable):
    hq, hkv, s = 8, 2, 512
    if variable:
        m = M.sample_mask(
            "variable_block_sparse",
            s,
            dict(avg_block=128, min_block=64, density=0.5),
            np.random.default_rng(1),
            heads_q=hq,
            heads_kv=hkv,
        )
    else:
        m = uniform(s, 64, hq, hkv)
    args = plan_arguments(m, hq, hkv, 32, torch.bfloat16)
    assert set(args) <= set(FLASHINFER_PLAN)
    assert args["num_qo_heads"] == hq and args["num_kv_heads"] == hkv and args["head_dim"] == 32
    assert (
        args["q_data_type"] == args["kv_data_type"] == torch.bfloat16 and args["causal"] is False
    )
    mm, rows, cols = args["block_mask_map"], args["block_row_sz"], args["block_col_sz"]
    assert mm.dtype == torch.bool and mm.shape[0] == hkv and rows.shape == mm.shape[:2]
    assert cols.shape == (hkv, mm.shape[2]) and rows.dtype == cols.dtype == torch.int32
    assert (rows.sum(1) == s).all() and (cols.sum(1) == s).all()
    dense = m.dense()
    for h in range(
        hq
    ):  # a query head uses its KV head's map (documented: a group shares the pattern)
        g = h // (hq // hkv)
        assert torch.equal(expand_blocks(mm[g], rows[g], cols[g]), dense[h])


def test_flashinfer_refuses_per_query_head_masks_under_gqa():
    m = uniform(256, 64, 4, 2, granularity="head")
    with pytest.raises(Unsupported, match="per KV head"):
        plan_arguments(m, 4, 2, 32, torch.bfloat16)
    mha = uniform(256, 64, 4, 4, granularity="head")
    assert plan_arguments(mha, 4, 4, 32, torch.bfloat16)["block_mask_map"].shape[0] == 4


def test_flashinfer_counts_the_token_indices_its_plan_builds():
    """plan() expands every kept block into key-token indices per (KV head, query block), in int32:
    the count is the expanded mask's kept pairs over query-block rows (variable blocks too)."""
    from attnbench.kernels.flashinfer_sparse import indexed_tokens

    for name, cfg in (
        ("block_sparse", dict(block_size=64, density=0.5)),
        ("variable_block_sparse", dict(avg_block=128, min_block=64, density=0.5)),
    ):
        m = M.sample_mask(name, 512, cfg, np.random.default_rng(2), heads_q=4, heads_kv=2)
        lay = m.layout()
        keep_rows = torch.stack(  # per group: [query block, key token] kept
            [
                expand_blocks(
                    lay.keep[g],
                    torch.ones_like(lay.row_bounds[g].diff()),
                    lay.col_bounds[g].diff(),
                )
                for g in range(2)
            ]
        )
        assert indexed_tokens(lay) == int(keep_rows.sum())


def test_flashinfer_is_unsupported_where_its_int32_token_indices_would_wrap():
    """At 64K, MHA 64:64, block 64, density 0.5 the plan would index exactly 2^31 tokens: the
    H200 run failed there inside FlashInfer (its own assertion, on wrapped int32 offsets)."""
    big = uniform(65536, 64, 64, 64)
    with pytest.raises(Unsupported, match="2,147,483,648 here, more than 2,147,483,647"):
        plan_arguments(big, 64, 64, 128, torch.bfloat16)
    ok = uniform(65536, 128, 64, 64)  # block 128: half as many query blocks, half the indices
    assert plan_arguments(ok, 64, 64, 128, torch.bfloat16)["block_mask_map"].shape == (
        64,
        512,
        512,
    )


@pytest.mark.parametrize("granularity", ["kv_head", "head"])
def test_fa2_sparse_arguments_encode_the_mask(granularity):
    hq, hkv, s = 8, 2, 512
    m = uniform(s, FA2_SPARSE_BLOCK, hq, hkv, granularity=granularity)
    args = call_arguments(m, hq)
    assert tuple(args) == FA2_SPARSE_FUNC  # keyword for keyword, in the documented order
    assert args["cu_seqlens_q"].tolist() == [0, s] and args["cu_seqlens_q"].dtype == torch.int32
    assert args["max_seqlen_q_"] == args["max_seqlen_k_"] == s and args["p_dropout"] == 0.0
    assert args["head_mask_type"].tolist() == [1] * hq  # every head block-sparse
    assert (
        args["streaming_info"].shape == (2 * hq,) and args["streaming_info"].dtype == torch.int32
    )
    bm = args["base_blockmask"]
    assert (
        bm.shape == (1, hq, s // FA2_SPARSE_BLOCK, s // FA2_SPARSE_BLOCK)
        and bm.dtype == torch.bool
    )
    sizes = torch.full((s // FA2_SPARSE_BLOCK,), FA2_SPARSE_BLOCK)
    assert torch.equal(expand_blocks(bm[0], sizes, sizes), m.dense())


def test_a_library_that_fails_to_import_makes_the_cell_unavailable(tmp_path, monkeypatch):
    """The real `vsa` queries the GPU at import and raises without one: unavailable, not a crash."""
    from attnbench.record.status import Unavailable

    pkg = tmp_path / "vsa"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise RuntimeError('Found no NVIDIA driver on your system.')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "vsa", raising=False)
    k = load(
        catalog.get("vsa"), device="cpu", dtype=torch.bfloat16, heads_q=4, heads_kv=4, head_dim=32
    )
    with pytest.raises(Unavailable, match="importing vsa failed: Found no NVIDIA driver"):
        k.prepare(uniform(256, 64, 4, 4))


@pytest.mark.parametrize(
    "symbol, missing",
    [  # what vsa 0.0.4's binary lacked under torch 2.11 (H200, 2026-12-01), what fastvideo-kernel
        # 0.3.5's lacked beside torch's NCCL 2.28.9 (same day), and a symbol of neither
        ("_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib", "torch"),
        ("ncclCommQueryProperties", "nccl"),
        ("cudaLaunchKernelExC", None),
    ],
)
def test_a_binary_built_against_another_torch_is_named_so(tmp_path, monkeypatch, symbol, missing):
    from attnbench.record.status import Unavailable

    pkg = tmp_path / "vsa"
    pkg.mkdir()
    so = "/tmp/site/vsa_cuda.cpython-312-x86_64-linux-gnu.so"
    (pkg / "__init__.py").write_text(f"raise ImportError('{so}: undefined symbol: {symbol}')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "vsa", raising=False)
    k = load(
        catalog.get("vsa"), device="cpu", dtype=torch.bfloat16, heads_q=4, heads_kv=4, head_dim=32
    )
    with pytest.raises(Unavailable) as e:
        k.prepare(uniform(256, 64, 4, 4))
    assert f"undefined symbol: {symbol}" in e.value.reason
    hint = f"built against another torch than {torch.__version__}"
    assert (hint in e.value.reason) == (missing == "torch")
    assert ("the binary needs a newer NCCL than torch's" in e.value.reason) == (missing == "nccl")


def test_a_library_release_that_does_not_match_its_dependency_makes_the_cell_unavailable(
    tmp_path, monkeypatch
):
    """FA4 4.0.0b36 beside an older CuTe DSL raised AttributeError at import (H200, 2026-12-01)."""
    import sys

    from attnbench.families.kernel import cell
    from attnbench.record.status import Unavailable

    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text(
        "raise AttributeError(\"module 'cutlass.cute.core' has no attribute 'ThrMma'\")\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    info = catalog.get("fa4")
    assert cell.import_failure(info)
    k = load(info, device="cpu", dtype=torch.bfloat16, heads_q=4, heads_kv=2, head_dim=32)
    with pytest.raises(Unavailable, match="importing flash_attn.cute failed: module 'cutlass"):
        k.functions()


def test_a_library_that_loads_only_after_torch_is_judged_as_the_measuring_process_sees_it(
    tmp_path,
):
    """block_sparse_attn's extension links torch's libraries: imported before torch (in a job
    that needs no torch, its worker measuring) it fails. On the H200 the job then took its cells
    for `unavailable`, held no GPU, and measured them beside the worker's cells. The job's verdict
    must be the measuring process's."""
    import subprocess
    import sys

    from commands import package_env

    pkg = tmp_path / "block_sparse_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import sys\n"
        "if 'torch' not in sys.modules:\n"
        "    raise ImportError('libc10.so: cannot open shared object file: No such file or directory')\n"
    )
    code = (
        "import sys\n"
        "from attnbench.families.kernel import cell\n"
        "from attnbench.kernels import catalog\n"
        "assert 'torch' not in sys.modules\n"
        "print(cell.import_failure(catalog.get('fa2_sparse')))\n"
    )
    env = package_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "None"


def test_a_cell_judged_to_end_without_a_gpu_is_never_measured(tmp_path, monkeypatch, repo):
    """run_cell(CellSpec.from_dict(measure=False)): the library's import failure is the record; a kernel that loads
    after all is an error, not a measurement without the GPU's lock."""
    import sys

    from attnbench.families.kernel import cell

    (tmp_path / "block_sparse_attn").mkdir()
    (tmp_path / "block_sparse_attn" / "__init__.py").write_text(
        "raise ImportError('libc10.so: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "block_sparse_attn", raising=False)
    monkeypatch.setattr(cell, "availability_reason", lambda info, spec: None)  # as on a GPU
    from attnbench.families import expand_grid, load_config

    cells = expand_grid(load_config(repo / "config.yaml"), "smoke_sparse")
    smoke = next(c for c in cells if c["impl"] == "fa2_sparse")
    spec = {**smoke, "device": "cuda", "mask_params": {**smoke["mask_params"], "block_size": 128}}
    record = cell.run_cell(CellSpec.from_dict(spec), measure=False)
    assert record["status"] == "unavailable" and not record["samples"]
    assert "importing block_sparse_attn failed: libc10.so" in record["status_reason"]
    naive = next(c for c in cells if c["impl"] == "naive")
    with pytest.raises(
        RuntimeError, match="kernel loads: not measuring it without holding the GPU"
    ):
        cell.run_cell(CellSpec.from_dict(naive), measure=False)


def test_fa2_sparse_refuses_64_token_blocks_before_importing_it():
    k = load(
        catalog.get("fa2_sparse"),
        device="cpu",
        dtype=torch.bfloat16,
        heads_q=4,
        heads_kv=2,
        head_dim=32,
    )
    with pytest.raises(Unsupported, match="128-token blocks"):
        k.prepare(uniform(256, 64, 4, 2))


@pytest.mark.parametrize(
    "impl,func", [("fa2_sparse", "block_sparse_attn_func"), ("flashinfer", None)]
)
def test_installed_library_matches_the_documented_signature(impl, func):
    """Where the library is installed, its real signature still has the keywords we pass."""
    if catalog.missing_module(catalog.get(impl)):
        pytest.skip(f"{LIBRARIES[impl]} is not installed here")
    if impl == "fa2_sparse":
        import block_sparse_attn

        params = inspect.signature(getattr(block_sparse_attn, func)).parameters
        assert set(FA2_SPARSE_FUNC) <= set(params)
    else:
        import flashinfer

        params = inspect.signature(flashinfer.VariableBlockSparseAttentionWrapper.plan).parameters
        assert set(FLASHINFER_PLAN) <= set(params)


def lists_to_map(index, num, cols):
    """[..., R, k] index lists (first num valid) -> [..., R, cols] bool map (the test's own)."""
    out = torch.zeros(*index.shape[:-1], cols + 1, dtype=torch.bool)
    valid = torch.arange(index.shape[-1]) < num[..., None]
    out.scatter_(-1, torch.where(valid, index.long(), cols), True)  # padding into a spare column
    return out[..., :cols]


@pytest.mark.parametrize("granularity", ["kv_head", "head"])
def test_vsa_triton_index_lists_encode_the_mask_and_its_transpose(granularity):
    from attnbench.kernels.vsa_sparse import vsa_triton_arguments

    m = uniform(512, 64, 4, 4, density=0.3, granularity=granularity)
    a = vsa_triton_arguments(m)
    keep = m.layout().keep.repeat_interleave(4 // m.layout().groups, dim=0)  # [H, 8, 8]
    for name in ("q2k_index", "q2k_num", "k2q_index", "k2q_num"):
        assert a[name].dtype == torch.int32 and a[name].shape[:2] == (1, 4), name
    q2k, k2q = (a["q2k_index"][0], a["q2k_num"][0]), (a["k2q_index"][0], a["k2q_num"][0])
    assert torch.equal(lists_to_map(*q2k, 8), keep)
    assert torch.equal(lists_to_map(*k2q, 8), keep.transpose(-1, -2))
    for index, num in (q2k, k2q):  # increasing, then -1 padding (VSA's layout)
        valid = torch.arange(index.shape[-1]) < num[..., None]
        assert (index[~valid] == -1).all() and (index[valid] >= 0).all()
        assert (index[..., 1:] > index[..., :-1])[valid[..., 1:]].all()
    assert a["variable_block_sizes"].tolist() == [64] * 8


def test_vsa_triton_loads_vsas_triton_file_without_the_package():
    """The wheel's __init__ loads its CUDA kernels (and on a CPU asks torch for a device): the
    Triton VSA must not depend on it, so a cell can tell the two apart."""
    if catalog.missing_module(catalog.get("vsa_triton")):
        pytest.skip("vsa is not installed here")
    import sys

    from attnbench.families.kernel import cell
    from attnbench.kernels.vsa_sparse import vsa_triton_module

    mod = vsa_triton_module()
    assert callable(mod.triton_block_sparse_attn_forward)
    assert callable(mod.triton_block_sparse_attn_backward)
    assert "vsa" not in sys.modules  # the package itself was not imported
    assert not cell.import_failure(catalog.get("vsa_triton"))
    if not torch.cuda.is_available():  # its __init__ cannot run without a GPU
        assert cell.import_failure(catalog.get("vsa"))


def test_cuda12_runtime_is_loaded_from_its_wheel_where_installed():
    from attnbench.kernels.vsa_sparse import CUDART12_DIST, preload_cuda12_runtime

    how = preload_cuda12_runtime()
    try:
        dist = importlib.metadata.distribution(CUDART12_DIST)
    except importlib.metadata.PackageNotFoundError:
        assert how.startswith(f"{CUDART12_DIST} is not installed")
        return
    path = str(dist.locate_file("nvidia/cuda_runtime/lib/libcudart.so.12"))
    assert how == f"libcudart.so.12 loaded from {path} ({CUDART12_DIST} {dist.version})"
    maps = open("/proc/self/maps").read()
    assert os.path.realpath(path) in maps  # really loaded into this process


def test_the_record_says_how_vsa_was_loaded(tmp_path, monkeypatch, repo):
    """Also when loading fails: the cuda_runtime note joins the record's kernel notes."""
    from attnbench.families import expand_grid, load_config

    pkg = tmp_path / "vsa"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "vsa", raising=False)
    spec = next(
        c
        for c in expand_grid(load_config(repo / "config.yaml"), "h200_sparse")
        if c["impl"] == "vsa" and c["heads_kv"] == 64 and c["seqlen"] == 32768
    )
    small = dict(seqlen=256, heads_q=2, heads_kv=2, head_dim=16, device="cpu")
    monkeypatch.setattr(C, "availability_reason", lambda info, spec: None)
    monkeypatch.setattr(catalog, "unsupported_reason", lambda *a, **k: None)  # CUDA-only kernel
    r = C.run_cell(CellSpec.from_dict({**spec, **small}))
    assert r["status"] == "unavailable" and "libcudart.so.12" in r["status_reason"]
    assert "libcudart.so.12" in r["kernel"]["notes"]["cuda_runtime"]


def test_a_failed_flashinfer_build_names_the_compiler_error():
    from attnbench.kernels.flashinfer_sparse import jit_failure_line

    # FlashInfer 0.7.2's run_ninja message around what nvcc printed (here: no curand headers)
    message = (
        "Ninja build failed. Ninja output:\n[1/4] /usr/local/cuda/bin/nvcc ... -c prefill.cu\n"
        "FAILED: prefill.cuda.o\nIn file included from flashinfer/cutlass_utils.cuh:42,\n"
        "cutlass/util/reference/device/tensor_fill.h:52:10: fatal error: curand_kernel.h: "
        "No such file or directory\ncompilation terminated.\n"
        "ninja: build stopped: subcommand failed.\n"
    )
    assert jit_failure_line(message).endswith(
        "fatal error: curand_kernel.h: No such file or directory"
    )
    assert jit_failure_line("nvcc not found\n") == "nvcc not found"


def fake_fastvideo_kernel(root, hopper=True):
    """A stand-in for PyPI fastvideo-kernel's interface (its wheel needs a GPU to import):
    block_sparse_attn(q, k, v, block_map, variable_block_sizes) -> (out, lse), recording its
    arguments, and the Hopper extension the adapter requires."""
    pkg = root / "fastvideo_kernel"
    (pkg / "_C").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "calls = []\n"
        "def block_sparse_attn(q, k, v, block_map, variable_block_sizes):\n"
        "    calls.append((block_map, variable_block_sizes))\n"
        "    return q, None\n"
    )
    (pkg / "_C" / "__init__.py").write_text("")
    ops = "block_sparse_fwd = block_sparse_bwd = object()\n" if hopper else ""
    (pkg / "_C" / "fastvideo_kernel_ops.py").write_text(ops)
    meta = root / "fastvideo_kernel-0.3.2.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fastvideo-kernel\nVersion: 0.3.2\n"
    )


def vsa_with_fastvideo(tmp_path, monkeypatch, hopper=True):
    import sys

    symbol = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib"
    (tmp_path / "vsa").mkdir()
    (tmp_path / "vsa" / "__init__.py").write_text(
        f"raise ImportError('undefined symbol: {symbol}')\n"
    )
    fake_fastvideo_kernel(tmp_path, hopper)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in (
        "vsa",
        "fastvideo_kernel",
        "fastvideo_kernel._C",
        "fastvideo_kernel._C.fastvideo_kernel_ops",
    ):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return load(
        catalog.get("vsa"), device="cpu", dtype=torch.bfloat16, heads_q=4, heads_kv=4, head_dim=32
    )


def test_vsa_runs_from_fastvideo_kernel_where_vsa_cannot_load(tmp_path, monkeypatch):
    import sys

    from attnbench.kernels.vsa_sparse import vsa_arguments

    k = vsa_with_fastvideo(tmp_path, monkeypatch)
    mask = uniform(256, 64, 4, 4)
    fn = k.prepare(mask)
    q = torch.randn(1, 4, 256, 32, dtype=torch.bfloat16)
    assert fn(q, q, q) is q
    block_map, sizes = sys.modules["fastvideo_kernel"].calls[0]
    want_map, want_sizes = vsa_arguments(mask)
    assert torch.equal(block_map, want_map) and torch.equal(sizes, want_sizes)
    library = k.load_notes["library"]
    assert library.startswith("fastvideo_kernel 0.3.2 (importing vsa failed: undefined symbol")
    assert "built against another torch" in library


def test_fastvideo_kernel_without_its_hopper_kernels_is_unavailable(tmp_path, monkeypatch):
    """Its own block_sparse_attn would quietly run Triton (vsa_triton's kernel) instead."""
    from attnbench.record.status import Unavailable

    k = vsa_with_fastvideo(tmp_path, monkeypatch, hopper=False)
    with pytest.raises(
        Unavailable,
        match="importing vsa failed: .*; importing fastvideo_kernel "
        "failed: this fastvideo_kernel has no Hopper block_sparse_fwd/bwd",
    ):
        k.prepare(uniform(256, 64, 4, 4))
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    with pytest.raises(
        Unavailable, match="FASTVIDEO_VSA_TRITON=1 makes fastvideo_kernel run Triton"
    ):
        k.prepare(uniform(256, 64, 4, 4))


def test_fastvideo_kernels_bundled_libcuda_comes_after_the_machines(tmp_path, monkeypatch):
    """fastvideo-kernel 0.3.2's wheel carries libcuda 580.173.02: the machine's libcuda.so.1 is
    loaded first (globally); where there is none (no driver), the cell says so."""
    import ctypes

    from attnbench.kernels.vsa_sparse import bundled_libcuda
    from attnbench.record.status import Unavailable

    k = vsa_with_fastvideo(tmp_path, monkeypatch)
    assert bundled_libcuda() == []
    (tmp_path / "fastvideo_kernel.libs").mkdir()
    (tmp_path / "fastvideo_kernel.libs" / "libcuda-dcdf334a.so.580.173.02").write_bytes(b"")
    assert [p.name for p in bundled_libcuda()] == ["libcuda-dcdf334a.so.580.173.02"]
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        with pytest.raises(Unavailable, match="importing fastvideo_kernel failed: libcuda.so.1"):
            k.prepare(uniform(256, 64, 4, 4))
    else:  # a machine with an NVIDIA driver
        k.prepare(uniform(256, 64, 4, 4))
        assert k.load_notes["library"].startswith("fastvideo_kernel 0.3.2")
