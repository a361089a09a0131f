"""One cell, end to end: the record, every status, seeds shared across kernels, real OOM."""

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from attnbench.families import expand_cells, load_config
from attnbench.families.kernel import cell as C
from attnbench.grid.spec import CellSpec
from attnbench.harness import faults as F
from attnbench.kernels import catalog
from attnbench.kernels.naive import Naive
from attnbench.record import record as R


@pytest.fixture(scope="module")
def cells(repo):
    cfg = load_config(repo / "config.yaml")
    return expand_cells(cfg, ["smoke"])


def pick(cells, impl, mask, seqlen=128, direction="fwd", **changes):
    c = next(
        c
        for c in cells
        if (c["impl"], c["mask"], c["seqlen"], c["direction"]) == (impl, mask, seqlen, direction)
    )
    return {**c, **changes}


def with_impl(spec, impl):
    return {**spec, "impl": impl}


class CausalWhateverTheMask(Naive):
    """A real kernel with a real bug: it always computes the causal mask."""

    def prepare(self, mask):
        import attnbench.masks as M

        return super().prepare(M.Mask("causal", mask.seqlen))


def test_ok_record_has_everything(cells):
    spec = pick(cells, "sdpa", "causal_document", 256, "bwd")
    r = C.run_cell(CellSpec.from_dict(spec), {"matmul_peak_tflops": 1.0})
    assert r["status"] == "ok" and r["status_reason"] is None
    assert r["cell"] == spec and len(r["cell_id"]) == 16
    assert len(r["samples"]) == spec["samples"]["document"]
    for s in r["samples"]:
        assert sum(s["mask_params"]["doc_lengths"]) == 256
        assert s["mask_area"] > 0 and s["flops"] == 4 * s["mask_area"] * 4 * 32 * 2.5
        assert len(s["time_ms"]) == spec["reps"]
        assert s["time_ms_p20"] <= s["time_ms_median"] <= s["time_ms_p80"]
    chk = r["samples"][0]["check"]
    assert chk["passed"] and set(chk["errors"]) == {"out", "dq", "dk", "dv"}
    assert chk["criterion"] == {"tensors": "row_max_rel", "heads": "head_scale"}
    assert set(chk["frobenius_errors"]) == set(chk["errors"]) == set(chk["head_scale"])
    assert chk["gate_version"] == 3
    floor = 2.0**-24 * (32 + 256)  # float32 accumulation over D + n
    assert all(
        chk["errors"][n] <= chk["tolerance"][n] == 5 * max(chk["naive_errors"][n], floor)
        for n in chk["errors"]
    )
    assert r["time_ms_p20"] <= r["time_ms_median"] <= r["time_ms_p80"]
    assert r["tflops_p20"] <= r["tflops"] <= r["tflops_p80"]
    assert r["fraction_of_peak"] == pytest.approx(r["tflops"])
    assert r["max_rel_err"] < 1e-5
    env = r["environment"]
    assert (
        env["torch"] == torch.__version__
        and "git_commit" in env
        and env["libraries"]["torch"] != "missing"
    )
    json.dumps(R.json_safe(r), allow_nan=False)


