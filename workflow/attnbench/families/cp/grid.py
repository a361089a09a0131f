"""Expansion and checks of `family: cp` grids (torch-free).

A CP grid crosses methods x masks x tokens_per_gpu x gpus x heads x head_dim x dtype x direction;
the grid's `cp:` object fixes the local kernel, the Ulysses degree of USP/LoongTrain (`auto`:
min(N, gpus_per_node), the paper's), LoongTrain's windows, the rank placement and gpus_per_node.
An `also:` entry may name its own `cp: {local_kernel, dkv_comm_dtype, split_documents,
ulysses_degree, windows, emulate}`
(each is then part of the cell id, grid.expand.cp_suffix). A cell carries the local kernel as named (`auto` stays `auto`: the cell
chooses when it runs, from the records then on disk, cp/choose.py), its resolved degrees (the
method's layout, cp.catalog.Layout), nodes and processes per node. A method of one's own is named
'module:Class' (cp.catalog.resolve_method): its cells carry its name and `method_class`. `cp.emulate: true` makes the cells emulations (families/cp/emulated.py): `gpus`
is the emulated world size, run by one process on one device (nodes 1, nproc_per_node 1).
"""

from __future__ import annotations

import itertools

from ... import masks as M
from ...cp import catalog
from ...grid import expand as expansion  # the shared expansion (this module defines `expand`)
from ...grid.spec import SPLIT_DOCUMENTS, CellSpec, CPSettings, Degrees, Measurement, Problem
from ...harness.samples import boundary_check_seqlen


def _cp(grid, prod=None) -> dict:
    """The grid's cp settings, with a product's own (an `also:` entry's cp) over them."""
    return {**grid.get("cp", {}), **(prod or {}).get("cp", {})}


def problems(cfg, grid, prod, at) -> list[str]:
    """Everything wrong with one product of a CP grid."""
    out = (
        expansion.mask_problems(prod, "cp", M.CP_MASKS, at)
        + grid_problems(grid, prod, at)
        + expansion.shape_problems(cfg, grid, prod, at)
    )
    return out + (check_length_problems(cfg, grid, prod, at) if not out else [])


def check_seqlen(method: str, seqlen: int, gpus: int, cap: int) -> int:
    """The length a CP cell's correctness is checked at (cell.check_sample): the cell's own or
    check.max_seqlen, less than that for torch's context_parallel, which pads nothing."""
    s = min(seqlen, cap)
    return s if catalog.uses_local_kernel(method) else s - s % (2 * gpus)


def method_names(prod) -> list[str]:
    """The product's methods by name (your own, 'module:Class', by its info.name); call after
    grid_problems found them all."""
    return [catalog.resolve_method(m).name for m in prod["methods"]]


def check_length_problems(cfg, grid, prod, at) -> list[str]:
    """Document masks whose checks (at check.max_seqlen) draw no document boundary, so that a
    method wrong at the boundaries passes; named with the length at which they do."""
    out, cap = [], grid["check"]["max_seqlen"]
    how = expansion.measurement(grid)
    direction = prod["direction"][0]  # the checks' data is the same in every direction
    masks = [m for m in prod["masks"] if M.pattern(m).uses_documents]
    points = itertools.product(
        masks, prod["tokens_per_gpu"], prod["gpus"], prod["heads"], prod["head_dim"], prod["dtype"]
    )
    for mask, tpg, gpus, (hq, hkv), d, dtype in points:
        seqlen = tpg * gpus
        hist = expansion.histograms_for(cfg, mask, seqlen)
        by_length = {}  # the check's length -> the methods checked at it
        for method in method_names(prod):
            by_length.setdefault(check_seqlen(method, seqlen, gpus, cap), []).append(method)
        for s, methods in by_length.items():
            if s >= seqlen:
                continue
            for mp in expansion.mask_param_points(mask, grid, prod):
                problem = Problem(
                    mask, mp, seqlen, hq, hkv, d, dtype, direction, grid["seed"], hist
                )
                m0 = methods[0]
                longer = lambda n: check_seqlen(m0, seqlen, gpus, 2 * n)  # noqa: E731, B023
                need = boundary_check_seqlen(problem, how, s, longer)
                if need != s:
                    out.append(
                        f"{at}: {', '.join(methods)} on mask {mask} at {gpus} x {tpg} tokens: "
                        f"checked at {s} tokens (check.max_seqlen {cap}), where none of the "
                        f"checked samples draws a document boundary: set check.max_seqlen to at "
                        f"least {need}, where they do"
                    )
    return sorted(set(out), key=out.index)


