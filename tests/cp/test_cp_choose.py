"""`auto` local kernel: the fastest correct one measured on the device, from kernel records on disk.

The records here are written by the test (synthetic TFLOP/s, not measurements) in the layout the
kernel cells write (cells/<grid>/kernel/<impl>/<mask>/<point>.json)."""

import pytest
from attnbench.cp import catalog
from attnbench.cp.choose import choose_local_kernel
from attnbench.grid.expand import output_root
from attnbench.grid.spec import CellSpec
from kernel_records import write_kernel_record

GPU = "NVIDIA H200"


def cell(**changes) -> dict:
    """A ring_p2p cell on 2 GPUs (its dict), with `changes` (cp's merged into its cp)."""
    cp = {
        "local_kernel": "auto",
        "ulysses": 1,
        "ring": 2,
        "windows": 1,
        "placement": "contiguous",
        "gpus_per_node": 8,
        "nodes": 1,
        "nproc_per_node": 2,
        "breakdown": True,
        "timeout_s": 600,
    }
    c = {
        "grid": "g",
        "family": "cp",
        "impl": "ring_p2p",
        "mask": "causal",
        "mask_params": {},
        "seqlen": 32768,
        "device": "cuda",
        "direction": "fwd",
        "gpus": 2,
        "tokens_per_gpu": 16384,
        "heads_q": 64,
        "heads_kv": 8,
        "head_dim": 128,
        "dtype": "bfloat16",
        "samples": {"document": 1, "single": 1},
        "warmup": 1,
        "reps": 1,
        "seed": 0,
        "check": {"max_seqlen": 4096, "tolerance_factor": 5, "samples": 1},
        "histograms": None,
        "cp": {**cp, **changes.pop("cp", {})},
    }
    return {**c, **changes}


def spec(**changes) -> CellSpec:
    return CellSpec.from_dict(cell(**changes))


def record(root, impl, mask, seqlen, direction, tflops, **changes):
    point = f"s{seqlen}-h64x8-d128-bfloat16-{direction}"
    write_kernel_record(root, impl, mask, point, tflops, GPU, **changes)


def test_a_named_kernel_is_what_runs():
    ch = choose_local_kernel(spec(cp={"local_kernel": "sdpa_flash"}), None, GPU)
    assert ch == {
        "setting": "sdpa_flash",
        "local_kernel": "sdpa_flash",
        "reason": "named by the grid",
    }


def test_auto_picks_the_fastest_correct_record_at_the_closest_length(tmp_path):
    record(tmp_path, "sdpa_cudnn", "causal", 16384, "fwd", 600.0)
    record(tmp_path, "sdpa_flash", "causal", 16384, "fwd", 340.0)
    record(tmp_path, "flex", "causal", 8192, "fwd", 700.0)  # farther from 16K than...
    record(
        tmp_path, "flex", "causal", 32768, "fwd", 200.0
    )  # ...this one (log distance: a tie, the longer wins)
    record(tmp_path, "naive", "causal", 16384, "fwd", 900.0, status="incorrect")  # no evidence
    ch = choose_local_kernel(spec(impl="ulysses"), tmp_path, GPU)
    assert ch["local_kernel"] == "sdpa_cudnn" and ch["setting"] == "auto"
    assert "fastest measured on NVIDIA H200 for causal fwd: sdpa_cudnn" in ch["reason"]
    by = {c["local_kernel"]: c for c in ch["candidates"]}
    assert by["flex"]["evidence"][0]["seqlen"] == 32768
    assert by["sdpa_cudnn"]["estimated_tflops"] == pytest.approx(600.0)
    assert (
        by["math"]["cost"] is None
        and "no ok kernel record" in by["math"]["evidence"][0]["missing"]
    )
    # FlashAttention is not installed here: left out, saying why
    assert "needs the Python module" in by["fa3"]["left_out"]


