"""The CP throughput model (docs/cp-model.md): its schedules are the methods' own (bytes by
counter and computed pairs of real gloo runs), its array form of the chunks is cp/chunks.py's,
its kernel fit, network, per-call overhead fit and peak memory, its validation on the committed
H200 cells, the rule's outputs, and the communication benchmark at world size 2."""

import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from attnbench.cp import catalog, schedule
from attnbench.cp.chunks import allgather_chunks, ring_step_chunk
from attnbench.cp.layout import ShardLayout
from attnbench.cp_model.checks import intra_text
from attnbench.cp_model.geometry import Geometry, real_slices, slices_of
from attnbench.cp_model.kernel_time import KernelTime
from attnbench.cp_model.network import Network
from attnbench.cp_model.overhead import calibrate, fit_terms, leave_one_out
from attnbench.cp_model.predict import Setting, predict
from attnbench.cp_model.run import read_records, run_predict, validation_rows
from attnbench.families import load_config
from attnbench.kernels.local_kernel import Ranges
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
            deg,
            rank,
            chunks,
            layout.shard_len,
            layout.piece_len,
            schedule.Attn(8, 2, 16, 4, 4),
            "fwdbwd",
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
    df = read_records(H200, ["h200", "h200_sweep"])
    df = df[(df["impl"] == "sdpa_flash") & (df["heads_kv"] == 8) & (df["status"] == "ok")]
    for (d, kind), (s, c) in kernel_time.points.items():
        rec = df[(df["direction"] == d) & (df["mask"] == kind)].groupby("seqlen")["time_ms_median"]
        got = [kernel_time.seconds(d, kind, int(x), 64) for x in s]
        assert np.allclose(got, rec.median().loc[s].to_numpy() * 1e-3, rtol=0.02), (d, kind)
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


def test_collectives_across_nodes_use_every_nic_of_the_node():
    """A ring all-gather across nodes runs one ring per NIC (NCCL's rings): its bytes cross the
    node boundary at the node's aggregate bandwidth, capped by the links inside the node; a
    transfer of one GPU gets its share of the NICs, at most one NIC."""
    gb, lat = 10**9, 10e-6
    ring16 = tuple(range(16))
    ag = schedule.Transfer("all_gather", "all_gather", gb, ring16)
    # 8 GPUs, 8 NICs of 50 GB/s: 400 GB/s across the boundary, under NVLink's 450
    net = Network("h100", 8, 450, 5, 50, 10, nics_per_node=8)
    assert net.node_gbytes_per_s == 400 and net.gpu_gbytes_per_s == 50
    assert net.seconds(ag, 0) == pytest.approx(15 * lat + 1 / 400)
    # NVLink slower than the NICs together: the links inside the node bound it
    slow_inside = Network("t", 8, 200, 5, 50, 10, nics_per_node=8)
    assert slow_inside.seconds(ag, 0) == pytest.approx(15 * lat + 1 / 200)
    # 4 NICs for 8 GPUs: collectives at 200 GB/s, a GPU alone or beside the others at 25
    half = Network("t", 8, 450, 5, 50, 10, nics_per_node=4)
    assert half.seconds(ag, 0) == pytest.approx(15 * lat + 1 / 200)
    p2p = schedule.Transfer("ring_kv", "p2p", gb, (8, 7))
    assert half.seconds(p2p, 0) == pytest.approx(lat + 1 / 25)
    a2a = schedule.Transfer("ulysses", "all_to_all", 15 * gb, ring16)  # 8 peers off the node
    assert half.seconds(a2a, 0) == pytest.approx(lat + 8 / 25)
    # inside one node nothing changes
    one_node = schedule.Transfer("all_gather", "all_gather", gb, tuple(range(8)))
    assert half.seconds(one_node, 0) == pytest.approx(7 * 5e-6 + 1 / 450)
    # the preset says it
    cfg = load_config(ROOT / "config.yaml")
    h100 = Network.from_config("h100_8x", cfg["cp_model"]["networks"]["h100_8x"])
    assert (h100.nics, h100.nic_gbytes_per_s) == (8, 50) and "8 NICs of 50 GB/s" in h100.text()


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
    # leave-one-out: each fitted cell predicted by the terms refitted without it
    fitted = val[val["in_fit"]]
    assert len(fitted) >= 30 and (val.loc[~val["in_fit"], "gpus"] == 1).all()
    assert fitted["loo_relative_error"].abs().median() < 0.10
    assert "leave-one-out" in res["summary"] and "in-sample" in res["summary"]
    # peak memory per GPU, no fitted parameter: exact where the code that measured the cells
    # allocated as the current one does; Ring AllGather's backward and Ring P2P's causal one ran
    # before the packed local kernel (a one-rectangle chunk was copied then, is a view now), and
    # Ring P2P's full_document backward before full rectangles took in their padding rows (its
    # query-side rows were gathered copies then, are views now: 16% less predicted)
    err = val["mem_relative_error"]
    same = (val["method"] == "ulysses") | ((val["method"] == "ring_p2p") & (val["mask"] == "full"))
    padded = (val["method"] == "ring_p2p") & (val["mask"] == "full_document")
    assert err.notna().all() and err[same].abs().max() < 0.001
    assert err[~padded].abs().max() < 0.12 and err[padded].abs().max() < 0.2
    table = pd.read_csv(tmp_path / "tables" / "cp_model.csv")
    assert list(table.columns[:12]) == [
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
        "predicted_peak_mem_gib",
        "measured_peak_mem_gib",
    ]
    assert table["measured_tflops_per_gpu"].notna().any()
    # the paper's findings are checked on the paper's grid only (cp_model.paper_grids)
    assert res["checks"] == [] and "paper's findings" not in res["summary"]
    with pytest.raises(ValueError, match="grid 'smoke' is not modelled"):
        run_predict(cfg, "smoke", H200, tmp_path, None)


