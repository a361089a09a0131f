"""The advice (report.advice, `python -m attnbench advise`, tables/<grid>/advice.md) on small
SYNTHETIC tidy tables: a winner only where every other contender is slower (each cell here is
one draw, a record without per-sample data: p20-p80 apart and >= 2%; tests/test_paired.py and
tests/test_verdict.py have several), the
training step as fwd + bwd, only ok cells competing, CP and block-sparse points, and command-line
errors that name the valid choices."""

import re
import subprocess
import sys

import pandas as pd
import pytest
from attnbench import families
from attnbench.__main__ import main
from attnbench.report import advice, advice_text
from commands import package_env
from synthetic_cells import tidy

CP_COLUMNS = ("tokens_per_gpu", "local_kernel", "local_kernel_setting", "dkv_comm_dtype")


def cell(impl, time=None, spread=0.1, direction="fwd", status="ok", **kw) -> dict:
    """A row of the tidy table: time per call `time` ms with p20/p80 at -/+ `spread` ms."""
    timed = status in ("ok", "incorrect") and time is not None
    return {
        "impl": impl,
        "mask": "causal",
        "seqlen": 4096,
        "heads_q": 64,
        "heads_kv": 8,
        "direction": direction,
        "status": status,
        "time_ms_median": time if timed else None,
        "time_ms_p20": time - spread if timed else None,
        "time_ms_p80": time + spread if timed else None,
        "cell_id": f"id-{impl}-{direction}-{kw.get('seqlen', 4096)}",
        "record": f"results/cells/{impl}-{direction}.json",
        **kw,
    }


def table(rows, family="kernel", grid="g", extra=()) -> pd.DataFrame:
    """tidy() keeps the table's common columns; a family's own (CP) columns are added back."""
    df = tidy(rows, grid=grid, family=family)
    for col in extra:
        df[col] = [r.get(col) for r in rows]
    return df


def only(found, **point) -> advice.Answer:
    """The one answer at the given point values (and direction)."""
    direction = point.pop("direction", "fwd")
    hits = [
        a
        for a in found
        if a.direction == direction and all(a.point[k] == v for k, v in point.items())
    ]
    assert len(hits) == 1, [(a.point, a.direction) for a in found]
    return hits[0]


def kernel_answers(rows):
    return advice.grid_answers(table(rows), "g", families.advice_of("kernel"))[0]


def margin(a) -> float:
    """The runner-up's time over the fastest's (one draw: the ratio of their medians)."""
    return a.standing[a.runner_up.name].ratio_hi


# ---------------------------------------------------------------- winner or no clear winner


def test_a_winner_is_named_where_its_spread_is_apart_from_the_runner_up():
    a = only(kernel_answers([cell("fa2", 10.0, 0.5), cell("fa3", 12.0, 0.2)]))
    assert a.verdict() == "fa2 (one draw)" and a.winner.name == "fa2"
    assert a.runner_up.name == "fa3" and margin(a) == pytest.approx(1.2)
    assert not a.per_sample  # records without per-sample data: each read as one draw


def test_overlapping_spreads_give_no_clear_winner_naming_both():
    a = only(kernel_answers([cell("fa2", 10.0, 0.5), cell("fa3", 10.8, 0.4)]))
    assert a.winner is None
    assert a.verdict() == "fa2 ~ fa3 (one draw)"
    assert a.fastest.name == "fa2" and a.runner_up.name == "fa3"


def test_a_slower_contender_whose_spread_reaches_the_fastest_also_blocks_a_winner():
    # fa3 is apart from fa2, but flex's wide interval overlaps fa2's: nothing is resolved
    rows = [cell("fa2", 10.0, 0.5), cell("fa3", 11.5, 0.3), cell("flex", 14.0, 4.0)]
    a = only(kernel_answers(rows))
    assert a.verdict() == "fa2 ~ flex (one draw)"
    assert a.runner_up.name == "fa3" and a.standing["fa3"].slower


def test_only_ok_cells_compete_and_the_others_are_listed_with_their_status():
    rows = [
        cell("fa2", 10.0),
        cell("fa3", 5.0, status="incorrect"),  # faster, but wrong: it does not compete
        cell("naive", status="oom"),
        cell("sdpa_flash", status="unsupported"),
    ]
    a = only(kernel_answers(rows))
    assert [c.name for c in a.ok] == ["fa2"]
    assert a.verdict() == "fa2 (the only one ok)"
    assert {c.name: c.why_not() for c in a.not_ok} == {
        "fa3": "wrong",
        "naive": "OOM",
        "sdpa_flash": "unsup.",
    }
    text = advice_text.caption(table(rows), [a], families.advice_of("kernel"), "")
    assert "3 of 4 cells are not ok" in text


