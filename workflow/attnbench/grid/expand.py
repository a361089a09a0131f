"""What every family's grid expansion shares (torch-free): the grid's products, the mask settings
each pattern reads, the length histograms of document masks, the checks of a point's masks and
shapes, and a cell's id and path. The family's own axes and checks live in its folder
(attnbench.families.<family>.grid)."""

from __future__ import annotations

import hashlib
import itertools
import json

from .. import masks as M
from ..masks.lengths import choose_histogram
from .spec import (
    DKV_COMM_DTYPES,
    EMULATE_CONTENTS,
    SPLIT_DOCUMENTS,
    Check,
    CPSettings,
    Measurement,
)

AXES = (
    "kernels",
    "methods",
    "masks",
    "seqlen",
    "tokens_per_gpu",
    "gpus",
    "heads",
    "head_dim",
    "dtype",
    "direction",
    "block_size",
    "avg_block",
    "density",
)


def stable_hash(obj, n=16) -> str:
    """A deterministic id of a JSON-able object (its sorted JSON's SHA-256, first n hex digits)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


def measurement(grid: dict) -> Measurement:
    """How every cell of the grid is measured (its schema-defaulted settings)."""
    c = grid["check"]
    check = Check(c["max_seqlen"], c["tolerance_factor"], c["samples"])
    return Measurement(grid["samples"], grid["warmup"], grid["reps"], check, side_by_side(grid))


def side_by_side(grid: dict) -> bool:
    """Whether the grid's kernel cells are measured point by point, side by side (grid key
    `side_by_side`; auto: on a GPU). CP cells are not: each is its own distributed job."""
    if grid.get("family") == "cp":
        return False
    value = grid.get("side_by_side", "auto")
    return grid.get("device") == "cuda" if value == "auto" else bool(value)


def grid_cells(cfg: dict, gname: str, product_cells) -> list[dict]:
    """A grid's cells: `product_cells(cfg, gname, product, measurement)` (grid.spec.CellSpec) of
    each of its products, as dicts, one cell per record path (a cell that two products name keeps
    its first place)."""
    grid = cfg["grids"][gname]
    how = measurement(grid)
    cells = {}
    for prod in grid_products(grid):
        for spec in product_cells(cfg, gname, prod, how):
            cell = spec.to_dict()
            cells[cell_path(cell)] = cell
    return list(cells.values())


def grid_products(grid):
    """The grid's own cross product, then one per `also` entry (overriding some axes)."""
    base = {k: grid[k] for k in AXES if k in grid}
    yield base
    for extra in grid.get("also", []):
        yield {**base, **extra}


def seqlens(prod):
    if "seqlen" in prod:
        return prod["seqlen"]
    return sorted({t * g for t in prod.get("tokens_per_gpu", []) for g in prod.get("gpus", [])})


def mask_param_points(mask, grid, prod):
    """The mask's settings: grid.mask_params restricted to what the pattern reads, crossed
    with the block-sparse axes (block_size / avg_block x density) where it reads those."""
    keys = M.pattern(mask).cfg_keys
    fixed = {k: v for k, v in grid.get("mask_params", {}).items() if k in keys}
    axes = [a for a in ("block_size", "avg_block", "density") if a in keys]
    for values in itertools.product(*(prod.get(a, grid.get(a)) for a in axes)):
        yield {**fixed, **dict(zip(axes, values))}


def mask_param_keys() -> tuple[str, ...]:
    """The keys a grid's mask_params may hold: what some mask pattern reads (its cfg_keys), but
    the block-sparse axes, which are the grid's own (block_size, avg_block, density)."""
    keys = (k for p in M.PATTERNS.values() for k in p.cfg_keys)
    return tuple(dict.fromkeys(k for k in keys if k not in AXES))


def mask_param_problems(grid: dict, where: str) -> list[str]:
    """mask_params keys that no mask pattern reads (the schema types the built-in ones; a
    pattern's own key is checked by its pattern's check())."""
    valid = mask_param_keys()
    return [
        f"{where}.mask_params: {key!r} is read by no mask pattern; valid keys: {', '.join(valid)}"
        for key in grid.get("mask_params", {})
        if key not in valid
    ]


def histograms_for(cfg, mask, seqlen):
    if not M.pattern(mask).uses_documents:
        return None
    name = choose_histogram(seqlen, cfg["doc_length_histograms"])
    return {name: cfg["doc_length_histograms"][name]}


