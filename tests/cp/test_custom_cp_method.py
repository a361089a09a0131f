"""Your own CP method by name: a grid names `module:Class`, and the method is validated when the
config is read, verified against float64 over gloo, measured, drawn and advised like a built-in one
(the example: tests/custom_cp_method.py)."""

import json
import os

import pytest
from attnbench.cp import catalog
from attnbench.families import expand_cells, load_config
from attnbench.grid.config import ConfigError
from attnbench.masks import CP_MASKS
from commands import cp_verify, planned_jobs
from tinygrids import config_running, cp_grid, snakemake_on_copy, workflow_copy

OWN = "tests.custom_cp_method:ContiguousAllGather"
NAME = "allgather_contiguous"


@pytest.fixture(autouse=True)
def registry_as_it_was():
    """Registering an own method is for this process; later tests see the built-in registry."""
    before = dict(catalog.METHODS)
    yield
    catalog.METHODS.clear()
    catalog.METHODS.update(before)


def config(repo, **grid):
    return load_config(repo / "config.yaml", {"run": ["own"], "grids": {"own": cp_grid(**grid)}})


def test_own_method_expands_by_its_name_with_its_layout(repo):
    """Its cells carry its name and import path; its degrees follow its layout (RING: U = 1,
    R = N) whatever the grid's Ulysses degree says (it applies to the grid-chosen layouts)."""
    cfg = config(repo, methods=["usp", OWN], gpus=[4], heads=[[4, 2]], cp={"ulysses_degree": 2})
    cells = {c["impl"]: c for c in expand_cells(cfg)}
    own, usp = cells[NAME], cells["usp"]
    assert own["method_class"] == OWN and "method_class" not in usp
    assert (own["cp"]["ulysses"], own["cp"]["ring"]) == (1, 4)
    assert (usp["cp"]["ulysses"], usp["cp"]["ring"]) == (2, 2)
    assert catalog.method(NAME).label == "AllGather, contiguous shards"


def test_split_documents_applies_only_to_methods_sharding_with_the_layout(repo):
    with pytest.raises(ConfigError) as e:
        config(repo, methods=[OWN, "ulysses"], cp={"split_documents": "as_needed"})
    msg = str(e.value)
    assert f"{NAME} does not shard documents with cp/layout.py" in msg
    assert "ulysses does not" not in msg  # Ulysses shards with it (whole documents at R = 1)
    assert "(it applies to ulysses, ring_p2p, ring_allgather, usp, loongtrain)" in msg


@pytest.mark.parametrize(
    "entry, says",
    [
        ("tests.custom_cp_method:NoSuchClass", "cannot be imported"),
        ("no_such_package.methods:Mine", "cannot be imported"),
        ("tests.custom_cp_method:Chunk", "no `info` attribute holding a MethodInfo"),
    ],
)
def test_a_bad_own_method_is_refused_naming_it(repo, entry, says):
    with pytest.raises(ConfigError) as e:
        config(repo, methods=["ring_p2p", entry])
    assert entry in str(e.value) and says in str(e.value) and "methods[1]" in str(e.value)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"marker": "X"}, "marker 'X' is reserved"),
        ({"colour": "#e41a1c", "marker": "s"}, "is ring_p2p's"),  # Ring P2P's looks
        ({"name": "ring_p2p"}, "the name 'ring_p2p' is taken"),
        ({"name": "naive"}, "the name 'naive' is taken"),  # a kernel's: figures look names up
        ({"impl": "elsewhere:Other"}, "must be the same 'module:Class'"),
        ({"name": "all gather"}, "must be letters, digits and _"),
    ],
)
def test_own_method_info_is_checked(monkeypatch, change, says):
    """resolve_method checks what its info claims: a reserved marker or another method's looks,
    a taken name, another impl, a name that cannot name files."""
    import dataclasses

    from tests import custom_cp_method

    cls = custom_cp_method.ContiguousAllGather
    monkeypatch.setattr(cls, "info", dataclasses.replace(cls.info, **change))
    with pytest.raises(ValueError, match=says):
        catalog.resolve_method(OWN)


def test_own_method_is_correct_on_every_mask_it_claims_over_gloo(tmp_path):
    """The verify matrix (cp.verify) on 2 CPU ranks, GQA 8:2, odd document lengths, a padded
    sequence: out, lse, dq, dk, dv of every rank against float64 on every mask the method
    claims, with both CPU local kernels; its bytes as its volume() says."""
    claimed = catalog.resolve_method(OWN).masks
    assert claimed == CP_MASKS  # every CP mask
    rows = cp_verify(2, tmp_path / "v.jsonl", "--methods", OWN, timeout=300)
    assert {r["method"] for r in rows} == {NAME}
    assert {(r["mask"], r["local_kernel"]) for r in rows} == {
        (m, k) for m in claimed for k in ("math", "cpu_flash")
    }
    for r in rows:
        assert r["status"] == "ok" and r["passed"] and r["backward"], r
        assert r["every_row_once"] and r["bytes_match_analytic"], r
        assert r["degrees"]["ring"] == 2 and r["degrees"]["ulysses"] == 1
        assert r["split_documents"] == "all"  # it shards its own way: as_needed is not its
        assert all(b["sent"] > 0 for b in r["bytes"])


