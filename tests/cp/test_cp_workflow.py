"""Snakemake end to end on a tiny CP grid: records through torchrun, the tidy table, CP tables and figures."""

import pandas as pd
from bounded import run_bounded
from commands import snakemake_cmd, tool_env
from tinygrids import config_running, cp_grid, workflow_copy

TINY = cp_grid(
    methods=["ring_p2p", "torch_cp"],
    tokens_per_gpu=[24],
    heads=[[2, 1]],
    head_dim=[8],
    direction=["bwd"],
    check={"max_seqlen": 256, "tolerance_factor": 5, "samples": 1},
    runtime_min=5,
    mem_mb=2000,
    also=[
        # the bare kernel on 1 GPU over the whole 48 tokens: cp_vs_single_gpu's baseline
        {"methods": ["local"], "gpus": [1], "tokens_per_gpu": [48]},
        # an `unsupported` record: FlexAttention's CPU local kernel has no backward
        {"methods": ["ulysses"], "cp": {"local_kernel": "flex"}},
    ],
)


def test_snakemake_runs_a_cp_grid(tmp_path):
    cfg = config_running({"tinycp": TINY})
    cfg["figures"] = {"formats": ["png", "pdf"], "dpi": 60}
    workflow_copy(tmp_path, cfg)
    cmd = snakemake_cmd(tmp_path, "--cores", "2", snakefile=tmp_path / "code/Snakefile")
    p = run_bounded(cmd, 600, env=tool_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = tmp_path / "results"
    records = sorted((res / "cells/tinycp/cp").rglob("*.json"))
    assert [r.relative_to(res / "cells/tinycp/cp").as_posix() for r in records] == [
        "local/causal/s48-h2x1-d8-float32-bwd-g1.json",
        "ring_p2p/causal/s48-h2x1-d8-float32-bwd-g2.json",
        "torch_cp/causal/s48-h2x1-d8-float32-bwd-g2.json",
        "ulysses/causal/s48-h2x1-d8-float32-bwd-g2-kflex.json",
    ]
    df = pd.read_csv(res / "tables/cells.csv")
    one = df[df["gpus"] == 1]
    assert (
        list(one["impl"]) == ["local"]
        and list(one["status"]) == ["ok"]
        and one["check_passed"].all()
    )
    df = df[df["gpus"] == 2]
    assert dict(zip(df["impl"], df["status"])) == {
        "ring_p2p": "ok",
        "ulysses": "unsupported",
        "torch_cp": "unavailable",
    }
    ring = df[df["impl"] == "ring_p2p"].iloc[0]
    assert (
        ring["tflops_per_gpu"] == ring["tflops"] > 0
        and ring["ring_degree"] == 2
        and ring["bytes_match_analytic"]
    )
    for f in (
        "tables/tinycp/cp_tflops.md",
        "tables/tinycp/cp_breakdown.tex",
        "figures/tinycp/cp_tflops_vs_gpus.png",
        "figures/tinycp/cp_breakdown.pdf",
    ):
        assert (res / f).stat().st_size > 0
    md = (res / "tables/tinycp/cp_tflops.md").read_text()
    assert "unsup." in md and "n/a" in md and "dtype: float32" in md
    share = (res / "tables/tinycp/cp_vs_single_gpu.md").read_text()
    # the share: the bare kernel's time over 2 x the CP cell's, on their one draw (samples.csv)
    samples = pd.read_csv(res / "tables/samples.csv").set_index("cell_id")
    ring2 = df[df["impl"] == "ring_p2p"].iloc[0]
    t1 = samples.loc[one["cell_id"].iloc[0], "time_ms_median"]
    t2 = samples.loc[ring2["cell_id"], "time_ms_median"]
    row = next(x for x in share.splitlines() if "| ring_p2p" in x)
    assert row.rstrip(" |").endswith(f"{t1 / (2 * t2):.0%}") or "~ " in row
    assert "1 GPU, bare kernel (TFLOP/s)" in share
    assert "none (no 1-GPU cell" not in share.split("\n\n", 1)[1]  # the table, not its caption
    # a CPU grid's ranks are processes: every figure's caption says so (and so do its texts,
    # test_a_cpu_grids_figures_say_processes)
    for stem in ("cp_tflops_vs_gpus", "cp_efficiency", "cp_breakdown"):
        what = (res / f"figures/tinycp/{stem}.caption.rst").read_text().split(":Machine:")[0]
        assert "per process" in what and "GPU" not in what, (stem, what)


def test_a_cpu_grids_figures_say_processes():
    import matplotlib.pyplot as plt
    from attnbench.families.cp import figures
    from matplotlib.text import Text

    def draw():
        fig, ax = plt.subplots()
        ax.set_xlabel("GPUs (ranks)")
        ax.set_title("TFLOP/s per GPU, 65536 tokens per GPU")
        ax.text(0.5, 0.5, "2 GPUs")
        ax.plot([0], [0], label="the bare kernel on one GPU (1-GPU group)")
        ax.legend()
        return fig, {}

    texts = {}
    for device in ("cpu", "cuda"):
        fig, _ = figures._words_for(pd.DataFrame({"device": [device, device]}), draw)()
        texts[device] = " | ".join(t.get_text() for t in fig.findobj(Text) if t.get_text())
        plt.close(fig)
    cpu = texts["cpu"]
    assert "GPU" not in cpu and "processes (ranks)" in cpu and "2 processes" in cpu
    assert "TFLOP/s per process, 65536 tokens per process" in cpu and "(1-process group)" in cpu
    assert "GPU" not in texts["cpu"] and texts["cuda"] == texts["cpu"].replace(
        "processes", "GPUs"
    ).replace("process", "GPU")
