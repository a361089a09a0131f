"""Predicted per-GPU TFLOP/s against GPUs (the paper's Figs. 20-23): one panel per mask and
direction, one line per method, measured cells drawn on top as filled markers."""

from __future__ import annotations

from pathlib import Path

from ..cp.catalog import method_label
from ..report.plotting import (
    apply_theme,
    collect_handles,
    grid_axes,
    kernel_line,
    legend_below,
    save,
    title_above,
)
from ..report.style import colour, marker


def model_figure(pred, out: Path, style, subtitle: str) -> list[Path]:
    style = apply_theme(style)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for tpg, t in pred.groupby("tokens_per_gpu"):
        panels = sorted(set(zip(t["mask"], t["direction"])), key=lambda md: (md[1] != "fwd", md))
        fig, axes = grid_axes(len(panels), ncols=min(4, len(panels)))
        for ax, (mask, d) in zip(axes, panels):
            p = t[(t["mask"] == mask) & (t["direction"] == d)]
            for m, g in p.groupby("method", sort=False):
                g = g.sort_values("gpus")
                ok = g.dropna(subset=["predicted_tflops_per_gpu"])
                model = ok["predicted_tflops_per_gpu"]
                label = f"{method_label(m)} (model)"
                kernel_line(ax, ok["gpus"], model, m, ms=3, mfc="none", lw=1.3, label=label)
                meas = g.dropna(subset=["measured_tflops_per_gpu"])
                if len(meas):
                    ax.plot(
                        meas["gpus"],
                        meas["measured_tflops_per_gpu"],
                        marker(m),
                        color=colour(m),
                        ms=7,
                        lw=0,
                        mec="black",
                        label=f"{method_label(m)} (measured)",
                    )
            ax.set_xscale("log", base=2)
            xs = sorted(set(p["gpus"]))
            ax.set_xticks(xs, [str(x) for x in xs], fontsize="x-small", rotation=45)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{mask}, {d}", fontsize="medium")
            ax.set_xlabel("GPUs")
            ax.set_ylabel("TFLOP/s per GPU")
            ax.grid(alpha=0.3)
        handles = collect_handles(axes)
        legend_below(fig, handles, min(5, len(handles)))
        title_above(
            fig,
            f"CP model: predicted per-GPU TFLOP/s ({tpg} tokens per GPU)",
            f"{subtitle} | lines: modelled, filled markers: measured",
        )
        fig.tight_layout()
        paths += save(fig, out, f"cp_model_t{tpg}", style)
    return paths


def figure_stems(grid: dict) -> list[str]:
    """The figures model_figure writes for a cp grid: one per tokens per GPU."""
    return [f"cp_model_t{tpg}" for tpg in grid["tokens_per_gpu"]]
