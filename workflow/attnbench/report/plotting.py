"""Drawing helpers every figure family shares: theme, panel grids, a kernel's line with its status
marks, notes in a panel, the legend and footnote placed below the panels (never over data), saving.

Drawing functions return what they drew (counts per kind), and tag each artist with a `gid`
("line|<impl>|...", "oom|...", "incorrect|...", "bar|...", "mark|<status>|...") so tests can check
the figure against the data.
"""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from ..record.status import STATUSES, TIMED  # noqa: E402
from .labels import GIB, heads_label, order, seqlen_label  # noqa: E402, F401  (GIB re-exported)
from .style import (  # noqa: E402
    HEADS_STYLES,
    INCORRECT_RING,
    OOM_MARKER,
    TIMEOUT_MARKER,
    colour,
    marker,
    marker_size,
)

DEFAULT_STYLE = {
    "dpi": 150,
    "context": "paper",
    "font_scale": 1.0,
    "formats": ["png", "pdf"],
    "bar_seqlen": 8192,
}


def apply_theme(style: dict) -> dict:
    import seaborn as sns

    style = {**DEFAULT_STYLE, **(style or {})}
    sns.set_theme(context=style["context"], style="whitegrid", font_scale=style["font_scale"])
    return style


def device_kind(df: pd.DataFrame) -> str:
    return "CPU" if set(df["device"].dropna()) == {"cpu"} else "GPU"


def describe(df: pd.DataFrame) -> str:
    """'GPU: NVIDIA H200 | dtype bfloat16': what every figure title states."""
    devs = sorted({str(x) for x in df["device_name"].dropna()}) or sorted(
        set(df["device"].dropna())
    )
    return f"{device_kind(df)}: {', '.join(devs)} | dtype {', '.join(sorted(set(df['dtype'].dropna())))}"


def memory_label(df: pd.DataFrame) -> str:
    """Axis label for peak memory; on the CPU the number is the process's resident set."""
    src = set(df.get("mem_source", pd.Series(dtype=object)).dropna())
    return "peak memory (GiB, process RSS)" if src == {"process_rss"} else "peak memory (GiB)"


def grid_axes(n, ncols=4, w=3.4, h=2.7):
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def save(fig, out: Path, stem: str, style) -> list[Path]:
    """One file per format; the tight bounding box is measured once for all of them."""
    fig.canvas.draw()
    bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(0.1)
    paths = []
    for fmt in style["formats"]:
        p = Path(out) / f"{stem}.{fmt}"
        fig.savefig(
            p,
            dpi=style["dpi"],
            bbox_inches=bbox,
            metadata={"CreationDate": None} if fmt == "pdf" else None,
        )
        paths.append(p)
    plt.close(fig)
    return paths


def save_drawn(draw, out: Path, stem: str, style) -> list[Path]:
    """Draw one figure (draw() -> (fig, drawn)) and save it; where either raises, a placeholder
    saying why takes its files (the reason on stderr), so the grid's other figures are still drawn."""
    before = set(plt.get_fignums())
    try:
        fig, _ = draw()
        return save(fig, out, stem, style)
    except Exception as e:  # noqa: BLE001 - any failure of one figure becomes its placeholder
        for n in set(plt.get_fignums()) - before:
            plt.close(n)
        why = f"{type(e).__name__}: {e}"
        print(f"figure {stem} not drawn, a placeholder in its place: {why}", file=sys.stderr)
        fig = plt.figure(figsize=(6.0, 1.5))
        text = textwrap.fill(f"Figure {stem} could not be drawn. {why[:500]}", 90)
        fig.text(0.5, 0.5, text, ha="center", va="center", color="0.25", parse_math=False)
        return save(fig, out, stem, style)


def no_data_note(ax, d: pd.DataFrame, value: str) -> bool:
    """Where none of a panel's rows has a finite positive `value` on a timed cell, a note in its
    middle saying why (the panel stays empty); whether it wrote one."""
    v = pd.to_numeric(d.loc[d["status"].isin(TIMED), value], errors="coerce")
    if (np.isfinite(v) & (v > 0)).any():
        return False
    statuses = "/".join(s for s in STATUSES if s in set(d["status"]))
    why = "no number recorded" if len(v) else f"no timed cell: all {statuses or 'absent'}"
    ax.text(
        0.5,
        0.5,
        why,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize="small",
        color="0.35",
        wrap=True,
        gid="no_data",
    )
    return True


def title_above(fig, title: str, subtitle: str = ""):
    """The figure title (and a second line, e.g. device and dtype) above the panels, outside them."""
    fig.suptitle(
        f"{title}\n{subtitle}" if subtitle else title, y=1.0, va="bottom", fontsize="large"
    )


