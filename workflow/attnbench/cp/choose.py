"""Which local kernel a CP cell runs: the one its grid names, or for `auto` the fastest correct local
kernel measured on this device (torch-free: it reads record files only).

Evidence: the kernel-family records (`cells/<grid>/kernel/<impl>/<mask>/*.json` under the cell's
output folder; the grids of cp.kernel_grids, or every grid there) that time the same library calls
as the local kernel (kernels.catalog.LocalKernelInfo.evidence), of the cell's mask (a `*_long` mask: its own
records, else those of the mask without `_long`), heads, head dim and dtype, on a device of the same
name, with status ok and a passed float64 check, at the length closest to the cell's tokens per GPU
(ties: the record with more repetitions). A local kernel's cost is the time per forward FLOP of what
the cell times: sum over its parts of direction factor / TFLOP/s (flex's
backward recomputes a forward), forward+backward adding both. The cheapest fully measured candidate
wins; candidates without records follow in catalog.AUTO_ORDER, which alone decides when nothing was
measured. The choice, its reason and the evidence go into the record.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..grid.spec import CellSpec
from ..harness.flops import DIRECTION_FACTOR
from . import catalog

_LENGTH = re.compile(r"^s(\d+)-")


def choose_local_kernel(spec: CellSpec, root: Path | None, device_name: str | None) -> dict:
    """{"local_kernel": what runs, "setting": what the grid named, "reason": why, and for `auto`
    "candidates": every local kernel considered, with its evidence or why it was left out}."""
    setting, method = spec.cp.local_kernel, spec.impl
    out = {"setting": setting}
    if setting != catalog.AUTO:
        return {**out, "local_kernel": setting, "reason": "named by the grid"}
    if method == "torch_cp":
        return {
            **out,
            "local_kernel": catalog.TORCH_CP_PINNED_DEFAULT,
            "reason": "torch_cp pins SDPA to one backend; auto pins FLASH, the comparison over "
            "the FA2 code it always was (SDPA's own choice is torch_cp_auto)",
        }
    if method == "torch_cp_auto":
        return {**out, "local_kernel": catalog.AUTO, "reason": "SDPA chooses its own backend"}
    return {**out, **_fastest(spec, root, device_name)}


def _fastest(spec: CellSpec, root, device_name) -> dict:
    device, direction, mask = spec.device, spec.problem.direction, spec.problem.mask
    order = catalog.AUTO_ORDER[(device, "fwd" if direction == "fwd" else "bwd")]
    considered, runnable = [], []
    for name in order:
        why = catalog.kernel_reason(name, mask, direction, device) or catalog.unavailable_reason(
            spec.impl, name, device, direction
        )
        if why:
            considered.append({"local_kernel": name, "left_out": why})
            continue
        evidence = _evidence(spec, name, root, device_name)
        cost = (
            sum(DIRECTION_FACTOR[e["direction"]] / e["tflops"] for e in evidence)
            if evidence and all(e.get("tflops") for e in evidence)
            else None
        )
        entry = {"local_kernel": name, "evidence": evidence, "cost": cost}
        if cost is not None:
            entry["estimated_tflops"] = DIRECTION_FACTOR[direction] / cost
        considered.append(entry)
        runnable.append(entry)
    if not runnable:
        return {
            "local_kernel": None,
            "reason": f"no local kernel runs {mask} {direction} on {device}: "
            + "; ".join(c["left_out"] for c in considered),
            "candidates": considered,
        }
    measured = sorted((c for c in runnable if c["cost"] is not None), key=lambda c: c["cost"])
    where = f"records under {root}/cells" if root is not None else "no output folder"
    if measured:
        best = measured[0]
        rivals = ", ".join(
            f"{c['local_kernel']} {c['estimated_tflops']:.1f}" for c in measured[1:]
        )
        reason = (
            f"fastest measured on {device_name} for {mask} {direction}: {best['local_kernel']} "
            f"(estimated {best['estimated_tflops']:.1f} TFLOP/s"
            + (f"; then {rivals}" if rivals else "")
            + f"; from {where})"
        )
    else:
        best = runnable[0]
        reason = (
            f"no kernel records of {mask} {direction} on {device_name} ({where}): the first that "
            f"runs the cell in the documented order {', '.join(order)}"
        )
    return {"local_kernel": best["local_kernel"], "reason": reason, "candidates": considered}


def _parts(info, direction: str) -> list:
    if direction == "fwdbwd":
        return [*info.evidence.get("fwd", ()), *info.evidence.get("bwd", ())]
    return list(info.evidence.get(direction, ()))


def _evidence(spec: CellSpec, name, root, device_name) -> list:
    """One entry per part of the local kernel's cost: the record found, or what is missing."""
    info = catalog.local_kernel(name)
    parts = _parts(info, spec.problem.direction)
    if root is None or not parts:
        return []
    return [_record_for(spec, impls.split("|"), d, Path(root), device_name) for impls, d in parts]


def _masks(mask: str) -> list:
    return [mask, mask.removesuffix("_long")] if mask.endswith("_long") else [mask]


def _record_for(spec: CellSpec, impls, direction, root, device_name) -> dict:
    """The kernel record of one part at the length closest to the cell's tokens per GPU."""
    cells = root / "cells"
    grids = spec.cp.kernel_grids or sorted(
        p.name for p in cells.glob("*") if (p / "kernel").is_dir()
    )
    target, p = spec.tokens_per_gpu, spec.problem
    point = f"h{p.heads_q}x{p.heads_kv}-d{p.head_dim}-{p.dtype}-{direction}"
    for mask in _masks(p.mask):
        files = []
        for g in grids:
            for rank, impl in enumerate(impls):
                for f in (cells / g / "kernel" / impl / mask).glob(f"s*-{point}.json"):
                    m = _LENGTH.match(f.name)
                    if m and f.name == f"s{m.group(1)}-{point}.json":
                        s = int(m.group(1))
                        files.append((abs(math.log(s / target)), -s, rank, f))
        found = []  # the usable records at the closest length that has one
        for dist, neg_s, _, f in sorted(files):
            if found and -neg_s != found[0]["seqlen"]:
                break
            if r := _usable(f, device_name):
                found.append(r)
        if found:  # of those, the one with more repetitions
            return {**max(found, key=lambda r: r["reps"]), "direction": direction}
    return {
        "impl": "|".join(impls),
        "direction": direction,
        "missing": f"no ok kernel record of {'|'.join(impls)} {'/'.join(_masks(p.mask))} "
        f"{point} on {device_name}",
    }


def _usable(path: Path, device_name) -> dict | None:
    """The facts auto needs from a kernel record, or None if it is no evidence (not ok, its check
    not passed, another device, no finite throughput)."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    tflops = rec.get("tflops")
    if (
        rec.get("status") != "ok"
        or rec.get("check_passed") is not True
        or not isinstance(tflops, (int, float))
        or not math.isfinite(tflops)
        or tflops <= 0
        or (
            device_name is not None
            and rec.get("environment", {}).get("device_name") != device_name
        )
    ):
        return None
    cell = rec["cell"]
    return {
        "impl": cell["impl"],
        "grid": cell["grid"],
        "mask": cell["mask"],
        "seqlen": cell["seqlen"],
        "reps": cell.get("reps", 0),
        "tflops": tflops,
        "record": str(path),
    }
