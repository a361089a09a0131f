"""Provenance: every record names the code tree (a content hash, not git) and the config that made it;
the tidy table and the captions repeat it."""

import json
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
import torch
from attnbench.families import expand_cells, load_config, validate
from attnbench.families.kernel import cell as C
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import CellSpec
from attnbench.harness.environment import code_files, code_hash, tree_sha256
from attnbench.harness.inputs import make_inputs
from attnbench.kernels import catalog
from attnbench.kernels.base import from_thd, load
from attnbench.masks import sample_mask
from attnbench.record import record as R
from attnbench.report import captions
from attnbench.report.collect import collect
from synthetic_cells import kernel_table


@pytest.fixture
def tree(repo, tmp_path):
    """A copy of this checkout's code files, beside a results folder and a test file."""
    for path in code_files(repo):
        dst = tmp_path / path.relative_to(repo)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dst)
    (tmp_path / "results" / "cells").mkdir(parents=True)
    (tmp_path / "results" / "cells" / "a.json").write_text("{}")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    return tmp_path


def test_the_copy_hashes_like_the_checkout(repo, tree):
    assert tree_sha256(tree) == tree_sha256(repo) == code_hash()
    assert code_hash()["code_files"] > 50  # the package, the rules, the schema, the pins


def test_results_tests_and_bytecode_do_not_change_the_hash(tree):
    before = tree_sha256(tree)
    (tree / "results" / "cells" / "a.json").write_text('{"status": "ok"}')
    (tree / "results" / "cells" / "b.json").write_text("{}")
    (tree / "tests" / "test_x.py").write_text("assert True\n")
    cache = tree / "workflow" / "attnbench" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "flops.cpython-311.pyc").write_bytes(b"\0")
    assert tree_sha256(tree) == before


@pytest.mark.parametrize(
    "change",
    ["edit package", "add module", "rename module", "edit rule", "edit pins", "edit schema"],
)
def test_every_code_change_changes_the_hash(tree, change):
    before = tree_sha256(tree)["code_sha256"]
    pkg = tree / "workflow" / "attnbench"
    if change == "edit package":
        (pkg / "harness" / "flops.py").write_text(
            (pkg / "harness" / "flops.py").read_text() + "\n"
        )
    elif change == "add module":
        (pkg / "kernels" / "extra.py").write_text("")
    elif change == "rename module":
        (pkg / "harness" / "flops.py").rename(pkg / "harness" / "flops2.py")
    elif change == "edit rule":
        (tree / "workflow" / "rules" / "kernels.smk").write_text("# changed\n")
    elif change == "edit pins":
        (tree / "envs" / "requirements-cpu.txt").write_text("torch==0.0\n")
    else:
        (tree / "workflow" / "schemas" / "config.schema.yaml").write_text("{}\n")
    assert tree_sha256(tree)["code_sha256"] != before


@pytest.fixture(scope="module")
def cells(repo):
    return expand_cells(load_config(repo / "config.yaml"), ["smoke"])


def test_a_record_and_its_row_carry_the_code_and_config_hashes(cells, tmp_path):
    """An unavailable cell is still a record, and it names its code and config like any other."""
    spec = next(c for c in cells if c["impl"] == "fa3")
    other = {**spec, "reps": spec["reps"] + 1}
    record, record2 = C.run_cell(CellSpec.from_dict(spec)), C.run_cell(CellSpec.from_dict(other))
    assert record["environment"]["code_sha256"] == code_hash()["code_sha256"]
    assert (
        len(record["config_sha256"]) == 64 and record["config_sha256"] != record2["config_sha256"]
    )
    assert C.run_cell(CellSpec.from_dict(dict(spec)))["config_sha256"] == record["config_sha256"]
    path = tmp_path / cell_path(spec)  # a record is read only at its cell's path
    R.write_record(record, path)
    row = collect([path]).iloc[0]
    assert (row["code_sha256"], row["config_sha256"]) == (
        code_hash()["code_sha256"],
        record["config_sha256"],
    )