def status_handles(oom=True, incorrect=True, timeout=False) -> dict:
    """Legend entries explaining the status marks of line figures."""
    h = {}
    if oom:
        h["out of memory (on the axis floor)"] = Line2D([], [], lw=0, color="0.6", **OOM_MARKER)
    if timeout:
        h["stopped at the time budget (on the axis floor)"] = Line2D(
            [], [], lw=0, color="0.6", **TIMEOUT_MARKER
        )
    if incorrect:
        h["disagrees with float64 reference"] = Line2D([], [], lw=0, **INCORRECT_RING)
    return h


def _legend_columns(labels, width_in: float) -> int:
    # an entry takes about its handle plus its text at the small legend font
    per = 0.6 + 0.06 * max(len(lab) for lab in labels)
    fit = max(1, min(len(labels), int(width_in / per)))
    rows = math.ceil(len(labels) / fit)
    return math.ceil(len(labels) / rows)  # balanced rows: 10 entries as 5 + 5, not 9 + 1


def legend_below(fig, handles: dict, ncol: int, loc: str = "upper center", y: float = 0.0):
    """One legend for all panels, centred on the figure at height y (below the panels)."""
    return fig.legend(
        list(handles.values()),
        list(handles.keys()),
        loc=loc,
        ncol=ncol,
        bbox_to_anchor=(0.5, y),
        frameon=False,
        fontsize="small",
    )


def note_below(fig, note: str, y: float, bottom: float = 0.0):
    """A grey note centred at height y (below the panels), then the panels laid out between
    `bottom` and the title."""
    fig.text(0.5, y, note, ha="center", fontsize="small", color="0.3")
    fig.tight_layout(rect=(0, bottom, 1, 0.97))


def panel_notes(ax, notes: list[str], **text_kw):
    """Notes in a panel's top left corner (e.g. what did not run there), one per line."""
    ax.text(
        0.02,
        0.97,
        "\n".join(notes),
        transform=ax.transAxes,
        fontsize="x-small",
        va="top",
        color="0.35",
        **text_kw,
    )


def kernel_line(ax, x, y, name: str, ls: str = "-", **line_kw):
    """A kernel's (or CP method's) line in its own colour and marker."""
    return ax.plot(x, y, ls, color=colour(name), marker=marker(name), **line_kw)


def timed_line(
    ax, g: pd.DataFrame, x: str, value: str, name: str, label: str, ms, lw, ring_ms, ls="-"
):
    """One kernel's rows g: the timed ones as a line of value against x (line style ls), red
    rings on the incorrect ones, out-of-memory ones as X on the axis floor. Returns (points,
    OOM marks)."""
    ok = g[g["status"].isin(TIMED) & g[value].notna()].sort_values(x)
    if len(ok):
        kernel_line(ax, ok[x], ok[value], name, ls=ls, ms=ms, lw=lw, label=label)
        bad = ok[ok["status"] == "incorrect"]
        ax.plot(bad[x], bad[value], "o", mfc="none", mec="red", ms=ring_ms, lw=0)
    oom = g[g["status"] == "oom"]
    if len(oom):
        ax.plot(
            oom[x],
            np.zeros(len(oom)),
            OOM_MARKER["marker"],
            color=colour(name),
            ms=OOM_MARKER["ms"],
            clip_on=False,
            label=f"{name} OOM",
        )
    return len(ok), len(oom)


def legend_and_notes(fig, handles: dict, notes: list[str], keys: dict | None = None):
    """Below the panels: the kernels' legend, then a legend of the marks and line styles (`keys`),
    then footnotes; all outside every axes.

    Call after tight_layout: each block hangs from the bottom of the one above it (the first from
    the figure's bottom edge), so nothing overlaps whatever their length; saving with the tight
    bounding box keeps them all.
    """
    width_in = fig.get_size_inches()[0]
    bottom = 0.0
    renderer = fig.canvas.get_renderer()
    for entries in (handles, keys or {}):
        if not entries:
            continue
        leg = legend_below(fig, entries, _legend_columns(list(entries), width_in), y=bottom)
        bottom = leg.get_window_extent(renderer).transformed(fig.transFigure.inverted()).y0
    if notes:
        chars = max(60, int(width_in * 15))
        text = "\n".join(textwrap.fill(n, chars, subsequent_indent="    ") for n in notes)
        fig.text(0.5, bottom - 0.01, text, ha="center", va="top", fontsize="small", color="0.25")


def collect_handles(axes) -> dict:
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if not lab.startswith("_"):
                handles.setdefault(lab, h)
    return handles


# ----------------------------------------------------------------------------- not-run notes


