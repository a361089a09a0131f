"""The paper's qualitative CP findings as pass/fail checks on the model's predictions, and the
model's summary (validation errors, kernel fit, checks) as Markdown."""

from __future__ import annotations

import numpy as np
import pandas as pd

FLAT = 0.9  # "flat": the lowest per-GPU TFLOP/s is at least 90% of the highest
# "lead": the best hybrid at least this share of the best other method (a tie within 2%, under the
# model's validated median error on full and causal masks, counts: at 8K tokens per GPU and 1024
# GPUs every method is compute-bound, and they differ by their per-call terms alone)
LEAD = 0.98


def _line(pred, method, mask, direction):
    d = pred[
        (pred["method"] == method) & (pred["mask"] == mask) & (pred["direction"] == direction)
    ]
    return (
        d.dropna(subset=["predicted_tflops_per_gpu"])
        .set_index("gpus")["predicted_tflops_per_gpu"]
        .sort_index()
    )


def _step_detail(pred, net, method, mask, direction, gpus) -> str:
    """Why a ring is or is not slowed by its transfers: its median step at `gpus` GPUs."""
    row = pred[
        (pred["method"] == method)
        & (pred["mask"] == mask)
        & (pred["direction"] == direction)
        & (pred["gpus"] == gpus)
    ]
    if row.empty or "ring_step_compute_ms" not in row or row["ring_step_compute_ms"].isna().all():
        return ""
    c, m = row["ring_step_compute_ms"].iloc[0], row["ring_step_comm_ms"].iloc[0]
    text = (
        f"; at {gpus} GPUs the median ring step computes {c:.2f} ms and transfers {m:.2f} ms "
        f"(its slowest rank each): the transfers are {'hidden' if m <= c else 'exposed'}"
    )
    if m <= c:  # the same bytes, sent as slowly as the step computes
        lat = net.inter_latency_us * 1e-3
        bw = net.gpu_gbytes_per_s * (m - lat) / (c - lat)
        text += f" down to about {bw:.2g} GB/s per GPU across nodes"
    return text


def paper_checks(pred: pd.DataFrame, net) -> list[dict]:
    """Each: {name, passed, detail}, per tokens per GPU and direction, from one node up."""
    checks = []
    for tpg, t in pred.groupby("tokens_per_gpu"):
        for c in _checks(t, net):
            checks.append({**c, "name": f"{c['name']} [{tpg} tokens/GPU]"})
    return checks


def _checks(pred: pd.DataFrame, net) -> list[dict]:
    checks = []
    p = pred[pred["gpus"] >= net.gpus_per_node]
    for d in sorted(set(p["direction"])):
        full = _line(p, "ring_p2p", "full", d)
        if len(full):
            ratio = full.min() / full.max()
            checks.append(
                {
                    "name": f"Ring P2P is flat on full ({d})",
                    "passed": bool(ratio >= FLAT),
                    "detail": f"min/max per-GPU TFLOP/s over {full.index.min()}..{full.index.max()} GPUs = "
                    f"{ratio:.2f} (flat: >= {FLAT})",
                }
            )
        causal = _line(p, "ring_p2p", "causal", d)
        if len(causal) > 1:
            one_node = causal.get(net.gpus_per_node, causal.iloc[0])
            across = causal[causal.index > net.gpus_per_node]
            worst = across.min()
            checks.append(
                {
                    "name": f"Ring P2P drops on causal across nodes ({d})",
                    "passed": bool(worst < FLAT * one_node),
                    "detail": f"lowest across nodes / one node = {worst / one_node:.2f} (drop: < {FLAT})"
                    + _step_detail(p, net, "ring_p2p", "causal", d, across.idxmin()),
                }
            )
    uly = pred[pred["method"] == "ulysses"]
    if len(uly):
        ran = sorted(set(uly.dropna(subset=["predicted_tflops_per_gpu"])["gpus"]))
        refused = sorted(set(uly[uly["predicted_tflops_per_gpu"].isna()]["gpus"]))
        capped = all(
            "query heads" in b for b in uly[uly["predicted_tflops_per_gpu"].isna()]["bottleneck"]
        )
        checks.append(
            {
                "name": "Ulysses is capped by the head count",
                "passed": bool(refused and capped and ran),
                "detail": f"runs at {ran}; refused (head count) at {refused}",
            }
        )
    top = pred["gpus"].max()
    at = pred[(pred["gpus"] == top)].dropna(subset=["predicted_tflops_per_gpu"])
    for (mask, d), g in at.groupby(["mask", "direction"]):
        hyb = g[g["method"].isin(["usp", "loongtrain"])]["predicted_tflops_per_gpu"]
        other = g[~g["method"].isin(["usp", "loongtrain"])]
        if len(hyb) and len(other):
            best_other = other.loc[other["predicted_tflops_per_gpu"].idxmax()]
            other_best = best_other["predicted_tflops_per_gpu"]
            checks.append(
                {
                    "name": f"the hybrids lead at scale ({mask}, {d}, {top} GPUs)",
                    "passed": bool(hyb.max() >= other_best * LEAD),
                    "detail": f"best hybrid {hyb.max():.0f} vs {best_other['method']} "
                    f"{other_best:.0f} TFLOP/s per GPU (lead: >= {LEAD} of it)",
                }
            )
    return checks


