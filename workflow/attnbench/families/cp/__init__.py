"""Family `cp`: context-parallel methods over N ranks (attnbench.cp), each cell one distributed
job started by attnbench.launch (`python -m attnbench cp-cell`, cell.py)."""

from __future__ import annotations

import copy
from functools import cache

from .grid import expand, problems  # noqa: F401  (the family interface)

NAME = "cp"
CELL_COMMAND = "cp-cell"
TABLES = "report"
FIGURES = "report"


def record_skeleton(spec: dict) -> dict:
    """The record with what ran (method and local kernel) and the CP tables' columns."""
    from ...record.record import base_record
    from .cell import cp_summary, implementation
    from .emulated import emulated_summary, is_emulated

    if is_emulated(spec):  # cp.emulate: the record says so whatever its status
        record = base_record(spec, {**implementation(spec), "emulated": True}, provenance(spec))
        emulated_summary(record, spec)
        return record
    record = base_record(spec, implementation(spec), provenance(spec))
    cp_summary(record, spec)
    return record


def provenance(spec: dict) -> dict:
    """The code a cell runs (its cell modules, what they import, the method's module and the
    local kernels' adapters, which are loaded by name: every local kernel for `auto`) and the
    libraries whose versions it depends on: record.code, compared by attnbench.currency."""
    return copy.deepcopy(_provenance(spec["impl"], spec["cp"]["local_kernel"]))


@cache  # the same for every cell of a method and local kernel
def _provenance(method: str, kernel: str) -> dict:
    from ...codegraph import PACKAGE
    from ...cp import catalog
    from ...kernels.catalog import LOCAL_KERNELS, first_version
    from ...record.code import cell_code

    kernels = LOCAL_KERNELS.values() if kernel == catalog.AUTO else [LOCAL_KERNELS[kernel]]
    modules = [f"{__name__}.cell", f"{__name__}.emulated"]
    modules.append(f"{PACKAGE}.cp.{catalog.METHODS[method].impl.split(':')[0]}")
    modules += [f"{PACKAGE}.kernels.{k.impl.split(':')[0]}" for k in kernels]
    return {
        "code": cell_code(modules),
        "libraries": {
            "torch": first_version(("torch",)),
            f"local kernel {kernel}": catalog.library_version(kernel),
        },
    }


def table_stems(grid: dict) -> list[str]:
    return ["cp_tflops", "cp_vs_single_gpu", "cp_breakdown"]


def figure_stems(grid: dict) -> list[str]:
    return ["cp_tflops_vs_gpus", "cp_breakdown"]
