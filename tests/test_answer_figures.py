"""The kernel figures of the paired answers (winner map, speedup over a reference), and what the
per-length figures draw besides their lines (each draw, the matmul ceiling, memory on a log axis,
settings of one length as bars), from a small SYNTHETIC tidy table and per-sample table."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from attnbench import families
from attnbench.families.kernel import figures, winners
from attnbench.families.kernel.grid import reference_problems
from attnbench.grid.config import ConfigError
from attnbench.report.figures import Inputs
from attnbench.report.winner_map import family_answers as winner_map_answers
from attnbench.report.winner_map import winner_map
from matplotlib.colors import to_rgb
from synthetic_cells import tidy

# ms per call of each kernel on the causal mask (one draw) and per draw on causal_document (3
# draws); p20-p80 +-1%, except where a row says otherwise
CAUSAL = {"fa3": 1.0, "fa2": 1.5, "flex": 2.0}
DOCS = {"fa3": (1.0, 1.2, 0.9), "flex": (2.0, 3.0, 1.8)}  # fa2 cannot express documents
TIE = {"fa3": 1.00, "flex": 1.01}  # at 4K on causal: within each other's spread
SPREAD = {"tie": 0.05}


def _cells_and_samples():
    """Kernel rows (GQA at 1K and 4K, MHA at 4K only; fwd and bwd) and their draws."""
    rows, samples = [], []
    for mask in ("causal", "causal_document"):
        for s, heads in ((1024, (64, 8)), (4096, (64, 8)), (4096, (64, 64))):
            for d in ("fwd", "bwd"):
                for impl in ("fa2", "flex", "fa3"):
                    cid = f"{impl}-{mask}-{s}-{heads[1]}-{d}"
                    scale = s / 1024 * (2 if d == "bwd" else 1)
                    if mask == "causal_document" and impl == "fa2":
                        rows.append(_row(impl, mask, s, heads, d, cid, "unsupported", None))
                        continue
                    tie = mask == "causal" and s == 4096 and impl in TIE
                    times = (
                        [TIE[impl]]
                        if tie
                        else [CAUSAL[impl]]
                        if mask == "causal"
                        else list(DOCS[impl])
                    )
                    rel = SPREAD["tie"] if tie else 0.01
                    for i, t in enumerate(times):
                        samples.append(
                            {
                                "cell_id": cid,
                                "sample": i,
                                "draw": f"{mask}-{s}-{i}",
                                "time_ms_median": t * scale,
                                "time_ms_p20": t * scale * (1 - rel),
                                "time_ms_p80": t * scale * (1 + rel),
                                "tflops": 100.0 / (t * scale),
                            }
                        )
                    med = float(np.median(times)) * scale
                    rows.append(_row(impl, mask, s, heads, d, cid, "ok", med, rel))
    return tidy(rows), pd.DataFrame(samples)


def _row(impl, mask, s, heads, d, cid, status, ms, rel=0.01):
    timed = ms is not None
    return {
        "impl": impl,
        "mask": mask,
        "seqlen": s,
        "heads_q": heads[0],
        "heads_kv": heads[1],
        "direction": d,
        "status": status,
        "cell_id": cid,
        "time_ms_median": ms,
        "time_ms_p20": ms * (1 - rel) if timed else None,
        "time_ms_p80": ms * (1 + rel) if timed else None,
        "tflops": 100.0 / ms if timed else None,
        "tflops_p20": 100.0 / ms / (1 + rel) if timed else None,
        "tflops_p80": 100.0 / ms / (1 - rel) if timed else None,
        "peak_mem_bytes": float(s * heads[1] * 2**16) if timed else None,
        "matmul_peak_tflops": 150.0,
    }


@pytest.fixture(scope="module")
def table():
    return _cells_and_samples()


@pytest.fixture(scope="module")
def found(table):
    df, samples = table
    return winners.answers(df, samples)


def _gids(fig, prefix):
    """(gid, artist) of the figure's patches and lines whose gid starts with prefix."""
    out = []
    for ax in fig.axes:
        for a in [*ax.patches, *ax.get_lines()]:
            gid = a.get_gid() or ""
            if gid.startswith(prefix):
                out.append((gid, a))
    return out