def _pct(x) -> str:
    return f"{100 * x:+.1f}%"


def _error_line(val, col: str, what: str) -> str:
    e = val[col].abs()
    worst = val.loc[e.idxmax()]
    return (
        f"{what}, {len(val)} cells: median |error| {100 * e.median():.1f}%, worst "
        f"{_pct(worst[col])} ({worst['method']}, {worst['mask']}, {worst['direction']}, "
        f"{worst['gpus']} GPUs, {worst['tokens_per_gpu']} tokens/GPU)"
    )


def summary_text(val: pd.DataFrame, checks: list[dict], kt, mc) -> str:
    net = mc["network"]
    lines = [
        f"# CP throughput model: {mc['grid'].get('description', '')}",
        "",
        f"Network `{net.name}`: {net.text()}; intra-node links {intra_text(net)}. Source: "
        f"{mc['networks'][net.name].get('source', 'not stated')}",
        "",
        f"Local kernel `{kt.kernel}`: time per visible pair and query head interpolated in log length from "
        "kernel records (leave-one-out error at interior lengths):",
        "",
    ]
    for (d, k), errs in sorted(kt.loo_errors().items()):
        s = kt.points[(d, k)][0]
        tail = (
            f"median {_pct(np.median(np.abs(errs)))}, worst {_pct(max(errs, key=abs))}"
            if errs
            else "no interior point"
        )
        lines.append(
            f"- {d} {k}: lengths {int(s.min())}..{int(s.max())} ({len(s)} points); {tail}"
        )
    lines += [
        "",
        "Peak memory per GPU (`predicted_peak_mem_gib`): one call as the CP cells measure it (the "
        "CUDA allocator's peak with the rank's inputs, the method's buffers and, in a backward, "
        "the forward's saved output resident; model/memory.py), on the worst modelled rank of "
        "the worst sampled mask. No weights, optimizer state or other layers' activations.",
    ]
    cal = mc["calibration"]
    lines += ["", f"Per-call overheads: {cal.text()}."]
    if cal.grid.split(", ")[0] != mc["grid_name"]:
        lines.append(
            f"Only the per-kernel-call terms apply here; the per-transfer term belongs to the "
            f"network of {cal.grid}, and this grid's network `{net.name}` gets none."
        )
    lines += [
        "",
        "## Validation (predicted vs measured per-GPU TFLOP/s and peak memory per GPU, every "
        "measured cell of a modelled method)",
        "",
    ]
    if len(val):
        lines.append(_error_line(val, "relative_error", "per-GPU TFLOP/s, in-sample"))
        lines += ["", _loo_line(val)]
        lines += _per_kernel_lines(val, kt.kernel, mc.get("other_kernels", {}))
        mem = val.dropna(subset=["mem_relative_error"])
        lines.append("")
        lines.append(
            _error_line(mem, "mem_relative_error", "peak memory per GPU")
            if len(mem)
            else "peak memory: no cell measured it with the CUDA allocator (a CPU cell's "
            "process resident set holds the libraries and allocator caches: not comparable)"
        )
        lines += ["", val.round(3).to_markdown(index=False)]
    else:
        lines.append("no measured cell of this grid")
    if checks:  # the paper's grid only (cp_model.paper_grids)
        lines += ["", "## The paper's findings, as checks", ""]
        lines += [
            f"- {'PASS' if c['passed'] else 'FAIL'}: {c['name']}: {c['detail']}" for c in checks
        ]
    return "\n".join(lines) + "\n"