BROKEN = '''"""The example computing a causal mask as a full one: its rows see the future."""

import dataclasses

from attnbench.masks import Mask
from tests.custom_cp_method import ContiguousAllGather, contiguous_chunk


class SeesTheFuture(ContiguousAllGather):
    info = dataclasses.replace(
        ContiguousAllGather.info, name="sees_the_future", impl="broken_cp:SeesTheFuture"
    )

    def __init__(self, info, rc, mask, *args):
        super().__init__(info, rc, mask, *args)
        full = Mask(mask.name.replace("causal", "full"), mask.seqlen, mask.params)
        self.chunk = contiguous_chunk(full, self.r, self.M, self.N)
'''


def test_a_wrong_method_is_caught(tmp_path):
    """The same check fails a method that computes a causal mask as a full one."""
    (tmp_path / "broken_cp.py").write_text(BROKEN)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    args = ["--methods", "broken_cp:SeesTheFuture", "--masks", "causal", "full"]
    args += ["--kernels", "math", "--split-documents", "all"]
    rows = cp_verify(2, tmp_path / "v.jsonl", *args, timeout=300, env=env)
    status = {r["mask"]: r["status"] for r in rows}
    assert status == {"causal": "incorrect", "full": "ok"}, rows


def test_own_method_runs_end_to_end_and_editing_it_reruns_its_cells(tmp_path):
    """Snakemake on a tiny grid: the method beside Ring P2P on 2 ranks and the bare kernel on 1;
    its records (ok, checked), the tidy table, the CP tables, figures and advice name it; its
    module and package are its cells' code inputs (and only theirs)."""
    from tests import custom_cp_method

    pkg = tmp_path / "owncp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    source = custom_cp_method.__file__
    text = open(source).read().replace(OWN, "owncp.method:ContiguousAllGather")
    (pkg / "method.py").write_text(text)
    own = "owncp.method:ContiguousAllGather"
    grid = cp_grid(
        methods=["ring_p2p", own],
        masks=["causal", "causal_document"],
        tokens_per_gpu=[48],
        heads=[[4, 2]],
        direction=["fwdbwd"],
        samples={"document": 2, "single": 1},
        reps=3,
        also=[{"methods": ["local"], "gpus": [1], "tokens_per_gpu": [96]}],
    )
    cfg = config_running({"owncp": grid})
    cfg["figures"] = {"formats": ["png"], "dpi": 50}
    (tmp_path / "run").mkdir()
    workdir = workflow_copy(tmp_path / "run", cfg)
    env = {"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    p = snakemake_on_copy(workdir, env=env, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = workdir / "results"
    mine = sorted((res / f"cells/owncp/cp/{NAME}").rglob("*.json"))
    assert [f.relative_to(res / "cells/owncp/cp").as_posix() for f in mine] == [
        f"{NAME}/causal/s96-h4x2-d16-float32-fwdbwd-g2.json",
        f"{NAME}/causal_document/s96-h4x2-d16-float32-fwdbwd-g2.json",
    ]
    for f in mine:
        record = json.loads(f.read_text())
        assert record["status"] == "ok", record["status_reason"]
        assert record["check_passed"] and record["cp"]["bytes_match_analytic"]
        assert record["kernel"]["name"] == NAME and record["kernel"]["local_kernel"] == "cpu_flash"
        src = record["kernel"]["source"]
        assert src["module"] == "owncp.method" and src["git"] == "outside the repository"
        assert record["cp"]["degrees"]["ring"] == 2
    tables = res / "tables/owncp"
    assert "AllGather, contiguous shards" in (tables / "cp_tflops.md").read_text()
    assert NAME in (tables / "cp_vs_single_gpu.md").read_text()
    assert NAME in (tables / "advice.md").read_text()
    assert (res / "figures/owncp/cp_tflops_vs_gpus.png").stat().st_size > 0
    assert planned_jobs(snakemake_on_copy(workdir, "-n", env=env)) == {}
    (pkg / "method.py").write_text(text + "\n# an edit\n")
    p = snakemake_on_copy(workdir, "-n", "--printshellcmds", env=env)
    assert planned_jobs(p)["cp_cell"] == 2
    cells = p.stdout.split("rule collect")[0]
    assert f"/{NAME}/causal" in cells and "/ring_p2p/" not in cells and "/local/" not in cells
