"""Your own kernel by name: a grid names `module:Class`, and the kernel is validated, measured,
checked against float64 and drawn like a built-in one."""

import json
import os

import pytest
from attnbench.families import expand_cells, load_config, write_figures, write_tables
from attnbench.families.kernel.cell import run_cell
from attnbench.grid.config import ConfigError
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import CellSpec
from attnbench.kernels import catalog, libraries
from attnbench.record.record import write_record
from attnbench.report.collect import collect

OWN = "tests.custom_kernel:RowBlockSDPA"
GRID = {
    "description": "own kernel",
    "family": "kernel",
    "device": "cpu",
    "kernels": ["sdpa", OWN],
    "masks": ["causal", "causal_document", "sliding_window"],
    "seqlen": [192],
    "heads": [[4, 2]],
    "head_dim": [16],
    "dtype": ["float32"],
    "direction": ["fwd", "bwd"],
    "mask_params": {"window": 32},
    "samples": {"document": 3, "single": 1},
    "warmup": 1,
    "reps": 2,
}


@pytest.fixture(autouse=True)
def registry_as_it_was():
    """Registering an own kernel is for this process; later tests see the built-in registry."""
    before = dict(catalog.KERNELS)
    yield
    catalog.KERNELS.clear()
    catalog.KERNELS.update(before)


def config(repo, grid):
    return load_config(repo / "config.yaml", {"run": ["own"], "grids": {"own": grid}})


def test_own_kernel_is_measured_checked_and_drawn(repo, tmp_path):
    cfg = config(repo, GRID)
    cells = expand_cells(cfg)
    own = [c for c in cells if c["impl"] == "row_block_sdpa"]
    assert len(own) == 6 and all(c["kernel_class"] == OWN for c in own)
    for spec in cells:
        record = run_cell(CellSpec.from_dict(spec))
        write_record(record, tmp_path / cell_path(spec))
        if spec["impl"] == "row_block_sdpa":
            if spec["mask"] == "sliding_window":  # not in the masks its info claims
                assert (
                    record["status"] == "unsupported"
                    and "row_block_sdpa" in record["status_reason"]
                )
            else:
                assert record["status"] == "ok", record["status_reason"]
                assert record["check_passed"] and len(record["samples"]) == (
                    3 if "document" in spec["mask"] else 1
                )
                assert record["kernel"]["summary"] == "SDPA over blocks of 64 query rows"
    csv = tmp_path / "cells.csv"
    collect(root=tmp_path / "cells").to_csv(csv, index=False)
    tables = write_tables(csv, tmp_path / "tables", grid="own", grid_cfg=cfg["grids"]["own"])
    tflops = next(p for p in tables if p.name == "tflops.md").read_text()
    assert "row_block_sdpa" in tflops
    figures = write_figures(
        csv, tmp_path / "figures", cfg["figures"], grid="own", grid_cfg=cfg["grids"]["own"]
    )
    assert any(p.suffix == ".png" for p in figures)
    assert catalog.get("row_block_sdpa").colour == "#b15928"


@pytest.mark.parametrize(
    "entry, says",
    [
        ("tests.custom_kernel:NoSuchClass", "cannot be imported"),
        ("no_such_package.kernels:Mine", "cannot be imported"),
        ("tests.custom_kernel:F", "no `info` attribute"),
    ],
)
def test_a_bad_own_kernel_is_refused_naming_it(repo, entry, says):
    with pytest.raises(ConfigError) as e:
        config(repo, {**GRID, "kernels": [entry]})
    assert entry in str(e.value) and says in str(e.value) and "kernels[0]" in str(e.value)
    json.dumps(str(e.value))


@pytest.mark.parametrize(
    "change, says",
    [
        ({"marker": "X"}, "marker 'X' is reserved"),
        ({"marker": "x"}, "marker 'x' is reserved"),
        ({"colour": "#1F77B4"}, "colour #1F77B4 is sdpa's"),  # any case
    ],
)
def test_own_kernel_looks_are_checked(repo, monkeypatch, change, says):
    """The figures' rules: the out-of-memory X is no kernel's marker, and dense and block-sparse
    kernels, drawn together, each have a colour of their own."""
    import dataclasses

    from tests import custom_kernel

    cls = custom_kernel.RowBlockSDPA
    monkeypatch.setattr(cls, "info", dataclasses.replace(cls.info, **change))
    with pytest.raises(ConfigError) as e:
        config(repo, GRID)
    assert OWN in str(e.value) and says in str(e.value)


# ---------------------------------------------------------------- its code tracked like ours


def test_the_record_names_the_code_that_ran(repo):
    """Module, class, file and its sha256, the package's sha256 over the files that are the
    cells' code inputs, and git's view of them (tracked here, in the repository)."""
    import hashlib
    import subprocess

    from attnbench.harness.environment import own_kernel_source

    cfg = config(repo, {**GRID, "masks": ["causal"], "direction": ["fwd"]})
    spec = next(c for c in expand_cells(cfg) if c["impl"] == "row_block_sdpa")
    record = run_cell(CellSpec.from_dict(spec))
    src = record["kernel"]["source"]
    assert src == own_kernel_source(OWN)
    assert src["module"] == "tests.custom_kernel" and src["class"] == "RowBlockSDPA"
    assert src["path"] == "tests/custom_kernel.py"
    assert src["sha256"] == hashlib.sha256((repo / src["path"]).read_bytes()).hexdigest()
    files = libraries.own_kernel_files(OWN)[1]
    assert src["package_files"] == len(files) and str(repo / "tests/commands.py") in files
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--", "tests"],
        cwd=repo,
        capture_output=True,
        text=True,
    ).stdout
    assert src["git"] == ("untracked" if "??" in status else "modified" if status else "clean")
    assert src["declared_version"] is None  # it declares none