def test_record_says_where_its_time_went(cells, tmp_path):
    """Phases add up to no more than the cell's wall time; the busy part is the timed, memory and
    check phases, which the throughput benchmark turns into a busy share."""
    r = C.run_cell(CellSpec.from_dict(pick(cells, "naive", "causal", 256, "bwd")))
    phases = [s["phases_s"] for s in r["samples"]]
    assert all(
        set(p) == {"mask", "inputs", "prepare", "first_call", "timed", "memory", "check"}
        for p in phases
    )
    assert sum(sum(p.values()) for p in phases) <= r["wall_s"] <= r["process_s"]
    busy = sum(p["timed"] + p["memory"] + p["check"] for p in phases)
    assert r["device_busy_ms"] == pytest.approx(busy * 1e3)
    assert r["device_busy_ms"] >= sum(t for s in r["samples"] for t in s["time_ms"])
    (tmp_path / "r.json").write_text(json.dumps(R.json_safe(r)))
    bench = Path(__file__).parents[1] / "benchmarks" / "harness_throughput.py"
    out = subprocess.run(
        [
            sys.executable,
            str(bench),
            str(tmp_path),
            "--gpus",
            "2",
            "--wall-s",
            "60",
            "--json",
            str(tmp_path / "t.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    t = json.loads((tmp_path / "t.json").read_text())
    assert t["timed"] == 1 and t["busy_share"] == pytest.approx(r["device_busy_ms"] / 1e3 / 120)
    assert t["cells_per_gpu_minute"] == pytest.approx(0.5) and "busy_share" in out.stdout


def test_unsupported_and_unavailable_are_records(cells):
    r = C.run_cell(CellSpec.from_dict(pick(cells, "flex", "causal", 256, "bwd")))
    assert r["status"] == "unsupported" and "no bwd on cpu" in r["status_reason"]
    r = C.run_cell(CellSpec.from_dict(pick(cells, "fa3", "causal")))
    assert r["status"] == "unavailable" and "runs only on cuda" in r["status_reason"]
    assert "tflops" not in r and r["samples"] == []


def test_same_seed_same_masks_across_kernels(cells):
    a = C.run_cell(CellSpec.from_dict(pick(cells, "naive", "prefix_lm_document", 256, "fwd")))
    b = C.run_cell(CellSpec.from_dict(pick(cells, "sdpa_math", "prefix_lm_document", 256, "bwd")))
    assert a["data_seed"] == b["data_seed"]
    assert [s["mask_params"] for s in a["samples"]] == [s["mask_params"] for s in b["samples"]]


def test_incorrect_kernel_is_flagged_and_timed(cells, monkeypatch):
    info = catalog.KernelInfo(
        "buggy",
        "dense",
        "test kernel",
        "test_cell:CausalWhateverTheMask",
        catalog.DENSE_MASKS,
        {"cpu": ("fwd", "bwd")},
    )
    monkeypatch.setitem(catalog.KERNELS, "buggy", info)
    r = C.run_cell(CellSpec.from_dict(with_impl(pick(cells, "naive", "full"), "buggy")))
    assert (
        r["status"] == "incorrect" and "disagree with the float64 reference" in r["status_reason"]
    )
    assert r["tflops"] > 0 and r["max_rel_err"] > 0.1
    # the same kernel on the mask it really computes is fine
    assert (
        C.run_cell(CellSpec.from_dict(with_impl(pick(cells, "naive", "causal"), "buggy")))[
            "status"
        ]
        == "ok"
    )


def test_reduced_length_correctness_check(cells):
    spec = pick(
        cells,
        "sdpa",
        "block_causal_document",
        256,
        "bwd",
        check={"max_seqlen": 200, "tolerance_factor": 5, "samples": 1},
    )
    r = C.run_cell(CellSpec.from_dict(spec))
    chk = r["samples"][0]["check"]
    assert r["status"] == "ok" and chk["seqlen"] == 192  # a multiple of the 64-token block
    assert sum(chk["mask_params"]["doc_lengths"]) == 192


def run_cell_in_3_gib(spec, out, timeout):
    """`python -m attnbench cell` in a process of 3 GiB of address space; the job must succeed
    whatever the cell does, and its record is returned."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    p = subprocess.run(
        [sys.executable, "-m", "attnbench", "cell", "--spec", json.dumps(spec), "--out", str(out)],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(out.read_text())


def test_real_out_of_memory_is_a_record_and_the_job_succeeds(cells, tmp_path):
    """naive attention at S = 16K needs 4 GiB of scores; the process may have 3 GiB."""
    spec = pick(cells, "naive", "full")
    spec.update(seqlen=16384, check={**spec["check"], "samples": 0})
    r = run_cell_in_3_gib(spec, tmp_path / "oom.json", timeout=300)
    assert r["status"] == "oom" and "can't allocate memory" in r["status_reason"]
    assert "tflops" not in r


def test_reference_out_of_memory_retries_shorter_and_keeps_the_timings(cells, tmp_path):
    """SDPA at S = 16K fits in 3 GiB; the float64 reference there (4 GiB of scores per KV group)
    does not, nor at 8K: the check runs at 4K, the cell is `ok`, its timings are kept."""
    spec = pick(cells, "sdpa", "full")
    spec.update(
        seqlen=16384, warmup=0, reps=1, check={**spec["check"], "max_seqlen": 16384, "samples": 1}
    )
    r = run_cell_in_3_gib(spec, tmp_path / "check_oom.json", timeout=600)
    chk = r["samples"][0]["check"]
    assert r["status"] == "ok" and r["tflops"] > 0
    assert (
        chk["out_of_memory_at_seqlen"][0] == 16384
        and chk["seqlen"] == chk["out_of_memory_at_seqlen"][-1] // 2
    )
    assert chk["passed"] and sum(1 for _ in chk["errors"]) == 1


def test_document_masks_check_three_samples(cells):
    def checked(mask, document, single) -> list[bool]:
        """Which samples a one-repetition sdpa cell checks against the reference."""
        samples = {"document": document, "single": single}
        spec = pick(cells, "sdpa", mask, samples=samples, warmup=0, reps=1)
        assert spec["check"]["samples"] == 1
        return [("check" in s) for s in C.run_cell(CellSpec.from_dict(spec))["samples"]]

    assert checked("causal_document", 4, 1) == [True, True, True, False]
    assert checked("causal_document", 2, 1) == [True, True]  # fewer than 3: all of them
    assert checked("causal", 4, 2) == [True, False]  # a single-sequence mask: check.samples


def test_a_crash_writes_no_record(cells, tmp_path, monkeypatch):
    monkeypatch.setenv(F.CRASH_ENV, "naive/causal/s128")
    spec = pick(cells, "naive", "causal")
    out = tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, "-m", "attnbench", "cell", "--spec", json.dumps(spec), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0 and "crash injected" in p.stderr
    assert not out.exists()
