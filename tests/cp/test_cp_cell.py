"""The distributed cell end to end: the record, statuses known up front, and out-of-memory on one
rank giving `oom` on every rank without a hang."""

import copy
import json
import os
import time

import pytest
from attnbench.families import expand_cells, validate
from attnbench.families.cp.cell import MEMORY_LIMIT_ENV, run_cp_cell
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import CellSpec
from attnbench.harness import faults as F
from attnbench.harness.environment import cpu_model
from bounded import run_bounded
from commands import cp_cell_cmd
from kernel_records import write_kernel_record

GRID = {
    "family": "cp",
    "device": "cpu",
    "methods": ["ring_p2p"],
    "masks": ["causal_document_long"],
    "tokens_per_gpu": [48],
    "gpus": [2],
    "heads": [[4, 2]],
    "head_dim": [16],
    "dtype": ["float32"],
    "direction": ["fwdbwd"],
    "mask_params": {"long_doc_range": [16, 40]},
    "samples": {"document": 2, "single": 1},
    "warmup": 1,
    "reps": 3,
    "check": {"max_seqlen": 512, "tolerance_factor": 5, "samples": 1},
    "cp": {"local_kernel": "cpu_flash", "timeout_s": 60},
}


def spec(base, **changes):
    cfg = copy.deepcopy(base)
    cfg["run"] = ["t"]
    cfg["grids"] = {"t": {**copy.deepcopy(GRID), **changes}}
    (cell,) = expand_cells(validate(cfg))
    return cell


def launch(cell, out, env=None, timeout=240):
    t0 = time.perf_counter()
    p = run_bounded(cp_cell_cmd(cell, out), timeout, env={**os.environ, **(env or {})})
    return p, time.perf_counter() - t0


