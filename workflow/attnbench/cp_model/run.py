"""`python -m attnbench predict`: the model's table, its validation and checks, and its figures.

Inputs: config.yaml (`cp_model`: the grids to model and the network of each, presets, kernel
record grids), the grid's own records under <output_dir>/cells/<grid> (measured points and
validation) and kernel records under <output_dir>/cells/<kernel grid>.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..grid.spec import DKV_COMM_DTYPES, SPLIT_DOCUMENTS
from ..masks import Mask
from ..masks.lengths import choose_histogram
from ..report.collect import collect
from ..terminal import bar
from .kernel_time import KernelTime
from .network import Network
from .overhead import calibrate, leave_one_out, measured_samples
from .predict import MODELLED_METHODS, Setting, predict, realised_masks

COLUMNS = [
    "method",
    "mask",
    "direction",
    "gpus",
    "nodes",
    "tokens_per_gpu",
    "network",
    "predicted_tflops_per_gpu",
    "measured_tflops_per_gpu",
    "bottleneck",
    "predicted_peak_mem_gib",
    "measured_peak_mem_gib",
]
GIB = 2**30


def model_config(cfg: dict, grid: str) -> dict:
    m = cfg.get("cp_model")
    if not m:
        raise ValueError("config.yaml has no `cp_model` section")
    if grid not in m["grids"]:
        raise ValueError(f"grid {grid!r} is not modelled; cp_model.grids: {', '.join(m['grids'])}")
    if grid not in cfg["grids"] or cfg["grids"][grid].get("family") != "cp":
        raise ValueError(f"cp_model.grids names {grid!r}, which is not a cp grid of config.yaml")
    net_name = m["grids"][grid]
    if net_name not in m["networks"]:
        raise ValueError(
            f"unknown network {net_name!r} for grid {grid}; presets: {', '.join(m['networks'])}"
        )
    return {
        **m,
        "grid": cfg["grids"][grid],
        "network": Network.from_config(net_name, m["networks"][net_name]),
    }


def read_records(out_dir: Path, grids) -> pd.DataFrame:
    frames = [
        collect(root=out_dir / "cells" / g) for g in grids if (out_dir / "cells" / g).is_dir()
    ]
    frames = [f for f in frames if len(f)]
    return (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=["status", "family"])
    )


def setting_of(grid: dict) -> tuple[Setting, list]:
    heads = grid["heads"]
    if len(heads) != 1 or len(grid["head_dim"]) != 1 or len(grid["dtype"]) != 1:
        raise ValueError(
            "cp_model models a grid of one heads, head_dim and dtype setting; "
            f"this one has heads {heads}, head_dim {grid['head_dim']}, dtype {grid['dtype']}"
        )
    hq, hkv = heads[0]
    return Setting(hq, hkv, grid["head_dim"][0], grid["dtype"][0]), [d for d in grid["direction"]]


def histograms_for(cfg: dict, seqlen: int) -> dict:
    name = choose_histogram(seqlen, cfg["doc_length_histograms"])
    return {name: cfg["doc_length_histograms"][name]}


def prediction_rows(cfg, mc, s: Setting, directions, kt, progress=print) -> pd.DataFrame:
    grid, net = mc["grid"], mc["network"]
    # the grid's `also` entries run more methods (paper_cp's Ulysses, at the GPU counts its heads
    # split over): the model predicts them at every count, as the main ones
    listed = grid["methods"] + [
        m for extra in grid.get("also", []) for m in extra.get("methods", [])
    ]
    methods = [m for m in dict.fromkeys(listed) if m in MODELLED_METHODS]
    rows = []
    points = [
        (tpg, mask_name, n)
        for tpg in grid["tokens_per_gpu"]
        for mask_name in grid["masks"]
        for n in mc["gpus"]
    ]
    for tpg, mask_name, n in bar(points, len(points), "CP model"):
        masks = realised_masks(
            mask_name,
            tpg * n,
            mc["mask_samples"],
            mc["seed"],
            grid.get("mask_params", {}),
            histograms_for(cfg, tpg * n),
            s.heads_q,
            s.heads_kv,
        )
        for d in directions:
            for m in methods:
                preds = [predict(m, n, mk, s, d, kt, net, mc["max_ring_ranks"]) for mk in masks]
                rows.append(summary_row(preds, mask_name, tpg, n, net))
        progress(f"{mask_name} {tpg} tokens/GPU, {n} GPUs")
    return pd.DataFrame(rows)


def summary_row(preds, mask_name, tpg, n, net) -> dict:
    p0 = preds[0]
    ok = [p.tflops_per_gpu for p in preds if p.tflops_per_gpu is not None]
    return {
        "method": p0.method,
        "mask": mask_name,
        "direction": p0.direction,
        "gpus": n,
        "nodes": -(-n // net.gpus_per_node),
        "tokens_per_gpu": tpg,
        "network": net.name,
        "predicted_tflops_per_gpu": float(np.mean(ok)) if ok else None,
        "bottleneck": p0.bottleneck,
        # per GPU, the worst rank of the worst sampled mask
        "predicted_peak_mem_gib": max(p.peak_mem_bytes for p in preds) / GIB if ok else None,
        # the median ring step (mean over sampled masks): is the transfer hidden behind compute?
        **ring_step_columns(preds),
        "predicted_time_ms": float(np.mean([p.time_s for p in preds])) * 1e3 if ok else None,
        "ulysses_degree": p0.degrees["ulysses"],
        "ring_degree": p0.degrees["ring"],
        "windows": p0.degrees["windows"],
        "ranks_modelled": p0.ranks_modelled,
    }


def ring_step_columns(preds) -> dict:
    steps = [p.ring_step_s for p in preds if p.ring_step_s]
    return {
        "ring_step_compute_ms": float(np.mean([c for c, _ in steps])) * 1e3 if steps else None,
        "ring_step_comm_ms": float(np.mean([m for _, m in steps])) * 1e3 if steps else None,
    }


def record_masks(path: str) -> list:
    """The realised masks a measured cell timed (its samples' mask parameters)."""
    rec = json.loads(Path(path).read_text())
    c = rec["cell"]
    return [
        Mask(c["mask"], c["seqlen"], s["mask_params"], heads_q=c["heads_q"])
        for s in rec["samples"]
    ]


def validation_rows(measured: pd.DataFrame, s: Setting, kt, net, mc, loo=None) -> pd.DataFrame:
    """Every measured ok cell of a modelled method: the model on the cell's own realised masks,
    in-sample (the per-call terms fitted on every cell) and leave-one-out (`loo`: record ->
    (KernelTime, Network) refitted without that cell, overhead.leave_one_out; a cell the terms
    were not fitted on, e.g. one GPU, is its own leave-one-out: `in_fit` False; a cell whose
    refit lacks a term has no leave-one-out value and `loo_reason` says why)."""
    loo = loo or {}
    rows = []
    for _, r in measured.iterrows():
        masks = record_masks(r["record"])

        def model(kt, net, masks=masks, r=r):
            return [
                predict(
                    r["method"],
                    int(r["gpus"]),
                    mk,
                    s,
                    r["direction"],
                    kt,
                    net,
                    mc["max_ring_ranks"],
                    int(r["ulysses_degree"]),
                    int(r["windows"]),
                    previous_output=int(r["gpus"]) == 1,
                )
                for mk in masks
            ]

        preds = model(kt, net)
        pred = float(np.mean([p.tflops_per_gpu for p in preds]))
        in_fit = str(r["record"]) in loo
        refit = loo.get(str(r["record"]))
        reason = refit if isinstance(refit, str) else ""
        if reason:
            left_out = np.nan
        elif in_fit:
            left_out = float(np.mean([p.tflops_per_gpu for p in model(*refit)]))
        else:
            left_out = pred
        rows.append(
            {
                "method": r["method"],
                "mask": r["mask"],
                "direction": r["direction"],
                "gpus": int(r["gpus"]),
                "tokens_per_gpu": int(r["tokens_per_gpu"]),
                "network": net.name,
                "measured_tflops_per_gpu": r["tflops_per_gpu"],
                "predicted_tflops_per_gpu": pred,
                "relative_error": pred / r["tflops_per_gpu"] - 1,
                "in_fit": in_fit,
                "loo_predicted_tflops_per_gpu": left_out,
                "loo_relative_error": left_out / r["tflops_per_gpu"] - 1,
                "loo_reason": reason,
                "measured_time_ms": r["time_ms_median"],
                "predicted_time_ms": float(np.mean([p.time_s for p in preds])) * 1e3,
                "bottleneck": preds[0].bottleneck,
            }
        )
        rows[-1].update(memory_columns(r, preds))
    return pd.DataFrame(rows)


def measured_gib(row) -> float:
    """A cell's measured peak memory per GPU (GiB): the CUDA allocator's only (a CPU cell's is
    the process' resident set, libraries and allocator caches included: not comparable)."""
    ok = row.get("mem_source") == "cuda_allocator" and pd.notna(row.get("peak_mem_bytes"))
    return row["peak_mem_bytes"] / GIB if ok else np.nan


def memory_columns(r, preds) -> dict:
    pred = max(p.peak_mem_bytes for p in preds) / GIB
    meas = measured_gib(r)
    return {
        "predicted_peak_mem_gib": pred,
        "measured_peak_mem_gib": meas,
        "mem_relative_error": pred / meas - 1 if meas == meas else np.nan,
    }


def measured_cells(df: pd.DataFrame, grid: str, kernel: str | None) -> pd.DataFrame:
    """The grid's ok cells of modelled methods that ran local kernel `kernel` (None: any; dK/dV
    sent in another dtype than the accumulator's, and documents split otherwise than all, are
    not modelled)."""
    if df.empty or "method" not in df:
        return df.iloc[0:0]
    same = True if kernel is None or "local_kernel" not in df else df["local_kernel"] == kernel
    if "dkv_comm_dtype" in df:
        same = same & df["dkv_comm_dtype"].fillna(DKV_COMM_DTYPES[0]).eq(DKV_COMM_DTYPES[0])
    if "split_documents" in df:
        same = same & df["split_documents"].fillna(SPLIT_DOCUMENTS[0]).eq(SPLIT_DOCUMENTS[0])
    return df[
        (df["grid"] == grid)
        & (df["family"] == "cp")
        & (df["status"] == "ok")
        & df["method"].isin(MODELLED_METHODS)
        & df["tflops_per_gpu"].notna()
        & same
    ]


def attach_measured(pred: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """The measured per-GPU TFLOP/s and peak memory (median over a point's records) beside
    the predicted, where the grid measured the point."""
    keys = ["method", "mask", "direction", "gpus", "tokens_per_gpu"]
    if measured.empty:
        return pred.assign(measured_tflops_per_gpu=np.nan, measured_peak_mem_gib=np.nan)
    m = measured.assign(measured_peak_mem_gib=measured.apply(measured_gib, axis=1))
    m = m[keys + ["tflops_per_gpu", "measured_peak_mem_gib"]].astype(
        {"gpus": int, "tokens_per_gpu": int}
    )
    m = (
        m.groupby(keys, as_index=False)[["tflops_per_gpu", "measured_peak_mem_gib"]]
        .median()
        .rename(columns={"tflops_per_gpu": "measured_tflops_per_gpu"})
    )
    return pred.merge(m, on=keys, how="left")


def calibration_grids(mc: dict, grid: str) -> list[str]:
    """The grids whose cells fit a grid's per-call terms (cp_model.calibrate_on: a grid or a
    list, the first one's network timing the fit; default: the grid itself)."""
    cal = mc.get("calibrate_on", {}).get(grid, grid)
    return [cal] if isinstance(cal, str) else list(cal)


def fitted_kernel(recs, kernel: str, s: Setting, cal_grids, net: Network, mc: dict):
    """(KernelTime, Network, Calibration) of one local kernel: its time from the kernel records,
    its per-call overheads fitted on every cell of that kernel in `cal_grids` (a grid or a list:
    real cells' compute-only and comm-only runs, emulated cells' compute)."""
    cal_grids = [cal_grids] if isinstance(cal_grids, str) else list(cal_grids)
    kt = KernelTime.from_table(recs, kernel, s.heads_q, s.heads_kv, s.head_dim, s.dtype)
    cells = pd.concat([measured_cells(recs, g, kernel) for g in cal_grids], ignore_index=True)
    samples = measured_samples(cells)
    kt, net, cal = calibrate(samples, s, kt, net, mc["max_ring_ranks"], ", ".join(cal_grids))
    cal.loo = leave_one_out(cal, kt, net)
    return kt, net, cal


def calibration_network(cfg, grid: str, cal_grids, s: Setting, kernel: str) -> Network:
    """The network the first calibration grid's cells ran on. Every calibration grid must share
    the modelled grid's setting, and the first its local kernel (its per-kernel-call overhead is
    carried over)."""
    first = cal_grids[0]
    mc = model_config(cfg, first)
    for g in cal_grids:
        if g == grid:
            continue
        if g not in cfg["grids"] or cfg["grids"][g].get("family") != "cp":
            raise ValueError(f"cp_model.calibrate_on names {g!r}, which is not a cp grid")
        theirs = cfg["grids"][g].get("cp", {}).get("local_kernel", "auto")
        theirs = mc["local_kernel"] if theirs == "auto" else theirs
        if setting_of(cfg["grids"][g])[0] != s or (g == first and theirs != kernel):
            raise ValueError(
                f"cp_model.calibrate_on: {grid} borrows the per-call overhead of {g}, which "
                f"runs {setting_of(cfg['grids'][g])[0]} with local kernel {theirs}, not {s} with "
                f"{kernel}"
            )
    return mc["network"]


def run_predict(
    cfg: dict,
    grid: str,
    out_dir: Path,
    tables_dir: Path,
    figures_dir: Path | None,
    style=None,
    progress=print,
) -> dict:
    mc = {"mask_samples": 2, "max_ring_ranks": 64, "seed": 0, **model_config(cfg, grid)}
    mc["grid_name"] = grid
    s, directions = setting_of(mc["grid"])
    cal_grids = calibration_grids(mc, grid)
    recs = read_records(out_dir, list(dict.fromkeys([grid, *cal_grids, *mc["kernel_grids"]])))
    kernel = mc["grid"].get("cp", {}).get("local_kernel", "auto")
    kernel = (
        mc["local_kernel"] if kernel == "auto" else kernel
    )  # the grid's own local kernel first
    cal_net = calibration_network(cfg, grid, cal_grids, s, kernel)
    kt, net, mc["calibration"] = fitted_kernel(recs, kernel, s, cal_grids, cal_net, mc)
    own = cal_grids[0] == grid
    if own:  # another grid's network: its per-transfer overhead is not this one's
        mc["network"] = net
    measured = measured_cells(recs, grid, kernel)
    pred = attach_measured(prediction_rows(cfg, mc, s, directions, kt, progress), measured)
    loo = mc["calibration"].loo if grid in cal_grids else {}
    val = validation_rows(measured, s, kt, mc["network"], mc, loo).assign(local_kernel=kernel)
    # the grid's cells of its other local kernels (`auto`, or named), each with its own fit
    mc["other_kernels"] = {}
    for other in sorted(set(measured_cells(recs, grid, None).get("local_kernel", [])) - {kernel}):
        try:
            kt_o, net_o, cal_o = fitted_kernel(recs, other, s, cal_grids, cal_net, mc)
        except ValueError as e:  # no kernel records of it to fit its time from
            mc["other_kernels"][other] = str(e)
            continue
        mc["other_kernels"][other] = cal_o
        rows = validation_rows(measured_cells(recs, grid, other), s, kt_o, net_o, mc, cal_o.loo)
        val = pd.concat([val, rows.assign(local_kernel=other)], ignore_index=True)
    tables_dir.mkdir(parents=True, exist_ok=True)
    pred = pred[COLUMNS + [c for c in pred.columns if c not in COLUMNS]]
    pred.to_csv(tables_dir / "cp_model.csv", index=False)
    val.to_csv(tables_dir / "cp_model_validation.csv", index=False)
    from .checks import paper_checks, summary_text

    # the paper's findings are claims about the paper's grid: checked there only
    checks = paper_checks(pred, mc["network"]) if grid in mc.get("paper_grids", []) else []
    text = summary_text(val, checks, kt, mc)
    (tables_dir / "cp_model.md").write_text(text)
    files = [tables_dir / n for n in ("cp_model.csv", "cp_model_validation.csv", "cp_model.md")]
    if figures_dir is not None:
        from .figures import model_figure

        files += model_figure(pred, figures_dir, style, f"{grid}, network {mc['network'].name}")
    return {"files": [str(f) for f in files], "checks": checks, "summary": text}
