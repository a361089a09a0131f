"""family: cp grids: degrees, expansion into cells, and errors that name the bad value."""

import copy

import pytest
from attnbench.cp import catalog
from attnbench.families import expand_cells, load_config, validate
from attnbench.grid.config import ConfigError
from attnbench.grid.expand import cell_path
from attnbench.grid.spec import CellSpec

TINY = {
    "family": "cp",
    "device": "cpu",
    "methods": ["ring_p2p", "usp"],
    "masks": ["causal"],
    "tokens_per_gpu": [32],
    "gpus": [2, 4],
    "heads": [[4, 2]],
    "head_dim": [16],
    "dtype": ["float32"],
    "direction": ["fwd"],
}


def with_grid(base, **changes):
    cfg = copy.deepcopy(base)
    cfg["run"] = ["t"]
    cfg["grids"] = {"t": {**copy.deepcopy(TINY), **changes}}
    return cfg


def problems(base, **changes) -> str:
    with pytest.raises(ConfigError) as e:
        validate(with_grid(base, **changes))
    return str(e.value)


def test_degrees():
    assert catalog.degrees("ulysses", 8).to_json() == {
        "ulysses": 8,
        "ring": 1,
        "windows": 1,
        "placement": "contiguous",
    }
    assert (
        catalog.degrees("usp", 96).ulysses == 8 and catalog.degrees("usp", 96).ring == 12
    )  # paper: U = min(N, 8)
    assert catalog.degrees("usp", 4, gpus_per_node=8).ring == 1
    assert [catalog.default_windows(r) for r in (1, 2, 3, 4, 6, 8, 9, 12)] == [
        1,
        1,
        1,
        2,
        2,
        2,
        3,
        3,
    ]
    lt = catalog.degrees("loongtrain", 32, ulysses_degree=2, placement="strided")
    assert (lt.ulysses, lt.ring, lt.windows, lt.window_size) == (2, 16, 4, 4)
    with pytest.raises(ValueError, match="ulysses_degree 3 does not divide the 8 GPUs"):
        catalog.degrees("usp", 8, ulysses_degree=3)


@pytest.mark.parametrize("placement", ["contiguous", "strided"])
def test_placement_maps_every_rank_once(placement):
    deg = catalog.Degrees(4, 3, 1, placement)
    coords = [deg.coords(r) for r in range(12)]
    assert sorted(coords) == [(r, u) for r in range(3) for u in range(4)]
    assert all(deg.rank(*deg.coords(x)) == x for x in range(12))
    group0 = sorted(deg.rank(0, u) for u in range(4))  # ranks of one Ulysses group
    assert group0 == ([0, 1, 2, 3] if placement == "contiguous" else [0, 3, 6, 9])


def test_expansion(base):
    cells = expand_cells(validate(with_grid(base)))
    assert len(cells) == 4
    usp4 = next(c for c in cells if c["impl"] == "usp" and c["gpus"] == 4)
    assert usp4["seqlen"] == 128 and usp4["tokens_per_gpu"] == 32
    assert usp4["cp"] == {
        "local_kernel": "auto",  # the grid names none: each cell chooses when it runs
        "ulysses": 4,
        "ring": 1,
        "windows": 1,
        "placement": "contiguous",
        "gpus_per_node": 8,
        "nodes": 1,
        "nproc_per_node": 4,
        "breakdown": True,
        "timeout_s": 600,
    }
    assert cell_path(usp4) == "cells/t/cp/usp/causal/s128-h4x2-d16-float32-fwd-g4-kauto.json"
    # cpu_flash (sdpa_flash on GPUs) cells keep the ids they had before the local kernel was named
    # per cell, so their records stay valid
    named = expand_cells(validate(with_grid(base, cp={"local_kernel": "cpu_flash"})))
    assert {cell_path(c).split("-g")[1] for c in named} == {"2.json", "4.json"}
    assert all(c["cp"]["local_kernel"] == "cpu_flash" for c in named)