def test_a_point_without_an_ok_cell_says_so():
    a = only(kernel_answers([cell("naive", status="oom"), cell("fa2", status="unavailable")]))
    assert a.verdict() == "none ok" and a.fastest is None and a.runner_up is None


def test_a_kernel_the_grid_measures_elsewhere_is_listed_without_a_record_where_it_has_none():
    """A sweep not yet finished: fa4 measured at 4K, not at 8K, is listed there, not left out."""
    rows = [
        cell(k, t, direction=d) for k, t in (("fa2", 10.0), ("fa4", 8.0)) for d in ("fwd", "bwd")
    ]
    rows += [cell("fa2", 30.0, direction=d, seqlen=8192) for d in ("fwd", "bwd")]
    rows += [cell("fa4", 25.0, direction="fwd", seqlen=8192)]
    found = kernel_answers(rows)
    for direction, why in (("bwd", "no record"), ("train", "bwd no record")):
        a = only(found, seqlen=8192, direction=direction)
        assert [(c.name, c.why_not()) for c in a.not_ok] == [("fa4", why)]
        assert a.verdict() == "fa2 (the only one ok)"
    assert only(found, seqlen=8192).verdict() == "fa4 (one draw)"  # fwd: both measured
    assert not only(found, seqlen=4096, direction="train").not_ok
    rows = [cell("fa2", 30.0, seqlen=8192), cell("fa3", 20.0, heads_kv=64)]  # MHA: its own kernels
    rows += [cell("fa2", 9.0, mask="full"), cell("sdpa_math", 90.0, mask="full")]  # only on full
    found = kernel_answers(rows)
    assert (
        not only(found, seqlen=8192).not_ok and not only(found, mask="causal", seqlen=4096).not_ok
    )


def test_heads_settings_are_advised_apart():
    rows = [cell("fa2", 10.0), cell("fa3", 12.0)]
    rows += [cell("fa2", 30.0, heads_kv=64), cell("fa3", 20.0, heads_kv=64)]
    found = kernel_answers(rows)
    assert only(found, heads_kv=8).verdict() == "fa2 (one draw)"
    assert only(found, heads_kv=64).verdict() == "fa3 (one draw)"
    assert [t for t, _ in advice_text.sections(found)] == ["GQA 64:8", "MHA 64:64"]


# ---------------------------------------------------------------- the training step


def test_train_sums_the_fwd_and_bwd_medians_and_their_spreads():
    # fa3 wins the forward, fa2 the backward and the step
    rows = [
        cell("fa2", 3.0, 0.1),
        cell("fa2", 5.0, 0.2, direction="bwd"),
        cell("fa3", 2.0, 0.1),
        cell("fa3", 8.0, 0.3, direction="bwd"),
    ]
    found = kernel_answers(rows)
    assert only(found).verdict() == "fa3 (one draw)"
    train = only(found, direction="train")
    assert train.verdict() == "fa2 (one draw)"
    fa2 = train.fastest
    (draw,) = fa2.timed().draws
    assert (draw.median, draw.p20, draw.p80) == pytest.approx((8.0, 7.7, 8.3))
    assert [r.direction for r in fa2.records] == ["fwd", "bwd"]
    assert [r.path for r in fa2.records] == [
        "results/cells/fa2-fwd.json",
        "results/cells/fa2-bwd.json",
    ]
    assert margin(train) == pytest.approx(10.0 / 8.0)


def test_train_overlap_comes_from_the_combined_spreads():
    # apart in each direction alone (0.4 < 0.5 between the intervals), overlapping once summed
    rows = [
        cell("fa2", 10.0, 0.2),
        cell("fa3", 10.6, 0.2),
        cell("fa2", 20.0, 0.2, direction="bwd"),
        cell("fa3", 20.6, 0.2, direction="bwd"),
    ]
    found = kernel_answers(rows)
    assert only(found).verdict() == "fa2 (one draw)"
    assert only(found, direction="bwd").verdict() == "fa2 (one draw)"
    assert only(found, direction="train").verdict() == "fa2 (one draw)"
    rows = [dict(r, time_ms_p80=r["time_ms_p80"] + 0.4) for r in rows]  # wider p80s
    assert only(kernel_answers(rows), direction="train").verdict() == "fa2 ~ fa3 (one draw)"


