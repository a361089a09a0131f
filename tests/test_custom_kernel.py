"""Your own kernel by name: a grid names `module:Class`, and the kernel is validated, measured,
checked against float64 and drawn like a built-in one."""

import json

import pytest
from attnbench.families import expand_cells, load_config, write_figures, write_tables
from attnbench.families.kernel.cell import run_cell
from attnbench.grid.config import ConfigError
from attnbench.kernels import catalog
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
        record = run_cell(spec)
        write_record(
            record, tmp_path / "cells" / f"{spec['impl']}-{spec['mask']}-{spec['direction']}.json"
        )
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
    assert catalog.get("row_block_sdpa").colour == "#17becf"


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
