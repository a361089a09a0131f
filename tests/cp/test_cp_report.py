"""The CP tables' derived columns and what the CP figures draw, from tidy-table rows (synthetic
numbers, not measurements)."""

import pandas as pd
import pytest
from attnbench.cp.catalog import METHODS
from attnbench.families.cp.tables import breakdown_table, tflops_table, vs_single_gpu_table

CP_COLOURS = {m: info.colour for m, info in METHODS.items()}


def row(
    impl,
    gpus,
    tflops,
    time_ms=None,
    comp=None,
    comm=None,
    ratio=None,
    tpg=4096,
    mask="full",
    status="ok",
    rel=0.01,
):
    """One tidy row; p20/p80 of TFLOP/s and time at +-rel around the median. The time follows
    from the TFLOP/s (FLOPs of a causal sequence of tpg x gpus tokens) unless given."""
    if tflops is None:  # a cell that did not run: no numbers
        return {
            **row(impl, gpus, 1.0, time_ms, comp, comm, ratio, tpg, mask, status, rel),
            **dict.fromkeys(
                (
                    "tflops",
                    "tflops_p20",
                    "tflops_p80",
                    "time_ms_median",
                    "time_ms_p20",
                    "time_ms_p80",
                )
            ),
        }
    if time_ms is None:  # FLOPs / (TFLOP/s per GPU x GPUs), in ms
        time_ms = 2 * 64 * 128 * (tpg * gpus) ** 2 / (tflops * 1e12 * gpus) * 1e3
    return {
        "impl": impl,
        "mask": mask,
        "direction": "fwd",
        "tokens_per_gpu": tpg,
        "gpus": gpus,
        "seqlen": tpg * gpus,
        "cell_id": f"{impl}-{gpus}-{tpg}-{mask}",
        "status": status,
        "heads_q": 64,
        "heads_kv": 8,
        "head_dim": 128,
        "dtype": "bfloat16",
        "tflops": tflops,
        "tflops_p20": tflops * (1 - rel),
        "tflops_p80": tflops * (1 + rel),
        "time_ms_median": time_ms,
        "time_ms_p20": time_ms * (1 - rel),
        "time_ms_p80": time_ms * (1 + rel),
        "compute_only_ms": comp,
        "comm_only_ms": comm,
        "overlap_ratio": ratio,
        "ulysses_degree": 1,
        "ring_degree": gpus,
        "windows": 1,
        "placement": "contiguous",
        "load_balance": 1.0,
        "bytes_sent_max": 0,
        "bytes_match_analytic": True,
        "peak_mem_bytes": 2**30,
    }


def shares(df) -> dict:
    t = vs_single_gpu_table(pd.DataFrame(df)).reset_index()
    return {
        (r["method"], r["gpus"], r["tokens_per_gpu"]): r["share of 1 GPU"] for _, r in t.iterrows()
    }


NONE = "none (no 1-GPU cell over the same documents)"


def test_share_is_against_the_bare_kernel_over_the_same_documents_and_says_when_it_is_missing():
    df = [
        row("local", 1, 200.0),  # 4K tokens on one GPU
        row("local", 1, 210.0, tpg=8192),  # 8K tokens on one GPU: the baseline of 2 x 4K
        row("ulysses", 1, 180.0),
        row("ring_p2p", 2, 150.0),
        row("ulysses", 1, 190.0, tpg=16384),
        row("ring_p2p", 2, 90.0, tpg=8192),
    ]
    s = shares(df)
    assert s[("ring_p2p", 2, 4096)] == "71%"  # 150 over 210, the 8K cell's: the same documents
    assert (
        s[("ulysses", 1, 4096)] == "90%"
    )  # the CP framework on one rank, against the bare kernel
    # 2 x 8K: no `local` cell of 16K tokens; neither the 8K one (other documents) nor the 1-GPU
    # Ulysses cell of 16K is used in its place
    assert s[("ring_p2p", 2, 8192)] == s[("ulysses", 1, 16384)] == NONE
    t = vs_single_gpu_table(pd.DataFrame(df)).reset_index()
    assert "local" not in set(t["method"])  # the baseline is a column, not a row
    at = t[(t["tokens_per_gpu"] == 4096) & (t["gpus"] == 2)].iloc[0]
    assert (
        at["1 GPU, bare kernel (TFLOP/s)"] == "210 [207.9-212.1]" and at["tokens (both)"] == "8K"
    )


