"""Sparse tables and figures on a paper-shaped tidy table: every panel, OOM marked, unsupported and
unavailable kernels listed, dense references at equal area, exactly the files the family names."""

import itertools

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from attnbench import families as outputs
from attnbench.families.sparse import figures as sparse_figures
from attnbench.families.sparse import tables as sparse_tables
from attnbench.report import plotting
from attnbench.report.outputs import ADVICE_STEM as ADVICE
from attnbench.report.plotting import DEFAULT_STYLE

GRID = {"family": "sparse", "direction": ["fwd", "bwd"]}


def spread_of(tflops, rel) -> dict:
    """p20 and p80 of TFLOP/s at +-rel around the median (None where there is no number)."""
    if tflops is None:
        return {"tflops_p20": None, "tflops_p80": None}
    return {"tflops_p20": tflops * (1 - rel), "tflops_p80": tflops * (1 + rel)}


# What every row shares besides its cell and numbers: grid g, bf16 at head dim 128 on an H200.
SHARED = dict(
    grid="g",
    family="sparse",
    head_dim=128,
    dtype="bfloat16",
    device="cuda",
    device_name="NVIDIA H200",
    mem_source="cuda_allocator",
)


def row(
    impl, mask, s, heads, direction, status, tflops, mem, area, block=None, avg=None, rho=None
):
    """One row (the block-sparse columns stay None for a dense kernel)."""
    hq, hkv = heads
    cell = dict(impl=impl, mask=mask, seqlen=s, heads_q=hq, heads_kv=hkv, direction=direction)
    measured = dict(status=status, tflops=tflops, **spread_of(tflops, 0.01), peak_mem_bytes=mem)
    blocks = dict(block_size=block, avg_block=avg, density=rho, realised_density=rho)
    return {**SHARED, **cell, **measured, **blocks, "mask_area_mean": area}


def tidy_table() -> pd.DataFrame:
    """Rows shaped like collect.py's (the statuses and numbers are test data, not measurements)."""
    rows = []
    settings = [
        ("block_sparse", 64, None),
        ("block_sparse", 128, None),
        ("variable_block_sparse", None, 256),
    ]
    for (mask, b, a), (hq, hkv), direction, s, rho in itertools.product(
        settings, [(64, 8), (64, 64)], ["fwd", "bwd"], [16384, 32768, 65536], [0.2, 0.5, 0.8]
    ):
        area = rho * s * s
        for impl in ("flex", "triton_block_sparse", "vsa", "flashinfer"):
            status, tflops = "ok", 100.0 + s / 1024 * rho
            if impl == "triton_block_sparse" and mask != "block_sparse":
                status, tflops = "unsupported", None
            if impl == "vsa":
                status, tflops = "unavailable", None
            if impl == "flashinfer" and direction == "bwd":
                status, tflops = "unsupported", None
            if impl == "flashinfer" and direction == "fwd" and s == 65536 and rho == 0.8:
                status, tflops = "oom", None
            at = (mask, b, hq, hkv, direction, s, rho)
            if impl == "flex" and at == ("block_sparse", 64, 64, 8, "fwd", 32768, 0.5):
                status = "incorrect"  # timed, but disagrees with the float64 reference
            if impl == "triton_block_sparse" and at == (
                "block_sparse",
                128,
                64,
                8,
                "fwd",
                65536,
                0.5,
            ):
                tflops = 402.0  # inside the dense reference's spread
            mem = None if tflops is None else 2**30 * s / 16384
            heads = (hq, hkv)
            rows.append(row(impl, mask, s, heads, direction, status, tflops, mem, area, b, a, rho))
    # dense kernels on the full mask at the lengths of area ~ 0.5 S^2 (S' = 23170, 46341): sdpa_flash
    # everywhere; at 23170 forward also fa3 (slower, inside sdpa_flash's spread) and flashmask (faster,
    # but incorrect: never the reference)
    dense = [("sdpa_flash", s, d, "ok", 400.0) for s in (23170, 46341) for d in ("fwd", "bwd")]
    dense += [("fa3", 23170, "fwd", "ok", 398.0), ("flashmask", 23170, "fwd", "incorrect", 900.0)]
    for impl, s, direction, status, tflops in dense:
        mem, area = 2**30 * s / 16384, float(s * s)
        rows.append(row(impl, "full", s, (64, 8), direction, status, tflops, mem, area))
    df = pd.DataFrame(rows)
    df["peak_mem_gib"] = df["peak_mem_bytes"] / 2**30
    return df


