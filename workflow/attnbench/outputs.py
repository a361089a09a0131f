"""The tables and figures each grid produces, known before anything runs (Snakemake needs
the file names at DAG time; the writers produce exactly these). Every table and figure stem
also gets a report caption, `<stem>.caption.rst`, beside it."""

from __future__ import annotations

from .labels import mask_families

CAPTION_SUFFIX = ".caption.rst"

# Formats the report can show inline, best first.
REPORT_FORMATS = ("png", "svg", "pdf")


def grid_axis(grid: dict, axis: str) -> list:
    values = list(grid.get(axis, []))
    for extra in grid.get("also", []):
        values += extra.get(axis, [])
    return list(dict.fromkeys(values))


def grid_directions(grid: dict) -> list[str]:
    return grid_axis(grid, "direction")


def table_names(grid: dict) -> list[str]:
    if grid["family"] == "cp":
        return ["cp_tflops.md", "cp_tflops.tex", "cp_vs_single_gpu.md", "cp_vs_single_gpu.tex", "cp_breakdown.md",
                "cp_breakdown.tex"]
    if grid["family"] == "sparse":
        return ["sparse_tflops.md", "sparse_tflops.tex", "sparse_memory.md", "sparse_memory.tex",
                "sparse_vs_dense.md", "sparse_vs_dense.tex"]
    return ["tflops.md", "tflops.tex", "memory.md", "memory.tex", "support.md", "support.tex"]


def figure_stems(grid: dict) -> list[str]:
    dirs = grid_directions(grid)
    if grid["family"] == "cp":
        return ["cp_tflops_vs_gpus", "cp_breakdown"]
    if grid["family"] == "sparse":
        return ["sparse_tflops_vs_seqlen", "sparse_tflops_vs_density", "sparse_memory"]
    # Figs. 3 and 7 (bars at one length) and 16-17 (memory) per direction; Figs. 8-14 per mask family
    return ([f"{kind}_{d}" for d in dirs for kind in ("tflops_bars", "memory_vs_seqlen")]
            + [f"tflops_vs_seqlen_{fam}" for fam in mask_families(grid_axis(grid, "masks"))])


def figure_names(grid: dict, formats) -> list[str]:
    return [f"{stem}.{fmt}" for stem in figure_stems(grid) for fmt in formats]


def table_stems(grid: dict) -> list[str]:
    return list(dict.fromkeys(n.rsplit(".", 1)[0] for n in table_names(grid)))


def figure_caption_names(grid: dict) -> list[str]:
    return [f"{stem}{CAPTION_SUFFIX}" for stem in figure_stems(grid)]


def table_caption_names(grid: dict) -> list[str]:
    return [f"{stem}{CAPTION_SUFFIX}" for stem in table_stems(grid)]


def report_format(formats) -> str:
    """The format of each figure the report shows."""
    for fmt in REPORT_FORMATS:
        if fmt in formats:
            return fmt
    raise ValueError(f"no figure format the report can show among {list(formats)}; use one of {REPORT_FORMATS}")
