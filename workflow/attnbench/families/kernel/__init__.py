"""Family `kernel`: one attention kernel on one GPU, every mask, length, heads setting, dtype and
direction (the paper's kernel study). Cells run with `python -m attnbench cell` (cell.py)."""

from __future__ import annotations

import copy
from functools import cache

from ...report.labels import mask_families
from ...report.outputs import grid_axis, grid_directions
from .grid import expand, problems  # noqa: F401  (the family interface)

NAME = "kernel"
CELL_COMMAND = "cell"
TABLES = "tables"
FIGURES = "figures"


def record_skeleton(spec: dict) -> dict:
    from ...record.record import base_record
    from .cell import implementation

    return base_record(spec, implementation(spec), provenance(spec))


def provenance(spec: dict) -> dict:
    """The code a cell runs (its cell module, what that imports, and the kernel's adapter, which
    is loaded by name; your own kernel's files) and the libraries whose versions it depends on
    (torch and the kernel's): record.code, compared by attnbench.currency."""
    return copy.deepcopy(_provenance(spec.get("kernel_class", spec["impl"])))


@cache  # the same for every cell of a kernel (thousands in a sweep)
def _provenance(entry: str) -> dict:
    from ...codegraph import PACKAGE, module_file
    from ...kernels import catalog
    from ...record.code import cell_code

    modules, own = [f"{__name__}.cell"], ()
    impl = entry if ":" in entry else catalog.get(entry).impl
    module = impl.split(":")[0]
    adapter = module if "." in module else f"{PACKAGE}.kernels.{module}"
    if ":" not in entry and module_file(adapter):  # ours (kernels.base.kernel_class finds it so)
        modules.append(adapter)
    else:  # your own kernel (hashed before resolve() imports it), or a registry entry's outside
        own = catalog.own_kernel_files(impl)[1]
    code = cell_code(modules, own)
    info = catalog.resolve(entry)
    return {
        "code": code,
        "libraries": {
            "torch": catalog.first_version(("torch",)),
            info.name: catalog.library_version(info),
        },
    }


def table_stems(grid: dict) -> list[str]:
    return ["tflops", "memory", "support"]


def figure_stems(grid: dict) -> list[str]:
    # Figs. 3 and 7 (bars at one length) and 16-17 (memory) per direction; Figs. 8-14 per mask family
    dirs = grid_directions(grid)
    return [f"{kind}_{d}" for d in dirs for kind in ("tflops_bars", "memory_vs_seqlen")] + [
        f"tflops_vs_seqlen_{fam}" for fam in mask_families(grid_axis(grid, "masks"))
    ]
