"""A grid point's contenders measured side by side (families/kernel/point.py): one job, interleaved
draw by draw in a rotating order, a record per kernel; a contender that crashes the process or
outlives its budget leaves the others' records; the workflow's point jobs, their reruns; the
control calls' drift flag."""

import json
import subprocess

import pytest
from attnbench import families
from attnbench.families.kernel.point import Contender, point_file_content, rotation
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import CellSpec
from attnbench.harness.control import DRIFT_LIMIT, drift
from attnbench.harness.faults import HANG_ENV
from commands import PY, REPO, package_env, planned_jobs, snakemake_cmd
from tinygrids import config_running, kernel_grid

DYING = "tests.dying_kernel:DiesOnSecondDraw"


def grid(**fields):
    """Three draws of a document mask: the draws differ, so their order matters."""
    base = {
        "masks": ["causal_document"],
        "seqlen": [96],
        "samples": {"document": 3, "single": 1},
        "check": {"max_seqlen": 512, "tolerance_factor": 5, "samples": 1},
    }
    return kernel_grid(**{**base, **fields})


def point_file(tmp_path, kernels, timeout_s=120.0):
    cfg = families.validate(config_running({"p": grid(kernels=kernels, side_by_side=True)}))
    contenders = [
        Contender(CellSpec.from_dict(c), str(tmp_path / cell_path(c)), timeout_s)
        for c in families.expand_cells(cfg)
    ]
    path = tmp_path / "point.json"
    path.write_text(json.dumps(point_file_content("p", contenders)))
    return path, contenders


def run_point(tmp_path, path, env=None):
    out = tmp_path / "records.json"
    cmd = [PY, "-m", "attnbench", "point", "--point", str(path), "--out", str(out)]
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=package_env(**(env or {})), timeout=300
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return {
        c.split("/kernel/")[1].split("/")[0]: r
        for c, r in json.loads(out.read_text())["records"].items()
    }, p


def test_the_order_rotates_draw_by_draw():
    assert [rotation(["a", "b", "c"], i) for i in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_contenders_are_interleaved_and_share_the_job(tmp_path):
    path, contenders = point_file(tmp_path, ["naive", "sdpa", "sdpa_math", "fa3"])
    records, _ = run_point(tmp_path, path)
    assert records["fa3"]["status"] == "unavailable"  # a GPU kernel: recorded, never measured
    measured = ["naive", "sdpa", "sdpa_math"]
    for i, name in enumerate(measured):
        r = records[name]
        assert r["status"] == "ok" and len(r["samples"]) == 3
        # draw d starts at the d-th contender: this one's place in each draw's order
        assert [s["order"] for s in r["samples"]] == [(i - d) % 3 for d in range(3)]
        assert r["side_by_side"]["measured"] == measured
        assert r["cell"]["side_by_side"] is True
        assert set(r["control"]) == {"before", "after", "drift"}
    # the same draws for everyone (one data seed: the same masks, in the same order)
    draws = {n: [s["mask_params"] for s in records[n]["samples"]] for n in measured}
    assert draws["naive"] == draws["sdpa"] == draws["sdpa_math"]
    # one job: every contender's samples were taken between the same control calls
    assert records["naive"]["control"] == records["sdpa"]["control"]


def test_a_contender_that_kills_the_process_leaves_the_others(tmp_path):
    path, _ = point_file(tmp_path, ["sdpa", DYING, "naive"])
    records, p = run_point(tmp_path, path)
    dead = records["dies_on_second_draw"]
    assert dead["status"] == "crashed" and "exit" in dead["crash"]["how"], dead["status_reason"]
    for name in ("sdpa", "naive"):  # measured again without it, side by side, all their draws
        assert records[name]["status"] == "ok" and len(records[name]["samples"]) == 3
        assert records[name]["side_by_side"]["measured"] == ["sdpa", "naive"]
    assert "crashed its process" in p.stdout


def test_a_contender_past_its_budget_is_a_timeout_and_the_others_finish(tmp_path):
    path, _ = point_file(tmp_path, ["sdpa", "naive"], timeout_s=20)
    records, _ = run_point(tmp_path, path, env={HANG_ENV: "^naive/"})
    assert records["naive"]["status"] == "timeout" and records["naive"]["time_budget_s"] == 20
    assert records["sdpa"]["status"] == "ok" and len(records["sdpa"]["samples"]) == 3


def test_a_control_that_moved_past_its_limit_flags_the_job():
    before = {"gemm_ms": 1.0, "sdpa_causal_ms": 2.0}
    assert drift(before, {"gemm_ms": 1.01, "sdpa_causal_ms": 2.02})["drifted"] is False
    moved = drift(before, {"gemm_ms": 1.0, "sdpa_causal_ms": 2.0 * (1 + DRIFT_LIMIT + 0.01)})
    assert moved["drifted"] is True and moved["worst"] == pytest.approx(DRIFT_LIMIT + 0.01)
    assert drift(None, before) is None


def test_the_matrix_product_control_is_reported_but_does_not_flag_the_job():
    """On an H200 the power-bound product read 14-19% slower at every job's end while the attention
    control and the cells held: its move is kept, and only the attention control judges."""
    moved = drift(
        {"gemm_ms": 1.42, "sdpa_causal_ms": 2.0}, {"gemm_ms": 1.67, "sdpa_causal_ms": 2.01}
    )
    assert moved["drifted"] is False and moved["worst"] == pytest.approx(0.005)
    assert moved["moved"]["gemm_ms"] == pytest.approx(1.67 / 1.42 - 1)


def test_the_workflow_runs_a_point_per_job_and_again_whole(tmp_path):
    """A side-by-side CPU grid: one point job for its contenders, a record each; nothing to do on
    a second run; a deleted record measures its whole point again."""
    cfg = config_running({"p": grid(kernels=["naive", "sdpa"], side_by_side=True)})
    cfg["output_dir"] = "out"
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))

    def snakemake(*args):
        return subprocess.run(
            snakemake_cmd(tmp_path, "--cores", "2", *args),
            capture_output=True,
            text=True,
            env=package_env(),
            timeout=600,
        )

    assert planned_jobs(snakemake("-n", "--quiet", "host"))["kernel_point"] == 1
    p = snakemake()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = sorted((tmp_path / "out/cells/p").rglob("*.json"))
    assert len(recs) == 2 and (tmp_path / "out/points/p/kernel/causal_document").is_dir()
    started = {r.parent.parent.name: json.loads(r.read_text())["started_at"] for r in recs}
    assert planned_jobs(snakemake("-n", "--quiet", "host")) == {}
    recs[0].unlink()
    plan = planned_jobs(snakemake("-n", "--quiet", "host"))
    assert plan["kernel_point"] == 1 and plan["point_record"] == 2  # both measured again
    p = snakemake()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    again = {r.parent.parent.name: json.loads(r.read_text())["started_at"] for r in recs}
    assert set(again) == set(started) and all(again[k] > started[k] for k in started)


