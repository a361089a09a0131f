"""A cell's typed spec (grid.spec): built from every cell of every grid and from every committed
record, it gives back the exact dict (the bytes a record stores, its id, its data seed); the CP
settings' defaults live in one place; a bad spec is refused naming the key."""

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from attnbench.families import expand_cells, load_config
from attnbench.grid import spec as G
from attnbench.grid.expand import cell_path, stable_hash
from attnbench.grid.spec import CellSpec, CPSettings, Degrees
from attnbench.harness.inputs import data_seed
from attnbench.record.record import base_record, finish_record
from attnbench.status import OK, TIMEOUT

PACKAGE = Path(G.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cells(repo):
    """Every grid's cells: config.yaml's, and those of a committed run's own config (a
    results/.../config.yaml read over config.yaml, e.g. your own CP method's)."""
    out = {}
    own = sorted((repo / "results").rglob("config.yaml"))
    for cfg in [load_config(repo / "config.yaml")] + [
        load_config(p, base=repo / "config.yaml") for p in own
    ]:
        out.update({g: expand_cells(cfg, [g]) for g in cfg["grids"]})
    assert "own_cp" in out  # results/cpu/custom_cp_method's
    return out


@pytest.fixture(scope="module")
def committed(repo):
    """Every committed record: {path: record} (not a run's spec files, .attnbench/specs/cells/)."""
    paths = sorted(
        p for p in (repo / "results").rglob("cells/**/*.json") if ".attnbench" not in p.parts
    )
    return {p: json.loads(p.read_text()) for p in paths}


def test_every_cell_of_every_grid_round_trips_to_its_dict(cells):
    for grid, grid_cells in cells.items():
        assert grid_cells, grid
        for cell in grid_cells:
            spec = CellSpec.from_dict(cell)
            again = spec.to_dict()
            # the bytes of its spec file and of its record's "cell", and so its id
            assert json.dumps(again) == json.dumps(cell), cell_path(cell)
            assert json.dumps(again, indent=1) == json.dumps(cell, indent=1)
            assert CellSpec.from_dict(again) == spec


def test_every_committed_record_keeps_its_cell_id_and_data_seed(committed):
    assert len(committed) > 1000  # the H200 records
    for path, record in committed.items():
        cell = record["cell"]
        spec = CellSpec.from_dict(cell)
        # byte for byte what the record stores (keys in the record's order)
        assert json.dumps(spec.to_dict(), indent=1) == json.dumps(cell, indent=1), path
        assert stable_hash(spec.to_dict()) == record["cell_id"], path
        if "config_sha256" in record:
            assert stable_hash(spec.to_dict(), 64) == record["config_sha256"], path
        assert data_seed(spec.problem) == record["data_seed"], path


def test_the_expansion_gives_the_committed_records_their_ids(cells, committed):
    """Grids expanded through the typed specs name the cells of the committed records by the ids
    those records carry (the few whose cp settings the config has changed since excepted). The GPU
    kernel grids are measured side by side now (grid key side_by_side, auto on a GPU): their cells
    carry `side_by_side: true`, which the committed records, measured alone, do not; without that
    key the ids are theirs."""
    expanded = {cell_path(c): c for grid in cells.values() for c in grid}
    alone = [
        {
            k: v
            for k, v in expanded[cell_path(r["cell"])].items()
            if k != "side_by_side" or k in r["cell"]
        }
        for r in committed.values()
    ]
    # h100_calibration's twin of fa3 was measured as tests.twin_kernel:FA3Twin, since moved into
    # the package (attnbench.kernels.twins): its records of then name the class where it was
    moved = [
        r.get("cell", {}).get("kernel_class", "").startswith("tests.twin_kernel")
        for r in committed.values()
    ]
    same = [
        stable_hash(c) == r["cell_id"] or m for c, r, m in zip(alone, committed.values(), moved)
    ]
    twins = [
        r.get("cell", {}).get("kernel_class", "").endswith(":FA3Twin") for r in committed.values()
    ]
    # every record of the twin names it: h100_calibration's first 8 the class where it was then,
    # those measured since the package's
    assert sum(twins) == sum("fa3_twin" in p.parts for p in committed) and sum(moved) <= 8
    assert sum(same) >= len(same) - 9 and sum(same) > 3000
    side_by_side = [expanded[cell_path(r["cell"])].get("side_by_side") for r in committed.values()]
    assert sum(bool(s) for s in side_by_side) > 2000  # h200, h200_sweep, h200_paired, h200_sparse


def test_a_record_starts_with_the_cells_dict_and_its_ids(cells):
    cell = next(c for c in cells["smoke_cp"] if c["mask"] == "causal_document_long")
    spec = CellSpec.from_dict(cell)
    code = {"code": {"sha256": "x", "files": {}}, "libraries": {}}
    record = base_record(spec, {"name": spec.impl}, code)
    assert record["cell"] == cell and record["cell_id"] == stable_hash(cell)
    assert record["config_sha256"] == stable_hash(cell, 64)
    assert record["data_seed"] == data_seed(spec.problem)


def test_cp_settings_left_out_at_their_defaults_come_back_as_the_defaults():
    """A cell names a CP setting only away from its default (the ids cells had before the setting
    existed); the default is the vocabulary's first entry, here and nowhere else."""
    base = {
        "local_kernel": "cpu_flash",
        "ulysses": 1,
        "ring": 2,
        "windows": 1,
        "placement": "contiguous",
        "gpus_per_node": 8,
        "nodes": 1,
        "nproc_per_node": 2,
        "breakdown": True,
        "timeout_s": 60,
    }
    c = CPSettings.from_dict(base)
    assert c.degrees == Degrees(1, 2, 1, G.PLACEMENTS[0], G.SPLIT_DOCUMENTS[0])
    assert c.dkv_comm_dtype == G.DKV_COMM_DTYPES[0] == "accumulator"
    assert c.emulate_contents == G.EMULATE_CONTENTS[0] == "peers"
    assert (c.kernel_grids, c.degrees_named, c.emulate) == ((), False, False)
    assert c.to_dict() == base
    named = {
        **base,
        "split_documents": "as_needed",
        "dkv_comm_dtype": "input",
        "emulate": True,
        "emulate_contents": "synthetic",
        "degrees_named": True,
        "kernel_grids": ["k"],
    }
    assert CPSettings.from_dict(named).to_dict() == named
    # a default named explicitly is left out again (one dict per cell, one id)
    explicit = {**base, "split_documents": "all", "dkv_comm_dtype": "accumulator"}
    assert CPSettings.from_dict(explicit).to_dict() == base


def test_the_defaults_are_read_nowhere_else():
    """No module but grid/spec.py takes a CP setting's default from a dict, nor puts the data seed
    into a spec (its `_data_seed` key is gone)."""
    keys = ("split_documents", "dkv_comm_dtype", "emulate_contents", "emulate", "kernel_grids")
    pattern = re.compile(r"""\.get\(\s*["'](%s)["']\s*,""" % "|".join(keys))
    for path in PACKAGE.rglob("*.py"):
        if path.name == "spec.py" and path.parent.name == "grid":
            continue
        text = path.read_text()
        assert not pattern.search(text), path
        assert "_data_seed" not in text, path
        assert 'spec["' not in text, path


def test_a_bad_spec_names_the_key(cells):
    cell = cells["smoke"][0]
    with pytest.raises(ValueError, match=r"cell spec: unknown 'head_dims' \(valid keys: grid, "):
        CellSpec.from_dict({**cell, "head_dims": 64})
    with pytest.raises(ValueError, match="cell spec: missing seed"):
        CellSpec.from_dict({k: v for k, v in cell.items() if k != "seed"})
    with pytest.raises(ValueError, match="cell spec: check: unknown 'tolerance'"):
        CellSpec.from_dict({**cell, "check": {**cell["check"], "tolerance": 3}})
    cp = cells["smoke_cp"][0]
    with pytest.raises(ValueError, match="unknown split_documents 'some'; valid: all, as_needed"):
        CellSpec.from_dict({**cp, "cp": {**cp["cp"], "split_documents": "some"}})
    with pytest.raises(ValueError, match="cp: missing ring"):
        CellSpec.from_dict({**cp, "cp": {k: v for k, v in cp["cp"].items() if k != "ring"}})


def test_the_cell_command_refuses_a_bad_spec_before_it_runs(cells, tmp_path, repo):
    bad = {**cells["smoke"][0], "warmups": 3}
    out = tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, "-m", "attnbench", "cell", "--spec", json.dumps(bad), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=120,
    )
    assert p.returncode != 0 and not out.exists()
    assert "--spec: cell spec: unknown 'warmups' (valid keys:" in p.stderr
    assert "warmup" in p.stderr