def test_tables_are_the_listed_files_with_statuses_and_dense_ratio(tmp_path):
    paths = sparse_tables.tables(tidy_table(), tmp_path)
    # the family's own tables: the advice every grid also lists, and each table's page for the
    # report, are written by the tables driver
    own = [
        n
        for n in outputs.table_names(GRID)
        if not n.startswith(f"{ADVICE}.") and not n.endswith(".html")
    ]
    assert sorted(p.name for p in paths) == sorted(own)
    md = (tmp_path / "sparse_tflops.md").read_text()
    for text in (
        "B=64",
        "B=128",
        "var A=256",
        "OOM",
        "unsup.",
        "n/a",
        "triton_block_sparse bwd",
        "realised density",
    ):
        assert text in md
    ratio = pd.read_csv(
        tmp_path / "sparse_vs_dense.md", sep="|", skipinitialspace=True, skiprows=[1, 3]
    )
    text = (tmp_path / "sparse_vs_dense.md").read_text()
    assert "sdpa_flash (full, S=23170)" in text and "sdpa_flash (full, S=46341)" in text
    assert "64:64" not in text  # no dense reference for MHA here: those rows are left out
    assert len(ratio) > 0
    assert r"\begin{tabular}" in (tmp_path / "sparse_memory.tex").read_text()


def test_dense_ratio_pairs_equal_area_only():
    sparse, dense = sparse_tables.split(tidy_table())
    r = sparse_tables.dense_ratio(sparse, dense)
    assert (
        set(r["density"]) == {0.5}
        and set(r["seqlen"]) == {32768, 65536}
        and set(r["heads"]) == {"64:8"}
    )
    row = r[
        (r["kernel"] == "flex")
        & (r["seqlen"] == 65536)
        & (r["direction"] == "fwd")
        & (r["blocks"] == "B=64")
    ].iloc[0]
    # flex at 64K, density 0.5: 100 + 64 x 0.5 = 132 TFLOP/s against sdpa_flash's 400
    assert row["tflops"] == "132 [130.7-133.3]" and row["dense tflops"] == "400 [396-404]"
    assert (
        row["fraction of dense"] == "0.330" and row["dense kernel"] == "sdpa_flash (full, S=46341)"
    )


def test_dense_ratio_uses_only_correct_cells_and_says_what_is_within_spread():
    sparse, dense = sparse_tables.split(tidy_table())
    r = sparse_tables.dense_ratio(sparse, dense).set_index(
        ["kernel", "blocks", "seqlen", "direction"]
    )
    # the fastest dense cell at 23170 forward is flashmask's 900, but it is incorrect: sdpa_flash is the
    # reference, and fa3's interval [394-402] overlaps sdpa_flash's [396-404]: not told apart
    fwd32 = r.loc[("triton_block_sparse", "B=64", 32768, "fwd")]
    assert fwd32["dense kernel"] == "sdpa_flash (full, S=23170) ~ fa3 (S=23170) (within spread)"
    assert "flashmask" not in " ".join(r["dense kernel"])
    # an incorrect sparse cell is listed, marked, and gets no ratio
    wrong = r.loc[("flex", "B=64", 32768, "fwd")]
    assert wrong["tflops"].endswith("(wrong)") and wrong["fraction of dense"] == "none (wrong)"
    # 402 [398-406] against 400 [396-404]: the ratio is not called a difference
    assert (
        r.loc[("triton_block_sparse", "B=128", 65536, "fwd"), "fraction of dense"]
        == "~ 1.005 (within spread)"
    )
    assert (
        not r["fraction of dense"]
        .str.startswith("~")
        .drop(("triton_block_sparse", "B=128", 65536, "fwd"))
        .any()
    )


def test_dense_references_are_drawn_at_their_own_length():
    sparse, dense = sparse_tables.split(tidy_table())
    at_half = sparse[sparse["density"] == 0.5]
    ref = sparse_tables.equal_area_references(dense, at_half)
    assert set(ref["seqlen"]) == {23170, 46341}  # their own lengths, not the sparse ones
    assert dict(zip(ref["seqlen"], ref["equal_area_seqlen"])) == {23170: 32768, 46341: 65536}
    fig, drawn = sparse_figures._figure(at_half, ref, "seqlen", "tflops", "TFLOP/s", "t")
    assert set(drawn["dense_x"]) == {23170, 46341}
    # the axis names the sparse lengths; a dense length is named by its label, not by a tick
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["16K", "32K", "64K"] and "23170" not in ticks and "46341" not in ticks
    labels = [t.get_text() for t in ax.texts if t.get_text().startswith("area of")]
    assert labels == ["area of 32K", "area of 64K"]


