"""The matmul ceiling is the best measured on the machine (attnbench.ceiling): every measurement is
kept per machine, and collect judges a cell against the highest ceiling known for its own machine,
so that a ceiling measured under load (a real CPU cell judged `implausible` against it) is taken
back by a later, higher one (the `peak` command, measuring for real), and no other machine's
ceiling ever judges it. The record keeps what it saw; the tables say which ceiling judged it."""

import json

import pytest
from attnbench.__main__ import parser
from attnbench.ceiling import FROM_RECORD, Machine, keep, kept_folder, read_kept
from attnbench.families import expand_cells, load_config
from attnbench.families.kernel.cell import run_cell
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import CellSpec
from attnbench.record.record import write_record
from attnbench.record.status import IMPLAUSIBLE, OK
from attnbench.record.validate import read_record
from attnbench.report.collect import collect, collect_samples, read_records


@pytest.fixture(scope="module")
def spec(repo):
    cells = expand_cells(load_config(repo / "config.yaml"), ["smoke"])
    return next(c for c in cells if (c["impl"], c["mask"], c["seqlen"]) == ("sdpa", "causal", 128))


def measure_peak(root, dtype: str) -> dict:
    """`python -m attnbench peak` as the device_peak rule runs it, into the output folder `root`."""
    out = root / "device" / f"cpu-{dtype}.json"
    a = parser().parse_args(
        ["peak", "--device", "cpu", "--dtype", dtype, "--out", str(out)]
        + ["--keep", str(kept_folder(root))]
    )
    a.fn(a)
    return json.loads(out.read_text())


@pytest.fixture
def loaded(spec, tmp_path):
    """A real cell judged against a ceiling measured under load: its record in an output folder
    whose kept file holds that one low measurement (a hundredth of what the cell itself reached,
    so that the cell measured again under a load that slows it tenfold is still above it; the
    2-core machine of issue 55 measured 0.028 TFLOP/s loaded, 0.094 quiet)."""
    first = run_cell(CellSpec.from_dict(spec), None)
    machine = Machine.of_record(first)
    low = {"device": "cpu", "matmul_peak_tflops": first["tflops"] / 100, "note": "under load"}
    peak = keep(low, machine, kept_folder(tmp_path))
    record = run_cell(CellSpec.from_dict(spec), peak)
    path = tmp_path / cell_path(spec)
    write_record(record, path)
    return tmp_path, path, machine


def test_a_ceiling_measured_under_load_is_taken_back_by_a_higher_one(loaded):
    root, path, machine = loaded
    recorded = read_record(path)
    assert recorded["status"] == IMPLAUSIBLE  # judged when made, against the loaded ceiling
    row = collect([path]).iloc[0]
    assert row["status"] == IMPLAUSIBLE
    assert row["ceiling_tflops"] == recorded["matmul_peak"]["matmul_peak_tflops"]

    quiet = measure_peak(root, machine.dtype)  # measured for real, best of 3
    assert len(quiet["runs_tflops"]) == 3
    assert quiet["measured_now_tflops"] == max(quiet["runs_tflops"])
    assert (
        quiet["measurements"] == 2 and quiet["matmul_peak_tflops"] == quiet["measured_now_tflops"]
    )
    assert recorded["tflops"] * 1.05 < quiet["matmul_peak_tflops"]  # what the test relies on

    row = collect([path]).iloc[0]
    assert row["status"] == OK
    assert row["ceiling_tflops"] == quiet["matmul_peak_tflops"]
    assert str(machine.file(kept_folder(root))) in row["ceiling_from"]
    assert row["status_reason"].startswith("recorded implausible against a lower ceiling")
    # the record keeps what it saw: the loaded ceiling and its judgement
    assert row["matmul_peak_tflops"] == recorded["matmul_peak"]["matmul_peak_tflops"]
    assert read_record(path)["status"] == IMPLAUSIBLE
    # the per-sample table (what the answers compare draw by draw) reads it the same way
    assert set(collect_samples(read_records([path]))["status"]) == {OK}


def test_the_kept_file_holds_every_measurement_and_their_max(tmp_path):
    m = Machine("node-1", "NVIDIA H200", "bfloat16")
    seen = [keep({"matmul_peak_tflops": t}, m, tmp_path) for t in (220.0, 790.0, 610.0)]
    assert [s["matmul_peak_tflops"] for s in seen] == [220.0, 790.0, 790.0]
    assert [s["measured_now_tflops"] for s in seen] == [220.0, 790.0, 610.0]
    kept = read_kept(m, tmp_path)
    assert [x["matmul_peak_tflops"] for x in kept["measurements"]] == [220.0, 790.0, 610.0]
    assert all(x["measured_at"] for x in kept["measurements"])
    assert kept["matmul_peak_tflops"] == 790.0 == kept["best"]["matmul_peak_tflops"]
    assert seen[-1]["measured_at"] == kept["best"]["measured_at"]  # when the best was measured


def test_the_peak_command_merges_with_what_is_kept(spec, tmp_path):
    dtype = spec["dtype"]
    first = measure_peak(tmp_path, dtype)
    assert first["measurements"] == 1 and len(first["runs_tflops"]) == 3
    m = Machine(first["host"], first["device_name"], dtype)
    keep({"matmul_peak_tflops": 1e6}, m, kept_folder(tmp_path))  # higher than any CPU measures
    again = measure_peak(tmp_path, dtype)
    assert again["matmul_peak_tflops"] == 1e6 and again["measured_now_tflops"] < 1e6
    assert again["measurements"] == 3


def test_a_ceiling_kept_for_another_machine_never_judges_a_record(loaded):
    root, path, machine = loaded
    folder, high = kept_folder(root), {"matmul_peak_tflops": 1e6}
    for other in (
        Machine("another-host", machine.device_name, machine.dtype),
        Machine(machine.host, "another device", machine.dtype),
        Machine(machine.host, machine.device_name, "float16"),
    ):
        keep(high, other, folder)
    # a file at this machine's name that is another's (their names give the same file name)
    own = machine.file(folder)
    stranger = {**json.loads(own.read_text()), "host": machine.host + "?", **high}
    own.write_text(json.dumps(stranger))
    row = collect([path]).iloc[0]
    assert row["status"] == IMPLAUSIBLE
    assert row["ceiling_from"] == FROM_RECORD  # the record's own, the only one of its machine
    # a record outside an output folder: its own ceiling judges it
    elsewhere = root / "elsewhere.json"
    elsewhere.write_text(path.read_text())
    from attnbench.report.collect import row as table_row

    assert table_row(read_record(elsewhere), str(elsewhere))["status"] == IMPLAUSIBLE