# A cp cell whose local kernel is its device's entry here carries none in its id: the ids cells had
# before a grid could name the local kernel per cell, so that their records stay valid. Any other
# local kernel (`auto` included), and every CP setting away from its default (grid.spec: dK/dV sent
# in another dtype than the accumulator's, documents split otherwise than all, ...) are part of it.
UNSUFFIXED_LOCAL_KERNEL = {"cpu": "cpu_flash", "cuda": "sdpa_flash"}


def cp_suffix(cell: dict) -> str:
    c = CPSettings.from_dict(cell["cp"])
    deg, out = c.degrees, ""
    if c.local_kernel != UNSUFFIXED_LOCAL_KERNEL[cell["device"]]:
        out += f"-k{c.local_kernel}"
    if c.dkv_comm_dtype != DKV_COMM_DTYPES[0]:
        out += f"-dkv{c.dkv_comm_dtype}"
    if deg.split_documents != SPLIT_DOCUMENTS[0]:
        out += f"-split{deg.split_documents}"
    if c.degrees_named:  # an also: entry named the factorisation (USP 2x4 beside 4x2)
        out += f"-u{deg.ulysses}r{deg.ring}w{deg.windows}"
    if c.emulate:  # every rank's compute emulated in one process (never a measurement)
        out += "-emu" + ("" if c.emulate_contents == EMULATE_CONTENTS[0] else "synthetic")
    return out


def point_id(cell: dict) -> str:
    """The cell's file name: every axis that is not already a folder (grid/family/impl/mask)."""
    p = f"s{cell['seqlen']}-h{cell['heads_q']}x{cell['heads_kv']}-d{cell['head_dim']}-{cell['dtype']}-{cell['direction']}"
    mp = cell.get("mask_params", {})
    if "block_size" in mp:
        p += f"-b{mp['block_size']}"
    if "avg_block" in mp:
        p += f"-a{mp['avg_block']}"
    if "density" in mp:
        p += f"-r{mp['density']}"
    if cell["family"] == "cp":
        p += f"-g{cell['gpus']}" + cp_suffix(cell)
    return p


def cell_path(cell: dict) -> str:
    """Relative to the output folder: cells/{grid}/{family}/{impl}/{mask}/{point}.json."""
    return f"cells/{cell['grid']}/{cell['family']}/{cell['impl']}/{cell['mask']}/{point_id(cell)}.json"


def output_root(path, cell: dict):
    """The output folder a cell's record at `path` belongs to (path = root / cell_path(cell)), or
    None where the record is written elsewhere."""
    from pathlib import Path

    path, rel = Path(path), Path(cell_path(cell))
    if path.parts[-len(rel.parts) :] != rel.parts:
        return None
    return Path(*path.parts[: -len(rel.parts)]) if len(path.parts) > len(rel.parts) else Path(".")


def mask_problems(prod, fam: str, valid_masks, at: str) -> list[str]:
    """The point's masks that its family cannot draw."""
    return [
        f"{at}.masks[{i}]: unknown mask {m!r} for family {fam}; valid masks: {', '.join(valid_masks)}"
        for i, m in enumerate(prod.get("masks", []))
        if m not in valid_masks
    ]


def shape_problems(cfg, grid, prod, at: str) -> list[str]:
    """Heads that do not group, lengths without a document histogram, mask settings a length
    cannot take: the same for every family."""
    problems = []
    for i, (hq, hkv) in enumerate(prod.get("heads", [])):
        if hq % hkv:
            problems.append(
                f"{at}.heads[{i}]: {hq} query heads are not a multiple of {hkv} KV heads"
            )
    if any(M.pattern(m).uses_documents for m in prod.get("masks", []) if m in M.PATTERNS):
        for s in seqlens(prod):
            try:
                choose_histogram(s, cfg.get("doc_length_histograms", {}))
            except ValueError as e:
                problems.append(f"{at}.seqlen: {e}")
    for m in prod.get("masks", []):
        if m not in M.PATTERNS:
            continue
        for s in seqlens(prod):
            for mp in mask_param_points(m, grid, prod):
                try:
                    M.check_mask(m, s, mp)
                except ValueError as e:
                    problems.append(f"{at}: mask {m} at seqlen {s}: {e}")
    return problems