def test_ok_record_has_what_the_spec_lists(base, tmp_path):
    cell = spec(base)
    out = tmp_path / "r.json"
    p, _ = launch(cell, out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["status"] == "ok" and r["cell"] == cell and r["kernel"]["local_kernel"] == "cpu_flash"
    assert len(r["samples"]) == 2
    for s in r["samples"]:
        assert sum(s["mask_params"]["doc_lengths"]) == 96 and len(s["time_ms"]) == 3
        assert (
            s["flops"] == 4 * s["mask_area"] * 4 * 16 * 3.5
        )  # exact area, fwd+bwd, padding never counts
        assert s["tflops_median"] == pytest.approx(
            s["flops"] / (s["time_ms_median"] * 1e-3) / 1e12 / 2
        )
        assert len(s["ranks"]) == 2 and {tuple(x["coords"]) for x in s["ranks"]} == {
            (0, 0),
            (1, 0),
        }
        for x in s["ranks"]:  # per rank: memory, counted and analytic bytes
            assert (
                x["peak_mem_bytes"] > 0 and x["bytes"]["sent"] == x["bytes_analytic"]["sent"] > 0
            )
            assert set(x["bytes"]["by_kind_sent"]) == {"ring_kv", "ring_dkv"}
        assert s["bytes_match_analytic"] and s["load_balance"] >= 1.0
        assert (
            s["compute_only_ms_median"] > 0
            and s["comm_only_ms_median"] > 0
            and "overlap_ratio" in s
        )
        assert s["peak_mem_bytes"] == max(x["peak_mem_bytes"] for x in s["ranks"])
    chk = r["samples"][0]["check"]
    assert (
        chk["passed"]
        and len(chk["ranks"]) == 2
        and set(chk["errors"]) == {"out", "lse", "dq", "dk", "dv"}
    )
    assert r["check_passed"] and r["max_rel_err"] < 1e-5
    assert r["tflops"] > 0 and r["cp"]["degrees"] == {
        "ulysses": 1,
        "ring": 2,
        "windows": 1,
        "placement": "contiguous",
        "split_documents": "all",
    }
    extra = r["table_extra"]
    assert (
        extra["tflops_per_gpu"] == r["tflops"]
        and extra["ring_degree"] == 2
        and extra["bytes_match_analytic"]
    )
    assert extra["tokens_per_gpu"] == 48 and extra["method"] == "ring_p2p"


def test_a_cell_with_documents_split_as_needed_runs_checks_and_records_it(base, tmp_path):
    """cp.split_documents: as_needed through the real cell (2 gloo ranks): the float64 check
    passes, counted bytes are the schedule's, and the record and the tidy table say the split."""
    cell = spec(base, cp={**GRID["cp"], "split_documents": "as_needed"})
    assert cell_path(cell).endswith("-splitas_needed.json")
    out = tmp_path / "r.json"
    p, _ = launch(cell, out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["status"] == "ok" and r["check_passed"], r.get("status_reason")
    assert r["cp"]["degrees"]["split_documents"] == "as_needed"
    assert r["table_extra"]["split_documents"] == "as_needed"
    assert all(s["bytes_match_analytic"] for s in r["samples"])


def test_statuses_known_before_any_rank_starts(base, tmp_path):
    # heads that 3 ranks cannot split: check-config refuses such a grid, and a cell built without
    # it (by hand, or from an older config) still ends `unsupported` before any rank starts
    r = run_cp_cell(
        CellSpec.from_dict(
            {
                **spec(base, methods=["ulysses"], gpus=[3], heads=[[3, 1]]),
                "heads_q": 4,
                "heads_kv": 2,
            }
        ),
        tmp_path / "u.json",
    )
    assert (
        r["status"] == "unsupported"
        and r["status_reason"] == "Ulysses degree 3 does not divide the 4 query heads"
    )
    r = run_cp_cell(
        CellSpec.from_dict(spec(base, methods=["torch_cp"], masks=["causal"])), tmp_path / "t.json"
    )
    assert r["status"] == "unavailable" and "torch_cp runs only on cuda" in r["status_reason"]
    r = run_cp_cell(
        CellSpec.from_dict(spec(base, cp={"local_kernel": "flex"})), tmp_path / "f.json"
    )
    assert r["status"] == "unsupported" and "flex has no fwdbwd on cpu" in r["status_reason"]
    assert json.loads((tmp_path / "f.json").read_text())["samples"] == []


def test_a_crash_writes_no_record(base, tmp_path, monkeypatch):
    monkeypatch.setenv(F.CRASH_ENV, "ring_p2p/causal_document_long/")
    with pytest.raises(RuntimeError, match="crash injected"):
        run_cp_cell(CellSpec.from_dict(spec(base)), tmp_path / "c.json")
    assert not (tmp_path / "c.json").exists()


def test_out_of_memory_on_one_rank_is_oom_on_every_rank_and_nobody_hangs(base, tmp_path):
    """Rank 1 may map only 24 MiB more than it has after start-up; the math kernel's scores for a
    1024 x 1024 step (4 heads, float32) need 16 MiB each, several at once: a real allocation
    failure, on that rank alone. Rank 0 never fails; the schedule drains, both record `oom`."""
    cell = spec(
        base,
        masks=["full"],
        tokens_per_gpu=[1024],
        cp={"local_kernel": "math", "timeout_s": 60},
        samples={"document": 1, "single": 1},
    )
    out = tmp_path / "oom.json"
    p, wall = launch(cell, out, env={MEMORY_LIMIT_ENV: f"1:{24 * 2**20}"}, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["status"] == "oom" and r["status_reason"].startswith("rank 1 in ")
    assert "tflops" not in r and wall < 60  # agreed, not timed out
    # the same cell without the limit runs
    p, _ = launch(cell, tmp_path / "ok.json")
    assert json.loads((tmp_path / "ok.json").read_text())["status"] == "ok"


@pytest.mark.parametrize("kernel,mask", [("cpu_flash", "causal_document_long"), ("math", "full")])
def test_bare_kernel_cell_runs_one_rank_and_passes_the_float64_check(base, tmp_path, kernel, mask):
    """`local`: the local kernel alone on one rank (the cp_vs_single_gpu baseline), timed and checked
    like every cell, with nothing sent and no CP schedule around it."""
    cell = spec(
        base,
        methods=["local"],
        gpus=[1],
        masks=[mask],
        cp={"local_kernel": kernel, "timeout_s": 60},
    )
    out = tmp_path / "local.json"
    p, _ = launch(cell, out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert (
        r["status"] == "ok"
        and r["kernel"]["name"] == "local"
        and r["kernel"]["local_kernel"] == kernel
    )
    assert r["cp"]["degrees"] == {
        **{"ulysses": 1, "ring": 1, "windows": 1, "placement": "contiguous"},
        "split_documents": "all",
    }
    for s in r["samples"]:
        (rank,) = s["ranks"]
        assert rank["bytes"]["sent"] == rank["bytes_analytic"]["sent"] == 0
        assert (
            rank["work_pairs"] == s["mask_area"] * 4
        )  # every visible pair of the 4 query heads, once
        assert "compute_only_ms" not in s  # no schedule to split
        assert s["flops"] == 4 * s["mask_area"] * 4 * 16 * 3.5
    chk = r["samples"][0]["check"]
    assert (
        chk["passed"]
        and chk["every_row_once"]
        and set(chk["errors"]) == {"out", "lse", "dq", "dk", "dv"}
    )
    assert r["max_rel_err"] < 1e-5


def test_bare_kernel_is_refused_beyond_one_gpu(base):
    cfg = copy.deepcopy(base)
    cfg["run"] = ["t"]
    cfg["grids"] = {"t": {**copy.deepcopy(GRID), "methods": ["local"], "gpus": [1, 2]}}
    with pytest.raises(
        Exception, match=r"local \(1 GPU, bare kernel\) runs on at most 1 GPU, not 2"
    ):
        validate(cfg)


def test_auto_runs_the_fastest_measured_local_kernel_and_the_record_says_why(base, tmp_path):
    """Kernel records in the cell's output folder say naive attention (the `math` local kernel's
    evidence) beats SDPA (cpu_flash's) on this CPU, forward and backward: the auto cell runs math,
    and its record keeps the grid's setting, the kernel that ran, and the evidence."""
    cell = spec(base, methods=["local"], gpus=[1], masks=["full"], cp={"timeout_s": 60})
    assert cell["cp"]["local_kernel"] == "auto"
    for impl, tflops in (("naive", 2.0), ("sdpa", 1.0)):
        for d in ("fwd", "bwd"):
            write_kernel_record(
                tmp_path, impl, "full", f"s48-h4x2-d16-float32-{d}", tflops, cpu_model()
            )
    out = tmp_path / cell_path(cell)
    p, _ = launch(cell, out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["status"] == "ok" and r["check_passed"] and r["cell"] == cell
    k = r["kernel"]
    assert (k["local_kernel"], k["local_kernel_setting"]) == ("math", "auto")
    assert k["local_kernel_choice"]["reason"].startswith("fastest measured on ")
    assert {c["local_kernel"] for c in k["local_kernel_choice"]["candidates"]} == {
        "cpu_flash",
        "math",
        "flex",
    }
    assert r["table_extra"]["local_kernel"] == "math" and r["cp"]["local_kernel_setting"] == "auto"