def test_a_kernel_competes_in_train_only_with_both_records_ok():
    rows = [
        cell("fa3", 1.0),
        cell("fa3", direction="bwd", status="unsupported"),
        cell("fa2", 3.0),
        cell("fa2", 6.0, direction="bwd"),
        cell("flex", 4.0),  # no backward record at all
    ]
    train = only(kernel_answers(rows), direction="train")
    assert [c.name for c in train.ok] == ["fa2"]
    assert {c.name: c.why_not() for c in train.not_ok} == {
        "fa3": "bwd unsup.",
        "flex": "bwd no record",
    }


def test_a_point_measured_in_one_direction_has_no_train_answer():
    found = kernel_answers([cell("fa2", 3.0), cell("fa3", 2.0)])
    assert [a.direction for a in found] == ["fwd"]


# ---------------------------------------------------------------- context parallelism


def cp_cell(
    impl, time=None, gpus=2, direction="fwd", setting="auto", ran="fa3", dkv="accumulator", **kw
):
    tokens = kw.pop("tokens_per_gpu", 65536)
    return cell(
        impl,
        time,
        direction=direction,
        gpus=gpus,
        seqlen=tokens * gpus,
        tokens_per_gpu=tokens,
        local_kernel=ran,
        local_kernel_setting=setting,
        dkv_comm_dtype=dkv,
        **kw,
    )


def cp_rows():
    return [
        cp_cell("local", 50.0, gpus=1),  # the bare kernel on one GPU: a baseline, not advice
        cp_cell("ulysses", 60.0, gpus=1),  # a method on one rank: not advice either
        cp_cell("ulysses", 100.0),
        cp_cell("ring_p2p", 110.0),
        cp_cell("ring_p2p", 150.0, setting="sdpa_flash", ran="sdpa_flash"),
        cp_cell("ulysses", 300.0, direction="bwd", ran="sdpa_cudnn"),
        cp_cell("ring_p2p", 280.0, direction="bwd", ran="sdpa_cudnn"),
        cp_cell("ring_p2p", 240.0, direction="bwd", ran="sdpa_cudnn", dkv="input"),
        cp_cell(
            "torch_cp_auto", direction="bwd", status="unsupported", setting="auto", ran="auto"
        ),
    ]


def cp_answers(rows, *extra):
    return advice.grid_answers(
        table(rows, "cp", extra=CP_COLUMNS + extra), "g", families.advice_of("cp")
    )


def test_cp_advice_is_per_mask_tokens_per_gpu_and_gpus_among_the_methods():
    found, left = cp_answers(cp_rows())
    assert {a.gpus for a in found} == {2}  # the one-GPU cells are left out, and said to be
    assert "2 one-GPU cells" in left
    fwd = only(found, tokens_per_gpu=65536, gpus=2)
    # each local-kernel setting a method runs in is its own contender, named with what ran
    assert [c.name for c in fwd.ok] == ["ulysses", "ring_p2p [auto]", "ring_p2p [sdpa_flash]"]
    assert fwd.verdict() == "ulysses (one draw)" and fwd.fastest.label() == "ulysses (fa3)"
    bwd = only(found, tokens_per_gpu=65536, direction="bwd")
    assert bwd.verdict() == "ring_p2p [auto] [dkv input] (one draw)"
    assert [c.name for c in bwd.not_ok] == ["torch_cp_auto"]


def test_cp_train_pairs_a_backward_only_setting_with_the_methods_forward():
    found, _ = cp_answers(cp_rows())
    train = only(found, tokens_per_gpu=65536, direction="train")
    best = train.fastest
    assert best.name == "ring_p2p [auto] [dkv input]"
    assert train.standing[best.name].mean_ms == pytest.approx(110.0 + 240.0)
    assert [r.ran for r in best.records] == ["fa3", "sdpa_cudnn"]
    assert best.label() == "ring_p2p [auto] [dkv input] (fa3 + sdpa_cudnn)"
    assert {c.name for c in train.not_ok} == {"ring_p2p [sdpa_flash]", "torch_cp_auto"}


def test_cp_cells_are_measured_unless_their_emulated_column_says_otherwise():
    rows = cp_rows()
    found, _ = cp_answers(rows)
    assert not any(a.emulated for a in found)
    assert "[emulated]" not in advice_text.sections(found)[0][1].iloc[0]["advice"]
    for r in rows:
        r["emulated"] = r["impl"] == "ulysses"
    found, _ = cp_answers(rows, "emulated")
    fwd = only(found, tokens_per_gpu=65536)
    assert fwd.emulated and fwd.fastest.emulated and not fwd.runner_up.emulated
    first = advice_text.sections(found)[0][1].iloc[0]
    assert first["advice"].endswith("[emulated]")


