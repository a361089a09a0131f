"""The one-process emulation of a CP world (attnbench.cp.emulate): its results are a real gloo
world's, every rank's rows pass the float64 check, its bytes are the schedule's, and each rank is
timed alone with its transfers off."""

import gc
import importlib.util
import json
import sys

import pytest
import torch
from attnbench.cp import catalog, emulate
from attnbench.families import expand_cells, validate, write_figures, write_tables
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import EMULATE_CONTENTS
from attnbench.harness.measure import release_memory
from attnbench.masks import Mask
from attnbench.report.collect import collect, write_cells
from bounded import run_bounded
from commands import REPO, launched, package_env
from emulate_cases import HQ, MASKS, SEED, cases, run_of
from tinygrids import config_running, cp_grid

NAMES = ("out", "lse", "dq", "dk", "dv")


@pytest.fixture(scope="module", params=[2, 4, 8])
def gloo(request, tmp_path_factory):
    """Every case's rank results from a real gloo world of 2, 4 or 8 processes."""
    world = request.param
    out = tmp_path_factory.mktemp(f"gloo{world}") / "results.pt"
    script = str(REPO / "tests" / "cp" / "gloo_results.py")
    p = run_bounded(
        launched(["--nproc-per-node", str(world)], script, str(out)), 300, package_env()
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return world, torch.load(out, weights_only=False)


def test_emulated_results_are_the_gloo_worlds(gloo):
    """Bit for bit, except a reduce-scatter's sums (Ring AllGather's dK, dV), whose order gloo
    chooses: within a few float32 roundings there."""
    world, real = gloo
    for name, method, deg, mask in cases(world):
        st, reason, got = emulate.results(run_of(method, deg), mask, SEED)
        assert st is None, (name, reason)
        for r, (mine, theirs) in enumerate(zip(got, real[name], strict=True)):
            assert (mine["positions"] == theirs["positions"]).all(), (name, r)
            assert mine["bytes"] == theirs["bytes"], (name, r)
            for n in NAMES:
                what = f"{name} rank {r} {n}"
                if method == "ring_allgather" and n in ("dk", "dv"):
                    torch.testing.assert_close(mine[n], theirs[n], rtol=1e-5, atol=1e-6, msg=what)
                else:
                    assert torch.equal(mine[n], theirs[n]), what


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_rank_passes_the_float64_check(world):
    """The cell's check (run.compare, the gate) on the emulated ranks: two masks per method at 2
    and 4 ranks, one at 8, in turn, so that every method and every mask is checked at each world
    (test_emulated_results_are_the_gloo_worlds covers the other cases)."""
    todo = list(cases(world))
    methods = [c[0].rsplit("-", 1)[0] for c in todo]
    for (name, method, deg, mask), which in zip(todo, methods):
        step = 2 if world < 8 else 4
        if (MASKS.index(mask.name) + sorted(set(methods)).index(which) + world) % step:
            continue
        v = emulate.check_method(run_of(method, deg), mask, SEED, 5.0)
        assert v["status"] == "ok" and v["passed"] and v["every_row_once"], (name, v)
        assert v["bytes_match_analytic"] and set(v["errors"]) == set(NAMES), name
        assert v["work_pairs_total"] == v["mask_area_all_heads"] * HQ, name


@pytest.mark.parametrize("method", ["ring_p2p", "ring_allgather", "usp"])
def test_documents_kept_whole_pass_the_float64_check_emulated(method):
    """split_documents as_needed at 4 ranks, documents cut and all whole (the ring local)."""
    deg = catalog.degrees(method, 4, 2 if method == "usp" else "auto", split_documents="as_needed")
    for docs in ([4] * 24 + [1, 1, 1], [40, 7, 3, 30, 12, 5]):
        mask = Mask("causal_document", sum(docs), {"doc_lengths": docs})
        v = emulate.check_method(run_of(method, deg), mask, SEED, 5.0)
        assert v["status"] == "ok" and v["passed"] and v["bytes_match_analytic"], (docs, v)
        assert v["work_pairs_total"] == v["mask_area_all_heads"] * HQ


def small_world(method="ring_p2p", world=4, contents="peers", mask_name="causal_document"):
    deg = catalog.degrees(method, world)
    mask = Mask(mask_name, 16 * world + 3, {"doc_lengths": [20, 7, 16 * world - 24]})
    w = emulate.World(run_of(method, deg), "cpu", contents=contents)
    w.load(mask)
    return w, w.inputs(SEED)


@pytest.mark.parametrize("contents", EMULATE_CONTENTS)
def test_every_rank_is_timed_alone_with_its_transfers_off(contents):
    w, inputs = small_world(contents=contents)
    emulate.prime(w, inputs, "fwdbwd")
    sent = [rc.comm.total_sent for rc in w.rcs]
    assert all(s > 0 for s in sent)
    times = emulate.time_ranks(w, inputs, "fwdbwd", warmup=1, reps=3)
    assert sorted(times) == [0, 1, 2, 3] and all(len(t) == 3 for t in times.values())
    assert [rc.comm.total_sent for rc in w.rcs] == sent  # nothing moved while timed
    assert all(rc.comm.enabled for rc in w.rcs)
    s = emulate.summary(times)
    assert s["slowest_rank_ms"] == max(s["rank_ms_median"]) >= s["fastest_rank_ms"] > 0
    assert s["rank_spread"] >= 1 and len(s["max_over_ranks_ms"]) == 3
    assert all(m >= times[s["slowest_rank"]][i] for i, m in enumerate(s["max_over_ranks_ms"]))


def test_a_dropped_world_gives_its_tensors_back_at_release_memory():
    """Its ranks' objects refer to one another, so its tensors outlive the last reference until
    the cycle collector runs; release_memory runs it (a benchmark emulating world after world in one
    process ran a GPU out of memory at world 8 without it)."""

    def live():  # tensors the collector tracks (`type is`: no isinstance hooks on odd objects)
        return sum(type(o) is torch.Tensor for o in gc.get_objects())

    gc.collect()
    gc.disable()
    try:
        before = live()
        w, inputs = small_world()
        emulate.prime(w, inputs, "fwdbwd")
        del w, inputs
        assert live() > before  # in a cycle: still there
        release_memory()
        assert live() <= before
    finally:
        gc.enable()


def test_a_rank_out_of_memory_is_every_ranks_status_and_nobody_hangs(monkeypatch):
    """As in a distributed cell: the failing rank keeps serving transfers (comm.Guard) and the
    agreement names it; a bug in one rank (not an oom) stops the others at once."""
    w, inputs = small_world()
    kernel = w.rcs[2].kernel
    real_forward = kernel.forward_into  # what the methods call

    def forward(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory (test)")

    monkeypatch.setattr(kernel, "forward_into", forward)
    emulate.prime(w, inputs, "fwd")
    st, reason = w.agree("the timing")
    assert st == "oom" and reason.startswith("rank 2 in the timing")
    monkeypatch.setattr(kernel, "forward_into", real_forward)
    w.rcs[1].kernel.forward_into = lambda *a, **kw: 1 / 0
    with pytest.raises(ZeroDivisionError):
        emulate.prime(w, inputs, "fwd")


# ---------------------------------------------------------------- an emulated cell in the pipeline

EMULATED = cp_grid(
    methods=["ring_p2p"],
    masks=["causal_document"],
    tokens_per_gpu=[24],
    gpus=[4],
    heads=[[2, 1]],
    head_dim=[8],
    direction=["bwd"],
    mask_params={"long_doc_range": [8, 40]},
    check={"max_seqlen": 256, "tolerance_factor": 5, "samples": 1},
    cp={"local_kernel": "cpu_flash", "timeout_s": 60, "emulate": True},
    # the bare kernel on one rank, measured: the baseline of cp_vs_single_gpu
    also=[{"methods": ["local"], "gpus": [1], "cp": {"emulate": False}}],
)


def test_an_emulated_cell_through_the_pipeline_is_marked_everywhere(base, tmp_path):
    """The rule's command (one process for the 4 emulated ranks) writes a record with emulated:
    true at a cell path of its own (-emu); the tidy table, tables and figures mark it."""
    cfg = config_running({"emu": EMULATED})
    cells = {c["impl"]: c for c in expand_cells(validate(cfg))}
    emu, local = cells["ring_p2p"], cells["local"]
    assert emu["cp"]["emulate"] and emu["cp"]["nproc_per_node"] == 1 and emu["gpus"] == 4
    assert "emulate" not in local["cp"] and cell_path(emu).endswith("-g4-emu.json")
    root = tmp_path / "results"
    for cell in (emu, local):
        out = root / cell_path(cell)
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = launched(
            ["--nproc-per-node", str(cell["cp"]["nproc_per_node"])],
            *["-m", "attnbench", "cp-cell", "--spec", json.dumps(cell), "--out", str(out)],
        )
        p = run_bounded(cmd, 240, package_env())
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((root / cell_path(emu)).read_text())
    assert r["status"] == "ok" and r["kernel"]["emulated"] and r["cp"]["emulated"]
    s = r["samples"][0]
    assert s["emulated"] and len(s["ranks"]) == 4 and s["check"]["passed"]
    assert s["slowest_rank_ms"] == max(s["rank_ms_median"]) and s["rank_spread"] >= 1
    assert s["bytes_match_analytic"] and r["tflops"] > 0
    df = collect(root=root)
    write_cells(df, root / "tables/cells.csv")
    flags = dict(zip(df["impl"], df["emulated"].fillna(False)))
    assert flags == {"ring_p2p": True, "local": False}
    out = root / "tables/emu"
    write_tables(root / "tables/cells.csv", out, grid="emu", grid_cfg=cfg["grids"]["emu"])
    tflops = (out / "cp_tflops.md").read_text()
    assert "ring_p2p [emulated]" in tflops and "not a distributed measurement" in tflops
    table = tflops.split("\n\n", 1)[1]
    assert "| ring_p2p" not in table.split("fastest")[-1]  # an emulation is never the fastest
    share = (out / "cp_vs_single_gpu.md").read_text()
    assert "ring_p2p [emulated]" in share and "none (no local cell)" not in share.split("\n\n")[1]
    assert "yes (" in (out / "cp_breakdown.md").read_text()
    figs = write_figures(
        root / "tables/cells.csv",
        root / "figures/emu",
        {"formats": ["png"], "dpi": 40},
        grid="emu",
        grid_cfg=cfg["grids"]["emu"],
    )
    assert any(p.name == "cp_breakdown.png" for p in figs)


def test_torch_cp_cannot_be_emulated():
    cfg = config_running({"emu": {**EMULATED, "methods": ["ring_p2p", "torch_cp"], "also": []}})
    with pytest.raises(Exception, match="cannot be emulated"):
        validate(cfg)


def test_the_benchmark_runs_every_combination_asked_for_and_skips_impossible_ones(tmp_path):
    """benchmarks/cp_emulate.py with several methods and worlds: one result per possible
    combination, in order, written to --json; LoongTrain's two windows cannot split 2 ranks."""
    out = tmp_path / "runs.json"
    script = str(REPO / "benchmarks" / "cp_emulate.py")
    args = [script, "--method", "ring_p2p", "loongtrain", "--world", "2", "4"]
    args += ["--mask", "causal_document", "--tokens-per-rank", "128", "--heads", "4:2"]
    args += ["--head-dim", "16", "--ulysses-degree", "2", "--windows", "2", "--reps", "1"]
    args += ["--warmup", "0", "--directions", "fwd", "--no-local", "--json", str(out)]
    p = run_bounded([sys.executable, *args], 300, package_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "loongtrain causal_document world 2: skipped" in p.stdout
    runs = json.loads(out.read_text())
    assert [(r["method"], r["world"]) for r in runs] == [
        ("ring_p2p", 2),
        ("ring_p2p", 4),
        ("loongtrain", 4),
    ]
    assert all(r["emulated"] and r["fwd"]["emulated"]["rank_spread"] >= 1 for r in runs)
    assert len(runs[2]["fwd"]["emulated"]["rank_ms_median"]) == 4
    # --compare of a file with itself: one row per run and direction, each 1.00x
    p = run_bounded([sys.executable, script, "--compare", str(out), str(out)], 120, package_env())
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ring_p2p")]
    rows += [line for line in p.stdout.splitlines() if line.startswith("| loongtrain")]
    assert len(rows) == 3 and all("| 1.00x |" in line for line in rows)


def test_the_target_table_shares_a_bare_kernel_run_among_runs_of_its_mask_world_and_direction(
    tmp_path,
):
    """--table: a run made with --no-local takes the bare kernel's TFLOP/s of another run of the
    same mask, world and direction; the share is met or not against the mask's target."""

    def run(method, mask, tflops, local=None):
        emu = {"tflops_per_gpu": tflops, "rank_spread": 1.0}
        return {
            "method": method,
            "mask": mask,
            "world": 4,
            "fwd": {"emulated": emu, "local": local},
        }

    files = [tmp_path / "a.json", tmp_path / "b.json"]
    files[0].write_text(json.dumps([run("ring_p2p", "full", 570.0, {"tflops": 600.0})]))
    files[1].write_text(json.dumps(run("usp", "full", 540.0)))
    script = str(REPO / "benchmarks" / "cp_emulate.py")
    p = run_bounded(
        [sys.executable, script, "--table", ",".join(map(str, files))], 120, package_env()
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {
        line.split(" | ")[3]: line for line in p.stdout.splitlines() if line.startswith("| 4 ")
    }
    assert "| 600.0 | 95.0% | met |" in rows["ring_p2p"]
    assert "| 600.0 | 90.0% | not met |" in rows["usp"]


@pytest.fixture
def bench():
    """benchmarks/cp_emulate.py as a module, run in this process."""
    spec = importlib.util.spec_from_file_location(
        "cp_emulate_bench", REPO / "benchmarks" / "cp_emulate.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_times_each_rank_alone_where_the_lockstep_world_runs_out_of_memory(
    bench, tmp_path, monkeypatch, capsys
):
    """--contents auto (the default): a lockstep world that runs out of memory (world 8's Ring
    AllGather backward on one H200: the hub's copies of every rank's dK/dV) is timed again with
    synthetic contents, and the output and JSON say which contents the timed buffers held."""
    real_prime = emulate.prime

    def prime(world, inputs, direction):
        if world.contents == "peers":
            raise torch.OutOfMemoryError("CUDA out of memory (test)")
        real_prime(world, inputs, direction)

    monkeypatch.setattr(bench.emulate, "prime", prime)
    out = tmp_path / "run.json"
    args = ["--method", "ring_allgather", "--world", "4", "--mask", "causal_document"]
    args += ["--tokens-per-rank", "64", "--heads", "4:2", "--head-dim", "16", "--reps", "1"]
    args += ["--warmup", "0", "--directions", "fwd", "--no-local", "--device", "cpu"]
    assert bench.main([*args, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ran out of memory; each rank alone" in printed
    assert "(each rank alone: synthetic contents)" in printed
    got = json.loads(out.read_text())["fwd"]["emulated"]
    assert got["contents"] == "synthetic" and len(got["rank_ms_median"]) == 4
    # asked for peers only: the oom is the result
    assert bench.main([*args, "--contents", "peers", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["fwd"]["emulated"] is None
    assert "fwd: oom" in capsys.readouterr().out


def test_resume_keeps_the_finished_runs_and_runs_only_the_missing_ones(bench, tmp_path, capsys):
    """--resume after a call cut off mid-way: the runs already in --json stay as they are (not
    run again), the missing one runs, and the file holds all of them in the order asked for; a
    run that ended out of memory is not kept."""
    out = tmp_path / "runs.json"
    args = ["--method", "ring_p2p", "ulysses", "--world", "2", "--mask", "causal_document"]
    args += ["--tokens-per-rank", "64", "--heads", "4:2", "--head-dim", "16", "--reps", "1"]
    args += ["--warmup", "0", "--directions", "fwd", "--device", "cpu", "--json", str(out)]
    assert bench.main(args) == 0
    first = json.loads(out.read_text())
    out.write_text(json.dumps(first[:1]))  # as if the call ended during Ulysses' run
    capsys.readouterr()
    assert bench.main([*args, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "ring_p2p causal_document world 2: kept from" in printed
    assert "ulysses fwd: rank_ms" in printed and "ring_p2p fwd: rank_ms" not in printed
    assert "local fwd" not in printed  # the kept run's bare kernel stands for Ulysses' too
    again = json.loads(out.read_text())
    assert again[0] == first[0]
    assert [r["method"] for r in again] == ["ring_p2p", "ulysses"]
    assert again[1]["fwd"]["local"] == first[0]["fwd"]["local"] is not None
    assert again[1]["fwd"]["emulated"]["share_of_local"] > 0
    # Ulysses out of memory last time: run again
    again[1]["fwd"]["emulated"] = None
    out.write_text(json.dumps(again))
    capsys.readouterr()
    assert bench.main([*args, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "ulysses fwd: rank_ms" in printed and "ring_p2p fwd: rank_ms" not in printed
    assert json.loads(out.read_text())[1]["fwd"]["emulated"]["rank_ms_median"]