def test_a_share_is_draw_by_draw_and_refused_over_other_documents():
    df = [row("local", 1, 200.0, tpg=8192), row("ring_p2p", 2, 150.0)]
    t1, tcp = df[0]["time_ms_median"], df[1]["time_ms_median"]
    samples = pd.DataFrame(
        [
            {
                "cell_id": r["cell_id"],
                "sample": i,
                "draw": f"docs{i}",
                "time_ms_median": m,
                "time_ms_p20": m * 0.99,
                "time_ms_p80": m * 1.01,
            }
            for r, scale in ((df[0], t1), (df[1], tcp))
            for i, m in enumerate((scale, scale * (1.2 if r is df[1] else 1.0)))
        ]
    )
    t = vs_single_gpu_table(pd.DataFrame(df), samples).reset_index()
    assert t.iloc[0]["share of 1 GPU"] == "69% [62%-75%]"  # 75% on one draw, 62.5% on the other
    samples.loc[samples["cell_id"] == df[1]["cell_id"], "draw"] = ["docs0", "elsewhere"]
    t = vs_single_gpu_table(pd.DataFrame(df), samples).reset_index()
    assert t.iloc[0]["share of 1 GPU"] == "none (other documents)"


def test_incorrect_cells_get_no_share():
    s = shares(
        [
            row("local", 1, 200.0, tpg=8192),
            row("ring_p2p", 2, 150.0, status="incorrect"),
            row("ulysses", 2, 150.0),
            row("local", 1, 200.0, tpg=16384, status="incorrect"),
            row("ulysses", 2, 150.0, tpg=8192),
            row("local", 1, None, tpg=32768, status="oom"),
            row("ulysses", 2, 150.0, tpg=16384),
        ]
    )
    assert s[("ring_p2p", 2, 4096)] == "none (wrong)" and s[("ulysses", 2, 4096)] == "75%"
    assert s[("ulysses", 2, 8192)] == "none (wrong)"  # the baseline itself is wrong
    assert s[("ulysses", 2, 16384)] == "none (baseline OOM)"


def test_a_share_inside_the_spread_is_not_called_a_difference():
    # 196 [192-200] against 200 [198-202]: the intervals overlap; 190 [186-194] does not reach 198
    s = shares(
        [
            row("local", 1, 200.0, tpg=8192),
            row("ulysses", 2, 196.0, rel=0.02),
            row("ring_p2p", 2, 190.0, rel=0.02),
        ]
    )
    assert s[("ulysses", 2, 4096)] == "~ 98% (within spread)" and s[("ring_p2p", 2, 4096)] == "95%"


def test_fastest_names_ties_within_spread_and_skips_wrong_cells_and_the_baseline():
    df = pd.DataFrame(
        [
            row("local", 1, 300.0),
            row("ulysses", 1, 280.0),
            row("ulysses", 2, 200.0),
            row("ring_p2p", 2, 198.0),
            row("usp", 2, 150.0),
            row("torch_cp", 2, 400.0, status="incorrect"),
            row("ulysses", 2, 200.0, tpg=8192),
            row("ring_p2p", 2, 150.0, tpg=8192),
        ]
    )
    t = tflops_table(df).reset_index().set_index(["tokens_per_gpu", "gpus"])
    assert t.loc[(4096, 2), "fastest (advice)"] == "ulysses ~ ring_p2p (one draw)"
    assert t.loc[(8192, 2), "fastest (advice)"] == "ulysses (one draw)"
    assert t.loc[(4096, 1), "fastest (advice)"] == ""  # one GPU: no advice
    assert t.loc[(4096, 2), "torch_cp"] == "400 [396-404] (wrong)"
    assert t.loc[(4096, 1), "local (1 GPU, bare kernel)"] == "300 [297-303]"


def test_overlap_is_shown_only_where_communication_is_not_negligible():
    df = pd.DataFrame(
        [
            row("ring_p2p", 2, 1.0, time_ms=105.0, comp=100.0, comm=20.0, ratio=0.75),
            row("ulysses", 2, 1.0, time_ms=109.0, comp=100.0, comm=1.0, ratio=-8.0),
        ]
    )
    t = breakdown_table(df).reset_index().set_index("method")
    assert t.loc["ring_p2p", "overlap"] == "0.75" and t.loc["ulysses", "overlap"] == "(comm 1.0%)"
    assert t.loc["ulysses", "measured / compute-only"] == "1.090"
    assert t.loc["ring_p2p", "time (ms)"] == "105 [104-106]"


