"""The code and libraries a kernel cell runs with (record.code; the family interface's
`provenance`), kept apart from the family's other helpers: what a cell imports is its code."""

from __future__ import annotations

import copy
from functools import cache

from ...grid.spec import CellSpec


def provenance(spec: CellSpec) -> dict:
    """The code a cell runs (its cell module, what that imports, and the kernel's adapter, which
    is loaded by name; your own kernel's files) and the libraries whose versions it depends on
    (torch, numpy, which draws the masks, and the kernel's): record.code, compared by attnbench.pipeline.currency."""
    return copy.deepcopy(_provenance(spec.entry))


@cache  # the same for every cell of a kernel (thousands in a sweep)
def _provenance(entry: str) -> dict:
    from ...codegraph import PACKAGE, module_file
    from ...kernels import catalog, libraries
    from ...record.code import cell_code

    # every file a cell's processes run: its command's entry (attnbench/__main__.py hands it to
    # commands.py), the launcher, the warm worker and its kernel side (named to it by module and
    # function, which attnbench.codegraph does not follow), the cell itself (tests/test_provenance.py
    # checks this against an import trace of a real cell)
    modules, own = [f"{PACKAGE}.__main__", f"{PACKAGE}.run.launch", f"{PACKAGE}.run.worker"], ()
    modules += [f"{__package__}.commands", f"{__package__}.warm", f"{__package__}.cell"]
    impl = entry if ":" in entry else catalog.get(entry).impl
    module = impl.split(":")[0]
    adapter = module if "." in module else f"{PACKAGE}.kernels.{module}"
    if ":" not in entry and module_file(adapter):  # ours (kernels.base.kernel_class finds it so)
        modules.append(adapter)
    else:  # your own kernel (hashed before resolve() imports it), or a registry entry's outside
        own = libraries.own_kernel_files(impl)[1]
    code = cell_code(modules, own)
    info = catalog.resolve(entry)
    return {
        "code": code,
        "libraries": {
            "torch": libraries.first_version(("torch",)),
            "numpy": libraries.first_version(("numpy",)),  # draws the masks
            info.name: libraries.library_version(info),
        },
    }
