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
    from ...harness.samples import boundary_check_seqlen

    out, cap = [], grid["check"]["max_seqlen"]
    masks = [m for m in prod["masks"] if M.pattern(m).uses_documents]
    points = itertools.product(
        masks, prod["tokens_per_gpu"], prod["gpus"], prod["heads"], prod["head_dim"], prod["dtype"]
    )
    for mask, tpg, gpus, (hq, hkv), d, dtype in points:
        seqlen = tpg * gpus
        by_length = {}  # the check's length -> the methods checked at it
        for method in method_names(prod):
            by_length.setdefault(check_seqlen(method, seqlen, gpus, cap), []).append(method)
        for s, methods in by_length.items():
            if s >= seqlen:
                continue
            for mp in expansion.mask_param_points(mask, grid, prod):
                spec = {
                    **{k: grid[k] for k in ("seed", "check", "samples")},
                    **dict(mask=mask, mask_params=mp, seqlen=seqlen, heads_q=hq, heads_kv=hkv),
                    **dict(head_dim=d, dtype=dtype),
                }
                hist = expansion.histograms_for(cfg, mask, seqlen)
                m0 = methods[0]
                longer = lambda n: check_seqlen(m0, seqlen, gpus, 2 * n)  # noqa: E731, B023
                need = boundary_check_seqlen(spec, s, hist, longer)
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
    kern = c.get("local_kernel", catalog.AUTO)
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
    split = c.get("split_documents", catalog.SPLIT_DOCUMENTS[0])
    if split != catalog.SPLIT_DOCUMENTS[0]:
        for m in names:
            if not catalog.method(m).shard_layout:
                sharded = [n for n, info in catalog.METHODS.items() if info.shard_layout]
                problems.append(
                    f"{at}.cp.split_documents: {m} does not shard documents with cp/layout.py, "
                    f"so split_documents {split} would not apply to it (it applies to "
                    f"{', '.join(sharded)})"
                )
    gpn = c.get("gpus_per_node", 8)
    emulated = c.get("emulate", False)
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
            named = c.get("ulysses_degree", "auto")
            where = f"{at}.cp.ulysses_degree ({named}: {deg.ulysses} on {gpus} GPUs)"
        out.append(f"{where}: {method} cannot split heads[{j}] = {hq}:{hkv}: {why}; valid {valid}")
    return out


def _degrees(method, gpus, c) -> catalog.Degrees:
    return catalog.degrees(
        method,
        gpus,
        c.get("ulysses_degree", "auto"),
        c.get("windows", "auto"),
        c.get("placement", "contiguous"),
        c.get("gpus_per_node", 8),
        c.get("split_documents", catalog.SPLIT_DOCUMENTS[0]),
    )


def _cell_cp(c: dict, own: dict) -> dict:
    """The cp settings a cell carries beyond its degrees: the local kernel as named, and the
    settings that only some cells have (so the others keep the spec, and the id, they had):
    among them a Ulysses degree or windows that an `also:` entry names itself (`own`), so that
    two factorisations of the same GPUs (USP 2x4 and 4x2) are two cells."""
    out = {"local_kernel": c["local_kernel"]}
    if "ulysses_degree" in own or "windows" in own:
        out["degrees_named"] = True
    if c["local_kernel"] == catalog.AUTO and c.get("kernel_grids"):
        out["kernel_grids"] = list(c["kernel_grids"])
    if c.get("dkv_comm_dtype", catalog.DKV_COMM_DTYPES[0]) != catalog.DKV_COMM_DTYPES[0]:
        out["dkv_comm_dtype"] = c["dkv_comm_dtype"]
    if c.get("emulate"):  # every rank's compute in one process (families/cp/emulated.py)
        out["emulate"] = True
        if c.get("emulate_contents", "peers") != "peers":
            out["emulate_contents"] = c["emulate_contents"]
    return out


def expand(cfg, gname) -> list[dict]:
    return expansion.grid_cells(cfg, gname, _product_cells)


def _product_cells(cfg, gname, prod, common):
    """The cells of one product of a cp grid."""
    grid = cfg["grids"][gname]
    device = grid["device"]
    c = _cp(grid, prod)
    own = _cell_cp(c, prod.get("cp", {}))
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
        own_method = {"method_class": entry} if ":" in entry else {}
        method = catalog.resolve_method(entry).name
        deg = _degrees(method, gpus, c)
        nodes = -(-gpus // c["gpus_per_node"]) if device == "cuda" else 1
        if own.get("emulate"):
            nodes = 1  # one process on one device emulates the `gpus` ranks
        seqlen = tpg * gpus
        for mp in expansion.mask_param_points(mask, grid, prod):
            yield {
                "grid": gname,
                "family": "cp",
                "impl": method,
                **own_method,
                "mask": mask,
                "mask_params": mp,
                "seqlen": seqlen,
                "tokens_per_gpu": tpg,
                "heads_q": hq,
                "heads_kv": hkv,
                "head_dim": d,
                "dtype": dtype,
                "direction": direction,
                "gpus": gpus,
                **common,
                "histograms": expansion.histograms_for(cfg, mask, seqlen),
                "cp": {
                    "local_kernel": own["local_kernel"],
                    **deg.to_json(),
                    "gpus_per_node": c["gpus_per_node"],
                    "nodes": nodes,
                    "nproc_per_node": 1 if own.get("emulate") else gpus // nodes,
                    "breakdown": c["breakdown"],
                    "timeout_s": c["timeout_s"],
                    **{k: v for k, v in own.items() if k != "local_kernel"},
                },
            }
