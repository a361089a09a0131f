"""Every outcome of a cell is a record: a kernel whose output is not the query's shape or the cell's
dtype is `incorrect`, naming what was expected; a process that exits, raises or dies by a signal
without writing its record gets a `crashed` one from the launcher (how it ended, the last lines of
its log), in a fresh process and in the warm worker alike."""

from __future__ import annotations

import json
import subprocess

import pytest
from attnbench.families import expand_cells, load_config
from attnbench.record.validate import record_problems
from commands import PY, cell_args, package_env

KERNELS = '''"""Kernels that misbehave in the ways a new kernel does."""

import ctypes
import os

import torch
import torch.nn.functional as F
from attnbench.kernels.base import Kernel
from attnbench.kernels.catalog import KernelInfo


def info(name):
    return KernelInfo(
        name=name, family="dense", summary=name, impl=f"badkern:{name.title().replace('_', '')}",
        masks=("causal",), directions={"cpu": ("fwd", "bwd")},
    )


class Base(Kernel):
    layout = "bhsd"

    def sdpa(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)


class WrongShape(Base):
    info = info("wrong_shape")

    def prepare(self, mask):
        return lambda q, k, v: self.sdpa(q, k, v)[:, :, :-1]


class Float64(Base):
    info = info("float64")

    def prepare(self, mask):
        return lambda q, k, v: self.sdpa(q.double(), k.double(), v.double())


class Exits(Base):
    info = info("exits")

    def prepare(self, mask):
        print("about to leave", flush=True)
        os._exit(0)


class Segfaults(Base):
    info = info("segfaults")

    def prepare(self, mask):
        print("about to read address 0", flush=True)
        ctypes.string_at(0)


class Raises(Base):
    info = info("raises")

    def prepare(self, mask):
        raise RuntimeError("this kernel's prepare is broken")
'''


@pytest.fixture(scope="module")
def bad(repo, tmp_path_factory):
    """badkern.py importable here and in the cells; the spec of each kernel's causal cell, by
    kernel and direction."""
    import sys

    from attnbench.kernels import catalog

    folder = tmp_path_factory.mktemp("badkern")
    (folder / "badkern.py").write_text(KERNELS)
    sys.path.insert(0, str(folder))
    before = dict(catalog.KERNELS)
    names = ["WrongShape", "Float64", "Exits", "Segfaults", "Raises"]
    grid = {
        "family": "kernel",
        "device": "cpu",
        "kernels": [f"badkern:{n}" for n in names],
        "masks": ["causal"],
        "seqlen": [64],
        "heads": [[2, 1]],
        "head_dim": [16],
        "dtype": ["float32"],
        "direction": ["fwd", "bwd"],
        "warmup": 0,
        "reps": 2,
    }
    cfg = load_config(repo / "config.yaml", {"run": ["bad"], "grids": {"bad": grid}})
    yield folder, {(c["impl"], c["direction"]): c for c in expand_cells(cfg)}
    sys.path.remove(str(folder))
    catalog.KERNELS.clear()
    catalog.KERNELS.update(before)


def launched_cell(folder, spec, tmp_path, *extra):
    """The cell as the workflow starts it: under the launcher with --record and --log, its output
    in the log. Returns (launcher's status, record, log text)."""
    out, log = tmp_path / "record.json", tmp_path / "cell.log"
    cmd = [
        PY, "-m", "attnbench.run.launch", "--time-limit-s", "120", "--record", str(out),
        "--log", str(log), "--", PY, *cell_args(spec, out, *extra),
    ]  # fmt: skip
    env = package_env()
    env["PYTHONPATH"] += f":{folder}"
    with log.open("w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=300)
    return p.returncode, json.loads(out.read_text()), log.read_text()


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize(
    "kernel, why",
    [
        ("wrong_shape", "the kernel's output has shape [1, 2, 63, 16]; expected [1, 2, 64, 16]"),
        ("float64", "the kernel's output is float64; expected float32, the cell's dtype"),
    ],
)
def test_a_malformed_output_is_incorrect_naming_what_was_expected(
    bad, tmp_path, kernel, why, direction
):
    folder, specs = bad
    rc, record, _ = launched_cell(folder, specs[(kernel, direction)], tmp_path)
    assert rc == 0 and record["status"] == "incorrect"
    assert record["status_reason"].startswith(why), record["status_reason"]
    assert record["samples"] == [] and "tflops" not in record  # found out before any timing
    assert record_problems(record) == []


@pytest.mark.parametrize("worker_idle_s", ["0", "20"])
@pytest.mark.parametrize(
    "kernel, how, last",
    [
        ("exits", "exited with status 0", "about to leave"),
        ("segfaults", "was killed by signal 11 (SIGSEGV)", "about to read address 0"),
        ("raises", "exited with status 1", "RuntimeError: this kernel's prepare is broken"),
    ],
)
def test_a_process_that_ends_without_its_record_gets_a_crashed_one(
    bad, tmp_path, kernel, how, last, worker_idle_s
):
    folder, specs = bad
    rc, record, log = launched_cell(
        folder, specs[(kernel, "fwd")], tmp_path, "--worker-idle-s", worker_idle_s
    )
    assert rc == 0, log  # the job succeeds: the run goes on, and keeps the record
    assert record["status"] == "crashed" and record_problems(record) == []
    assert record["samples"] == [] and "tflops" not in record
    crash = record["crash"]
    if worker_idle_s == "0":
        assert crash["how"] == how, crash
        assert any(last in line for line in crash["log_tail"]), crash["log_tail"]
    else:  # the worker died in the cell (or raised): the job says so and exits 1
        assert crash["how"] == "exited with status 1", crash
        said = "\n".join(crash["log_tail"])
        assert "the worker (pid" in said or "the cell failed in the worker" in said, said
        if kernel == "raises":
            assert last in said
    assert f"its process {crash['how']} without writing a record" in record["status_reason"]
    assert crash["log"] == str(tmp_path / "cell.log")
    assert record["cell"] == specs[(kernel, "fwd")] and record["environment"]["host"]