def test_a_plan_of_calls_keeps_each_point_whole(tmp_path):
    """An offline GPU session's calls (attnbench records --calls) never split a side-by-side point:
    a call naming part of a point would run the whole point job."""
    from attnbench.families.estimate import calls, units

    cfg = families.validate(
        config_running(
            {
                "p": grid(
                    kernels=["naive", "sdpa"],
                    masks=["causal", "causal_document"],
                    side_by_side=True,
                )
            }
        )
    )
    cells = families.expand_cells(cfg)
    assert sorted(len(u) for u in units(cells)) == [2, 2]
    plan = calls(cells, tmp_path, 60.0)  # no records here: every job a call of its own
    assert sorted(sorted(c["impl"] for c in batch) for batch, _ in plan) == [["naive", "sdpa"]] * 2
    alone = families.validate(config_running({"p": grid(kernels=["naive", "sdpa"])}))
    assert len(units(families.expand_cells(alone))) == 2  # one job per cell


def test_a_measurement_is_never_replaced_by_unavailable(tmp_path):
    """A point run where its kernels cannot run (a GPU grid on a CPU machine) writes `unavailable`
    records; a record that holds a measurement (made on a GPU) stays as it is, as
    attnbench.pipeline.currency keeps it."""
    from attnbench.families.kernel.point import write_point_record

    measured = next(iter(sorted((REPO / "results/h100/cells/h100_calibration").rglob("*.json"))))
    out = tmp_path / "record.json"
    out.write_text(measured.read_text())
    from attnbench.record.schema import SUMMARY

    kept = {k: v for k, v in json.loads(measured.read_text()).items() if k not in SUMMARY}
    unavailable = {
        **kept,
        "status": "unavailable",
        "samples": [],
    }  # no timings: as the schema says
    bundle = tmp_path / "points/p.json"
    bundle.parent.mkdir()
    bundle.write_text(json.dumps({"point": "p", "records": {str(out): unavailable}}))
    write_point_record(str(bundle), str(out), str(tmp_path / "log"))
    assert out.read_text() == measured.read_text() and "kept" in (tmp_path / "log").read_text()
    fresh = tmp_path / "fresh.json"  # where there is none, the unavailable record is written
    bundle.write_text(json.dumps({"point": "p", "records": {str(fresh): unavailable}}))
    write_point_record(str(bundle), str(fresh))
    assert json.loads(fresh.read_text())["status"] == "unavailable"