def _errorbars(fig, prefix) -> dict:
    """{gid of its line: errorbar container} of the figure's error bars."""
    return {
        c.lines[0].get_gid(): c
        for ax in fig.axes
        for c in ax.containers
        if (c.lines[0].get_gid() or "").startswith(prefix)
    }


def test_the_winner_map_draws_the_advices_answers(found):
    fig, drawn = winner_map(found, winners.MAP_AXES, "t")
    cells = {(d, m, c.group, c.at): (who, margin) for d, m, c, who, margin in drawn["cells"]}
    assert len(cells) == len(found) == 2 * 3 * 3  # masks x (GQA 1K, 4K, MHA 4K) x fwd, bwd, train
    # fa3 beats both others on the one causal draw, p20-p80 apart: a winner, fa2 1.5x behind
    assert cells[("fwd", "causal", (64, 8), 1024)] == ("fa3", "1.50x 1 draw")
    # at 4K fa3 and flex overlap (+-5%): a tie, named as one, in a hatched cell
    assert cells[("train", "causal", (64, 8), 4096)] == ("fa3~flex", "1.01x 1 draw")
    # on documents fa3 wins all three draws; flex takes 1.8-2.5x its time, draw by draw
    assert cells[("bwd", "causal_document", (64, 64), 4096)] == ("fa3", "2.00-2.50x 3/3")
    kinds = {gid.split("|")[1] for gid, _ in _gids(fig, "win|")}
    assert (
        kinds == {"winner", "tie"} and drawn["tie"] == 6 and drawn["winner"] == 12
    )  # 4K causal: ties
    for gid, patch in _gids(fig, "win|"):
        assert (patch.get_hatch() is not None) == (gid.split("|")[1] == "tie")
        a = next(
            a
            for a in found
            if f"|{a.point['mask']}|" in gid
            and f" {a.heads}|{a.direction}|" in gid
            and f"|{a.seqlen // 1024}K|" in gid
        )
        assert gid.endswith(a.verdict())
    plt.close(fig)


def test_speedup_is_per_draw_over_the_reference_else_the_next_one(found):
    refs = winners.references({})
    assert refs == ["fa2", "flex"] and winners.references({"reference_kernel": "fa3"}) == ["fa3"]
    fig, drawn = winners.speedup_figure(found, "fwd", refs, "t")
    # fa2 cannot run documents: that panel is over flex, the causal one over fa2
    assert drawn["reference"] == {"causal": "fa2", "causal_document": "flex"}
    lines = _errorbars(fig, "speedup|")
    causal = lines["speedup|fa3|causal|64:8|fwd"]
    y = causal.lines[0].get_ydata()
    assert list(y) == pytest.approx([1.5, 1.5 / 1.0])  # fa2's time over fa3's at 1K and 4K
    docs = lines["speedup|fa3|causal_document|64:8|fwd"]
    per_draw = [f / t for f, t in zip(DOCS["flex"], DOCS["fa3"])]  # 2.0, 2.5, 2.0
    assert list(docs.lines[0].get_ydata()) == pytest.approx([np.median(per_draw)] * 2)
    # the bar spans the draws' min-max
    (bars,) = docs.lines[2]
    segments = bars.get_segments()
    assert [s[0][1] for s in segments] == pytest.approx([min(per_draw)] * 2)
    assert [s[1][1] for s in segments] == pytest.approx([max(per_draw)] * 2)
    # MHA has one length here: left to the winner map, and said so
    notes = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
    assert "MHA 64:64 (at 4K only)" in notes
    assert not any("|64:64|" in gid for gid in lines)
    plt.close(fig)


def test_a_figure_of_one_length_draws_speedup_bars(found):
    one = [a for a in found if a.seqlen == 1024]
    fig, drawn = winners.speedup_figure(one, "train", ["fa2", "flex"], "t")
    assert drawn["points"] == 0 and drawn["bars"] == 3  # causal: fa3, flex; documents: fa3
    plt.close(fig)