def test_variants_of_a_method_are_rows_of_their_own_and_meet_the_bare_kernel_that_ran_theirs():
    """A method run with two dK/dV dtypes (or local-kernel settings) gets one name per variant;
    its share is against the bare cell that ran the same local kernel."""
    from attnbench.families.cp.tables import with_variants

    def lk(r, ran, setting="auto", dkv="accumulator"):
        return {**r, "local_kernel": ran, "local_kernel_setting": setting, "dkv_comm_dtype": dkv}

    df = pd.DataFrame(
        [
            lk(row("local", 1, 500.0, tpg=8192), "sdpa_cudnn"),
            lk(row("local", 1, 300.0, tpg=8192), "sdpa_flash", "sdpa_flash"),
            lk(row("ring_p2p", 2, 450.0), "sdpa_cudnn"),
            lk(row("ring_p2p", 2, 480.0), "sdpa_cudnn", dkv="input"),
            lk(row("ulysses", 2, 270.0), "sdpa_flash", "sdpa_flash"),
        ]
    )
    named = with_variants(df)
    assert list(named["impl"]) == [
        "local",
        "local",
        "ring_p2p [dkv accumulator]",
        "ring_p2p [dkv input]",
        "ulysses",
    ]
    t = vs_single_gpu_table(named).reset_index().set_index("method")
    assert t.loc["ring_p2p [dkv input]", "share of 1 GPU"] == "96%"  # against cuDNN's 500
    assert t.loc["ring_p2p [dkv input]", "local kernel"] == "sdpa_cudnn (auto)"
    assert t.loc["ulysses", "share of 1 GPU"] == "90%"  # against sdpa_flash's 300
    assert t.loc["ulysses", "1 GPU, bare kernel: local kernel"] == "sdpa_flash"


def test_documents_split_as_needed_is_a_variant_of_its_own_in_tables_and_advice():
    """cp.split_documents: a method run both ways gets one name per way, in the tables
    (with_variants) and in the advice (cp_names); records that predate the setting are `all`."""
    from attnbench.families.cp.advice import cp_names
    from attnbench.families.cp.tables import with_variants

    df = pd.DataFrame(
        [
            row("local", 1, 500.0, tpg=8192),
            row("ring_p2p", 2, 450.0),
            {**row("ring_p2p", 2, 480.0), "split_documents": "as_needed"},
            row("ulysses", 2, 270.0),
        ]
    )
    assert list(with_variants(df)["impl"]) == [
        "local",
        "ring_p2p [split all]",
        "ring_p2p [split as_needed]",
        "ulysses",
    ]
    _, name, _ = cp_names(df.assign(ulysses_degree=1, ring_degree=2))
    assert list(name)[1:3] == ["ring_p2p [split all]", "ring_p2p [split as_needed]"]


def test_every_cp_cell_is_shared_against_the_bare_kernel_over_its_whole_sequence():
    """Emulated or measured, the baseline is the `local` cell of the CP cell's whole length (the
    same seqlen, so the same documents), never the one of its tokens per GPU (other documents)."""
    emu = {**row("ring_p2p", 2, 150.0), "_emulated": True}
    per_gpu = row("local", 1, 200.0)  # 4K tokens: other documents than the 2 x 4K cell's
    whole = row("local", 1, 300.0, tpg=8192)

    def share(rows):
        t = vs_single_gpu_table(pd.DataFrame(rows)).reset_index().set_index("method")
        return t.loc["ring_p2p", "share of 1 GPU"], t.loc["ring_p2p", "tokens (both)"]

    assert share([emu, per_gpu, whole]) == ("50%", "8K")
    assert share([emu, per_gpu]) == (NONE, "8K")
    measured = {**emu, "_emulated": False}
    assert share([measured, per_gpu, whole]) == ("50%", "8K")


def cp_table(rows, grid="g") -> pd.DataFrame:
    """Tidy CP rows of a grid, with the machine columns every figure names."""
    from synthetic_cells import ENV

    return pd.DataFrame([{**ENV, "grid": grid, "family": "cp", **r} for r in rows])


def _figure_inputs(tmp_path, cells, model=None):
    """The figures' Inputs: the whole tidy table, and the CP model's table of the grid where
    given."""
    from attnbench.report.figures import Inputs

    tables = tmp_path / "cp"
    tables.mkdir(exist_ok=True)
    if model is not None:
        pd.DataFrame(model).to_csv(tables / "cp_model_validation.csv", index=False)
    return Inputs(cells=cp_table(cells, grid="other"), tables_dir=tables)