def grid_problems(grid, prod, at) -> list[str]:
    problems = []
    c, device = _cp(grid, prod), grid.get("device", "cuda")
    if "methods" not in prod:
        problems.append(
            f"{at}: family cp needs 'methods' (valid methods: {', '.join(catalog.METHODS)})"
        )
    names = []  # the methods found, by name
    for i, m in enumerate(prod.get("methods", [])):
        if ":" in str(m):  # your own, 'module:Class'
            try:
                names.append(catalog.resolve_method(m).name)
            except ValueError as e:
                problems.append(f"{at}.methods[{i}]: {e}")
        elif m not in catalog.METHODS:
            problems.append(
                f"{at}.methods[{i}]: unknown method {m!r}; valid methods: {', '.join(catalog.METHODS)} "
                "(or your own, as 'module:Class')"
            )
        else:
            names.append(m)
    for key, why in (
        ("kernels", "it runs 'methods' over cp.local_kernel"),
        ("seqlen", "its length is tokens_per_gpu x gpus"),
    ):
        if key in prod:
            problems.append(f"{at}: family cp takes no '{key}' ({why})")
    for key in ("tokens_per_gpu", "gpus"):
        if key not in prod:
            problems.append(f"{at}: family cp needs '{key}'")
    kern = c["local_kernel"]
    if kern != catalog.AUTO:
        if kern not in catalog.LOCAL_KERNELS:
            problems.append(
                f"{at}.cp.local_kernel: unknown local kernel {kern!r}; valid local kernels: "
                f"{catalog.AUTO}, {', '.join(catalog.LOCAL_KERNELS)}"
            )
        elif device not in catalog.LOCAL_KERNELS[kern].devices:
            problems.append(
                f"{at}.cp.local_kernel: {kern} runs only on {', '.join(catalog.LOCAL_KERNELS[kern].devices)}"
                f", not on the grid's device {device}"
            )
    split = c["split_documents"]
    if split != SPLIT_DOCUMENTS[0]:
        for m in names:
            if not catalog.method(m).shard_layout:
                sharded = [n for n, info in catalog.METHODS.items() if info.shard_layout]
                problems.append(
                    f"{at}.cp.split_documents: {m} does not shard documents with cp/layout.py, "
                    f"so split_documents {split} would not apply to it (it applies to "
                    f"{', '.join(sharded)})"
                )
    gpn, emulated = c["gpus_per_node"], c["emulate"]
    if emulated:  # one process runs every rank: only our methods (cp.emulate)
        for m in names:
            if not catalog.method(m).runs_local_kernel:
                problems.append(
                    f"{at}.cp.emulate: {m} runs torch's own collectives and cannot be emulated in "
                    f"one process; emulate the methods over a local kernel"
                )
    for i, n in enumerate(prod.get("gpus", [])):
        if device == "cuda" and n > gpn and n % gpn and not emulated:
            problems.append(
                f"{at}.gpus[{i}]: {n} GPUs are not whole nodes of cp.gpus_per_node={gpn}"
            )
        for m in names:
            try:
                deg = _degrees(m, n, c)
            except ValueError as e:
                problems.append(f"{at}.gpus[{i}] ({n} GPUs): {e}")
                continue
            if deg.ulysses > 1:  # a cell that could only record `unsupported` is refused here
                problems += _head_split_problems(m, n, i, deg, c, prod, at)
    return sorted(set(problems), key=problems.index)


