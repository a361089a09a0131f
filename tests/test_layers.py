"""docs/architecture.md, "The layout": a folder of the package imports only from the folders before
it in the stage order, at module level or inside a function, and the top level holds a few modules."""

from collections import defaultdict

from attnbench.codegraph import ROOT, direct_imports

# The stages in order (docs/architecture.md): each folder imports only from those before it.
STAGES = (
    "masks",
    "grid",
    "kernels",
    "harness",
    "cp",
    "run",
    "record",
    "report",
    "families",
    "cp_model",
    "pipeline",
    "cli",  # the command line, last: imported by no module (__main__ imports it by name)
)
# Top-level modules every stage may use (they import nothing of the package's folders) ...
BASE = ("__init__", "codegraph", "status", "terminal")
# ... and those that no module of the package imports: the entry points.
ENTRIES = ("__main__", "snakemake_fixes")
# ... which the command line's folder is too: a cell's code list (record.code) never holds it.
IMPORTED_BY_NONE = (*ENTRIES, "cli")
MAX_TOP_LEVEL = 8


def _module(path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _place(module: str) -> str:
    """A module's folder, or its own name for a top-level module."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _arrows():
    """(from folder, to folder) -> the imports between them, for every module of the package."""
    arrows = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        module = _module(path)
        for target in direct_imports(module):
            a, b = _place(module), _place(target)
            if a != b:
                arrows[(a, b)].append(f"{module} -> {target}")
    return arrows


def test_the_stage_order_and_the_top_level_name_every_folder_and_module():
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(STAGES)
    top = {p.stem for p in ROOT.glob("*.py")}
    assert top == set(BASE) | set(ENTRIES)
    assert len(top) <= MAX_TOP_LEVEL


def against_the_order(arrows) -> list[str]:
    """The imports of `arrows` that run against the stage order, each with why."""
    found = []
    for (a, b), imports in sorted(arrows.items()):
        if b in BASE:
            continue
        if b in IMPORTED_BY_NONE:
            found += [f"{i} (an entry point is imported by no module)" for i in imports]
        elif a in BASE:
            found += [f"{i} (a base module imports no folder)" for i in imports]
        elif a in STAGES and STAGES.index(b) > STAGES.index(a):
            found += [f"{i} ({a} comes before {b})" for i in imports]
    return found


def test_a_folder_imports_only_from_the_stages_before_it():
    found = against_the_order(_arrows())
    assert not found, "imports against the stage order:\n" + "\n".join(found)


def test_the_check_finds_an_arrow_back_up():
    """Lazy imports count (tests/test_codegraph.py); an arrow back up, or into an entry point,
    is found and named."""
    arrows = {
        ("masks", "report"): ["attnbench.masks.x -> attnbench.report.paired"],
        ("report", "masks"): ["attnbench.report.y -> attnbench.masks"],
        ("families", "cli"): ["attnbench.families.z -> attnbench.cli"],
        ("codegraph", "grid"): ["attnbench.codegraph -> attnbench.grid"],
        ("__main__", "cli"): ["attnbench.__main__ -> attnbench.cli"],
    }
    assert against_the_order(arrows) == [
        "attnbench.__main__ -> attnbench.cli (an entry point is imported by no module)",
        "attnbench.codegraph -> attnbench.grid (a base module imports no folder)",
        "attnbench.families.z -> attnbench.cli (an entry point is imported by no module)",
        "attnbench.masks.x -> attnbench.report.paired (masks comes before report)",
    ]
