"""Figures, tables and report captions from a small synthetic tidy table: what is drawn matches the
data, statuses included; the files each grid promises are written; captions render as the report
renders them."""

import html
import re
import sys
import types
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from attnbench import families
from attnbench.cp.catalog import METHODS as CP_METHODS
from attnbench.families.kernel import figures
from attnbench.families.kernel import tables as kernel_tables
from attnbench.kernels.catalog import KERNELS as CATALOG
from attnbench.kernels.catalog import SPARSE_KERNELS
from attnbench.record.status import STATUSES, TIMED
from attnbench.report import captions, plotting, style, tables
from attnbench.report.html import markdown_page
from attnbench.report.labels import mask_families
from synthetic_cells import KERNELS, LENGTHS, kernel_grid_config, kernel_table, tidy

GRID_CFG = kernel_grid_config()


@pytest.fixture(scope="module")
def df():
    return kernel_table()


@pytest.fixture(scope="module")
def cells_csv(df, tmp_path_factory):
    p = tmp_path_factory.mktemp("tidy") / "cells.csv"
    df.to_csv(p, index=False)
    return p


def artists(fig, prefix):
    """(gid, artist) of every artist in the figure's axes whose gid starts with prefix."""
    out = []
    for ax in fig.axes:
        for a in list(ax.patches) + list(ax.texts) + list(ax.get_lines()):
            gid = a.get_gid() or ""
            if gid.startswith(prefix):
                out.append((gid, a))
    return out


def test_synthetic_table_has_every_status(df):
    assert set(df["status"]) == {"ok", "oom", "unsupported", "unavailable", "incorrect"}
    assert len(set(zip(df["heads_q"], df["heads_kv"]))) == 2 and len(set(df["seqlen"])) == 4


def test_bar_length_prefers_the_configured_length_else_the_longest(df):
    assert figures.bar_length(df, 8192) == 8192
    assert figures.bar_length(df, 2048) == 16384
    assert figures.bar_length(df[df["seqlen"] < 8192], 8192) == 4096


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_bars_match_the_data(df, direction):
    at = df[(df["seqlen"] == 8192) & (df["direction"] == direction)]
    fig, drawn = figures.bars_at_length(at, "t", expected_impls=KERNELS)
    # sdpa_flash is unavailable in every cell: no place, named under the figure
    assert drawn["not_installed"] == ["sdpa_flash"] and drawn["slots"] == 3
    counted = at[at["impl"] != "sdpa_flash"]
    bars = artists(fig, "bar|")
    assert len(bars) == drawn["bars"] == counted["status"].isin(TIMED).sum()
    for gid, patch in bars:  # every bar has the height of its row
        _, impl, mask, heads = gid.split("|")
        hq, hkv = map(int, heads.split(":"))
        row = at[
            (at["impl"] == impl)
            & (at["mask"] == mask)
            & (at["heads_q"] == hq)
            & (at["heads_kv"] == hkv)
        ]
        assert patch.get_height() == pytest.approx(row["tflops"].item())
        assert (patch.get_hatch() is not None) == (row["status"].item() == "incorrect")
    assert drawn["incorrect_bars"] == (counted["status"] == "incorrect").sum() == 0
    for status in ("oom", "unsupported", "unavailable"):
        marks = artists(fig, f"mark|{status}|")
        assert len(marks) == drawn["marks"][status] == (counted["status"] == status).sum()
        for _, text in marks:
            assert text.get_text() == style.BAR_MARK[status]
    assert (
        drawn["marks"]["oom"] == 3
        and drawn["marks"]["unsupported"] == 2 + (direction == "bwd") * 2
    )
    assert any(
        "Not measured on this machine" in t.get_text() and "sdpa_flash" in t.get_text()
        for t in fig.texts
    )
    plt.close(fig)


def test_bars_hatch_incorrect_cells(df):
    at = df[(df["seqlen"] == 4096) & (df["direction"] == "fwd")]
    fig, drawn = figures.bars_at_length(at, "t")
    hatched = [gid for gid, p in artists(fig, "bar|") if p.get_hatch()]
    assert hatched == ["bar|flex|causal|64:8"] and drawn["incorrect_bars"] == 1
    plt.close(fig)


def _line_points(fig, prefix):
    return sum(len(a.get_xdata()) for _, a in artists(fig, prefix))


