"""The paper-comparison table of family sparse: the paper's H100 numbers (paper_h100.csv) beside a
grid's own, on SYNTHETIC rows (synthetic_cells.tidy), never results."""

import pandas as pd
from attnbench.families.sparse import paper
from synthetic_cells import tidy


def row(impl, heads_kv, status="ok", tflops=None, **over):
    r = dict(
        impl=impl,
        mask="block_sparse",
        seqlen=16384,
        heads_q=64,
        heads_kv=heads_kv,
        direction="fwd",
        block_size=128,
        density=0.2,
        status=status,
        tflops=tflops,
        tflops_p20=None if tflops is None else tflops - 1,
        tflops_p80=None if tflops is None else tflops + 1,
    )
    return {**r, **over}


def test_the_data_file_holds_the_two_quoted_cells():
    p = paper.paper_numbers().set_index(["impl", "heads"])
    assert p.loc[("flashinfer", "64:64"), "tflops"] == 414.93
    assert p.loc[("fa2_sparse", "64:8"), "tflops"] == 312.54
    assert (p["direction"] == "fwd").all() and set(p["seqlen"]) == {16384}
    assert p["source"].str.len().gt(0).all()  # every number says where it was read


def test_measured_cells_stand_beside_the_papers_and_the_rest_is_empty():
    quoted = paper.paper_numbers()
    columns = ("direction", "seqlen", "block_size", "density", "heads", "impl", "tflops", "source")
    extra = pd.DataFrame(
        [dict(zip(columns, ("bwd", 32768, 64, 0.5, "64:64", "vsa", 250.0, "test")))]
    )
    df = tidy(
        [
            row("flashinfer", 64, tflops=420.5),  # the quoted MHA cell, measured
            row("flashinfer", 8, tflops=999.0),  # GQA: not what the paper quotes
            row("fa2_sparse", 8, status="unavailable"),
            row("fa2_sparse", 8, tflops=777.0, density=0.5),  # another density
        ],
        grid="g",
        family="sparse",
    )
    t = paper.comparison(df, pd.concat([quoted, extra], ignore_index=True))
    fwd = t.loc[("fwd", 16384, 128, "0.2")]
    assert fwd["flashinfer 64:64 H100 (paper)"] == "414.93"
    assert fwd["flashinfer 64:64 H200 (here)"].startswith("420")
    assert fwd["fa2_sparse 64:8 H100 (paper)"] == "312.54"
    assert fwd["fa2_sparse 64:8 H200 (here)"] == "n/a"  # the status word of the other tables
    bwd = t.loc[("bwd", 32768, 64, "0.5")]
    assert bwd["vsa 64:64 H100 (paper)"] == "250" and bwd["vsa 64:64 H200 (here)"] == ""
    assert bwd["flashinfer 64:64 H100 (paper)"] == ""  # the paper has no such cell
    assert "999" not in t.to_string() and "777" not in t.to_string()
