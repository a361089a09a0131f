"""What is installed here, for the registries (kernels/catalog.py, cp/catalog.py): whether a
library's modules can be found (without importing them), the versions of its distributions, the
build of FlashAttention-3 installed, and your own kernel's or CP method's class and source files.
The registries hold what each kernel is (data); this module probes the machine for it.

Torch-free, as the registries: config validation and Snakemake parsing read it without importing
torch (importing your own class's module is the one place it may).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

# Distributions whose module this process may have imported already (a warm worker): their
# record names the version imported, which an upgrade since does not change.
IMPORTED_AS = {"torch": "torch", "triton": "triton", "numpy": "numpy"}


def first_version(dists) -> str:
    """'name version' of the first installed distribution among `dists` (as imported, where this
    process has imported it: IMPORTED_AS), or 'missing'. Imports nothing."""
    for dist in dists:
        module = sys.modules.get(IMPORTED_AS.get(dist, ""))
        if getattr(module, "__version__", None):
            return f"{dist} {module.__version__}"
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "missing"


def library_version(info) -> str:
    """The version of a kernel's library (the first of its KernelInfo.dists found), or 'missing'."""
    return first_version(info.dists)


def all_library_versions(kernels: dict) -> dict:
    """{distribution: version or 'missing'} of every library of `kernels` (a registry), and
    torch, triton and numpy."""
    dists = sorted({d for k in kernels.values() for d in k.dists} | {"torch", "triton", "numpy"})
    out = {}
    for d in dists:
        try:
            out[d] = importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            out[d] = "missing"
    return out


def findable(entry: str) -> str | None:
    """The module an entry of KernelInfo.modules names ('a', or 'a|b': a, else b) that is installed
    here (found, not imported), or None."""
    for module in entry.split("|"):
        try:
            if importlib.util.find_spec(module) is not None:
                return module
        except (ImportError, ValueError):
            continue
    return None


def first_missing(modules) -> str | None:
    """The first entry of `modules` that cannot be imported here, or None."""
    return next((entry for entry in modules if findable(entry) is None), None)


def missing_module(info) -> str | None:
    """The first module a kernel needs (its KernelInfo.modules) that cannot be imported, or None."""
    return first_missing(info.modules)


WINDOW_MASKS = ("sliding_window", "sliding_window_causal")
FA3_FULL, FA3_FORWARD_ONLY = "flash_attn_interface", "fa3_fwd_interface"


def fa3_build_limits(mask: str, direction: str) -> str | None:
    """The full FlashAttention-3 (flash_attn_interface) runs everything; PyPI's fa3-fwd
    (fa3_fwd_interface) is compiled without some features, which its fa3_fwd_config lists."""
    if first_missing((FA3_FULL,)) is None or first_missing(("fa3_fwd_config",)) is not None:
        return None
    flags = importlib.import_module("fa3_fwd_config").CONFIG.get("build_flags", {})
    built = f"{FA3_FORWARD_ONLY} ({first_version(('fa3-fwd',))}) is built with"
    if direction != "fwd" and flags.get("FLASHATTENTION_DISABLE_BACKWARD"):
        return (
            f"{built} FLASHATTENTION_DISABLE_BACKWARD: forward only (the full FA3 has a backward)"
        )
    if mask in WINDOW_MASKS and flags.get("FLASHATTENTION_DISABLE_LOCAL"):
        return f"{built} FLASHATTENTION_DISABLE_LOCAL: no sliding windows"
    return None


def own_class(entry: str, what: str, info_type: type, readme: str):
    """The `info` of the class 'module:Class' names (your own kernel or CP method), checked: the
    class imports, carries an `info` of `info_type` whose impl is `entry`, and its name can name
    files. ValueError names what is wrong. Importing the module is the one place the catalogs
    may import torch."""
    module, cls = entry.split(":", 1)
    try:
        obj = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{what} {entry!r} cannot be imported: {e}") from None
    info = getattr(obj, "info", None)
    if not isinstance(info, info_type):
        raise ValueError(
            f"{what} {entry!r} has no `info` attribute holding a {info_type.__name__} (what it "
            f"supports); see README, {readme!r}"
        )
    if info.impl != entry:
        raise ValueError(
            f"{what} {entry!r}: its info.impl is {info.impl!r}; they must be the same 'module:Class'"
        )
    if not re.fullmatch(r"[A-Za-z0-9_]+", info.name):
        raise ValueError(
            f"{what} {entry!r}: its name {info.name!r} must be letters, digits and _ (it names files)"
        )
    return info


def own_files(entry: str, what: str) -> tuple[str, tuple[str, ...]]:
    """Your own kernel's or CP method's source, found without importing it: the file of its
    module, and the Python files of the package the module sits in (the folder holding it, and
    its subfolders, where the module is part of a package; else the file alone). A cell of it
    lists them as code inputs, and its record hashes them."""
    module = entry.split(":", 1)[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:
        raise ValueError(f"{what} {entry!r} cannot be found: {e}") from None
    if spec is None or not spec.origin or not spec.has_location:
        raise ValueError(f"{what} {entry!r}: module {module!r} has no file to track")
    origin = Path(spec.origin).resolve()
    if "." not in module and origin.name != "__init__.py":  # a module alone, and its neighbours
        return str(origin), tuple(str(p) for p in sorted(_neighbours_imported(origin)))
    files = {p.resolve() for p in origin.parent.rglob("*.py") if "__pycache__" not in p.parts}
    return str(origin), tuple(str(p) for p in sorted(files | {origin}))


def _neighbours_imported(origin: Path) -> set[Path]:
    """A module outside a package and the modules (or packages) of its folder it imports,
    transitively, read from the source: a helper beside your kernel is part of its code."""
    import ast

    found, todo = {origin}, [origin]
    while todo:
        tree = ast.parse(todo.pop().read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = origin.parent / name.split(".")[0]
                if top.with_suffix(".py").is_file():
                    new = {top.with_suffix(".py").resolve()}
                elif (top / "__init__.py").is_file():
                    new = {p.resolve() for p in top.rglob("*.py") if "__pycache__" not in p.parts}
                else:
                    continue
                todo += sorted(new - found)
                found |= new
    return found


def own_kernel_files(entry: str) -> tuple[str, tuple[str, ...]]:
    """own_files of your own kernel."""
    return own_files(entry, "kernel")
