"""Each report rule's code inputs derive from the package (attnbench.codegraph): the modules its
command imports, transitively, and no others."""

from pathlib import Path

import pytest
from attnbench import families
from attnbench.codegraph import code_files, direct_imports, modules_used

PKG = Path(families.__file__).resolve().parents[1]


def rel(paths) -> set[str]:
    return {str(Path(p).relative_to(PKG)) for p in paths}


def test_figure_rules_read_the_tidy_table_code_and_their_family_only():
    kernel = rel(code_files(*families.command_modules("kernel", "FIGURES")))
    cp = rel(code_files(*families.command_modules("cp", "FIGURES")))
    # the tidy table's reader is code of every figure rule (it was missing from the hand-made lists)
    assert {"report/collect.py", "report/plotting.py", "report/style.py"} <= kernel & cp
    assert "families/kernel/figures.py" in kernel and "families/cp/figures.py" in cp
    # a kernel-only module is no input of the CP figure rule, and the other way round
    assert "families/kernel/figures.py" not in cp and "families/kernel/tables.py" not in cp
    assert "families/cp/figures.py" not in kernel and "families/cp/tables.py" not in kernel
    # no rule of the report depends on a cell's measuring code
    for measuring in ("families/kernel/cell.py", "families/cp/cell.py", "harness/measure.py"):
        assert measuring not in kernel | cp


def test_table_and_figure_rules_differ_where_their_code_does():
    tables = rel(code_files(*families.command_modules("kernel", "TABLES")))
    figures = rel(code_files(*families.command_modules("kernel", "FIGURES")))
    assert "report/tables.py" in tables and "report/plotting.py" not in tables
    assert "report/plotting.py" in figures and "families/kernel/tables.py" not in figures
    assert {"report/labels.py", "report/captions.py", "report/collect.py"} <= tables & figures


def test_imports_inside_functions_and_package_inits_count():
    # an entry's imports inside functions count (families/__init__.py imports the drivers there)
    assert "attnbench.report.tables" in modules_used("attnbench.families")
    # importing attnbench.families.cp.tables runs the packages' __init__.py files too, with what
    # they import at module level (cp's provenance), not what their functions import (its grid)
    used = set(modules_used("attnbench.families.cp.tables"))
    assert {
        "attnbench",
        "attnbench.families",
        "attnbench.families.cp",
        "attnbench.families.cp.provenance",
    } <= used
    assert "attnbench.families.cp.grid" not in used
    assert "attnbench.report.tables" in used  # imported by cp.report itself
    assert (
        "attnbench.report.figures" not in used
    )  # only families/__init__.py's functions import it
    # `from . import status as S` names a module: it is followed
    assert "attnbench.status" in direct_imports("attnbench.record.not_run")


def test_an_unknown_module_is_an_error_naming_it():
    with pytest.raises(
        ValueError, match="'attnbench.no_such_module' is not a module of attnbench"
    ):
        modules_used("attnbench.no_such_module")