def test_comm_bench_at_world_size_two(tmp_path):
    out = tmp_path / "comm.json"
    bench = ["attnbench.cp_model.commbench", "--device", "cpu", "--out", str(out)]
    sizes = ["--sizes-mib", "0.25", "1", "--reps", "2", "--warmup", "1"]
    cmd = launched(["--nproc-per-node", "2"], "-m", *bench, *sizes)
    p = run_bounded(cmd, 120)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["backend"] == "gloo" and res["world"] == 2
    assert set(res["fit"]) == {"all_to_all", "p2p", "all_gather"}
    p2p = res["patterns"]["p2p"]
    assert [x["bytes_sent"] for x in p2p] == [2**18, 2**20] and all(x["seconds"] > 0 for x in p2p)
    # a preset naming the output times each intra-node pattern by its own fit
    preset = {"gpus_per_node": 2, "intra_gbytes_per_s": 1e6, "intra_latency_us": 0}
    preset.update(nic_gbytes_per_s=1, inter_latency_us=0, comm_bench=str(out))
    net = Network.from_config("gloo", preset)
    for pattern in ("p2p", "all_to_all", "all_gather"):
        fit = res["fit"][pattern]
        # peers: the other rank of a send/recv, every member of a collective
        t = schedule.Transfer("x", pattern, 10**8, (1,) if pattern == "p2p" else (0, 1))
        if fit["gbytes_per_s"]:
            want = max(0.0, fit["latency_us"]) * 1e-6 + 10**8 / (fit["gbytes_per_s"] * 1e9)
        else:  # gloo's small messages can fit no bandwidth: the preset's then
            want = 10**8 / 1e15
        assert net.seconds(t, 0) == pytest.approx(want)
    # the same, deterministically: a fit without bandwidth, a negative intercept
    fits = {"p2p": {"latency_us": -3.0, "gbytes_per_s": 100.0}}
    fits["all_to_all"] = {"latency_us": 50.0, "gbytes_per_s": None}
    (tmp_path / "fits.json").write_text(json.dumps({"fit": fits}))
    made = Network.from_config("t", {**preset, "comm_bench": str(tmp_path / "fits.json")})
    assert made.intra_by_pattern == (("p2p", 100.0, 0.0),)
    assert made.intra("all_to_all") == (1e15, 0.0) and made.intra("p2p") == (1e11, 0.0)
    said = intra_text(made)  # the model's summary says which pattern fell back to the preset
    assert "p2p 100 GB/s" in said and "all_gather, all_to_all: no bandwidth fitted" in said
    rs = schedule.Transfer("x", "reduce_scatter", 10**8, (0, 1))
    assert net.seconds(rs, 0) == net.seconds(
        schedule.Transfer("x", "all_gather", 10**8, (0, 1)), 0
    )
    # off the node the preset's NIC, whatever was measured inside it
    assert net.seconds(schedule.Transfer("x", "p2p", 10**9, (2,)), 0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="comm_bench 'nowhere.json' is not a readable"):
        Network.from_config("gloo", {**preset, "comm_bench": "nowhere.json"})


