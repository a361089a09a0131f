"""Figures from the tidy table alone (never a record, never a GPU): PNG and PDF per grid.

Every figure states the device and dtype; each kernel keeps its colour and marker
(attnbench.style); out-of-memory points are marked, unsupported ones are absent and listed.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from . import outputs  # noqa: E402
from .collect import read_cells  # noqa: E402
from .style import STATUS_LABEL, colour, marker, order  # noqa: E402

GIB = 2**30
DEFAULT_STYLE = {"dpi": 150, "context": "paper", "font_scale": 1.0, "formats": ["png", "pdf"]}
HEADS_STYLES = ["-", "--", ":", "-."]


def describe(df: pd.DataFrame) -> str:
    devs = sorted({str(x) for x in df["device_name"].dropna()}) or sorted(set(df["device"]))
    kind = "CPU" if set(df["device"]) == {"cpu"} else "GPU"
    return f"{kind}: {', '.join(devs)} | dtype {', '.join(sorted(set(df['dtype'])))}"


def seqlen_label(s: int) -> str:
    return f"{s // 1024}K" if s >= 1024 and s % 1024 == 0 else str(s)


def _save(fig, out: Path, stem: str, style) -> list[Path]:
    paths = []
    for fmt in style["formats"]:
        p = out / f"{stem}.{fmt}"
        fig.savefig(p, dpi=style["dpi"], bbox_inches="tight")
        paths.append(p)
    plt.close(fig)
    return paths


def _grid_axes(n, ncols=4, w=3.4, h=2.7):
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows + 0.9), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def lines_vs_seqlen(df: pd.DataFrame, value: str, ylabel: str, title: str):
    """One panel per mask, one line per kernel (and heads setting); OOM as X on the axis floor.

    Returns the figure and what was drawn, so tests can count lines and markers.
    """
    masks = list(dict.fromkeys(df["mask"]))
    heads = list(dict.fromkeys(zip(df["heads_q"], df["heads_kv"])))
    fig, axes = _grid_axes(len(masks))
    drawn = {"lines": 0, "points": 0, "oom_markers": 0, "unsupported": {}, "unavailable": set()}
    for ax, mask in zip(axes, masks):
        d = df[df["mask"] == mask]
        unsup = []
        for impl in order(d["impl"]):
            for hi, hk in enumerate(heads):
                g = d[(d["impl"] == impl) & (d["heads_q"] == hk[0]) & (d["heads_kv"] == hk[1])]
                if g.empty:
                    continue
                ok = g[g["status"].isin(["ok", "incorrect"]) & g[value].notna()].sort_values("seqlen")
                label = impl if len(heads) == 1 else f"{impl} {hk[0]}:{hk[1]}"
                if len(ok):
                    ax.plot(ok["seqlen"], ok[value], HEADS_STYLES[hi % 4], color=colour(impl),
                            marker=marker(impl), ms=4, lw=1.3, label=label)
                    bad = ok[ok["status"] == "incorrect"]
                    ax.plot(bad["seqlen"], bad[value], "o", mfc="none", mec="red", ms=9, lw=0)
                    drawn["lines"] += 1
                    drawn["points"] += len(ok)
                oom = g[g["status"] == "oom"]
                if len(oom):
                    ax.plot(oom["seqlen"], np.zeros(len(oom)), "X", color=colour(impl), ms=8, clip_on=False,
                            label=f"{label} OOM")
                    drawn["oom_markers"] += len(oom)
                if (g["status"] == "unsupported").all():
                    unsup.append(impl)
                if (g["status"] == "unavailable").all():
                    drawn["unavailable"].add(impl)
        drawn["unsupported"][mask] = sorted(set(unsup))
        ax.set_title(mask, fontsize="medium")
        ax.set_xscale("log", base=2)
        xs = sorted(set(d["seqlen"]))
        ax.set_xticks(xs, [seqlen_label(x) for x in xs])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if unsup:
            ax.text(0.02, 0.97, "unsupported: " + ", ".join(sorted(set(unsup))), transform=ax.transAxes,
                    fontsize="x-small", va="top", color="0.35", wrap=True)
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(6, max(1, len(handles))),
               bbox_to_anchor=(0.5, -0.02), frameon=False, fontsize="small")
    fig.suptitle(title, y=1.0)
    notes = ["X on the axis: out of memory; red ring: disagrees with the float64 reference"]
    if drawn["unavailable"]:
        notes.append("not installed here (unavailable): " + ", ".join(order(drawn["unavailable"])))
    fig.text(0.5, -0.06, "\n".join(notes), ha="center", fontsize="small", color="0.3")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return fig, drawn


def heatmap(df: pd.DataFrame, title: str):
    """Kernel x mask at the longest length: TFLOP/s where it ran, the status where it did not."""
    s = df["seqlen"].max()
    d = df[df["seqlen"] == s]
    if len(set(zip(d["heads_q"], d["heads_kv"]))) > 1:  # one heads setting per heatmap: the first
        hq, hkv = d.iloc[0][["heads_q", "heads_kv"]]
        d = d[(d["heads_q"] == hq) & (d["heads_kv"] == hkv)]
    impls = order(d["impl"])
    masks = list(dict.fromkeys(df["mask"]))
    val = np.full((len(impls), len(masks)), np.nan)
    text = np.full((len(impls), len(masks)), "", dtype=object)
    for _, r in d.iterrows():
        i, j = impls.index(r["impl"]), masks.index(r["mask"])
        if r["status"] in ("ok", "incorrect") and pd.notna(r["tflops"]):
            val[i, j] = r["tflops"]
            text[i, j] = f"{r['tflops']:.3g}" + ("!" if r["status"] == "incorrect" else "")
        else:
            text[i, j] = STATUS_LABEL.get(r["status"], r["status"])
    fig, ax = plt.subplots(figsize=(1.0 * len(masks) + 2.5, 0.45 * len(impls) + 2.2))
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("0.92")
    im = ax.imshow(np.ma.masked_invalid(val), cmap=cmap, aspect="auto")
    vmax = np.nanmax(val) if np.isfinite(val).any() else 1.0
    for i in range(len(impls)):
        for j in range(len(masks)):
            dark = np.isfinite(val[i, j]) and val[i, j] < 0.6 * vmax
            ax.text(j, i, text[i, j], ha="center", va="center", fontsize="x-small",
                    color="white" if dark else "black")
    ax.set_xticks(range(len(masks)), masks, rotation=40, ha="right")
    ax.set_yticks(range(len(impls)), impls)
    fig.colorbar(im, ax=ax, label="TFLOP/s", shrink=0.8)
    ax.set_title(f"{title} | S = {seqlen_label(s)}", fontsize="medium")
    fig.tight_layout()
    return fig, {"cells": int(np.isfinite(val).sum()), "labels": int((text != "").sum())}


def kernel_figures(df: pd.DataFrame, out: Path, style, grid_cfg=None) -> list[Path]:
    paths = []
    for d in dict.fromkeys(df["direction"]):
        sub = df[df["direction"] == d]
        head = f"{d} | {describe(sub)}"
        fig, _ = lines_vs_seqlen(sub, "tflops", "TFLOP/s", f"Throughput vs sequence length | {head}")
        paths += _save(fig, out, f"tflops_vs_seqlen_{d}", style)
        fig, _ = lines_vs_seqlen(sub.assign(mem_gib=sub["peak_mem_bytes"] / GIB), "mem_gib", "peak memory (GiB)",
                                 f"Peak memory vs sequence length | {head}")
        paths += _save(fig, out, f"memory_vs_seqlen_{d}", style)
        fig, _ = heatmap(sub, f"TFLOP/s per kernel and mask | {head}")
        paths += _save(fig, out, f"heatmap_{d}", style)
    return paths


def write_figures(cells_csv, out_dir, style=None, grid: str | None = None, grid_cfg: dict | None = None):
    style = {**DEFAULT_STYLE, **(style or {})}
    sns.set_theme(context=style["context"], style="whitegrid", font_scale=style["font_scale"])
    df = read_cells(cells_csv)
    if grid:
        df = df[df["grid"] == grid]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    family = (grid_cfg or {}).get("family") or (df["family"].iloc[0] if len(df) else "kernel")
    if family == "kernel":
        paths = kernel_figures(df, out, style, grid_cfg)
    else:
        from importlib import import_module

        paths = import_module(f".{family}_report", __package__).figures(df, out, style)
    if grid_cfg is not None:  # make sure the files Snakemake expects are the ones written
        expected = {out / n for n in outputs.figure_names(grid_cfg, style["formats"])}
        missing = expected - set(paths)
        if missing:
            raise RuntimeError(f"figures not produced: {sorted(map(str, missing))}")
    return paths
