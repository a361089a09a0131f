"""The CP throughput model (issue 17): its schedules are the methods' own (bytes by counter and
computed pairs of real gloo runs), its kernel fit and network, its validation on the committed
H200 cells, and the communication benchmark at world size 2."""

import json
from pathlib import Path

import numpy as np
import pytest
from attnbench.cp import catalog, schedule
from attnbench.cp.chunks import ring_step_chunk
from attnbench.cp.layout import ShardLayout
from attnbench.families import load_config
from attnbench.families.cp.model.kernel_time import KernelTime
from attnbench.families.cp.model.network import Network
from attnbench.families.cp.model.predict import Setting, predict
from attnbench.families.cp.model.run import read_records, run_predict
from attnbench.masks import Mask
from bounded import run_bounded
from commands import cp_verify, launched

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "results" / "h200"


@pytest.mark.parametrize(
    "world,methods", [(2, ["ulysses", "ring_p2p", "ring_allgather"]), (4, ["usp", "loongtrain"])]
)
def test_schedule_bytes_by_counter_are_what_real_runs_count(world, methods, tmp_path):
    """Forward and backward on real gloo processes: every rank's counted bytes per counter
    (ring_kv, ring_dkv, ulysses, all_gather, reduce_scatter) equal its schedule's, and the
    pairs all ranks compute add up to the mask's area."""
    cases = ["--kernels", "cpu_flash", "--methods", *methods, "--masks", "causal_document", "full"]
    rows = cp_verify(world, tmp_path / "verify.jsonl", *cases, timeout=300)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["method"] for r in ok} == set(methods)
    for r in ok:
        for b in r["bytes"]:
            assert b["by_kind"] == b["analytic_by_kind"], (r["method"], r["degrees"], b)
        assert r["work_pairs_total"] == r["mask_area_all_heads"] * 8
    if world == 4:
        assert any(
            r["degrees"]["windows"] == 2 for r in ok
        )  # LoongTrain's outer ring is exercised


@pytest.mark.parametrize("ring,windows", [(4, 1), (4, 2), (6, 2), (9, 3)])
def test_every_rank_meets_every_shard_once_and_steps_tile_the_mask(ring, windows):
    mask = Mask("causal_document", 500, {"doc_lengths": [37, 200, 13, 250]})
    layout = ShardLayout(mask.params["doc_lengths"], ring, 2)
    deg = catalog.Degrees(2, ring, windows)
    total = 0
    for rank in range(deg.world):
        r, _ = deg.coords(rank)
        assert sorted(o for _, _, o in schedule.ring_origins(r, ring, windows)) == list(
            range(ring)
        )
        chunks = {s: ring_step_chunk(layout, r, s, True) for s in range(ring)}
        phases = schedule.hybrid_schedule(
            deg, rank, chunks, layout.shard_len, layout.piece_len, 8, 2, 16, 4, 4, "fwdbwd"
        )
        total += schedule.work(phases["fwd"])
        kinds = schedule.volume(phases)["by_kind"]
        kv = 2 * layout.shard_len * 1 * 16 * 4  # 2 KV heads over U = 2: one per rank
        assert kinds["ring_kv"] == 2 * (ring - 1) * kv and kinds["ring_dkv"] == (ring - 1) * kv
    assert total == mask.area * 8


@pytest.fixture(scope="module")
def kernel_time():
    df = read_records(H200, ["h200", "h200_sweep"])
    return KernelTime.from_table(df, "sdpa_flash", 64, 8, 128, "bfloat16")


def test_kernel_fit_reproduces_measured_lengths_and_interpolates_within_a_third(kernel_time):
    for (d, kind), (s, c) in kernel_time.points.items():
        area = s * s if kind == "full" else s * (s + 1) / 2
        got = [kernel_time.seconds(d, kind, int(x), 64) for x in s]
        assert np.allclose(got, area * 64 * c, rtol=0.02), (d, kind)
    errs = [abs(e) for es in kernel_time.loo_errors().values() for e in es]
    assert errs and max(errs) < 0.35
    with pytest.raises(ValueError, match="no kernel records of sdpa_flash for fwdbwd"):
        kernel_time.per_pair("fwdbwd", "full", 4096)


def test_network_charges_the_nic_only_across_nodes():
    net = Network("t", 8, 400, 5, 50, 10)
    gb = 10**9
    intra = schedule.Transfer("ring_kv", "p2p", gb, (1, 7))
    inter = schedule.Transfer("ring_kv", "p2p", gb, (8, 7))
    assert net.seconds(intra, 0) == pytest.approx(5e-6 + 1 / 400)
    assert net.seconds(inter, 0) == pytest.approx(10e-6 + 1 / 50)
    with pytest.raises(ValueError, match="unknown transfer pattern 'bcast'"):
        schedule.Transfer("x", "bcast", 1, ())


def test_predictions_follow_the_schedules(kernel_time):
    s = Setting(64, 8, 128, "bfloat16")
    net = Network("h100", 8, 450, 5, 50, 10)
    full = Mask("full", 8192 * 8, {})
    assert predict(
        "ulysses", 128, Mask("full", 8192 * 128, {}), s, "fwd", kernel_time, net
    ).bottleneck.startswith("unsupported")
    one = kernel_time.seconds("fwd", "full", 8192 * 8, 64)
    ring = predict("ring_p2p", 8, full, s, "fwd", kernel_time, net)
    # 8 steps of an 8K x 64K / 8 rectangle each, on 64 heads: the whole mask's work over 8 GPUs
    assert ring.compute_s == pytest.approx(one / 8, rel=0.15)
    slow = Network("slow", 8, 0.5, 5, 0.5, 10)
    assert (
        predict("ring_p2p", 8, full, s, "fwd", kernel_time, slow).bottleneck == "intra-node comm"
    )


def test_h200_validation_median_within_ten_percent(tmp_path):
    cfg = load_config(ROOT / "config.yaml")
    cfg["cp_model"]["gpus"] = [2]
    res = run_predict(cfg, "h200_cp", H200, tmp_path / "tables", None, progress=lambda m: None)
    import pandas as pd

    val = pd.read_csv(tmp_path / "tables" / "cp_model_validation.csv")
    assert len(val) >= 30 and val["relative_error"].abs().median() < 0.10
    table = pd.read_csv(tmp_path / "tables" / "cp_model.csv")
    assert list(table.columns[:10]) == [
        "method",
        "mask",
        "direction",
        "gpus",
        "nodes",
        "tokens_per_gpu",
        "network",
        "predicted_tflops_per_gpu",
        "measured_tflops_per_gpu",
        "bottleneck",
    ]
    assert table["measured_tflops_per_gpu"].notna().any()
    assert res["checks"] and all("passed" in c for c in res["checks"])
    with pytest.raises(ValueError, match="grid 'smoke' is not modelled"):
        run_predict(cfg, "smoke", H200, tmp_path, None)


def test_comm_bench_at_world_size_two(tmp_path):
    out = tmp_path / "comm.json"
    bench = ["attnbench.families.cp.model.commbench", "--device", "cpu", "--out", str(out)]
    sizes = ["--sizes-mib", "0.25", "1", "--reps", "2", "--warmup", "1"]
    cmd = launched(["--nproc-per-node", "2"], "-m", *bench, *sizes)
    p = run_bounded(cmd, 120)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["backend"] == "gloo" and res["world"] == 2
    assert set(res["fit"]) == {"all_to_all", "p2p", "all_gather"}
    p2p = res["patterns"]["p2p"]
    assert [x["bytes_sent"] for x in p2p] == [2**18, 2**20] and all(x["seconds"] > 0 for x in p2p)