@pytest.mark.parametrize("seed", range(4))
def test_geometry_is_the_real_chunks(seed, kernel_time):
    """The model's array form of the chunks (geometry.py) equals cp/chunks.py rectangle by
    rectangle, gathers the rows the varlen kernel gathers, and times the same."""
    rng = np.random.default_rng(seed)
    for _ in range(6):
        docs = [int(x) for x in rng.integers(1, 300, size=rng.integers(1, 7))]
        ring, ulysses = int(rng.choice([1, 2, 3, 4, 6])), int(rng.choice([1, 2, 4]))
        layout, geo = ShardLayout(docs, ring, ulysses), Geometry(docs, ring, ulysses)
        assert (geo.shard_len, geo.piece_len, geo.padded_len) == (
            layout.shard_len,
            layout.piece_len,
            layout.padded_len,
        )
        flat = ShardLayout(docs, ring, 1), Geometry(docs, ring, 1)
        for causal in (True, False):
            for r in range(ring):
                mine = geo.ring_chunks(r, causal) + flat[1].allgather_chunks(r, causal)
                real = [ring_step_chunk(layout, r, o, causal) for o in range(ring)]
                real += allgather_chunks(flat[0], r, causal)
                for g, c in zip(mine, real, strict=True):
                    assert slices_of(g) == real_slices(c)
                    assert (g.area, g.causal, g.ql, g.kl) == (c.area, c.causal, c.ql, c.kl)
                    if not c.empty:
                        v = c.varlen("cpu")
                        assert (g.subset_q, g.subset_k) == (
                            v.q_rows is not None,
                            v.k_rows is not None,
                        )
                        assert (g.gathers_q, g.gathers_k) == (
                            isinstance(v.q_rows, (Ranges, torch.Tensor)),
                            isinstance(v.k_rows, (Ranges, torch.Tensor)),
                        )
                        assert (g.nseg, g.rows_q, g.rows_k) == (
                            len(c.segments),
                            int(v.cu_q[-1]),
                            int(v.cu_k[-1]),
                        )
                    assert g.seconds(kernel_time, 8, "bwd") == pytest.approx(
                        kernel_time.chunk_seconds(c, 8, "bwd"), rel=1e-12
                    )


MIB = 2**20