def _loo_line(val) -> str:
    """The leave-one-out error beside the in-sample one: each cell the per-call terms were
    fitted on predicted by the terms refitted on every other cell (overhead.leave_one_out)."""
    if "loo_relative_error" not in val:
        return "leave-one-out: not computed"
    fitted = val[val["in_fit"].astype(bool)] if "in_fit" in val else val.iloc[0:0]
    if not len(fitted):
        return (
            "leave-one-out: no cell here was fitted on (the per-call terms come from another "
            "grid's cells, or from none): the in-sample error is already out of sample"
        )
    refit = fitted.dropna(subset=["loo_relative_error"])  # both medians on the same cells
    within = (refit["relative_error"].abs().median(), refit["loo_relative_error"].abs().median())
    return (
        _loo_error_line(val, "per-GPU TFLOP/s, leave-one-out")
        + f"; the {len(refit)} cells the per-call terms were fitted on, each predicted by the "
        f"terms refitted without it: median |error| {100 * within[1]:.1f}% (in-sample "
        f"{100 * within[0]:.1f}%); the other {len(val) - len(fitted)} were not fitted on"
    )


def _loo_error_line(val, what: str) -> str:
    """_error_line of the leave-one-out errors, and the cells that have none (why)."""
    has = val.dropna(subset=["loo_relative_error"])
    text = _error_line(has, "loo_relative_error", what) if len(has) else f"{what}: no cell"
    missing = val[val["loo_relative_error"].isna()]
    if len(missing):
        reasons = "; ".join(sorted(set(missing["loo_reason"])))
        text += f"; {len(missing)} without a value ({reasons})"
    return text


def _per_kernel_lines(val, kernel: str, others: dict) -> list[str]:
    """Validation per local kernel, where the grid ran more than the modelled one (`auto`):
    in-sample and leave-one-out."""
    if not others:
        return []
    lines = [
        "",
        "Per local kernel (each its own time fit from its kernel records, and its own overheads):",
        "",
    ]
    for name in [kernel, *others]:
        cells = val[val["local_kernel"] == name]
        fit = others.get(name)  # a Calibration, or why the kernel could not be fitted
        if name == kernel:
            how = "the model's own kernel, above"
        else:
            how = fit if isinstance(fit, str) else f"per-call overheads {fit.text()}"
        err = (
            _error_line(cells, "relative_error", f"`{name}`, in-sample")
            + "; "
            + _loo_error_line(cells, "leave-one-out")
            if len(cells)
            else f"`{name}`: no cell"
        )
        lines.append(f"- {err}; {how}")
    return lines


def intra_text(net) -> str:
    """The intra-node links: the preset's numbers, or the comm benchmark's per pattern (and the
    preset's for a pattern it fitted no bandwidth for, said so)."""
    preset = f"{net.intra_gbytes_per_s} GB/s, {net.intra_latency_us} us"
    if not net.intra_by_pattern:
        return preset
    measured = {p for p, _, _ in net.intra_by_pattern}
    text = "measured per pattern: " + ", ".join(
        f"{p} {bw:.0f} GB/s, {lat:.0f} us" for p, bw, lat in net.intra_by_pattern
    )
    unfitted = sorted({"p2p", "all_to_all", "all_gather"} - measured)
    if unfitted:
        text += f"; {', '.join(unfitted)}: no bandwidth fitted, the preset's {preset}"
    return text
