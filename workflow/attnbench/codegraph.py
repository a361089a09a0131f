"""Which of the package's files a piece of it runs: the modules an entry module imports,
transitively, read from the source (nothing is imported). Snakemake rules list these as their code
inputs, so that editing a module reruns exactly the rules that use it.

Every import statement of a module used counts, module-level or inside a function (a lazy import
runs when the function does). Importing a module also runs its packages' __init__.py files: those
count, with what they import at module level (their functions run only when called, and a caller
that uses one names its module as an entry too). Imports by name at run time (importlib) are not
seen: the entry modules name those parts themselves.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = __name__.split(".")[0]
ROOT = Path(__file__).resolve().parent


def module_file(module: str) -> Path | None:
    """The file of a module of the package (its __init__.py for a folder), or None."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = ROOT.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a relative import `from {'.' * level}{name} import ...`."""
    if level == 0:
        return name or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _import_nodes(tree, module_level: bool):
    """Every import statement; with module_level, only those run on import (not in functions)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if not (
                module_level
                and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            ):
                todo.append(child)


@cache
def direct_imports(module: str, module_level: bool = False) -> frozenset[str]:
    """The package's modules one module imports (anywhere in its file, or only at module level)."""
    path = module_file(module)
    if path is None:
        raise ValueError(f"{module!r} is not a module of {PACKAGE} (no file under {ROOT})")
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in _import_nodes(tree, module_level):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node.level, node.module)
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return frozenset(m for m in found if module_file(m) is not None)


def _packages(module: str) -> list[str]:
    """The packages whose __init__.py importing the module runs."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def modules_used(*entries: str) -> list[str]:
    """The entry modules and every module of the package they import, transitively, with the
    packages whose __init__.py those imports run; sorted."""
    for e in entries:
        if module_file(e) is None:
            raise ValueError(f"{e!r} is not a module of {PACKAGE} (no file under {ROOT})")
    used, inits = set(), set()  # modules used whole; packages only imported (their module level)
    todo = [(e, False) for e in entries]
    while todo:
        m, module_level = todo.pop()
        if m in used or (module_level and m in inits):
            continue
        (inits if module_level else used).add(m)
        for dep in direct_imports(m, module_level) | {m}:
            todo += [(p, True) for p in _packages(dep)]
            if dep != m:
                todo.append((dep, False))
    return sorted(used | inits)


def code_files(*entries: str) -> list[str]:
    """The files of modules_used(*entries), as paths (what a rule lists as its code inputs)."""
    return [str(module_file(m)) for m in modules_used(*entries)]