# ---------------------------------------------------------------- block-sparse


def sparse_cell(impl, time, block, density, seqlen=32768, **kw):
    return cell(
        impl,
        time,
        mask="block_sparse",
        block_size=block,
        density=density,
        seqlen=seqlen,
        **kw,
    )


def test_sparse_advice_is_per_block_size_and_density_among_sparse_kernels():
    rows = [
        sparse_cell("triton_block_sparse", 10.0, 64, 0.2),
        sparse_cell("flex", 20.0, 64, 0.2),
        sparse_cell("triton_block_sparse", 30.0, 128, 0.2),
        sparse_cell("flex", 25.0, 128, 0.2),
        sparse_cell("flex", 50.0, 128, 0.5),
        sparse_cell("fa2_sparse", None, 128, 0.5, status="unsupported"),
        cell("fa3", 1.0, mask="full", seqlen=14592),  # a dense reference: not a contender
    ]
    found, left = advice.grid_answers(table(rows, "sparse"), "g", families.advice_of("sparse"))
    assert [(a.point["blocks"], a.point["density"]) for a in found] == [
        ("B=64", 0.2),
        ("B=128", 0.2),
        ("B=128", 0.5),
    ]
    assert found[0].verdict() == "triton_block_sparse (one draw)"
    assert found[1].verdict() == "flex (one draw)"
    assert found[2].verdict() == "flex (the only one ok)"
    assert [c.name for c in found[2].not_ok] == ["fa2_sparse"]
    assert "1 dense reference cells (mask full)" in left
    assert all(c.name != "fa3" for a in found for c in (*a.ok, *a.not_ok))


# ---------------------------------------------------------------- advice.md beside the other tables


def test_write_tables_writes_the_advice_beside_the_other_tables(tmp_path):
    rows = [cell("fa2", 10.0), cell("fa3", 12.0, 0.2), cell("fa2", 20.0, direction="bwd")]
    rows.append(cell("fa3", status="unsupported", direction="bwd"))
    cells = tmp_path / "cells.csv"
    table(rows).to_csv(cells, index=False)
    grid = {"family": "kernel", "device": "cuda", "direction": ["fwd", "bwd"]}  # as the rows
    out = tmp_path / "tables"
    paths = families.write_tables(cells, out, grid="g", grid_cfg=grid)
    names = {p.name for p in paths}
    assert {"advice.md", "advice.tex", "advice.caption.rst"} <= names
    assert sorted(names) == sorted(families.table_names(grid) + families.table_caption_names(grid))
    md = (out / "advice.md").read_text()
    assert md.startswith("advice: the fastest kernel")
    first = md.split("\n", 1)[0]
    assert "1 of 4 cells are not ok" in first and "on every draw B's p20 is above A's p80" in first
    assert "sign test at p <= 0.05" in first and "is >= 1.02" in first
    assert "### GQA 64:8" in md
    rows = {
        cells[2]: cells
        for cells in (
            [c.strip() for c in line.strip("|").split("|")]
            for line in md.splitlines()
            if line.startswith("| causal")
        )
    }
    assert rows["fwd"][:5] == ["causal", "4K", "fwd", "1 (no per-sample data)", "fa2 (one draw)"]
    assert rows["fwd"][6] == "fa3 1.20x, 0/1 won"
    assert rows["train"][4:6] == ["fa2 (the only one ok)", "fa2 30"]
    assert rows["train"][-1] == "fa3 bwd unsup."
    assert "advice" in (out / "advice.caption.rst").read_text()


# ---------------------------------------------------------------- the command line


@pytest.fixture
def cells_csv(tmp_path):
    rows = [
        cell("fa2", 3.0),
        cell("fa2", 5.0, direction="bwd"),
        cell("fa3", 2.0),
        cell("fa3", 8.0, direction="bwd"),
        cell("fa2", 9.0, seqlen=8192),
    ]
    path = tmp_path / "cells.csv"
    pd.concat(
        [table(rows), table(cp_rows(), "cp", grid="gcp", extra=CP_COLUMNS)], ignore_index=True
    ).to_csv(path, index=False)
    return path


def advise(cells_csv, *args):
    main(["advise", "--cells", str(cells_csv), *args])