def test_figures_draw_every_panel_and_mark_what_did_not_run(tmp_path):
    df = tidy_table()
    paths = sparse_figures.figures(df, tmp_path, DEFAULT_STYLE)
    assert sorted(p.name for p in paths) == sorted(
        outputs.figure_names(GRID, DEFAULT_STYLE["formats"])
    )
    assert all(p.stat().st_size > 0 for p in paths)
    sparse, dense = sparse_tables.split(df)
    sparse["mem_gib"] = sparse["peak_mem_bytes"] / 2**30
    at_half = sparse[sparse["density"] == 0.5]
    ref = sparse_tables.equal_area_references(dense, at_half)
    _, drawn = sparse_figures._figure(at_half, ref, "seqlen", "tflops", "TFLOP/s", "t")
    assert drawn["panels"] == 3 * 2 * 2  # (B=64, B=128, var A=256) x (GQA, MHA) x (fwd, bwd)
    missing = drawn["missing"][("var A=256", "64:8", "fwd")]
    assert missing == {
        "unsupported": ["triton_block_sparse"],
        "unavailable": ["vsa"],
        "timeout": [],
        "crashed": [],
    }
    assert drawn["missing"][("B=64", "64:8", "bwd")]["unsupported"] == ["flashinfer"]
    # sdpa_flash: 2 lengths x 2 directions, and fa3 once (fwd), in each GQA panel (3 settings); never the
    # incorrect flashmask cell
    assert drawn["dense_points"] == (2 * 2 + 1) * 3
    at_dense = sparse[(sparse["seqlen"] == 65536)]
    _, drawn = sparse_figures._figure(
        at_dense.assign(x=at_dense["density"]), None, "x", "tflops", "TFLOP/s", "t", xlog=False
    )
    assert (
        drawn["oom_markers"] == 3 * 2
    )  # flashinfer fwd at 64K, density 0.8: each setting, both head counts


def test_a_kernel_that_ran_at_some_lengths_is_named_with_the_others(tmp_path):
    # FlashInfer's int32 plan offsets: it runs at 32K and ends `unsupported` at longer lengths; the
    # panel names those lengths, not only the kernels that ran nowhere in it
    df = tidy_table()
    at = (
        (df["impl"] == "flashinfer")
        & (df["direction"] == "fwd")
        & (df["seqlen"] >= 32768)
        & (df["block_size"] == 64)
        & (df["heads_kv"] == 64)
    )
    df.loc[at, ["status", "tflops"]] = ["unsupported", None]
    sparse, _ = sparse_tables.split(df)
    at_half = sparse[sparse["density"] == 0.5]
    fig, drawn = sparse_figures._figure(at_half, None, "seqlen", "tflops", "TFLOP/s", "t")
    missing = drawn["missing"][("B=64", "64:64", "fwd")]
    assert missing["unsupported"] == ["flashinfer (at 32K, 64K)"]
    assert drawn["missing"][("B=128", "64:64", "fwd")]["unsupported"] == []
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("unsupported: flashinfer (at 32K, 64K)" in n for n in notes)