def test_captions_name_the_commit_and_the_code_hash():
    df = kernel_table()
    df["code_sha256"] = "ab" * 32
    text = captions.code(df)
    assert (
        "commit 0123456789" in text and "code sha256 abababababab" in text and "cells)" not in text
    )
    df.loc[df.index[:2], "code_sha256"] = "cd" * 32
    df.loc[df.index[2], "code_sha256"] = None
    text = captions.code(df)
    assert (
        f"abababababab ({len(df) - 3} cells), cdcdcdcdcdcd (2 cells), not recorded (1 cells)"
        in text
    )


def test_captions_of_records_without_a_code_hash_say_so():
    assert "code sha256 not recorded" in captions.code(kernel_table())


def test_the_commit_a_tree_was_copied_from_wins_over_its_stale_history(monkeypatch, tmp_path):
    """A GPU machine gets a copy of the working tree with an older .git: the commit the copy was
    made from (ATTNBENCH_GIT_COMMIT / _DIRTY, set by whoever copied it) is the record's."""
    from attnbench.harness import environment as E

    monkeypatch.setenv("ATTNBENCH_GIT_COMMIT", "0" * 40)
    monkeypatch.setenv("ATTNBENCH_GIT_DIRTY", "0")
    E.git_state.cache_clear()
    try:
        assert E.git_state() == {"git_commit": "0" * 40, "git_dirty": False}
        monkeypatch.chdir(tmp_path)  # no git history at all: the same
        E.git_state.cache_clear()
        assert E.git_state() == {"git_commit": "0" * 40, "git_dirty": False}
    finally:
        E.git_state.cache_clear()


def test_the_row_names_the_library_that_ran_not_the_first_installed(cells, tmp_path):
    """vsa's record lists the vsa wheel (installed, but not loadable with torch 2.11); its kernels ran
    from fastvideo-kernel, which notes.library names: the tidy table (and the captions) say so."""
    spec = next(c for c in cells if c["impl"] == "fa3")
    record = C.run_cell(CellSpec.from_dict(spec))
    path = tmp_path / cell_path(spec)
    R.write_record(record, path)
    assert collect([path]).iloc[0]["library_version"] == record["kernel"]["library_version"]
    record["kernel"]["library_version"] = "vsa 0.0.4"
    record["kernel"]["notes"]["library"] = (
        "fastvideo_kernel 0.3.2 (importing vsa failed: libcudart.so.12: cannot open shared object)"
    )
    R.write_record(record, path)
    assert collect([path]).iloc[0]["library_version"] == "fastvideo_kernel 0.3.2"


# ---------------------------------------------------------------- the machine, and what SDPA ran


def test_a_record_names_the_cpu_in_full(cells):
    record = C.run_cell(
        CellSpec.from_dict(next(c for c in cells if c["impl"] == "naive" and c["seqlen"] == 128))
    )
    cpu = record["environment"]["cpu"]
    block = open("/proc/cpuinfo").read().split("\n\n")[0]
    first = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in block.splitlines())}
    assert cpu["model_name"] == first["model name"] and cpu["vendor"] == first["vendor_id"]
    assert [cpu["family"], cpu["model"], cpu["stepping"]] == [
        first["cpu family"],
        first["model"],
        first["stepping"],
    ]
    assert cpu["logical_cpus"] == os.cpu_count() and cpu["sockets"] >= 1
    assert set(cpu["isa"]) <= set(first["flags"].split())
    assert cpu["torch_capability"] == torch.backends.cpu.get_cpu_capability()


@pytest.mark.parametrize(
    "impl, mask, op",
    [
        ("sdpa", "causal", "_scaled_dot_product_flash_attention_for_cpu"),
        ("sdpa", "causal_document", "_scaled_dot_product_flash_attention_for_cpu"),
        ("sdpa_math", "causal", "_scaled_dot_product_attention_math"),
    ],
)
def test_the_record_names_the_sdpa_backend_that_ran(cells, impl, mask, op):
    """SDPA's own choice on the CPU is recorded, and it is the kernel the profiler sees run."""
    from torch.profiler import profile

    spec = next(c for c in cells if (c["impl"], c["mask"], c["direction"]) == (impl, mask, "fwd"))
    backend = C.run_cell(CellSpec.from_dict(spec))["kernel"]["notes"]["sdpa_backend"]
    kern = load(
        catalog.get(impl), device="cpu", dtype=torch.float32, heads_q=4, heads_kv=2, head_dim=32
    )
    rng = np.random.default_rng(0)
    m = sample_mask(mask, spec["seqlen"], spec["mask_params"], rng, spec["histograms"], 4, 2)
    fn = kern.prepare(m)
    q, k, v, _ = make_inputs(0, spec["seqlen"], 4, 2, 32, torch.float32, "cpu")
    with profile() as p, torch.no_grad():
        fn(*(from_thd(x, kern.layout) for x in (q, k, v)))
    ran = {e.key for e in p.key_averages() if "scaled_dot_product" in e.key}
    assert f"aten::{op}" in ran, ran
    expected = "MATH" if "math" in op else "FLASH_ATTENTION"
    assert backend.split()[0] == expected == kern.load_notes["sdpa_backend"].split()[0]
    if impl == "sdpa":
        assert backend == "FLASH_ATTENTION (SDPA's choice on cpu)"