def _head_split_problems(method, gpus, i, deg, c, prod, at) -> list[str]:
    """Heads that `deg.ulysses` ranks cannot split (catalog.head_split_reason: U divides the
    query heads, and the KV heads or a multiple of them), with the choices that would."""
    out = []
    for j, (hq, hkv) in enumerate(prod.get("heads", [])):
        why = catalog.head_split_reason(deg.ulysses, hq, hkv)
        if not why:
            continue
        splits = lambda u: catalog.head_split_reason(u, hq, hkv) is None  # noqa: E731
        if catalog.method(method).layout.ulysses == "all":  # its degree is the GPU count
            fits = [u for u in range(1, hq + 1) if splits(u)]
            valid = f"GPU counts that split {hq}:{hkv} heads: {', '.join(map(str, fits))}"
            where = f"{at}.gpus[{i}] ({gpus} GPUs)"
        else:
            fits = [u for u in range(1, gpus + 1) if gpus % u == 0 and splits(u)]
            valid = f"cp.ulysses_degree that split {hq}:{hkv} heads on {gpus} GPUs: {', '.join(map(str, fits))}"
            named = c["ulysses_degree"]
            where = f"{at}.cp.ulysses_degree ({named}: {deg.ulysses} on {gpus} GPUs)"
        out.append(f"{where}: {method} cannot split heads[{j}] = {hq}:{hkv}: {why}; valid {valid}")
    return out


def _degrees(method, gpus, c) -> Degrees:
    return catalog.degrees(
        method,
        gpus,
        c["ulysses_degree"],
        c["windows"],
        c["placement"],
        c["gpus_per_node"],
        c["split_documents"],
    )


def expand(cfg, gname) -> list[dict]:
    return expansion.grid_cells(cfg, gname, _product_cells)


def _product_cells(cfg, gname, prod, how: Measurement):
    """The cells of one product of a cp grid."""
    grid = cfg["grids"][gname]
    device = grid["device"]
    c = _cp(grid, prod)
    own = prod.get("cp", {})  # the product's own settings (an also: entry's)
    for entry, mask, tpg, gpus, (hq, hkv), d, dtype, direction in itertools.product(
        prod["methods"],
        prod["masks"],
        prod["tokens_per_gpu"],
        prod["gpus"],
        prod["heads"],
        prod["head_dim"],
        prod["dtype"],
        prod["direction"],
    ):
        # your own method: cells use its registered name, and carry its import path for the
        # processes that run and draw them
        method = catalog.resolve_method(entry).name
        nodes = -(-gpus // c["gpus_per_node"]) if device == "cuda" else 1
        if c["emulate"]:
            nodes = 1  # one process on one device emulates the `gpus` ranks
        settings = CPSettings(
            _degrees(method, gpus, c),
            c["local_kernel"],
            c["gpus_per_node"],
            nodes,
            1 if c["emulate"] else gpus // nodes,
            c["breakdown"],
            c["timeout_s"],
            # auto's evidence grids (only auto reads them)
            tuple(c["kernel_grids"]) if c["local_kernel"] == catalog.AUTO else (),
            c["dkv_comm_dtype"],
            # a Ulysses degree or windows an `also:` entry names itself: two factorisations of
            # the same GPUs (USP 2x4 and 4x2) are two cells
            "ulysses_degree" in own or "windows" in own,
            c["emulate"],
            c["emulate_contents"],
        )
        seqlen = tpg * gpus
        hist = expansion.histograms_for(cfg, mask, seqlen)
        for mp in expansion.mask_param_points(mask, grid, prod):
            problem = Problem(mask, mp, seqlen, hq, hkv, d, dtype, direction, grid["seed"], hist)
            own_class = entry if ":" in entry else None
            yield CellSpec(
                gname, "cp", method, device, gpus, problem, how, own_class, tpg, settings
            )
