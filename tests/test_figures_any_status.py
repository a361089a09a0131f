"""Every figure a grid promises is drawn whatever its cells' statuses (issue 56, item 6): small
synthetic tables of each family (kernel, sparse, cp), statuses drawn at random (seeded) and the
extreme mixes; the figures step writes every promised file, needs no placeholder and raises
nothing. A figure that raises anyway becomes a placeholder beside the others."""

import itertools
import random
from functools import partial

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from attnbench import families
from attnbench.families.kernel import figures as kernel_figures
from attnbench.record.status import STATUSES, WITH_TIMINGS
from attnbench.report import plotting
from attnbench.report.collect import COLUMNS
from synthetic_cells import ENV, kernel_grid_config, tidy

STYLE = {"formats": ["png"], "dpi": 20, "bar_seqlen": 4096}
RANDOM = 5  # random status assignments per family, besides the extreme ones
PLACEHOLDER = "not drawn, a placeholder in its place"


def with_timings(df: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    """Timings only where the status carries them (tidy keeps none for `implausible`)."""
    for c in ("tflops", "tflops_p20", "tflops_p80", "time_ms_median"):
        df[c] = [r[c] if r["status"] in WITH_TIMINGS else None for r in rows]
    return df


def numbers(tflops: float, time: float) -> dict:
    return dict(
        tflops=tflops,
        tflops_p20=tflops * 0.99,
        tflops_p80=tflops * 1.01,
        time_ms_median=time,
        time_ms_p20=time * 0.99,
        time_ms_p80=time * 1.01,
    )


# ---------------------------------------------------------------- kernel: 3 kernels, 2 masks, 2 lengths


def kernel_points(directions=("fwd",)):
    """(impl, mask, seqlen, direction)."""
    return list(
        itertools.product(("naive", "flex", "fa2"), ("full", "causal"), (1024, 4096), directions)
    )


def kernel_table(statuses, directions=("fwd",)) -> pd.DataFrame:
    rows = []
    for (impl, mask, s, d), st in zip(kernel_points(directions), statuses):
        tflops = 10.0 + len(impl) + s / 1024
        time = 4 * 16 * 64 * s * s / (tflops * 1e12) * 1e3
        cell = dict(impl=impl, mask=mask, seqlen=s, direction=d, heads_q=16, heads_kv=4)
        rows.append(
            {
                **cell,
                "status": st,
                **numbers(tflops, time),
                "peak_mem_bytes": float(s * (len(impl) + 1) * 2**16),
                "cell_id": f"{impl}-{mask}-{s}-{d}",
            }
        )
    return with_timings(tidy(rows, grid="g"), rows)


def kernel_grid(directions=("fwd",)) -> dict:
    return {
        **kernel_grid_config((1024, 4096)),
        "kernels": ["naive", "flex", "fa2"],
        "masks": ["full", "causal"],
        "heads": [[16, 4]],
        "direction": list(directions),
    }


# ---------------------------------------------------------------- sparse: 2 kernels, 2 block settings


def sparse_points():
    """(impl, mask, block_size, avg_block, density, seqlen, direction): block-sparse cells, and a
    dense reference on the full mask at the area of density 0.5."""
    sparse = itertools.product(
        ("flex", "triton_block_sparse"),
        [("block_sparse", 64, None), ("variable_block_sparse", None, 256)],
        (0.2, 0.5),
        (4096, 8192),
        ("fwd",),
    )
    pts = [(i, m, b, a, rho, s, d) for i, (m, b, a), rho, s, d in sparse]
    return pts + [("sdpa_flash", "full", None, None, None, s, "fwd") for s in (2896, 5793)]


def sparse_table(statuses) -> pd.DataFrame:
    rows = []
    for (impl, mask, b, a, rho, s, d), st in zip(sparse_points(), statuses):
        tflops = 50.0 + s / 1024 * (rho or 1.0)
        cell = dict(impl=impl, mask=mask, seqlen=s, direction=d, heads_q=16, heads_kv=4)
        blocks = dict(block_size=b, avg_block=a, density=rho, realised_density=rho)
        rows.append(
            {
                **cell,
                **blocks,
                "status": st,
                **numbers(tflops, 1.0),
                "peak_mem_bytes": 2.0**20 * s / 1024,
                "mask_area_mean": (rho or 1.0) * s * s,
                "cell_id": f"{impl}-{mask}-{b}-{a}-{rho}-{s}-{d}",
            }
        )
    return with_timings(tidy(rows, grid="g", family="sparse"), rows)


SPARSE_GRID = {"family": "sparse", "direction": ["fwd"]}


# ---------------------------------------------------------------- cp: the bare kernel, 2 methods


def cp_points():
    """(impl, gpus, tokens per GPU): the bare kernel on one GPU over each whole sequence, and two
    methods at 1 and 2 GPUs."""
    local = [("local", 1, t) for t in (2048, 4096)]
    return local + list(itertools.product(("ring_p2p", "ulysses"), (1, 2), (2048,)))


def cp_table(statuses) -> pd.DataFrame:
    rows = []
    for (impl, gpus, tpg), st in zip(cp_points(), statuses):
        s = tpg * gpus
        tflops = 100.0 + 10 * gpus
        time = 4 * 16 * 64 * s * s / (tflops * 1e12 * gpus) * 1e3
        timed = st in WITH_TIMINGS
        rows.append(
            {
                **ENV,
                "grid": "g",
                "family": "cp",
                "impl": impl,
                "mask": "causal_document",
                "direction": "fwd",
                "tokens_per_gpu": tpg,
                "gpus": gpus,
                "seqlen": s,
                "heads_q": 16,
                "heads_kv": 4,
                "status": st,
                "cell_id": f"{impl}-{gpus}-{tpg}",
                "local_kernel": "fa2",
                **(numbers(tflops, time) if timed else {}),
                "compute_only_ms": time * 0.7 if timed else None,
                "comm_only_ms": time * 0.4 if timed else None,
                "peak_mem_bytes": 2.0**30,
                "ulysses_degree": gpus if impl == "ulysses" else 1,
                "ring_degree": 1 if impl == "ulysses" else gpus,
            }
        )
    df = pd.DataFrame(rows)
    return df.reindex(columns=list(dict.fromkeys([*COLUMNS, *df.columns])))


CP_GRID = {"family": "cp"}

# One direction keeps the test short; the training step's figure (fwd + bwd) is drawn once, below.
TRAIN = ("fwd", "bwd")
FAMILIES = {
    "kernel": (kernel_points, kernel_table, kernel_grid()),
    "sparse": (sparse_points, sparse_table, SPARSE_GRID),
    "cp": (cp_points, cp_table, CP_GRID),
    "kernel+train": (
        partial(kernel_points, TRAIN),
        partial(kernel_table, directions=TRAIN),
        kernel_grid(TRAIN),
    ),
}
EVERY_STATUS = ("kernel", "sparse", "cp")


def cases(name: str) -> list[tuple[str, list[str]]]:
    """(id, a status per point): every cell of one status, a single ok cell among oom ones, every
    cell of one mask (cp: GPU count) oom or timeout, then RANDOM seeded draws, each from a random
    subset of the statuses (so some draws are mostly one status)."""
    points = FAMILIES[name][0]()
    n = len(points)
    out = [(f"all-{st}", [st] * n) for st in STATUSES]
    out.append(("single-ok", ["ok" if i == n // 2 else "oom" for i in range(n)]))
    first = points[0][1]
    one = [("oom", "timeout")[i % 2] if p[1] == first else "ok" for i, p in enumerate(points)]
    out.append((f"whole-{first}-oom+timeout", one))
    rng = random.Random(56)
    for k in range(RANDOM):
        some = rng.sample(STATUSES, rng.randint(1, 4))
        out.append((f"random-{k}", [rng.choice(some) for _ in points]))
    return out


def drawn_only(fig, out, stem, style):
    """plotting.save without its image files' cost: the figure drawn and measured as save does
    (what raises there raises here), then a stub file per format."""
    fig.canvas.draw()
    fig.get_tightbbox(fig.canvas.get_renderer())
    plt.close(fig)
    paths = [out / f"{stem}.{fmt}" for fmt in style["formats"]]
    for p in paths:
        p.write_text("drawn")
    return paths


def draw_grid(name, statuses, tmp_path):
    """The grid's figures from a table of these statuses: (paths written, the names promised)."""
    _, table, grid_cfg = FAMILIES[name]
    csv = tmp_path / "cells.csv"
    table(statuses).to_csv(csv, index=False)
    out = tmp_path / "figures"
    plt.close("all")
    paths = families.write_figures(csv, out, STYLE, grid="g", grid_cfg=grid_cfg)
    assert not plt.get_fignums()  # every figure closed, drawn or not
    promised = families.figure_names(grid_cfg, STYLE["formats"])
    assert set(promised) <= {p.name for p in paths}
    assert all((out / n).stat().st_size > 0 for n in promised)
    return paths, promised


@pytest.mark.parametrize(
    "name,statuses", [pytest.param(f, s, id=f"{f}-{i}") for f in EVERY_STATUS for i, s in cases(f)]
)
def test_every_promised_figure_is_drawn_whatever_the_statuses(
    name, statuses, tmp_path, monkeypatch, capfd
):
    monkeypatch.setattr(plotting, "save", drawn_only)
    draw_grid(name, statuses, tmp_path)
    assert PLACEHOLDER not in capfd.readouterr().err  # drawn, not replaced


@pytest.mark.parametrize("name", ["kernel+train", "sparse", "cp"])
def test_the_image_files_are_written_when_a_whole_mask_ran_out_of_memory_or_time(
    name, tmp_path, capfd
):
    """The issue's case, with the real files: every kernel of one mask ended oom or timeout."""
    statuses = dict(cases(name))[f"whole-{FAMILIES[name][0]()[0][1]}-oom+timeout"]
    paths, promised = draw_grid(name, statuses, tmp_path)
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths if p.suffix == ".png")
    assert PLACEHOLDER not in capfd.readouterr().err


def test_a_panel_without_a_number_says_why():
    df = kernel_table(["oom" if p[1] == "full" else "timeout" for p in kernel_points()])
    sub = df[df["direction"] == "fwd"].assign(mem_gib=df["peak_mem_bytes"] / 2**30)
    fig, _ = kernel_figures.memory_lines(sub, "mem_gib", "GiB", "t")
    notes = {ax.get_title(): t.get_text() for ax in fig.axes for t in ax.texts}
    assert notes == {"full": "no timed cell: all oom", "causal": "no timed cell: all timeout"}
    fig.canvas.draw()  # the empty log axis draws
    plt.close(fig)


def test_a_figure_that_raises_becomes_a_placeholder_and_the_others_are_drawn(
    tmp_path, monkeypatch, capfd
):
    def broken(*args, **kwargs):
        raise RuntimeError("the drawing broke")

    monkeypatch.setattr(kernel_figures, "memory_lines", broken)
    monkeypatch.setattr(plotting, "save", drawn_only)
    paths, promised = draw_grid("kernel", ["ok"] * len(kernel_points()), tmp_path)
    err = capfd.readouterr().err
    assert f"figure memory_vs_seqlen_fwd {PLACEHOLDER}: RuntimeError: the drawing broke" in err
    assert err.count(PLACEHOLDER) == 1
    assert (tmp_path / "figures" / "memory_vs_seqlen_fwd.caption.rst").exists()