def test_cells_without_a_measurement_are_listed_with_their_reasons(tmp_path):
    """sparse_not_measured: per kernel, status and reason, how many cells at which lengths and
    heads; measured cells are not in it, and a reason never recorded says so."""
    df = tidy_table()
    vsa = df["impl"] == "vsa"
    df["status_reason"] = None
    df.loc[vsa, "status_reason"] = "vsa: importing vsa failed: undefined symbol: ncclX"
    sparse_tables.tables(df, tmp_path)
    text = (tmp_path / "sparse_not_measured.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]
    by = {(r["kernel"], r["status"]): r for r in rows}
    v = by[("vsa", "unavailable")]
    assert int(v["cells"]) == int(vsa.sum())
    assert v["reason"] == "vsa: importing vsa failed: undefined symbol: ncclX"
    assert v["lengths"] == "16K, 32K, 64K" and v["heads"] == "64:64, 64:8"
    oom = by[("flashinfer", "oom")]
    assert oom["reason"] == "(none recorded)" and oom["lengths"] == "64K"
    assert ("flex", "incorrect") in by and "sdpa_flash" not in text


def test_each_sampled_layout_is_a_dot_where_a_cell_has_several():
    df = tidy_table().reset_index(drop=True)
    df["cell_id"] = [f"c{i}" for i in range(len(df))]
    sparse, dense = sparse_tables.split(df)
    at_half = sparse[(sparse["density"] == 0.5) & sparse["status"].isin(["ok", "incorrect"])]
    two = at_half[at_half["impl"] == "flex"]  # two layouts drawn for each flex cell
    samples = pd.DataFrame(
        [
            {"cell_id": c, "sample": i, "tflops": t * f}
            for c, t in zip(two["cell_id"], two["tflops"])
            for i, f in enumerate((0.9, 1.1))
        ]
    )
    draws = plotting.per_draw(samples)
    fig, drawn = sparse_figures._figure(
        sparse[sparse["density"] == 0.5], None, "seqlen", "tflops", "TFLOP/s", "t", draws=draws
    )
    assert drawn["draw_dots"] == 2 * len(two)
    ys = sorted(
        y
        for ax in fig.axes
        for ln in ax.get_lines()
        if (ln.get_gid() or "").startswith("draws|")
        for y in ln.get_ydata()
    )
    assert ys == pytest.approx(sorted(samples["tflops"]))


def kernel_grid_full(lengths, direction="fwd") -> pd.DataFrame:
    """A kernel grid's full-mask cells on the same device: at each length fa4 (1 ms per 1K tokens)
    and the slower fa2 (twice that), TFLOP/s 600 and 300; times give the answers their draws."""
    rows = []
    for s in lengths:
        for impl, ms, tflops in (("fa4", s / 1024, 600.0), ("fa2", s / 512, 300.0)):
            r = row(impl, "full", s, (64, 8), direction, "ok", tflops, 2**30, float(s * s))
            r.update(
                grid="kernels",
                family="kernel",
                gpus=1,
                cell_id=f"{impl}-{s}",
                time_ms_median=ms,
                time_ms_p20=ms * 0.99,
                time_ms_p80=ms * 1.01,
            )
            rows.append(r)
    return pd.DataFrame(rows)


def test_the_density_figure_draws_dense_full_attention_at_each_length_it_has(tmp_path):
    """A panel per block setting, heads, direction and length; in each, the fastest dense kernel
    on the full mask at that length (the answer advise sets a block-sparse one against) as a
    dashed line at its TFLOP/s; a length without one says so."""
    from attnbench.families.sparse.full_attention import full_attention_lines

    df = tidy_table()
    sparse, _ = sparse_tables.split(df)
    cells = pd.concat([df, kernel_grid_full([16384, 32768])], ignore_index=True)
    full = full_attention_lines(sparse, cells, None)
    # fwd at 64:8 only: the kernel grid has no MHA, no bwd, no 64K
    assert set(full) == {("64:8", "fwd", 16384), ("64:8", "fwd", 32768)}
    assert {(x.impl, x.tflops, x.grid) for x in full.values()} == {("fa4", 600.0, "kernels")}
    fig, drawn = sparse_figures.density_figure(sparse, full, "t")
    assert drawn["panels"] == 3 * 2 * 2 * 3  # settings x heads x directions x lengths
    lines = {(b, h, d, s): (impl, v) for b, h, d, s, impl, v in drawn["full_lines"]}
    assert len(lines) == 3 * 2  # (each setting) x 16K, 32K at GQA forward
    assert lines[("B=64", "64:8", "fwd", 32768)] == ("fa4", 600.0)
    assert ("B=64", "64:8", "fwd", 65536) in drawn["no_full"]
    dashed = [
        ln
        for ax in fig.axes
        for ln in ax.get_lines()
        if (ln.get_gid() or "").startswith("dense_full|")
    ]
    assert len(dashed) == 6 and {ln.get_ydata()[0] for ln in dashed} == {600.0}
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("no dense full attention at 64K in the tidy table" in n for n in notes)
    # on another device, the kernel grid's cells are no baseline
    other = cells.assign(
        device_name=[
            "Other GPU" if f == "kernel" else d
            for f, d in zip(cells["family"], cells["device_name"])
        ]
    )
    assert full_attention_lines(sparse, other, None) == {}
    plt.close(fig)