@pytest.mark.parametrize("family", ["full_causal", "share_question"])
def test_family_lines_match_the_data(df, family):
    masks = mask_families(df["mask"])[family]
    sub = df[df["mask"].isin(masks)]
    fig, drawn = figures.family_lines(sub, masks, "tflops", "TFLOP/s", "t")
    assert len(fig.axes) == len(masks) * 4  # GQA/MHA x fwd/bwd
    timed = sub[sub["status"].isin(TIMED)]
    groups = timed.groupby(["impl", "mask", "heads_q", "heads_kv", "direction"]).ngroups
    assert len(artists(fig, "line|")) == drawn["lines"] == groups
    assert _line_points(fig, "line|") == drawn["points"] == len(timed)
    assert (
        _line_points(fig, "incorrect|")
        == drawn["incorrect_markers"]
        == (sub["status"] == "incorrect").sum()
    )
    oom = sub[sub["status"] == "oom"]
    assert _line_points(fig, "oom|") == drawn["oom_markers"] == len(oom) > 0
    # each OOM mark sits at its length (categorical x, shifted less than half a step) on the floor
    lengths = sorted(set(sub["seqlen"]))
    marked = Counter()
    for gid, line in artists(fig, "oom|"):
        impl, mask, heads, direction = gid.split("|")[1:]
        assert set(line.get_ydata()) == {0}
        for x in line.get_xdata():
            marked[(impl, mask, heads, direction, lengths[round(x)])] += 1
    expected = Counter(
        (r.impl, r.mask, f"{r.heads_q}:{r.heads_kv}", r.direction, r.seqlen)
        for r in oom.itertuples()
    )
    assert marked == expected
    notes = "\n".join(t.get_text() for t in fig.texts)
    assert "unavailable (not measured on this machine): sdpa_flash: all panels" in notes.replace(
        "\n", " "
    )
    if family == "share_question":
        flat = notes.replace("\n", " ").replace("     ", " ")
        assert "Not drawn, unsupported: flex: share_question (bwd); fa2: all panels." in flat
    plt.close(fig)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_memory_lines_match_the_data(df, direction):
    sub = df[df["direction"] == direction].assign(mem_gib=lambda d: d["peak_mem_bytes"] / 2**30)
    fig, drawn = figures.memory_lines(sub, "mem_gib", "GiB", "t")
    assert len(fig.axes) == 3
    timed = sub[sub["status"].isin(TIMED)]
    assert (
        len(artists(fig, "line|"))
        == drawn["lines"]
        == timed.groupby(["impl", "mask", "heads_q", "heads_kv"]).ngroups
    )
    assert _line_points(fig, "line|") == len(timed)
    assert _line_points(fig, "oom|") == (sub["status"] == "oom").sum()
    # two heads settings share a panel: two line styles, explained in the legend
    assert {a.get_linestyle() for _, a in artists(fig, "line|")} == {"-", "--"}
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "GQA 64:8 (line style)" in legend and "MHA 64:64 (line style)" in legend
    plt.close(fig)


def test_write_figures_writes_the_promised_files_and_captions(cells_csv, tmp_path, df):
    style_cfg = {"formats": ["png", "pdf"], "dpi": 60, "bar_seqlen": 8192}
    paths = families.write_figures(
        cells_csv, tmp_path, style_cfg, grid="synthetic", grid_cfg=GRID_CFG
    )
    promised = families.figure_names(
        GRID_CFG, style_cfg["formats"]
    ) + families.figure_caption_names(GRID_CFG)
    assert sorted(p.name for p in paths) == sorted(promised)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(promised)
    assert all((tmp_path / n).stat().st_size > 0 for n in promised)
    assert set(families.figure_stems(GRID_CFG)) == {
        "tflops_bars_fwd",
        "tflops_bars_bwd",
        "memory_vs_seqlen_fwd",
        "memory_vs_seqlen_bwd",
        "tflops_vs_seqlen_full_causal",
        "tflops_vs_seqlen_share_question",
        "winner_map",
        "speedup_fwd",
        "speedup_bwd",
        "speedup_train",
    }
    cap = (tmp_path / "tflops_bars_fwd.caption.rst").read_text()
    for fact in (
        "Test GPU 80GB",
        "CUDA 12.8",
        "driver 570.00",
        "torch 2.11.0+test",
        "bfloat16",
        "S = 8K (the configured length)",
        "Fig. 3",
        "0123456789",
    ):
        assert fact in cap.replace("\\", ""), fact


def test_bar_caption_says_when_the_configured_length_is_absent(df):
    whats = figures.figure_captions(df[df["seqlen"] < 8192], {"bar_seqlen": 8192})
    assert (
        "S = 4K (the longest length in the grid, which lacks the configured 8K)"
        in whats["tflops_bars_bwd"]
    )


