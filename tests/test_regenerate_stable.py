"""Regeneration is byte-stable: the tidy tables of an output folder are the same, row order and
`outdated` reasons included, whichever of its grids a regeneration (or a run) asks for."""

import shutil
from pathlib import Path

from attnbench.families import load_config
from attnbench.pipeline.regenerate import regenerate
from commands import REPO


def test_regenerating_one_committed_grid_leaves_the_tidy_tables_as_regenerating_all(tmp_path):
    """Two committed grids in one folder: h100_calibration's records and h200_paired's. Their
    tidy tables after regenerating only the first equal those after regenerating both, byte for
    byte; the second grid's rows keep their place and their `outdated` reasons."""
    out = tmp_path / "results"
    shutil.copytree(REPO / "results/h100/cells", out / "cells")
    shutil.copytree(REPO / "results/h200/cells/h200_paired", out / "cells/h200_paired")
    cfg = load_config(REPO / "config.yaml")
    cfg["output_dir"] = str(out)
    tables = out / "tables"

    def tidy_bytes():
        return {f: (tables / f).read_bytes() for f in ("cells.csv", "samples.csv")}

    regenerate(cfg, ["h100_calibration"], say=lambda _: None)
    one = tidy_bytes()
    shutil.rmtree(tables)
    regenerate(cfg, ["h100_calibration", "h200_paired"], say=lambda _: None)
    both = tidy_bytes()
    assert one == both
    text = both["cells.csv"].decode()
    assert "h200_paired" in text and "h100_calibration" in text
    rows = [line.split(",")[0] for line in text.splitlines()[1:]]
    assert rows == sorted(rows)  # grid first in the sort keys: each grid's rows together
    assert Path(tables / "h100_calibration").is_dir()