def test_an_untracked_kernel_file_makes_the_record_dirty(repo):
    """git_dirty covers your kernel: a file of its package that git does not know."""
    probe = repo / "tests" / f"_untracked_probe_{os.getpid()}.py"
    probe.write_text("# a file of the kernel's package that git does not track\n")
    try:
        cfg = config(repo, {**GRID, "masks": ["causal"], "direction": ["fwd"]})
        spec = next(c for c in expand_cells(cfg) if c["impl"] == "row_block_sdpa")
        record = run_cell(CellSpec.from_dict(spec))
        assert record["kernel"]["source"]["git"] == "untracked"
        assert record["environment"]["git_dirty"] is True
    finally:
        probe.unlink()


OUTSIDE = '''"""A kernel of one's own outside the repository: SDPA behind a module:Class."""

import torch.nn.functional as F
from attnbench.kernels.base import Kernel
from attnbench.kernels.catalog import KernelInfo

from . import helper

__version__ = "0.3"


class OwnSDPA(Kernel):
    info = KernelInfo(
        name="own_sdpa",
        family="dense",
        summary="SDPA from a package of one's own",
        impl="ownkernels.attention:OwnSDPA",
        masks=("causal",),
        directions={"cpu": ("fwd",)},
    )
    layout = "bhsd"

    def prepare(self, mask):
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=helper.CAUSAL, enable_gqa=self.gqa)
'''


def test_editing_your_kernels_package_reruns_exactly_its_cells(tmp_path):
    """Its module and the package it sits in are code inputs of its cells (and only of them);
    outside the repository, the record says so."""
    from commands import planned_jobs
    from tinygrids import config_running, kernel_grid, snakemake_on_copy, workflow_copy

    grid = kernel_grid(kernels=["naive", "ownkernels.attention:OwnSDPA"], masks=["causal"])
    workdir = workflow_copy(tmp_path, config_running({"own": grid}))
    pkg = tmp_path / "ownkernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "attention.py").write_text(OUTSIDE)
    (pkg / "helper.py").write_text("CAUSAL = True\n")
    env = {"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    p = snakemake_on_copy(workdir, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    record = json.loads(
        (
            workdir / "results/cells/own/kernel/own_sdpa/causal/s64-h2x1-d16-float32-fwd.json"
        ).read_text()
    )
    src = record["kernel"]["source"]
    assert record["status"] == "ok" and src["git"] == "outside the repository"
    assert src["path"] == str((pkg / "attention.py").resolve()) and src["package_files"] == 3
    assert src["declared_version"] == "0.3"
    assert planned_jobs(snakemake_on_copy(workdir, "-n", env=env)) == {}
    (pkg / "helper.py").write_text("CAUSAL = True  # an edit\n")
    p = snakemake_on_copy(workdir, "-n", "--printshellcmds", env=env)
    assert planned_jobs(p)["kernel_cell"] == 1
    cells = p.stdout.split("rule collect")[0]
    assert "/own_sdpa/causal/" in cells and "/naive/" not in cells


@pytest.mark.parametrize("check_max_seqlen", [None, 128])
def test_a_kernel_whose_graph_frees_itself_gets_a_new_forward_before_each_backward(
    repo, check_max_seqlen
):
    """TransformerEngine's fused attention can run the backward of one forward only once; a bwd
    cell of such a kernel (backward_once) must still time every repetition and pass the check,
    also where the check runs at a shorter length than the timing (the H200's 8K cells failed
    there), and one that says nothing fails at its second backward (as the H200 cells did)."""
    from tests import custom_kernel

    grid = {
        **GRID,
        "kernels": ["tests.custom_kernel:BackwardOnceSDPA"],
        "masks": ["causal"],
        "direction": ["bwd"],
    }
    if check_max_seqlen:
        grid["check"] = {"max_seqlen": check_max_seqlen}
    (spec,) = expand_cells(config(repo, grid))
    record = run_cell(CellSpec.from_dict(spec))
    assert record["status"] == "ok", record.get("status_reason")
    assert all(len(s["time_ms"]) == GRID["reps"] for s in record["samples"])
    custom_kernel.BackwardOnceSDPA.backward_once = False
    try:
        with pytest.raises(RuntimeError, match="backward of this forward ran already"):
            run_cell(CellSpec.from_dict(spec))
    finally:
        custom_kernel.BackwardOnceSDPA.backward_once = True


def test_a_lone_kernel_modules_neighbours_it_imports_are_its_code(tmp_path, monkeypatch):
    """A kernel in a module outside any package (mykern.py) with a helper beside it (helpers.py,
    and a helper package): both are its code, so editing the helper outdates its records; a file
    beside it that it does not import is not."""
    (tmp_path / "mykern.py").write_text("import helpers\nfrom tools.scale import factor\n")
    (tmp_path / "helpers.py").write_text("import os\nSCALE = 1.0\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "scale.py").write_text("factor = 1\n")
    (tmp_path / "unrelated.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    origin, files = libraries.own_kernel_files("mykern:Kernel")
    assert origin == str((tmp_path / "mykern.py").resolve())
    names = {os.path.relpath(f, tmp_path.resolve()) for f in files}
    assert names == {"mykern.py", "helpers.py", "tools/__init__.py", "tools/scale.py"}