def test_captions_render_as_the_report_renders_them(df):
    jinja2 = pytest.importorskip("jinja2")
    from docutils.core import publish_parts

    text = captions.caption_text(
        "A {{ braces }} and sliding_window_causal | *star*", df, "synthetic", GRID_CFG
    )
    rendered = (
        jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        .from_string(text)
        .render(snakemake=None)
    )
    html = publish_parts(rendered, writer="html", settings_overrides={"report_level": 2})["body"]
    assert "{{ braces }}" in html and "sliding_window_causal | *star*" in html
    assert "Test GPU 80GB" in html and "System Message" not in html
    assert re.search(
        r"\d+ cells \(\d+ ok, \d+ oom, \d+ unsupported, \d+ unavailable, 1 "
        r"incorrect\)",
        html,
    )


def test_captions_show_mixed_versions_with_their_counts(df):
    mixed = df.copy()
    mixed.loc[mixed.index[:3], "triton"] = "missing"
    assert "triton 3.5.0 (189 cells), missing (3 cells)" in captions.software(mixed)
    assert "naive: naive-lib 1.0" in captions.software(df)


def test_captions_name_the_library_of_the_cells_that_ran_it(df):
    """An unsupported cell never loaded its library: its recorded version is not what ran."""
    vsa = df[df["impl"] == "naive"].head(4).copy()
    vsa["status"] = ["ok", "ok", "unsupported", "unavailable"]
    vsa["library_version"] = ["fastvideo_kernel 0.3.2"] * 2 + ["vsa 0.0.4"] * 2
    assert captions.software(vsa).endswith("cells that ran: naive: fastvideo_kernel 0.3.2")
    vsa["status"] = "unavailable"  # never ran: every cell's
    assert "naive: fastvideo_kernel 0.3.2 (2 cells), vsa 0.0.4 (2 cells)" in captions.software(vsa)


def test_captions_name_a_driver_once_whatever_its_gpu_count(df):
    """nvidia-smi answers one line per GPU: a two-GPU machine's driver is still one driver."""
    gpus = df.copy()
    gpus["driver"] = "580.159.04"
    gpus.loc[gpus.index[:3], "driver"] = "580.159.04\n580.159.04"
    assert "driver 580.159.04; host" in captions.machine(gpus)
    gpus.loc[gpus.index[0], "driver"] = "570.1"
    assert "driver 570.1, 580.159.04; host" in captions.machine(gpus)


def test_captions_count_an_emulated_world_as_the_one_gpu_it_ran_on(df):
    """cp.emulate runs every rank of a world on one device: the caption must not claim N GPUs."""
    cells = df.head(4).copy()
    cells["device"], cells["device_name"] = "cuda", "NVIDIA H200"
    cells["gpus"], cells["emulated"] = 2, True
    assert captions.machine(cells).startswith("GPU: NVIDIA H200;")
    cells.loc[cells.index[0], "emulated"] = False  # one distributed cell beside them
    assert captions.machine(cells).startswith("GPU: NVIDIA H200 (1, 2 GPUs);")


def test_support_table_is_derived_from_statuses(df):
    t = kernel_tables.support_table(df)
    assert list(t.index) == ["naive", "sdpa_flash", "flex", "fa2"]
    assert list(t.columns) == ["full", "causal", "share_question"]
    ok, no = tables.SUPPORTED, tables.UNSUPPORTED
    assert t.loc["naive", "full"] == ok  # out of memory at 16K still means it can express the mask
    assert t.loc["fa2", "share_question"] == no and t.loc["fa2", "causal"] == ok
    assert t.loc["flex", "share_question"] == "fwd"
    assert t.loc["flex", "causal"] == f"{ok} (wrong)"
    assert (t.loc["sdpa_flash"] == "n/a").all()