def test_peak_memory_of_a_hand_computed_ring_backward(kernel_time):
    """Ring P2P backward, full mask, 2 GPUs x 16K tokens, GQA 64:8, D 128, bf16, counted by hand
    from cp/ring.py, kernels/local_kernel.py and FlashAttention-2's varlen backward (MiB): and what the
    H200 measured for it."""
    q = 16384 * 64 * 128 * 2 / MIB  # q, dout, out: 256 MiB each; k, v: 32 each
    kv = 2 * 16384 * 8 * 128 * 2 / MIB  # one KV shard (bf16): 64
    lse = 64 * 16384 * 4 / MIB  # 4
    resident = 2 * q + kv  # inputs q, dout, k, v
    resident += kv + 2 * kv + 2 * 2 * kv  # KV shard, inner double buffer, its fp32 dKV buffers
    resident += q + lse  # the forward's saved output and LSE
    rows = 16384 + 128  # dq_accum / softmax_d: one sequence, 128 rows of slack
    moment = lse + 2 * q + 2 * kv  # finite LSE, dq and dKV home (fp32)
    moment += 2 * kv  # the window's dKV total (fp32) after its first step
    moment += rows * 64 * 128 * 4 / MIB + rows * 64 * 4 / MIB  # dq_accum, softmax_d (fp32)
    moment += 2 * q  # dk, dv expanded to the 64 query heads
    moment += q + kv  # the kernel's dq, dk, dv
    s = Setting(64, 8, 128, "bfloat16")
    net = Network("h200", 2, 335, 109, 50, 10)
    got = predict("ring_p2p", 2, Mask("full", 32768, {}), s, "bwd", kernel_time, net)
    assert got.peak_mem_bytes == pytest.approx((resident + moment) * MIB, abs=1)
    rec = H200 / "cells/h200_cp/cp/ring_p2p/full/s32768-h64x8-d128-bfloat16-bwd-g2.json"
    measured = json.loads(rec.read_text())["peak_mem_bytes"]
    assert got.peak_mem_bytes == pytest.approx(measured, rel=1e-3)


def test_overhead_fit_recovers_known_terms_despite_slowed_samples():
    """fit_terms on synthetic samples made from known terms: it finds them, and samples slowed
    30x (a loaded machine's first sample) do not move it."""
    rng = np.random.default_rng(0)
    base = rng.uniform(1e-3, 1e-1, 40)
    slopes = np.stack([rng.integers(1, 16, 40), rng.uniform(0.1, 20, 40)])
    true = np.array([2e-4, 3e-5])
    measured = base + true @ slopes
    assert fit_terms(base, slopes, measured) == pytest.approx(true, rel=1e-3)
    slowed = measured.copy()
    slowed[:10] *= 30
    assert fit_terms(base, slopes, slowed) == pytest.approx(true, rel=0.05)
    assert fit_terms(base, slopes, base * 0.5) == pytest.approx([0, 0])  # never negative


def test_calibration_fits_per_call_terms_from_synthetic_cells(kernel_time):
    """Cells whose compute-only and comm-only times are the model's own with known per-call
    terms (the real H200 cells' masks and schedules): calibrate() finds those terms."""
    s = Setting(64, 8, 128, "bfloat16")
    net = Network("h200", 2, 335, 109, 50, 10)
    truth = {"fwd": (3e-4, 1e-9)}
    kt_true = kernel_time.with_overhead(truth)
    net_true = Network("h200", 2, 335, 109, 50, 10, call_overhead_s=4e-5)
    samples = []
    for method in ("ring_p2p", "ring_allgather", "ulysses"):
        for tokens in (4096, 16384, 65536):
            x = {
                "method": method,
                "gpus": 2,
                "direction": "fwd",
                "ulysses": 2 if method == "ulysses" else 1,
                "windows": 1,
                "mask": Mask("causal", 2 * tokens, {}),
            }
            p = predict(method, 2, x["mask"], s, "fwd", kt_true, net_true)
            samples.append({**x, "compute_s": p.compute_s, "comm_only_s": p.comm_only_s})
    kt, fitted_net, cal = calibrate(samples, s, kernel_time, net, 64, "synthetic")
    assert cal.kernel["fwd"] == pytest.approx((*truth["fwd"], 0.0), rel=0.02)
    assert fitted_net.call_overhead_s == pytest.approx(4e-5, rel=0.02)
    assert kt.call_seconds("fwd", 1000, 2) == pytest.approx(3e-4 + 2e-6, rel=0.02)
    assert np.abs(cal.errors["compute-only"]).max() < 0.01