def test_per_length_lines_show_each_draw_and_one_length_settings_as_bars(table):
    df, samples = table
    fig, counts = figures.family_lines(
        df[df["mask"] == "causal_document"],
        ["causal_document"],
        "tflops",
        "TFLOP/s",
        "t",
        samples=samples,
    )
    # GQA fwd, GQA bwd as lines; MHA, measured at 4K only, as bars
    assert counts["bar_panels"] == 2 and len(fig.axes) == 4
    # each draw of the timed multi-draw cells of the line panels: fa3 and flex, 2 lengths, 2
    # directions, 3 draws each; and beside the bars of the MHA panels, 2 kernels x 2 x 3
    assert counts["draw_dots"] == 2 * 2 * 2 * 3 + 2 * 2 * 3
    dots = _gids(fig, "draws|")
    ys = sorted(v for _, line in dots for v in line.get_ydata())
    docs = samples[samples["cell_id"].str.contains("causal_document")]
    assert ys == pytest.approx(sorted(docs["tflops"]))
    plt.close(fig)


def test_bars_carry_the_measured_ceiling_and_memory_is_on_a_log_axis(table):
    df, _ = table
    at = df[(df["seqlen"] == 4096) & (df["direction"] == "fwd")]
    fig, drawn = figures.bars_at_length(at, "t")
    ceilings = _gids(fig, "ceiling")
    assert drawn["ceiling"] == 150.0 and len(ceilings) == 2  # one per heads panel
    assert all(list(line.get_ydata()) == [150.0, 150.0] for _, line in ceilings)
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "measured bfloat16 matmul ceiling (150.0 TFLOP/s)" in legend
    plt.close(fig)
    sub = df[df["direction"] == "fwd"].assign(mem_gib=lambda d: d["peak_mem_bytes"] / 2**30)
    sub.loc[sub.index[0], "status"] = "oom"
    fig, counts = figures.memory_lines(sub, "mem_gib", "GiB", "t")
    assert {ax.get_yscale() for ax in fig.axes if ax.get_visible() and ax.get_title()} == {"log"}
    ((_, oom),) = _gids(fig, "oom|")  # on the floor of the log axis: y in axes units
    x = oom.get_xdata()[0]
    floor = oom.axes.transAxes.transform((0, 0))[1]  # the bottom of the panel, in pixels
    assert oom.get_transform().transform((x, oom.get_ydata()[0]))[1] == pytest.approx(floor)
    plt.close(fig)


def test_the_new_figures_are_promised_and_written(table, tmp_path):
    df, samples = table
    cfg = {
        "family": "kernel",
        "kernels": ["fa2", "flex", "fa3"],
        "masks": ["causal", "causal_document"],
        "seqlen": [1024, 4096],
        "direction": ["fwd", "bwd"],
    }
    stems = families.figure_stems(cfg)
    assert {"winner_map", "speedup_fwd", "speedup_bwd", "speedup_train"} <= set(stems)
    inputs = Inputs(samples=samples, grid_cfg=cfg)
    style = {"formats": ["png"], "dpi": 40, "bar_seqlen": 4096}
    paths = figures.figures(df, tmp_path, style, {"winner_map", "speedup_train"}, inputs)
    assert sorted(p.name for p in paths) == ["speedup_train.png", "winner_map.png"]
    whats = figures.figure_captions(df, style, inputs)
    assert "fa2; flex where fa2 is not ok at a mask" in whats["speedup_train"]
    assert set(stems) <= set(whats)


def test_a_reference_kernel_outside_the_grid_is_refused_naming_its_kernels():
    grid = {"kernels": ["fa2", "flex"], "also": [{"kernels": ["fa3"]}]}
    assert reference_problems({**grid, "reference_kernel": "fa3"}, "grids.g") == []
    (bad,) = reference_problems({**grid, "reference_kernel": ["flex", "fa4"]}, "grids.g")
    assert bad == (
        "grids.g.reference_kernel[1]: 'fa4' is not a kernel of this grid; its kernels: fa2, flex, fa3"
    )
    with pytest.raises(ConfigError, match=r"grids.smoke.reference_kernel: 'nope' is not a kernel"):
        families.load_config("config.yaml", {"grids": {"smoke": {"reference_kernel": "nope"}}})