def test_an_also_entry_names_its_own_local_kernel_and_dkv_dtype(base):
    """Per product: a local kernel and the dtype dK/dV travel the ring in, both in the cell id;
    the settings a cell does not use stay out of its spec."""
    cfg = with_grid(
        base,
        methods=["ring_p2p"],
        gpus=[2],
        cp={"local_kernel": "cpu_flash"},
        direction=["bwd"],
        also=[
            {"methods": ["ring_p2p"], "cp": {"dkv_comm_dtype": "input"}},
            {"methods": ["ulysses"], "cp": {"local_kernel": "math"}},
            {"methods": ["ulysses"], "cp": {"local_kernel": "auto"}},
        ],
    )
    cells = {
        cell_path(c).rsplit("/", 2)[0].split("/")[-1] + cell_path(c).split("-g2")[1]: c
        for c in expand_cells(validate(cfg))
    }
    assert set(cells) == {
        "ring_p2p.json",
        "ring_p2p-dkvinput.json",
        "ulysses-kmath.json",
        "ulysses-kauto.json",
    }
    assert cells["ring_p2p-dkvinput.json"]["cp"]["dkv_comm_dtype"] == "input"
    assert "dkv_comm_dtype" not in cells["ring_p2p.json"]["cp"]
    assert cells["ulysses-kmath.json"]["cp"]["local_kernel"] == "math"
    msg = problems(base, also=[{"methods": ["usp"], "cp": {"local_kernel": "flashy"}}])
    assert "grids.t.also[0].cp.local_kernel: unknown local kernel 'flashy'" in msg
    msg = problems(base, also=[{"methods": ["usp"], "cp": {"placement": "strided"}}])
    assert "placement" in msg


def test_documents_split_as_needed_is_its_own_cell_and_a_bad_value_is_named(base):
    """cp.split_documents: as_needed is in the id and the spec (the degrees the cell runs with);
    all, the default, in neither (the cells and records made before it keep theirs)."""
    cfg = with_grid(
        base,
        methods=["ring_p2p"],
        gpus=[2],
        masks=["causal_document"],
        also=[{"methods": ["ring_p2p"], "cp": {"split_documents": "as_needed"}}],
    )
    cells = {cell_path(c).split("-g2")[1]: c for c in expand_cells(validate(cfg))}
    assert set(cells) == {"-kauto.json", "-kauto-splitas_needed.json"}
    assert cells["-kauto-splitas_needed.json"]["cp"]["split_documents"] == "as_needed"
    assert "split_documents" not in cells["-kauto.json"]["cp"]
    degrees = {k: CellSpec.from_dict(c).cp.degrees for k, c in cells.items()}
    assert degrees["-kauto-splitas_needed.json"].split_documents == "as_needed"
    assert degrees["-kauto.json"].split_documents == "all"
    msg = problems(base, cp={"split_documents": "some"})
    assert "split_documents" in msg and "as_needed" in msg
    with pytest.raises(ValueError, match="unknown split_documents 'x'; valid: all, as_needed"):
        catalog.degrees("ring_p2p", 2, split_documents="x")


def test_an_also_entry_names_a_factorisation_of_the_same_gpus(base):
    """USP 2x4 and 4x2 on 8 GPUs (as in h200_cp_x8): two cells, each named by its degrees; a
    grid-wide Ulysses degree names none (the ids cells had before)."""
    cfg = with_grid(
        base,
        methods=["usp"],
        gpus=[8],
        heads=[[8, 4]],
        also=[
            {"methods": ["usp"], "gpus": [8], "cp": {"ulysses_degree": 2}},
            {"methods": ["usp"], "gpus": [8], "cp": {"ulysses_degree": 4}},
            {"methods": ["loongtrain"], "gpus": [8], "cp": {"ulysses_degree": 2, "windows": 2}},
        ],
    )
    tails = {cell_path(c).split("-g8")[1]: c["cp"] for c in expand_cells(validate(cfg))}
    assert set(tails) == {
        "-kauto.json",
        "-kauto-u2r4w1.json",
        "-kauto-u4r2w1.json",
        "-kauto-u2r4w2.json",
    }
    assert (tails["-kauto-u4r2w1.json"]["ulysses"], tails["-kauto-u4r2w1.json"]["ring"]) == (4, 2)
    assert tails["-kauto-u2r4w2.json"]["windows"] == 2


