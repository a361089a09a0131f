"""The code and libraries a context-parallel cell runs with (record.code; the family interface's
`provenance`), kept apart from the family's other helpers: what a cell imports is its code."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

from ...grid.spec import CellSpec


def provenance(spec: CellSpec) -> dict:
    """The code a cell runs (its cell modules, what they import, the method's module and the
    local kernels' adapters, which are loaded by name: every local kernel for `auto`; for your
    own method, its package's files and every built-in method, any of which it may build on) and
    the libraries whose versions it depends on: record.code, compared by attnbench.pipeline.currency."""
    return copy.deepcopy(_provenance(spec.impl, spec.cp.local_kernel, spec.own_class or ""))


@cache  # the same for every cell of a method and local kernel
def _provenance(method: str, kernel: str, own: str) -> dict:
    from ...codegraph import PACKAGE
    from ...cp import catalog
    from ...kernels.catalog import LOCAL_KERNELS
    from ...kernels.libraries import first_version
    from ...record.code import cell_code

    kernels = LOCAL_KERNELS.values() if kernel == catalog.AUTO else [LOCAL_KERNELS[kernel]]
    # every file a cell's processes run: its command's entry (attnbench/__main__.py hands it to
    # commands.py), the launcher, the cell itself (tests/test_provenance.py checks this against
    # an import trace of a real cell)
    modules = [f"{PACKAGE}.__main__", f"{PACKAGE}.run.launch", f"{__package__}.commands"]
    modules += [f"{__package__}.cell", f"{__package__}.emulated"]
    if own:  # every built-in method's module (a module of the package's cp/ folder)
        cp_dir = Path(catalog.__file__).parent
        impls = [m.impl.split(":")[0] for m in catalog.METHODS.values()]
        modules += [f"{PACKAGE}.cp.{i}" for i in impls if (cp_dir / f"{i}.py").is_file()]
    else:
        modules.append(f"{PACKAGE}.cp.{catalog.METHODS[method].impl.split(':')[0]}")
    modules += [f"{PACKAGE}.kernels.{k.impl.split(':')[0]}" for k in kernels]
    own_files = catalog.own_method_files(own)[1] if own else ()
    return {
        "code": cell_code(modules, own_files),
        "libraries": {
            "torch": first_version(("torch",)),
            "numpy": first_version(("numpy",)),  # draws the masks
            f"local kernel {kernel}": catalog.library_version(kernel),
        },
    }