def test_kernel_tables_have_rows_per_length_and_a_column_per_kernel(cells_csv, tmp_path):
    paths = families.write_tables(cells_csv, tmp_path, grid="synthetic", grid_cfg=GRID_CFG)
    promised = families.table_names(GRID_CFG) + families.table_caption_names(GRID_CFG)
    assert sorted(p.name for p in paths) == sorted(promised)
    sections = kernel_tables.length_tables(kernel_table().assign(peak_mem_gib=1.0), "tflops")
    assert len(sections) == 3 * 2 * 2  # masks x heads x directions
    title, t = sections[2]
    assert title == "full, MHA 64:64, forward"
    assert list(t.index) == ["1K", "4K", "8K", "16K"] and list(t.columns) == [
        "naive",
        "sdpa_flash",
        "flex",
        "fa2",
    ]
    assert t.loc["8K", "naive"] == "OOM" and t.loc["16K", "sdpa_flash"] == "n/a"
    # the median with its p20-p80 (naive is kernel 1: 10 + 1 TFLOP/s at 1K, the spread +-0.5)
    assert t.loc["1K", "naive"] == "11.0 [10.5-11.5]"
    md = (tmp_path / "tflops.md").read_text()
    assert (
        "### causal, GQA 64:8, forward" in md
        and "(wrong)" in md
        and "p20-p80" in md.split("\n", 1)[0]
    )
    tex = (tmp_path / "support.tex").read_text()
    assert r"$\checkmark$" in tex and r"$\times$" in tex and r"share\_question" in tex
    assert (tmp_path / "tflops.tex").read_text().count(r"\begin{table}") == 12
    cap = (tmp_path / "support.caption.rst").read_text()
    assert "Table 1" in cap and "| fa2" in cap and "Test GPU 80GB" in cap


def test_every_table_gets_a_page_for_the_report_with_its_cells(cells_csv, tmp_path):
    """The report shows an HTML file inline (a Markdown file only as a download link): each table's
    Markdown is also written as a page, its caption a paragraph, its sections headings, its
    numbers right-aligned cells."""
    families.write_tables(cells_csv, tmp_path, grid="synthetic", grid_cfg=GRID_CFG)
    for stem in families.table_stems(GRID_CFG):
        md, page = (tmp_path / f"{stem}.{fmt}" for fmt in ("md", "html"))
        text = page.read_text()
        assert text.startswith("<!DOCTYPE html>") and "<table>" in text, stem
        caption = md.read_text().split("\n", 1)[0]
        assert html.escape(caption, quote=False) in text
    page = (tmp_path / "tflops.html").read_text()
    assert page.count("<table>") == 12 and "<h3>causal, GQA 64:8, forward</h3>" in page
    assert "<td>11.0 [10.5-11.5]</td>" in page  # naive at 1K, as in the Markdown


def test_markdown_page_reads_headings_aligned_tables_code_and_escapes():
    md = (
        "caption with `code` and <b>\n\n### a | b\n\n"
        "| kernel | TFLOP/s |\n|:-------|--------:|\n| fa2 <x> | 1.5 |\n| `flex` | 2 |\n\nafter"
    )
    page = markdown_page(md, "t & u")
    assert "<title>t &amp; u</title>" in page
    assert '<p class="caption">caption with <code>code</code> and &lt;b&gt;</p>' in page
    assert "<h3>a | b</h3>" in page
    assert '<th>kernel</th>\n<th class="r">TFLOP/s</th>' in page
    assert '<tr><td>fa2 &lt;x&gt;</td><td class="r">1.5</td></tr>' in page
    assert '<tr><td><code>flex</code></td><td class="r">2</td></tr>' in page
    assert "<p>after</p>" in page


def test_a_family_without_captions_gets_generic_ones(cells_csv, tmp_path, monkeypatch):
    """The report machinery is family-agnostic: a family module that only draws still gets captions."""

    def draw(df, out, st, only=None, inputs=None):
        fig, ax = plt.subplots()
        ax.plot([1, 2], [1, 2])
        return plotting.save(fig, out, "fam_figure", st)

    # a family registered like the built-in ones (one registry line), whose figures say nothing
    monkeypatch.setitem(families.FAMILIES, "testfam", "testfam")
    monkeypatch.setitem(
        sys.modules,
        "attnbench.families.testfam",
        types.SimpleNamespace(__name__="attnbench.families.testfam", FIGURES="figures"),
    )
    monkeypatch.setitem(
        sys.modules,
        "attnbench.families.testfam.figures",
        types.SimpleNamespace(figures=draw, figure_captions=lambda df, st, inputs: {}),
    )
    df = pd.read_csv(cells_csv).assign(family="testfam")
    csv = tmp_path / "cells.csv"
    df.to_csv(csv, index=False)
    paths = families.write_figures(csv, tmp_path / "f", {"formats": ["png"], "dpi": 50})
    assert sorted(p.name for p in paths) == ["fam_figure.caption.rst", "fam_figure.png"]
    cap = (tmp_path / "f" / "fam_figure.caption.rst").read_text()
    assert "Figure fam\\_figure of grid (all grids)" in cap and "Test GPU 80GB" in cap