def test_dkv_dtype_applies_to_the_ring_backward_only():
    deg = catalog.degrees("ring_p2p", 2)
    args = ("causal", "bwd", "cpu", deg, 4, 2)
    assert catalog.unsupported_reason("ring_p2p", "cpu_flash", *args, "input") is None
    why = catalog.unsupported_reason(
        "ulysses",
        "cpu_flash",
        "causal",
        "bwd",
        "cpu",
        catalog.degrees("ulysses", 2),
        4,
        2,
        "input",
    )
    assert "sends no dK/dV around a ring" in why
    why = catalog.unsupported_reason(
        "ring_p2p", "cpu_flash", "causal", "fwd", "cpu", deg, 4, 2, "input"
    )
    assert why == "dkv_comm_dtype input: a forward cell communicates no dK/dV"


def test_gpu_grid_nodes(base):
    cfg = with_grid(
        base,
        device="cuda",
        gpus=[8, 16],
        heads=[[8, 2]],  # USP's auto Ulysses degree 8 splits them
        cp={"gpus_per_node": 8, "local_kernel": "sdpa_flash"},
    )
    c16 = next(c for c in expand_cells(validate(cfg)) if c["gpus"] == 16 and c["impl"] == "usp")
    assert (
        c16["cp"]["nodes"],
        c16["cp"]["nproc_per_node"],
        c16["cp"]["ulysses"],
        c16["cp"]["ring"],
    ) == (2, 8, 8, 2)


def test_repo_cp_grids(repo):
    cfg = load_config(repo / "config.yaml")
    assert "smoke_cp" in cfg["run"]
    smoke = expand_cells(cfg, ["smoke_cp"])
    # every method that runs on the CPU (a new built-in one is added to smoke_cp's methods)
    on_cpu = {n for n, m in catalog.METHODS.items() if "cpu" in m.devices}
    assert 10 <= len(smoke) <= 25 and {c["impl"] for c in smoke} >= on_cpu
    assert {c["device"] for c in smoke} == {"cpu"} and max(c["gpus"] for c in smoke) == 4
    paper = expand_cells(cfg, ["paper_cp"])
    assert {c["tokens_per_gpu"] for c in paper} == {8192} and min(c["gpus"] for c in paper) == 8
    assert max(c["gpus"] for c in paper) == 96 and {
        (c["heads_q"], c["heads_kv"]) for c in paper
    } == {(64, 8)}
    assert {c["reps"] for c in paper} == {15} and {c["warmup"] for c in paper} == {5}
    assert {c["mask"] for c in paper} == {
        "full",
        "causal",
        "full_document_long",
        "causal_document_long",
    }
    u96 = next(c for c in paper if c["impl"] == "usp" and c["gpus"] == 96)
    assert (u96["cp"]["ulysses"], u96["cp"]["ring"], u96["cp"]["nodes"]) == (8, 12, 12)


def test_unknown_method(base):
    msg = problems(base, methods=["ring_p2p", "ringy"])
    assert (
        "grids.t.methods[1]: unknown method 'ringy'; valid methods: local, ulysses, ring_p2p, ring_allgather"
        in msg
    )


def test_bad_ulysses_degree(base):
    msg = problems(base, cp={"ulysses_degree": 3})
    assert (
        "grids.t.gpus[0] (2 GPUs): usp: ulysses_degree 3 does not divide the 2 GPUs (valid degrees: 1, 2)"
        in msg
    )


def test_impossible_head_split(base):
    msg = problems(base, gpus=[4], heads=[[6, 2]], cp={"ulysses_degree": 4})
    assert (
        "grids.t.cp.ulysses_degree (4: 4 on 4 GPUs): usp cannot split heads[0] = 6:2: Ulysses "
        "degree 4 does not divide the 6 query heads; valid cp.ulysses_degree that split 6:2 heads "
        "on 4 GPUs: 1, 2" in msg
    )
    # the auto degree (min(N, gpus_per_node)) is checked too
    msg = problems(base, gpus=[4], heads=[[6, 2]])
    assert "grids.t.cp.ulysses_degree (auto: 4 on 4 GPUs): usp cannot split heads[0] = 6:2" in msg