def test_advise_prints_the_verdict_then_a_ranked_table(cells_csv, capsys):
    advise(cells_csv, "--mask", "causal", "--seqlen", "4K", "--direction", "train")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("g (kernel), causal, S=4K (4096)") and "train (fwd + bwd)" in out
    assert (
        "fa2: every other kernel is slower (one draw: repetitions' p20-p80 apart and >= 2%)" in out
    )
    assert any(x.split()[:4] == ["1", "fa2", "8", "1"] for x in lines)
    assert any(x.split()[:3] == ["2", "fa3", "10"] and "1.25x" in x for x in lines)
    fa3 = next(x for x in lines if x.split()[:2] == ["2", "fa3"])
    assert "1/1, p 0.5" in fa3 and fa3.endswith("slower")  # slower on 1 of 1 draw, and how sure
    assert "results/cells" not in out  # the record paths only with --verbose
    assert max(len(x) for x in lines) <= 100
    assert "gcp" not in out  # the CP grid has no cells at 4K
    advise(cells_csv, "--mask", "causal", "--seqlen", "4K", "--direction", "train", "--verbose")
    out = capsys.readouterr().out
    assert "fwd ok: results/cells/fa2-fwd.json (cell id-fa2-fwd-4096)" in out
    assert "bwd ok: results/cells/fa3-bwd.json (cell id-fa3-bwd-4096)" in out


def test_advise_with_gpus_answers_for_context_parallelism(cells_csv, capsys):
    advise(cells_csv, "--gpus", "2", "--direction", "bwd")
    out = capsys.readouterr().out
    assert "gcp (cp), causal, S=128K (131072), 65536 tokens/GPU x 2 GPUs" in out
    assert "ring_p2p [auto] [dkv input]: every other context-parallel method is slower" in out
    assert "not ok: torch_cp_auto unsup." in out


def test_every_answer_states_its_ground_in_every_format(repo, capsys):
    """measured or emulated, the device and days, and whether the records are current: on the
    committed h200_paired records (the code has changed since they were measured)."""
    import json

    cells = repo / "results/h200/tables/cells.csv"
    ask = ["--grid", "h200_paired", "--mask", "causal", "--seqlen", "8K", "--direction", "fwd"]
    advise(cells, *ask)
    out = capsys.readouterr().out.replace("\n    ", " ")
    ground = next(x for x in out.splitlines() if x.startswith("  ground: "))
    assert ground.startswith("  ground: measured on NVIDIA H200 2026-12-0")
    assert "records outdated (" in ground and "a run would remake them" in ground
    for fmt in ("json", "csv", "md"):
        advise(cells, *ask, "--format", fmt)
        out = capsys.readouterr().out
        if fmt == "json":
            assert json.loads(out)[0]["ground"] == ground.removeprefix("  ground: ")
        else:
            assert "measured on NVIDIA H200" in out


def test_the_ground_names_the_mask_as_drawn(repo, capsys, monkeypatch):
    """The realised mask parameters over the draws the answer rests on, read from its records:
    how many documents each of the 10 draws had, the window of a window mask."""
    import json

    monkeypatch.chdir(repo)  # the tidy table names its records from the repository's root
    cells = repo / "results/h200/tables/cells.csv"
    ask = ["--grid", "h200_paired", "--mask", "causal_document", "--seqlen", "8K"]
    advise(cells, *ask, "--direction", "fwd", "--format", "json")
    (answer,) = json.loads(capsys.readouterr().out)
    record = repo / "results/h200/cells/h200_paired/kernel/fa3/causal_document"
    record = json.loads((record / "s8192-h64x8-d128-bfloat16-fwd.json").read_text())
    docs = [len(s["mask_params"]["doc_lengths"]) for s in record["samples"]]
    assert len(docs) == 10 and min(docs) < max(docs)
    assert answer["ground"].endswith(f"; mask as drawn: {min(docs)}-{max(docs)} documents")
    advise(cells, "--grid", "h200_sweep", "--mask", "sliding_window", "--seqlen", "8K")
    assert "; mask as drawn: window 1,024" in capsys.readouterr().out.replace("\n    ", " ")
    advise(cells, *ask[:2], "--seqlen", "8K", "--mask", "causal", "--direction", "fwd")
    assert "mask as drawn" not in capsys.readouterr().out  # causal draws nothing