def test_another_device_and_a_failed_check_are_no_evidence(tmp_path):
    record(
        tmp_path, "sdpa_cudnn", "causal", 16384, "fwd", 600.0, environment={"device_name": "H100"}
    )
    record(tmp_path, "sdpa_flash", "causal", 16384, "fwd", 340.0, check_passed=False)
    ch = choose_local_kernel(spec(), tmp_path, GPU)
    # nothing measured: the documented order decides (fa3 and fa2 are not installed here)
    assert ch["local_kernel"] == "sdpa_cudnn"
    assert "no kernel records of causal fwd on NVIDIA H200" in ch["reason"]
    assert "fa3, sdpa_cudnn, fa2, sdpa_flash, flashmask, flex, math" in ch["reason"]


def test_backward_costs_add_up_and_masks_a_kernel_cannot_run_are_left_out(tmp_path):
    """bwd cost = 2.5 / TFLOP/s per part; flex's backward recomputes a forward (1 / fwd TFLOP/s
    more); sdpa_cudnn runs no documents, whatever its records say."""
    record(tmp_path, "flex", "causal_document", 16384, "fwd", 100.0)
    record(tmp_path, "flex", "causal_document", 16384, "bwd", 500.0)  # 1/100 + 2.5/500 = 0.015
    record(tmp_path, "varlen", "causal_document", 16384, "bwd", 200.0)  # 2.5/200 = 0.0125
    record(tmp_path, "sdpa_cudnn", "causal_document", 16384, "bwd", 900.0)
    ch = choose_local_kernel(spec(mask="causal_document", direction="bwd"), tmp_path, GPU)
    assert ch["local_kernel"] == "sdpa_flash"  # its evidence: the varlen kernel's records
    by = {c["local_kernel"]: c for c in ch["candidates"]}
    assert by["flex"]["cost"] == pytest.approx(0.015)
    assert by["sdpa_flash"]["estimated_tflops"] == pytest.approx(200.0)
    assert "cannot express the causal_document mask" in by["sdpa_cudnn"]["left_out"]
    # a *_long mask falls back on the records of its base mask
    ch = choose_local_kernel(spec(mask="causal_document_long", direction="bwd"), tmp_path, GPU)
    assert ch["local_kernel"] == "sdpa_flash"


def test_kernel_grids_restrict_the_evidence_and_more_repetitions_win_a_tie(tmp_path):
    record(tmp_path, "sdpa_cudnn", "full", 16384, "fwd", 600.0, grid="short", reps=5)
    record(tmp_path, "sdpa_cudnn", "full", 16384, "fwd", 500.0, grid="sweep", reps=20)
    record(tmp_path, "sdpa_flash", "full", 16384, "fwd", 550.0, grid="sweep")
    c = spec(mask="full")
    assert choose_local_kernel(c, tmp_path, GPU)["local_kernel"] == "sdpa_flash"  # 550 > 500
    only = spec(mask="full", cp={"local_kernel": "auto", "kernel_grids": ["short"]})
    assert choose_local_kernel(only, tmp_path, GPU)["local_kernel"] == "sdpa_cudnn"


def test_torch_cp_and_its_auto_variant():
    ch = choose_local_kernel(spec(impl="torch_cp"), None, GPU)
    assert ch["local_kernel"] == "sdpa_flash" and "torch_cp_auto" in ch["reason"]
    assert choose_local_kernel(spec(impl="torch_cp_auto"), None, GPU)["local_kernel"] == "auto"


def test_cpu_auto_without_records_is_cpu_flash_and_flex_is_no_backward_choice():
    c = spec(device="cpu", direction="fwdbwd")
    ch = choose_local_kernel(c, None, "some cpu")
    assert ch["local_kernel"] == "cpu_flash"
    by = {x["local_kernel"]: x for x in ch["candidates"]}
    assert "flex has no fwdbwd on cpu" in by["flex"]["left_out"]


def test_output_root_is_where_the_cell_path_starts(tmp_path):
    c = cell()
    from attnbench.grid.expand import cell_path

    assert output_root(tmp_path / cell_path(c), c) == tmp_path
    assert output_root(tmp_path / "elsewhere.json", c) is None
    assert cell_path(c).endswith("-g2-kauto.json")
    assert catalog.library_version("auto").startswith("math: torch")
