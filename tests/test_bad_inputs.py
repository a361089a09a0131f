"""Inputs a new user may hand the commands that read the pipeline's files: each is refused in one
line naming the file, with a non-zero exit, never a traceback or a silent success."""

from __future__ import annotations

import pytest
from bounded import run_bounded
from commands import PY, REPO, package_env


def advise(cells):
    return run_bounded(
        [PY, "-m", "attnbench", "advise", "--cells", str(cells)], 120, env=package_env()
    )


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "not a readable tidy table (No columns to parse from file)"),
        (bytes(range(128, 256)) * 4, "not a readable tidy table ('utf-8' codec can't decode"),
        (b"a,b\n1,2\n", "not a tidy table (no column grid, impl, status)"),
    ],
)
def test_advise_on_an_empty_binary_or_foreign_table_says_so_in_one_line(tmp_path, content, why):
    cells = tmp_path / "cells.csv"
    cells.write_bytes(content)
    p = advise(cells)
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(f"advise: {cells}: {why}")


def test_advise_on_a_header_only_table_says_so_and_fails(tmp_path):
    cells = tmp_path / "cells.csv"
    header = (REPO / "results/h200/tables/cells.csv").read_text().splitlines()[0]
    cells.write_text(header + "\n")
    p = advise(cells)
    assert p.returncode == 2 and p.stdout == ""
    assert (
        p.stderr.strip() == f"advise: {cells} has no cells (a header only): nothing to advise on"
    )