def test_every_kernel_and_method_keeps_one_distinct_style():
    dense_sparse = list(CATALOG) + list(SPARSE_KERNELS)
    pairs = [(style.colour(n), style.marker(n)) for n in dict.fromkeys(dense_sparse)]
    assert len(set(pairs)) == len(pairs)
    assert len({style.colour(n) for n in dict.fromkeys(dense_sparse)}) == len(
        pairs
    )  # colours alone differ too
    cp = [(style.colour(n), style.marker(n)) for n in CP_METHODS]
    assert len(set(cp)) == len(cp)
    # the status marks stay unambiguous: no kernel is drawn with the out-of-memory X
    assert all(style.marker(n) not in ("X", "x") for n in dense_sparse + list(CP_METHODS))
    assert style.colour("some_new_kernel") == style.colour(
        "some_new_kernel"
    )  # deterministic fallback
    # the looks come from the registries: every entry carries its own (none falls back)
    for info in [*CATALOG.values(), *CP_METHODS.values()]:
        assert info.colour.startswith("#") and info.marker, info.name
        assert (style.colour(info.name), style.marker(info.name)) == (info.colour, info.marker)


def test_synthetic_lengths_drive_the_axis(df):
    fig, _ = figures.family_lines(df[df["mask"] == "causal"], ["causal"], "tflops", "TFLOP/s", "t")
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["1K", "4K", "8K", "16K"] and len(LENGTHS) == 4
    plt.close(fig)


def test_tidy_helper_blanks_numbers_of_untimed_rows():
    t = tidy(
        [
            {
                "impl": "fa2",
                "mask": "causal",
                "seqlen": 8,
                "heads_q": 1,
                "heads_kv": 1,
                "direction": "fwd",
                "status": "unsupported",
                "tflops": 3.0,
                "peak_mem_bytes": 5.0,
            }
        ]
    )
    assert t["tflops"].isna().all() and t["peak_mem_bytes"].isna().all()


def test_a_grid_varying_another_axis_is_refused_not_averaged(df, tmp_path):
    two = pd.concat([df, df.assign(dtype="float16")])
    with pytest.raises(ValueError, match="differ in dtype"):
        figures.figure_makers(two, {"bar_seqlen": 8192})
    with pytest.raises(ValueError, match="differ in dtype"):
        kernel_tables.tables(two.assign(peak_mem_gib=1.0), tmp_path)


def test_a_difference_inside_the_spread_is_not_called_one():
    def r(impl, med, lo, hi):
        return {"impl": impl, "tflops": med, "tflops_p20": lo, "tflops_p80": hi}

    a, b, c = r("a", 100.0, 98.0, 102.0), r("b", 97.0, 95.0, 98.0), r("c", 90.0, 88.0, 94.0)
    assert tables.within_spread(a, b) and not tables.within_spread(
        a, c
    )  # touching at 98 counts as overlap
    assert tables.ratio_text(b, a, lambda x: f"{x:.2f}") == "~ 0.97 (within spread)"
    assert tables.ratio_text(c, a, lambda x: f"{x:.2f}") == "0.90"
    # no spread recorded: compared by medians alone, never declared a tie
    assert not tables.within_spread(a, r("d", 99.0, None, None))
    best, ties = tables.fastest(pd.DataFrame([c, b, a]))
    assert best["impl"] == "a" and ties == ["b"]


def test_captions_name_the_tidy_table_they_were_drawn_from(df, tmp_path, monkeypatch):
    # a grid written under another output_dir (results/h200) names that table, not results/tables
    monkeypatch.chdir(tmp_path)
    table = tmp_path / "results" / "h200" / "tables" / "cells.csv"
    text = captions.caption_text("A figure.", df, "synthetic", GRID_CFG, source=table)
    assert "the tidy table results/h200/tables/cells.csv;" in text.replace("\\", "")
    outside = Path("/elsewhere/tables/cells.csv")
    text = captions.caption_text("A figure.", df, "synthetic", GRID_CFG, source=outside)
    assert "the tidy table /elsewhere/tables/cells.csv;" in text.replace("\\", "")


def test_the_reports_description_names_every_status_with_its_meaning():
    text = (Path(__file__).parents[1] / "workflow/report/workflow.rst").read_text()
    flat = " ".join(text.split())
    for status in STATUSES:
        assert f"``{status}`` (" in flat, status
    for meaning in ("out of memory", "cell_timeout_s", "measured matmul ceiling"):
        assert meaning in flat