def test_realised_mask_parameters_in_words():
    from attnbench.masks.realised import describe

    assert describe([{"doc_lengths": [5, 3]}, {"doc_lengths": [8]}]) == "1-2 documents"
    assert (
        describe([{"window": 2523, "global_tokens": 5046}]) == "window 2,523; global tokens 5,046"
    )
    assert describe([{"realised_density": 0.2}, {"realised_density": 0.25}]) == "density 0.2-0.25"
    assert describe([{}, {"histogram": "pile", "seed": 3}]) == ""


@pytest.mark.parametrize("fmt", ["md", "json", "csv"])
def test_advise_writes_markdown_json_and_csv(cells_csv, capsys, fmt):
    import io
    import json

    advise(cells_csv, "--mask", "causal", "--seqlen", "4K", "--direction", "fwd", "--format", fmt)
    out = capsys.readouterr().out
    if fmt == "json":
        (a,) = json.loads(out)
        assert a["winner"] == "fa3" and a["draws"] == 1 and not a["per_sample"]
        assert a["rule"] == "p20-p80 apart" and a["how"].startswith("one draw: repetitions'")
        assert a["contenders"][1]["geomean"] == pytest.approx(1.5)
        assert a["contenders"][1]["p_value"] == 0.5 and a["contenders"][0]["p_value"] == 1.0
        assert [c["name"] for c in a["contenders"]] == ["fa3", "fa2"]
        assert a["contenders"][1]["ratio_lo"] == pytest.approx(1.5)
        assert a["contenders"][0]["records"][0]["path"] == "results/cells/fa3-fwd.json"
    elif fmt == "csv":
        t = pd.read_csv(io.StringIO(out))
        assert list(t["kernel"]) == ["fa3", "fa2"] and set(t["grid"]) == {"g"}
    else:
        assert "| fa3" in out and "fa3: every other kernel is slower" in out


def test_one_question_is_answered_from_one_grid_and_all_shows_the_others(tmp_path, capsys):
    old = [cell("sdpa_cudnn", 2.0), cell("fa2", 3.0)]  # an older grid without the new kernels
    new = [cell("fa4", 1.0), cell("fa3", 1.5), cell("fa2", 3.1)]
    path = tmp_path / "cells.csv"
    pd.concat([table(old, grid="old"), table(new, grid="new")]).to_csv(path, index=False)
    advise(path, "--mask", "causal", "--seqlen", "4K", "--direction", "fwd")
    out = capsys.readouterr().out
    assert out.startswith("new (kernel)") and "\nold (kernel)" not in out
    assert "also answered by: old (2 ok, 1 draw)" in out
    advise(path, "--mask", "causal", "--seqlen", "4K", "--direction", "fwd", "--all")
    out = capsys.readouterr().out
    assert out.startswith("new (kernel)") and "\nold (kernel)" in out
    advise(path, "--mask", "causal", "--seqlen", "4K", "--direction", "fwd", "--grid", "old")
    assert capsys.readouterr().out.startswith("old (kernel)")


def test_emulated_answers_come_in_a_labelled_block_of_their_own(tmp_path, capsys):
    measured = cp_rows()
    emulated = [dict(r, emulated=True) for r in cp_rows() if r["impl"] != "torch_cp_auto"]
    path = tmp_path / "cells.csv"
    pd.concat(
        [
            table(measured, "cp", grid="real", extra=CP_COLUMNS + ("emulated",)),
            table(emulated, "cp", grid="emu", extra=CP_COLUMNS + ("emulated",)),
        ]
    ).to_csv(path, index=False)
    advise(path, "--gpus", "2", "--direction", "fwd")
    out = capsys.readouterr().out
    real, emu = out.split("[emulated: one GPU ran every rank's compute")
    assert real.startswith("real (cp)") and "emu (cp)" not in real
    assert "emu (cp)" in emu and "[emulated]" in emu and "also answered by" not in out


def test_a_question_over_many_points_prints_one_verdict_line_each(cells_csv, capsys, monkeypatch):
    from attnbench.report import question

    monkeypatch.setattr(question, "MANY", 2)
    advise(cells_csv, "--grid", "gcp", "--gpus", "2")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("gcp: causal 64K/GPU x 2 GPUs GQA 64:8 fwd: ulysses (one draw)")
    assert len(lines) == 4 and "narrow the question" in lines[3]  # fwd, bwd, train


def test_advise_without_filters_prints_the_whole_advice(cells_csv, capsys):
    advise(cells_csv)
    out = capsys.readouterr().out
    assert "## g (kernel)" in out and "## gcp (cp)" in out
    assert out.count("advice: the fastest") == 2