def _marks(drawn_fig):
    fig, drawn = drawn_fig
    out = {}
    for ax in fig.axes:
        for a in [*ax.patches, *ax.get_lines()]:
            gid = a.get_gid() or ""
            if gid.split("|")[0] in ("measured", "emulated", "modelled"):
                head, gpus = gid.rsplit("|", 1)  # kind|mask|direction|tpg|slot|gpus
                kind, mask, _, tpg, slot = head.split("|", 4)
                y = a.get_height() if hasattr(a, "get_height") else a.get_ydata()[0]
                out[(kind, mask, int(tpg), f"{slot} | {gpus}")] = (
                    y,
                    a.get_facecolor() if hasattr(a, "get_height") else a.get_markeredgecolor(),
                )
    return out, drawn, fig


def test_cp_efficiency_draws_measured_emulated_and_modelled_shares_by_their_rule(tmp_path):
    """The share of each CP cell is cp_vs_single_gpu's; an emulated cell of another grid at the
    same point is a hollow diamond beside it; the model's prediction for the cell a tick, over
    the same baseline; each method in its own colour."""
    import matplotlib.pyplot as plt
    from attnbench.families.cp.figures import efficiency
    from attnbench.report.figures import Inputs
    from matplotlib.colors import to_rgba

    def lk(r, ran="fa3"):
        return {**r, "local_kernel": ran, "local_kernel_setting": "auto"}

    grid = cp_table(
        [
            lk(row("ring_p2p", 2, 150.0)),
            lk(row("ulysses", 2, 180.0)),
            lk(row("ring_allgather", 2, 120.0, tpg=2048)),  # no baseline of 4K tokens
        ]
    )
    other = [
        lk(row("local", 1, 200.0, tpg=8192)),  # the baseline of 2 x 4K, in another grid
        {**lk(row("ring_p2p", 2, 190.0)), "emulated": True},
    ]
    model = [
        {
            "method": "ring_p2p",
            "mask": "full",
            "direction": "fwd",
            "gpus": 2,
            "tokens_per_gpu": 4096,
            "local_kernel": "fa3",
            "predicted_tflops_per_gpu": 160.0,
        }
    ]
    inputs = _figure_inputs(tmp_path, other, model)
    marks, drawn, fig = _marks(efficiency(grid, inputs))
    shares = vs_single_gpu_table(pd.concat([grid, cp_table(other)])).reset_index()
    ring = shares[shares["method"] == "ring_p2p"]["share of 1 GPU"].iloc[0]
    assert ring == "75%"  # the table's share: 150 over 200
    assert marks[("measured", "full", 4096, "ring_p2p | fa3 | 2")][0] == pytest.approx(75.0)
    assert marks[("measured", "full", 4096, "ulysses | fa3 | 2")][0] == pytest.approx(90.0)
    assert marks[("emulated", "full", 4096, "ring_p2p | fa3 | 2")][0] == pytest.approx(95.0)
    assert marks[("modelled", "full", 4096, "ring_p2p | fa3 | 2")][0] == pytest.approx(80.0)
    assert drawn["measured"] == 2 and drawn["emulated"] == 1 and drawn["modelled"] == 1
    colours = {k[3].split(" | ")[0]: v[1] for k, v in marks.items() if k[0] == "measured"}
    assert colours["ring_p2p"] != colours["ulysses"]
    assert colours["ring_p2p"] == to_rgba(CP_COLOURS["ring_p2p"])
    notes = " ".join(" ".join(t.get_text() for t in fig.texts).split())  # wrapped lines joined
    assert "Emulated cells from grid other" in notes
    assert (
        "No share (no 1-GPU cell over the same documents): full | fwd | 2048 tokens/GPU" in notes
    )
    plt.close(fig)
    # without the other grid's baseline, no share and no panel; without the model, no tick
    marks, drawn, fig = _marks(efficiency(grid, Inputs()))
    assert drawn["measured"] == drawn["modelled"] == 0 and not marks
    plt.close(fig)


def test_cp_tflops_draws_the_bare_kernel_of_the_same_sequence_in_the_one_gpu_group(tmp_path):
    import matplotlib.pyplot as plt
    from attnbench.families.cp.figures import tflops_vs_gpus
    from attnbench.report.figures import Inputs

    grid = cp_table(
        [
            row("local", 1, 200.0, tpg=8192),
            row("ring_p2p", 2, 150.0),
            row("ulysses", 2, None, status="oom"),
        ]
    )
    marks, drawn, fig = _marks(tflops_vs_gpus(grid, Inputs()))
    assert set(marks) == {
        ("measured", "full", 4096, "ring_p2p | ? | 2"),
        ("measured", "full", 4096, "local | ? (8K) | 1"),
    }
    assert marks[("measured", "full", 4096, "local | ? (8K) | 1")][0] == 200.0
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "ulysses OOM at 2" in notes
    plt.close(fig)
