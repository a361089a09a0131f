"""Expansion and checks of single-GPU kernel grids (`family: kernel`, and `family: sparse`, which
shares them): kernels x masks x seqlen x heads x head_dim x dtype x direction (torch-free)."""

from __future__ import annotations

import itertools

from ... import masks as M
from ...grid import expand as expansion  # the shared expansion (this module defines `expand`)
from ...grid.spec import CellSpec, Measurement, Problem
from ...harness.samples import boundary_check_seqlen, check_seqlen, mask_features
from ...kernels import catalog
from ...report.outputs import grid_axis

# Kernel grids may draw every single-GPU mask, and CP's patterns on one GPU.
VALID_MASKS = M.STATIC_MASKS + M.SPARSE_MASKS + tuple(M.CP_PATTERNS)


def problems(cfg, grid, prod, at, family="kernel") -> list[str]:
    """Everything wrong with one product of a kernel grid."""
    out = expansion.mask_problems(prod, family, VALID_MASKS, at)
    if "kernels" not in prod:
        out.append(
            f"{at}: family {family} needs 'kernels' (valid kernels: {', '.join(catalog.KERNELS)})"
        )
    for i, k in enumerate(prod.get("kernels", [])):
        if ":" in str(k):  # your own kernel, 'module:Class'
            try:
                catalog.resolve(k)
            except ValueError as e:
                out.append(f"{at}.kernels[{i}]: {e}")
        elif k not in catalog.KERNELS:
            out.append(
                f"{at}.kernels[{i}]: unknown kernel {k!r}; valid kernels: {', '.join(catalog.KERNELS)} "
                "(or your own, as 'module:Class')"
            )
    if "seqlen" not in prod:
        out.append(f"{at}: family {family} needs 'seqlen'")
    if ".also[" not in at:  # a setting of the whole grid: checked once
        out += reference_problems(grid, at)
    out += expansion.shape_problems(cfg, grid, prod, at)
    return out + (check_length_problems(cfg, grid, prod, at) if not out else [])


def reference_problems(grid, at) -> list[str]:
    """The grid's reference_kernel (the speedup figures' 1x) must name kernels it measures."""
    named = grid.get("reference_kernel")
    if named is None:
        return []
    ours = [catalog.resolve(k).name if ":" in str(k) else k for k in grid_axis(grid, "kernels")]
    out = []
    for i, k in enumerate([named] if isinstance(named, str) else named):
        if k not in ours:
            where = f"{at}.reference_kernel" + ("" if isinstance(named, str) else f"[{i}]")
            out.append(
                f"{where}: {k!r} is not a kernel of this grid; its kernels: {', '.join(ours)}"
            )
    return out


def check_length_problems(cfg, grid, prod, at) -> list[str]:
    """Cells checked at a length (check.max_seqlen) too short to see their mask: a window one
    key too wide, blocks or document boundaries that the check's mask would not have, so that a
    kernel wrong there passes. Named with the length that would see them."""
    out, cap = [], grid["check"]["max_seqlen"]
    how = expansion.measurement(grid)
    direction = prod["direction"][0]  # the checks' data is the same in every direction
    points = itertools.product(
        prod["masks"], prod["seqlen"], prod["heads"], prod["head_dim"], prod["dtype"]
    )
    for mask, seqlen, (hq, hkv), d, dtype in points:
        hist = expansion.histograms_for(cfg, mask, seqlen)
        for mp in expansion.mask_param_points(mask, grid, prod):
            problem = Problem(mask, mp, seqlen, hq, hkv, d, dtype, direction, grid["seed"], hist)
            s = check_seqlen(problem, cap)
            if s >= seqlen:
                continue  # checked whole
            settings = ", ".join(f"{k} {v}" for k, v in mp.items())
            where = f"{at}: mask {mask}{f' ({settings})' if mp else ''} at seqlen {seqlen}"
            for feature, need in mask_features(problem):
                if s < need:
                    out.append(
                        f"{where} is checked at {s} tokens (check.max_seqlen {cap}), fewer than "
                        f"{feature} needs: set check.max_seqlen to at least {need}"
                    )
            if M.pattern(mask).uses_documents:
                longer = lambda n: check_seqlen(problem, 2 * n)  # noqa: E731, B023
                need = boundary_check_seqlen(problem, how, s, longer)
                if need != s:
                    out.append(
                        f"{where} is checked at {s} tokens (check.max_seqlen {cap}), where none of "
                        f"its checked samples draws a document boundary (each is one document): "
                        f"set check.max_seqlen to at least {need}, where they do"
                    )
    return out


def expand(cfg, gname) -> list[dict]:
    return expansion.grid_cells(cfg, gname, _product_cells)


def _product_cells(cfg, gname, prod, how: Measurement):
    """The cells of one product of a kernel grid."""
    grid = cfg["grids"][gname]
    for impl, mask, seqlen, (hq, hkv), d, dtype, direction in itertools.product(
        prod["kernels"],
        prod["masks"],
        prod["seqlen"],
        prod["heads"],
        prod["head_dim"],
        prod["dtype"],
        prod["direction"],
    ):
        # your own kernel: cells use its registered name, and carry its import path for the
        # processes that run and draw them
        own = impl if ":" in impl else None
        name = catalog.resolve(impl).name
        hist = expansion.histograms_for(cfg, mask, seqlen)
        for mp in expansion.mask_param_points(mask, grid, prod):
            problem = Problem(mask, mp, seqlen, hq, hkv, d, dtype, direction, grid["seed"], hist)
            yield CellSpec(gname, grid["family"], name, grid["device"], 1, problem, how, own)