def test_the_overview_has_one_row_per_mask_and_two_columns_per_length(cells_csv, capsys):
    advise(cells_csv, "--grid", "g", "--overview")
    out = [[c.strip() for c in x.split("|")[1:-1]] for x in capsys.readouterr().out.splitlines()]
    assert out[0] == ["mask", "4K train", "4K runner-up"]  # 8K: fa2 has no backward there
    assert out[2] == ["causal", "fa2 (one draw)", "fa3 1.25x"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_an_overview_with_nothing_to_show_says_so_and_exits_2(tmp_path, capsys, fmt):
    """Forward cells only: no train answer, the overview's default direction (it printed an empty
    line, exit 0); --direction fwd has one."""
    path = tmp_path / "cells.csv"
    table([cell("fa2", 3.0), cell("fa3", 2.0)]).to_csv(path, index=False)
    with pytest.raises(SystemExit) as e:
        advise(path, "--overview", "--format", fmt)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "advise: --overview: no train answers to show; valid --direction: fwd" in err, err
    advise(path, "--overview", "--direction", "fwd")
    assert "| causal | fa3 (one draw)" in capsys.readouterr().out


def test_a_filter_given_twice_keeps_the_values_of_both(cells_csv, capsys):
    advise(cells_csv, "--grid", "g", "--seqlen", "4K", "--direction", "fwd", "bwd")
    both = capsys.readouterr().out
    advise(cells_csv, "--grid", "g", "--seqlen", "4K", "--direction", "fwd", "--direction", "bwd")
    assert capsys.readouterr().out == both and "fwd" in both and "bwd" in both
    with pytest.raises(SystemExit) as e:  # the first --mask is not dropped for the last
        advise(cells_csv, "--mask", "sideways", "--mask", "causal")
    assert e.value.code == 2
    assert (
        "--mask sideways: not in the tidy table; valid --mask: causal" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "option, values",
    [("--format", ["md", "json"]), ("--network", ["a", "b"]), ("--local-kernel", ["a", "b"])],
)
def test_an_option_of_one_value_given_twice_is_refused_naming_it(
    cells_csv, capsys, option, values
):
    with pytest.raises(SystemExit) as e:
        advise(cells_csv, "--mask", "causal", option, values[0], option, values[1])
    assert e.value.code == 2
    said = f"argument {option}: given twice ({values[0]}, {values[1]}): give it once"
    assert said in capsys.readouterr().err
    with pytest.raises(SystemExit):
        advise(cells_csv, "--cells", str(cells_csv))
    assert "argument --cells: given twice" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["records", "regenerate"])