class NotRun:
    """Which kernel did not run where (by status), summarised for a footnote.

    `where` is what the reader looks for (a mask); `setting` qualifies it (heads and direction):
    the note names a setting only when the kernel ran in some settings of that mask and not in others.
    """

    def __init__(self):
        self.seen: dict = {}  # where -> settings drawn
        self.cells: dict = {}  # status -> impl -> where -> settings

    def panel(self, where: str, setting: tuple):
        self.seen.setdefault(where, set()).add(setting)

    def add(self, status: str, impl: str, where: str, setting: tuple):
        self.cells.setdefault(status, {}).setdefault(impl, {}).setdefault(where, set()).add(
            setting
        )

    def impls(self, status: str) -> list:
        return order(self.cells.get(status, {}))

    def everywhere(self, status: str) -> list:
        """Kernels with this status in every setting of every panel (e.g. a library not installed)."""
        return [
            i
            for i, w in self.cells.get(status, {}).items()
            if set(w) == set(self.seen) and all(w[k] == self.seen[k] for k in w)
        ]

    @staticmethod
    def _qualify(affected: set, seen: set) -> str:
        if affected == seen:
            return ""
        for pos, fmt in ((1, str), (0, lambda h: heads_label(*h))):  # direction, then heads
            vals = {s[pos] for s in affected}
            if affected == {s for s in seen if s[pos] in vals}:
                return " (" + ", ".join(sorted(fmt(v) for v in vals)) + ")"
        return " (" + ", ".join(f"{heads_label(*h)} {d}" for h, d in sorted(affected)) + ")"

    def lines(self) -> list[str]:
        """One footnote per status; kernels missing from the same places share one entry."""
        out = []
        for status in ("unsupported", "unavailable"):
            groups: dict = {}  # where-text -> kernels
            for impl in self.impls(status):
                where = self.cells[status][impl]
                text = (
                    "all panels"
                    if impl in self.everywhere(status)
                    else ", ".join(
                        f"{w}{self._qualify(s, self.seen[w])}" for w, s in where.items()
                    )
                )
                groups.setdefault(text, []).append(impl)
            if groups:
                out.append(
                    f"Not drawn, {NOT_DRAWN[status]}: "
                    + "; ".join(f"{', '.join(impls)}: {text}" for text, impls in groups.items())
                    + "."
                )
        return out


NOT_DRAWN = {
    "unsupported": "unsupported",
    "unavailable": "unavailable (not measured on this machine)",
}


# ----------------------------------------------------------------------------- lines vs x


def new_counts() -> dict:
    return {
        "lines": 0,
        "points": 0,
        "draw_dots": 0,
        "oom_markers": 0,
        "incorrect_markers": 0,
        "timeout_markers": 0,
    }


def draw_lines(
    ax,
    d: pd.DataFrame,
    value: str,
    x_of,
    counts: dict,
    notrun: NotRun,
    where: str,
    direction: str,
    heads_styles: dict | None = None,
    draws: dict | None = None,
):
    """One line per (kernel, heads) at x = `x_of(rows)` (an array per frame of rows); OOM as X and
    timeout as T on the floor, rings on incorrect points; kernels without a number recorded in `notrun`.

    `d` holds one panel's rows (one direction); `heads_styles` maps (hq, hkv) to a line style
    when several heads settings share the panel (None: every line solid); `draws`: {cell_id:
    the value on each of its draws} (per_draw), drawn as dots where a cell has several.
    """
    impls = order(d["impl"])
    d = d.assign(_x=np.asarray(x_of(d), dtype=float) if len(d) else [])
    groups = dict(list(d.groupby(["impl", "heads_q", "heads_kv"], sort=False)))
    for k, impl in enumerate(impls):
        for (i, hq, hkv), g in groups.items():
            if i != impl:
                continue
            hk = (int(hq), int(hkv))
            ls = (heads_styles or {}).get(hk, "-")
            tag = f"{impl}|{where}|{hk[0]}:{hk[1]}|{direction}"
            ran = g[g["status"].isin(TIMED) & g[value].notna()].sort_values("_x")
            if len(ran):
                ax.plot(
                    ran["_x"].to_numpy(),
                    ran[value].to_numpy(),
                    ls,
                    color=colour(impl),
                    marker=marker(impl),
                    ms=marker_size(impl),
                    lw=1.4,
                    label=impl,
                    gid=f"line|{tag}",
                )
                counts["lines"] += 1
                counts["points"] += len(ran)
                if draws:
                    counts["draw_dots"] += draw_dots(ax, ran, draws, impl, tag)
                bad = ran[ran["status"] == "incorrect"]
                if len(bad):
                    ax.plot(
                        bad["_x"].to_numpy(),
                        bad[value].to_numpy(),
                        lw=0,
                        gid=f"incorrect|{tag}",
                        **INCORRECT_RING,
                    )
                    counts["incorrect_markers"] += len(bad)
            # spread coincident floor marks of different kernels a little sideways
            shift = (k - (len(impls) - 1) / 2) * min(0.06, 0.5 / max(1, len(impls)))
            for status, style in (("oom", OOM_MARKER), ("timeout", TIMEOUT_MARKER)):
                floor = g[g["status"] == status]
                if len(floor):
                    ax.plot(  # y in axes units: on the floor of a linear or a log axis
                        floor["_x"].to_numpy() + shift,
                        np.zeros(len(floor)),
                        lw=0,
                        color=colour(impl),
                        clip_on=False,
                        zorder=5,
                        gid=f"{status}|{tag}",
                        transform=ax.get_xaxis_transform(),
                        **style,
                    )
                    counts[f"{status}_markers"] += len(floor)
            for status in ("unsupported", "unavailable"):
                if (g["status"] == status).any():
                    notrun.add(status, impl, where, (hk, direction))