def test_bad_windows_and_kernel_and_axes(base):
    msg = problems(base, methods=["loongtrain"], gpus=[4], cp={"ulysses_degree": 1, "windows": 3})
    assert "windows 3 does not divide the ring degree 4 (valid: 1, 2, 4)" in msg
    msg = problems(base, cp={"local_kernel": "flashy"})
    assert (
        "grids.t.cp.local_kernel: unknown local kernel 'flashy'; valid local kernels: auto, math, cpu_flash"
        in msg
    )
    msg = problems(base, cp={"local_kernel": "sdpa_flash"})
    assert "sdpa_flash runs only on cuda, not on the grid's device cpu" in msg
    msg = problems(base, seqlen=[128])
    assert "family cp takes no 'seqlen' (its length is tokens_per_gpu x gpus)" in msg
    msg = problems(base, device="cuda", gpus=[12], cp={"gpus_per_node": 8})
    assert "grids.t.gpus[0]: 12 GPUs are not whole nodes of cp.gpus_per_node=8" in msg
    msg = problems(base, cp={"placement": "diagonal"})
    assert "grids.t.cp.placement: 'diagonal' is not one of ['contiguous', 'strided']" in msg
    msg = problems(base, masks=["sliding_window"])
    assert "unknown mask 'sliding_window' for family cp" in msg


def test_ulysses_head_limit_is_refused_before_a_job_starts(base):
    """'Ulysses is capped by the head count': a grid asking for more is refused by check-config
    (on Slurm each such cell was a job of N GPUs, only to record `unsupported`), naming the GPU
    counts that split the heads."""
    msg = problems(base, methods=["ulysses"], gpus=[3])
    assert (
        "grids.t.gpus[0] (3 GPUs): ulysses cannot split heads[0] = 4:2: Ulysses degree 3 does "
        "not divide the 4 query heads; valid GPU counts that split 4:2 heads: 1, 2, 4" in msg
    )
    # the GQA rule: the KV heads split evenly over U ranks, or U is a multiple of them
    msg = problems(base, methods=["ulysses"], gpus=[2], heads=[[12, 3]])
    assert "KV heads can be neither split evenly nor replicated evenly" in msg
    assert "valid GPU counts that split 12:3 heads: 1, 3, 6, 12" in msg
    cfg = validate(with_grid(base, methods=["ulysses"], gpus=[4], heads=[[8, 2]]))
    (cell,) = expand_cells(cfg)  # 4 ranks, 2 KV heads: each replicated twice
    assert cell["cp"]["ulysses"] == 4


def test_torch_cp_needs_an_sdpa_local_kernel():
    """torch_cp is pinned to the SDPA backend named by cp.local_kernel; any other kernel is refused."""
    deg = catalog.degrees("torch_cp", 2)
    assert (
        catalog.unsupported_reason("torch_cp", "sdpa_flash", "causal", "fwd", "cuda", deg, 8, 2)
        is None
    )
    why = catalog.unsupported_reason("torch_cp", "flex", "causal", "fwd", "cuda", deg, 8, 2)
    assert "local kernel 'flex'" in why and "valid: sdpa_flash, sdpa_cudnn" in why
    # SDPA's own choice is a method of its own, with the local kernel left to it
    assert (
        catalog.unsupported_reason("torch_cp_auto", "auto", "causal", "fwd", "cuda", deg, 8, 2)
        is None
    )
    why = catalog.unsupported_reason(
        "torch_cp_auto", "sdpa_flash", "causal", "fwd", "cuda", deg, 8, 2
    )
    assert "torch_cp_auto leaves the backend to SDPA" in why
    # SDPA's is_causal is all it can be told: documents are refused (cp.verify once ran them unmasked)
    why = catalog.unsupported_reason(
        "torch_cp", "sdpa_flash", "causal_document", "bwd", "cuda", deg, 8, 2
    )
    assert why == "torch_cp cannot express the causal_document mask (it runs: full, causal)"
    # and building the method refuses it too, before anything else (whoever calls: cell or verify)
    from attnbench.cp.base import load
    from attnbench.masks import Mask
    from attnbench.record.status import Unsupported

    with pytest.raises(Unsupported, match="torch_cp cannot express the causal_document mask"):
        load(
            catalog.method("torch_cp"),
            None,
            Mask("causal_document", 64, {"doc_lengths": [30, 34]}),
            8,
            2,
            16,
            None,
        )