def test_leave_one_out_refits_without_each_cell(kernel_time):
    """Cells of two samples each, made from known per-call terms: one refit per cell, on every
    other cell's samples (a cell is left out whole), each finding the terms."""
    s = Setting(64, 8, 128, "bfloat16")
    net = Network("h200", 2, 335, 109, 50, 10)
    kt_true = kernel_time.with_overhead({"fwd": (3e-4, 0.0)})
    net_true = Network("h200", 2, 335, 109, 50, 10, call_overhead_s=4e-5)
    samples = []
    for i, (method, tokens) in enumerate(
        (m, t) for m in ("ring_p2p", "ring_allgather", "ulysses") for t in (4096, 16384, 65536)
    ):
        x = {
            "method": method,
            "gpus": 2,
            "direction": "fwd",
            "ulysses": 2 if method == "ulysses" else 1,
            "windows": 1,
            "mask": Mask("causal", 2 * tokens, {}),
            "record": f"cell{i}",
        }
        p = predict(method, 2, x["mask"], s, "fwd", kt_true, net_true)
        samples += [{**x, "compute_s": p.compute_s, "comm_only_s": p.comm_only_s}] * 2
    kt, fitted_net, cal = calibrate(samples, s, kernel_time, net, 64, "synthetic")
    loo = leave_one_out(cal, kt, fitted_net)
    assert sorted(loo) == sorted(f"cell{i}" for i in range(9))
    cells = np.array([x["record"] for x in samples])
    assert cal.fit.fitted(cells != "cell4")[2] == {"fwd": 16, "comm": 16}
    for rec, (kt_l, net_l) in loo.items():
        assert kt_l.overhead["fwd"] == pytest.approx((3e-4, 0.0, 0.0), rel=0.02, abs=1e-12), rec
        assert net_l.call_overhead_s == pytest.approx(4e-5, rel=0.02), rec


def test_leave_one_out_is_the_fit_on_the_other_cells(kernel_time, tmp_path):
    """A cell timed on more samples than the others, with a 10x per-call overhead, pulls the
    in-sample fit onto itself; its leave-one-out model is exactly calibrate() on the other cells'
    samples, and misses it. The only backward cell leaves no cell to fit its term on: its row
    has no leave-one-out error and says why."""
    import pandas as pd

    s = Setting(64, 8, 128, "bfloat16")
    net = Network("h200", 2, 335, 109, 50, 10)
    net_true = dataclasses.replace(net, call_overhead_s=4e-5)
    samples, rows = [], []
    for method, direction, terms, n in [
        ("ring_p2p", "fwd", (3e-4, 0.0), 1),
        ("ring_allgather", "fwd", (3e-4, 0.0), 1),
        ("ulysses", "fwd", (3e-4, 0.0), 1),
        ("ring_p2p", "fwd", (3e-3, 0.0), 4),  # the deviating cell
        ("ring_p2p", "bwd", (5e-4, 0.0), 1),
    ]:
        tokens = 8192 if n > 1 else 4096
        rec = tmp_path / f"cell{len(rows)}.json"
        cell = {"mask": "causal", "seqlen": 2 * tokens, "heads_q": 64}
        rec.write_text(json.dumps({"cell": cell, "samples": [{"mask_params": {}}] * n}))
        x = {
            "method": method,
            "gpus": 2,
            "direction": direction,
            "ulysses": 2 if method == "ulysses" else 1,
            "windows": 1,
            "mask": Mask("causal", 2 * tokens, {}, heads_q=64),
            "record": str(rec),
        }
        p = predict(
            method,
            2,
            x["mask"],
            s,
            direction,
            kernel_time.with_overhead({direction: terms}),
            net_true,
        )
        samples += [{**x, "compute_s": p.compute_s, "comm_only_s": p.comm_only_s}] * n
        rows.append(
            {
                **{k: x[k] for k in ("method", "gpus", "direction", "record")},
                "mask": "causal",
                "tokens_per_gpu": tokens,
                "ulysses_degree": x["ulysses"],
                "windows": 1,
                "tflops_per_gpu": p.tflops_per_gpu,
                "time_ms_median": p.time_s * 1e3,
            }
        )
    kt, fitted_net, cal = calibrate(samples, s, kernel_time, net, 64, "synthetic")
    loo = leave_one_out(cal, kt, fitted_net)
    deviating, backward = rows[3]["record"], rows[4]["record"]
    kt_o, net_o, _ = calibrate(
        [x for x in samples if x["record"] != deviating], s, kernel_time, net, 64, "synthetic"
    )
    kt_l, net_l = loo[deviating]
    assert kt_l.overhead == kt_o.overhead and net_l == net_o
    assert isinstance(loo[backward], str) and "per bwd local-kernel call" in loo[backward]
    val = validation_rows(pd.DataFrame(rows), s, kt, fitted_net, {"max_ring_ranks": 64}, loo)
    assert val["in_fit"].all()
    dev, bwd = val.iloc[3], val.iloc[4]
    assert abs(dev["relative_error"]) < 0.01 and dev["loo_relative_error"] > 0.2
    assert np.isnan(bwd["loo_relative_error"]) and bwd["loo_reason"] == loo[backward]
    assert val["loo_reason"].iloc[:4].eq("").all()