def per_draw(samples: pd.DataFrame | None, value: str = "tflops") -> dict:
    """{cell_id: [value on each draw]} from the per-sample table (report.collect.read_samples)."""
    if samples is None or samples.empty or value not in samples:
        return {}
    s = samples.dropna(subset=[value]).sort_values(["cell_id", "sample"])
    return {str(k): g[value].tolist() for k, g in s.groupby("cell_id", sort=False)}


DRAW_DOT = {"marker": "o", "ms": 2.2, "alpha": 0.55, "mew": 0, "lw": 0}


def draw_dots(ax, ran: pd.DataFrame, draws: dict, name: str, tag: str) -> int:
    """Each draw of the rows' cells as a small dot beside its point (cells with one draw: none,
    the point is the draw); returns how many were drawn."""
    xs, ys = [], []
    for x, cell in zip(ran["_x"], ran["cell_id"].astype(str)):
        values = draws.get(cell, [])
        if len(values) > 1:
            offsets = np.linspace(-0.12, 0.12, len(values))
            xs += list(x + offsets)
            ys += values
    if xs:
        ax.plot(xs, ys, color=colour(name), gid=f"draws|{tag}", **DRAW_DOT)
    return len(xs)


def ceiling_line(ax, df: pd.DataFrame) -> float | None:
    """The device's measured matmul ceiling (matmul_peak_tflops) as a dashed line across the
    panel, with head room above it; None (nothing drawn) where the records carry none."""
    peaks = df["matmul_peak_tflops"].dropna() if "matmul_peak_tflops" in df else pd.Series()
    if peaks.empty:
        return None
    peak = float(peaks.median())
    ax.axhline(peak, color="0.25", ls=(0, (5, 3)), lw=1.0, zorder=1, gid="ceiling")
    ax.set_ylim(top=max(ax.get_ylim()[1], peak * 1.08))
    return peak


def ceiling_handle(peak: float, dtype: str) -> dict:
    text = f"measured {dtype} matmul ceiling ({peak:.1f} TFLOP/s)"
    return {text: Line2D([], [], color="0.25", ls=(0, (5, 3)), lw=1.0)}


def log_axis(ax, values):
    """A log y axis over positive values, ticks at 1, 2, 5 x 10^k written plainly (0.1, 2, 50)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    values = [v for v in values if v > 0 and math.isfinite(v)]
    # none (every cell out of memory, say): a decade, so the empty log axis can be drawn
    ax.set_ylim(*(min(values) / 1.6, max(values) * 1.6) if values else (1, 10))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def categorical_lengths(ax, lengths: list):
    """Sequence lengths as evenly spaced categories (1K..48K stay legible), labelled 1K, 2K, ..."""
    ax.set_xticks(
        range(len(lengths)),
        [seqlen_label(s) for s in lengths],
        rotation=45 if len(lengths) > 9 else 0,
    )
    ax.set_xlim(-0.5, len(lengths) - 0.5)
    ax.set_xlabel("sequence length (tokens)")


def finish_axes(ax, ylabel: str, log: bool = False):
    """Labels and grid; a linear axis from 0 with head room (points at the maximum stay whole),
    a log axis as log_axis set it."""
    if not log:
        ax.set_ylim(bottom=0)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.06)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if not log:
        ax.minorticks_off()


def outer_labels(axes, ncols: int):
    """Axis labels on the left column and the bottom panel of each column only (ticks stay)."""
    n = len(axes)
    for i, ax in enumerate(axes):
        if i % ncols:
            ax.set_ylabel("")
        if i + ncols < n:
            ax.set_xlabel("")


def heads_style_map(df: pd.DataFrame) -> dict:
    heads = list(dict.fromkeys((int(a), int(b)) for a, b in zip(df["heads_q"], df["heads_kv"])))
    return {h: HEADS_STYLES[i % len(HEADS_STYLES)] for i, h in enumerate(heads)}


def heads_handles(styles: dict) -> dict:
    if len(styles) < 2:
        return {}
    return {
        f"{heads_label(*h)} (line style)": Line2D([], [], color="0.3", ls=ls, lw=1.4)
        for h, ls in styles.items()
    }
