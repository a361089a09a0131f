"""Expansion and checks of single-GPU kernel grids (`family: kernel`, and `family: sparse`, which
shares them): kernels x masks x seqlen x heads x head_dim x dtype x direction (torch-free)."""

from __future__ import annotations

import itertools

from ... import masks as M
from ...grid import expand as expansion  # the shared expansion (this module defines `expand`)
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
    from ...harness.samples import boundary_check_seqlen, check_seqlen, mask_features

    out, cap = [], grid["check"]["max_seqlen"]
    points = itertools.product(
        prod["masks"], prod["seqlen"], prod["heads"], prod["head_dim"], prod["dtype"]
    )
    for mask, seqlen, (hq, hkv), d, dtype in points:
        for mp in expansion.mask_param_points(mask, grid, prod):
            spec = {
                **{k: grid[k] for k in ("seed", "check", "samples")},
                **dict(mask=mask, mask_params=mp, seqlen=seqlen, heads_q=hq, heads_kv=hkv),
                **dict(head_dim=d, dtype=dtype),
            }
            s = check_seqlen(spec)
            if s >= seqlen:
                continue  # checked whole
            settings = ", ".join(f"{k} {v}" for k, v in mp.items())
            where = f"{at}: mask {mask}{f' ({settings})' if mp else ''} at seqlen {seqlen}"
            for feature, need in mask_features(spec):
                if s < need:
                    out.append(
                        f"{where} is checked at {s} tokens (check.max_seqlen {cap}), fewer than "
                        f"{feature} needs: set check.max_seqlen to at least {need}"
                    )
            if M.pattern(mask).uses_documents:
                hist = expansion.histograms_for(cfg, mask, seqlen)
                longer = lambda n: check_seqlen(spec, 2 * n)  # noqa: E731
                need = boundary_check_seqlen(spec, s, hist, longer)
                if need != s:
                    out.append(
                        f"{where} is checked at {s} tokens (check.max_seqlen {cap}), where none of "
                        f"its checked samples draws a document boundary (each is one document): "
                        f"set check.max_seqlen to at least {need}, where they do"
                    )
    return out


def expand(cfg, gname) -> list[dict]:
    return expansion.grid_cells(cfg, gname, _product_cells)


def _product_cells(cfg, gname, prod, common):
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
        own = {"kernel_class": impl} if ":" in impl else {}
        name = catalog.resolve(impl).name
        for mp in expansion.mask_param_points(mask, grid, prod):
            yield {
                "grid": gname,
                "family": grid["family"],
                "impl": name,
                **own,
                "mask": mask,
                "mask_params": mp,
                "seqlen": seqlen,
                "heads_q": hq,
                "heads_kv": hkv,
                "head_dim": d,
                "dtype": dtype,
                "direction": direction,
                "gpus": 1,
                **common,
                "histograms": expansion.histograms_for(cfg, mask, seqlen),
            }