# ---------------------------------------------------------------- the code list is every file a cell runs

TRACER = """import atexit, os, sys


def _dump():  # the package's files this process imported, one per line
    files = sorted(
        m.__file__ for m in list(sys.modules.values())
        if "/attnbench/" in (getattr(m, "__file__", None) or "")  # __main__ too
    )
    with open(os.path.join(os.environ["ATTNBENCH_TRACE"], f"{os.getpid()}.txt"), "w") as f:
        f.write("\\n".join(files))


atexit.register(_dump)
"""


def traced_files(trace, record) -> set[str]:
    """The files every traced process imported, named as a record names them, that the record's
    code list lacks."""
    from attnbench.record.code import file_name

    imported = {file_name(f) for t in trace.glob("*.txt") for f in t.read_text().split()}
    assert len(list(trace.glob("*.txt"))) >= 2 and "attnbench/__main__.py" in imported
    return imported - set(record["code"]["files"])


@pytest.mark.parametrize("worker", [False, True], ids=["own process", "warm worker"])
def test_a_kernel_cells_code_list_holds_every_file_its_processes_import(tmp_path, worker):
    """An import trace of a real cell (the launcher, the cell's command and, with a warm worker,
    the worker: every process a cell's job starts) against the code list its record names: a file
    missing from the list could be edited without the record being outdated."""
    from commands import cell_args, launched, package_env
    from tinygrids import config_running, kernel_grid

    trace, hook = tmp_path / "trace", tmp_path / "hook"
    trace.mkdir()
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(TRACER)  # imported by every Python process started
    (cell,) = expand_cells(validate(config_running({"c": kernel_grid(kernels=["sdpa"])})))
    out = tmp_path / "record.json"
    extra = ("--threads", "1", "--worker-idle-s", "2") if worker else ("--threads", "1")
    env = package_env(ATTNBENCH_TRACE=str(trace))
    env["PYTHONPATH"] = f"{hook}:{env['PYTHONPATH']}"
    cmd = launched(["--nproc-per-node", "1"], *cell_args(cell, out, *extra))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    record = json.loads(out.read_text())
    if worker:  # its file is written when it ends, idle
        assert "worker" in record
        deadline = time.monotonic() + 60
        while len(list(trace.glob("*.txt"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    for name in ("__main__", "run/launch", "harness/process_state", "harness/cpu_math"):
        assert f"attnbench/{name}.py" in record["code"]["files"]
    assert ("attnbench/run/worker.py" in record["code"]["files"]) and not traced_files(
        trace, record
    )
    # the other commands (attnbench/cli/) are not a cell's
    assert not [f for f in record["code"]["files"] if f.startswith("attnbench/cli/")]


def test_a_cp_cells_code_list_holds_every_file_its_processes_import(tmp_path):
    """The same for an emulated CP cell, launched as the workflow launches it."""
    from commands import cp_cell_cmd, package_env
    from tinygrids import config_running, cp_grid

    trace, hook = tmp_path / "trace", tmp_path / "hook"
    trace.mkdir()
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(TRACER)
    cells = expand_cells(validate(config_running({"c": cp_grid()})))
    out = tmp_path / "record.json"
    env = package_env(ATTNBENCH_TRACE=str(trace))
    env["PYTHONPATH"] = f"{hook}:{env['PYTHONPATH']}"
    p = subprocess.run(
        cp_cell_cmd(cells[0], out), capture_output=True, text=True, timeout=300, env=env
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["status"] == "ok", record["status_reason"]
    assert not traced_files(trace, record)