# ----------------------------------------------------------------------------- other families


def _timed(impl, ms, **kw) -> dict:
    """A one-draw row at ms per call, p20-p80 +-1% (no per-sample data: read as one draw)."""
    row = {"status": "ok", "cell_id": f"{impl}-{len(kw)}-{hash(tuple(kw.items()))}", **kw}
    row.update(impl=impl, time_ms_median=ms, time_ms_p20=ms * 0.99, time_ms_p80=ms * 1.01)
    return {"heads_q": 64, "heads_kv": 8, **row}


def test_the_sparse_winner_map_has_a_row_per_block_setting_and_density():
    from attnbench.families.sparse import figures as sparse_figures
    from attnbench.families.sparse.advice import ADVICE

    rows = []
    for b, rho, s, d in itertools.product((64, 128), (0.2, 0.5), (32768, 65536), ("fwd", "bwd")):
        at = dict(mask="block_sparse", block_size=b, density=rho, seqlen=s, direction=d)
        # triton wins every point but B=128 at 0.5, where flex is within its spread
        flex = 1.005 if (b, rho) == (128, 0.5) else 3.0
        rows += [
            _timed("triton_block_sparse", s / 1000, **at),
            _timed("flex", s / 1000 * flex, **at),
        ]
    rows.append(_timed("fa3", 1.0, mask="full", seqlen=23168, direction="fwd"))  # no contender
    found = winner_map_answers(tidy(rows, family="sparse"), ADVICE)
    fig, drawn = winner_map(found, sparse_figures.MAP_AXES, "t")
    cells = {(d, row, c.label): who for d, row, c, who, _ in drawn["cells"]}
    assert len(cells) == 4 * 2 * 3  # settings x lengths x (fwd, bwd, train)
    assert cells[("fwd", "B=64, density 0.2", "32K")] == "triton_block_sparse"
    assert cells[("train", "B=128, density 0.5", "64K")] == "triton_block_sparse~flex"
    rows_drawn = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert rows_drawn == [f"B={b}, density {r}" for b in (64, 128) for r in (0.2, 0.5)]
    assert drawn["tie"] == 2 * 3 and drawn["winner"] == 6 * 3
    plt.close(fig)


def test_the_cp_winner_map_colours_a_method_whatever_its_settings():
    from attnbench.families.cp.advice import ADVICE
    from attnbench.families.cp.winners import MAP_AXES
    from attnbench.report.style import colour

    rows = []
    for tokens, d in itertools.product((16384, 65536), ("fwd", "bwd")):
        at = dict(mask="causal", gpus=2, tokens_per_gpu=tokens, seqlen=2 * tokens, direction=d)
        kernels = dict(local_kernel="fa3", dkv_comm_dtype="accumulator")
        rows += [
            _timed("ring_p2p", tokens / 1000, local_kernel_setting="auto", **kernels, **at),
            _timed("ring_p2p", tokens / 500, local_kernel_setting="fa3", **kernels, **at),
            _timed("ulysses", tokens / 800, local_kernel_setting="auto", **kernels, **at),
        ]
    df = tidy(rows, family="cp")
    for col in ("tokens_per_gpu", "local_kernel", "local_kernel_setting", "dkv_comm_dtype"):
        df[col] = [r[col] for r in rows]
    found = winner_map_answers(df, ADVICE)
    fig, drawn = winner_map(found, MAP_AXES, "t")
    cells = {(d, c.label, c.group_label): who for d, row, c, who, _ in drawn["cells"]}
    assert cells[("bwd", "64K/GPU", "2 GPUs, GQA 64:8")] == "ring_p2p [auto]"
    (patch,) = [p for gid, p in _gids(fig, "win|winner|causal|64K/GPU|") if "|bwd|" in gid]
    assert patch.get_facecolor()[:3] == pytest.approx(to_rgb(colour("ring_p2p")))
    plt.close(fig)


def test_a_grid_without_answers_gets_a_map_that_says_so():
    fig, drawn = winner_map([], winners.MAP_AXES, "t")
    assert drawn["cells"] == [] and "No answers to map" in fig.texts[0].get_text()
    plt.close(fig)