def test_finish_record_ends_every_record_alike(cells):
    """One end of a record: status (and what it says) before its reason, statistics only where
    timed, then the ceiling, the machine, when it finished and the wall time from t0."""
    spec = CellSpec.from_dict(cells["smoke"][0])
    code = {"code": {"sha256": "x", "files": {}}, "libraries": {}}
    record = base_record(spec, {"name": spec.impl}, code)
    finish_record(record, TIMEOUT, "stopped", None, "cpu", details={"time_budget_s": 5})
    keys = list(record)
    assert keys[keys.index("status") :][:3] == ["status", "time_budget_s", "status_reason"]
    assert keys[-3:] == ["matmul_peak", "environment", "finished_at"]
    assert "tflops" not in record and "wall_s" not in record
    timed = base_record(spec, {"name": spec.impl}, code)
    timed["samples"] = [{"time_ms": [1.0, 2.0], "flops": 4e9, "peak_mem_bytes": 8}]
    finish_record(timed, OK, None, {"matmul_peak_tflops": 100.0}, "cpu", gpus=2, t0=0.0)
    # per GPU, the median over the repetitions' TFLOP/s: 2.0 at 1 ms, 1.0 at 2 ms
    assert timed["tflops"] == pytest.approx((4e9 / 1e-3 + 4e9 / 2e-3) / 2 / 1e12 / 2)
    assert timed["fraction_of_peak"] == pytest.approx(timed["tflops"] / 100)
    assert timed["wall_s"] > 0 and list(timed)[-1] == "wall_s"


def test_a_problem_is_what_fixes_the_data():
    p = G.Problem("causal", {}, 256, 4, 2, 16, "float32", "fwd", 0)
    assert data_seed(p) == data_seed(replace(p, direction="bwd"))  # every direction: one data
    assert data_seed(p) != data_seed(replace(p, heads_kv=4))
    assert not p.backward and replace(p, direction="fwdbwd").backward