def test_the_rule_writes_the_model_tables_and_figures(tmp_path):
    """snakemake on the cp_model rule of h200_cp (the committed records, at 2 and 4 GPUs): the
    tables and every declared figure."""
    import yaml

    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    cfg["run"], cfg["output_dir"] = ["h200_cp"], str(tmp_path / "results")
    cfg["cp_model"]["gpus"] = [2, 4]
    cfg["figures"]["formats"] = ["png"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "cells").symlink_to(H200 / "cells")  # read, never written
    figures = [tmp_path / f"results/figures/h200_cp/cp_model_t{t}.png" for t in (16384, 65536)]
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path)]
    cmd += ["--configfile", str(tmp_path / "config.yaml"), "--cores", "1", *map(str, figures)]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    p = run_bounded(cmd, 600, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for f in figures:
        assert f.stat().st_size > 10_000
    import pandas as pd

    table = pd.read_csv(tmp_path / "results/tables/h200_cp/cp_model.csv")
    assert sorted(set(table["gpus"])) == [2, 4]
    assert table["predicted_peak_mem_gib"].notna().any()


def test_methods_of_a_grids_also_entries_are_predicted(kernel_time):
    """paper_cp runs Ulysses in an `also` entry (at the GPU counts its heads split over): the
    model predicts it beside the main methods, unsupported beyond its 64 query heads."""
    from attnbench.cp_model.run import prediction_rows

    cfg = load_config(ROOT / "config.yaml")
    grid = {**cfg["grids"]["paper_cp"], "masks": ["full"]}
    assert "ulysses" not in grid["methods"]
    net = Network("h100", 8, 450, 5, 50, 10)
    mc = {"grid": grid, "network": net, "gpus": [8, 128], "mask_samples": 1, "seed": 0}
    mc["max_ring_ranks"] = 64
    rows = prediction_rows(
        cfg, mc, Setting(64, 8, 128, "bfloat16"), ["fwd"], kernel_time, progress=lambda _: None
    )
    uly = rows[rows["method"] == "ulysses"].set_index("gpus")
    assert uly.loc[8, "predicted_tflops_per_gpu"] > 0
    assert uly.loc[128, "bottleneck"].startswith("unsupported")  # 64 query heads
    assert set(rows["method"]) >= {"ulysses", "ring_p2p", "usp"}


def test_the_model_beside_the_committed_emulated_runs():
    """benchmarks/cp_model_vs_emulated.py on the committed world-2 causal_document runs (H200):
    one row per method and direction, and at world 2, where its terms were fitted, the model's
    compute term within 10% of the emulation."""
    runs = H200 / "cp_emulate" / "before_after" / "before_causal_document_w2.json"
    script = ROOT / "benchmarks" / "cp_model_vs_emulated.py"
    p = run_bounded([sys.executable, str(script), str(runs)], 300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [
        line.split(" | ") for line in p.stdout.splitlines() if "| causal_document | 2 |" in line
    ]
    assert len(rows) == 6
    assert all(abs(float(r[-1].strip(" |")) - 1) < 0.10 for r in rows)