def test_grids_not_in_the_config_are_named_with_the_valid_ones(repo, monkeypatch, capsys, command):
    """A KeyError traceback before; now one line and exit 2, before any work (regenerate's lock)."""
    monkeypatch.chdir(repo)
    with pytest.raises(SystemExit) as e:
        main([command, "--grids", "smoke", "--grids", "nosuch"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"{command}: --grids nosuch: no such grid in the config; valid --grids: "
    )
    assert "smoke, " in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("command", ["tables", "figures"])
def test_a_grid_not_in_the_tidy_table_is_named_before_any_file(cells_csv, capsys, command):
    out = cells_csv.parent / "out"
    with pytest.raises(SystemExit) as e:
        main([command, "--cells", str(cells_csv), "--out-dir", str(out), "--grid", "nosuch"])
    assert e.value.code == 2 and not out.exists()
    said = f"{command}: --grid nosuch: no such grid in {cells_csv}; valid --grid: g, gcp"
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, named",
    [
        (["--mask", "sideways"], "--mask sideways: not in the tidy table; valid --mask: causal"),
        (
            ["--mask", "causal", "--seqlen", "5000"],
            "--seqlen 5000: not in the tidy table with --mask causal; valid --seqlen: 4096, 8192, 131072",
        ),
        (
            ["--direction", "up"],
            "--direction up: not in the tidy table; valid --direction: bwd, fwd, train",
        ),
        (["--grid", "nope"], "--grid nope: no such grid; valid --grid: g, gcp"),
        (["--seqlen", "4096", "--gpus", "2"], "valid --gpus: 1"),
        (
            ["--block-size", "64"],
            "--block-size 64: not in the tidy table; valid --block-size: none",
        ),
    ],
)
def test_bad_arguments_name_the_bad_value_and_the_valid_choices(cells_csv, capsys, args, named):
    with pytest.raises(SystemExit) as e:
        advise(cells_csv, *args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert named in err, err


@pytest.mark.parametrize(
    "content, said",
    [
        (b"", "not a readable tidy table"),
        (b"grid,family,impl,status\n", "has no cells (a header only)"),
        (bytes(range(256)) * 8, "not a readable tidy table"),
        (b"a,b\n1,2\n", "not a tidy table (no column grid, impl, status)"),
    ],
)
def test_an_empty_or_unreadable_table_is_one_line_and_exit_2(tmp_path, capsys, content, said):
    path = tmp_path / "cells.csv"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as e:
        advise(path, "--mask", "causal")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_the_command_exits_2_without_a_traceback(cells_csv, repo):
    p = subprocess.run(
        [sys.executable, "-m", "attnbench", "advise", "--cells", str(cells_csv), "--mask", "nope"],
        capture_output=True,
        text=True,
        env=package_env(),
        cwd=repo,
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and "valid --mask: causal" in p.stderr


def test_times_are_written_without_exponents():
    a = only(kernel_answers([cell("fa2", 12215.4, 10.0), cell("fa3", 0.08006, 0.001)]))
    t = advice_text.sections([a])[0][1].iloc[0]
    assert t["fastest, ms"] == "fa3 0.08006"
    assert t["runner-up (x fastest, draws won)"] == "fa2 152578x, 0/1 won"


def test_gpus_no_grid_measured_are_answered_by_the_cp_model_labelled_with_its_error(repo, capsys):
    """--gpus 8 over the committed H200 tables (2 GPUs measured): the CP model's answer, in a block
    of its own, with its validated error; a question it cannot answer names what it needs."""
    cells = repo / "results" / "h200" / "tables" / "cells.csv"
    args = ["--gpus", "2", "8", "--mask", "causal", "--seqlen", "128K", "--direction", "fwd"]
    advise(cells, *args, "--configfile", str(repo / "config.yaml"))
    out = capsys.readouterr().out
    measured, modelled = out.split("[modelled: the CP model's prediction")
    assert measured.startswith("h200_cp (cp), causal, S=128K (131072), 65536 tokens/GPU x 2 GPUs")
    assert "causal, 8 GPUs x 16384 tokens (S=131072)" in modelled
    assert "fastest predicted:" in modelled and "error: validated on" in modelled
    assert "published full/causal points" in modelled
    # the defaults the question did not name, with where they come from; none where it named both
    flat = " ".join(modelled.split())
    # the local kernel the question did not name: the fastest by the records (cp_model/answer.py)
    chosen = re.search(
        r"defaults: local kernel (\w+) \(auto: by their records, the fastest of \d+ local "
        r"kernels on causal fwd over 16384 tokens, the one-GPU baseline's \(then (\w+) ([\d.]+)x",
        flat,
    )
    assert chosen and chosen[1] != chosen[2] and float(chosen[3]) >= 1, flat
    assert "network h100_8x (cp_model.network in the config: a typical 8 x H100 SXM node)" in flat
    named = ["--local-kernel", "sdpa_flash", "--network", "h200_host"]
    advise(cells, *args[:1], "8", *args[3:], *named, "--configfile", str(repo / "config.yaml"))
    out = " ".join(capsys.readouterr().out.split())
    assert "network h200_host" in out and "defaults:" not in out
    with pytest.raises(SystemExit) as e:
        advise(cells, "--gpus", "8", "--configfile", str(repo / "config.yaml"))
    assert e.value.code == 2
    assert "--gpus 8: no grid measured 8 GPUs; the CP model answers it given --mask" in (
        capsys.readouterr().err
    )


def test_an_answer_whose_contenders_ran_on_different_machines_says_so():
    """Compare like with like: two kernels of one point measured on two GPUs (another card, or
    the same model on another machine) are still compared, and the answer names the machines."""
    same = [cell("fa2", 10.0, gpu_uuid="GPU-aaaa"), cell("fa3", 12.0, gpu_uuid="GPU-aaaa")]
    (a,) = kernel_answers(same)
    assert not any("different machines" in n for n in advice_text.notes(a))
    mixed = [cell("fa2", 10.0, gpu_uuid="GPU-aaaa"), cell("fa3", 12.0, gpu_uuid="GPU-bbbb")]
    (a,) = kernel_answers(mixed)
    (note,) = [n for n in advice_text.notes(a) if "different machines" in n]
    assert "fa2 on Test GPU 80GB" in note and "GPU-aaaa" in note and "GPU-bbbb" in note
