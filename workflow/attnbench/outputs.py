"""The tables and figures each grid produces, known before anything runs (Snakemake needs
the file names at DAG time; the writers produce exactly these)."""

from __future__ import annotations


def grid_directions(grid: dict) -> list[str]:
    dirs = list(grid.get("direction", []))
    for extra in grid.get("also", []):
        dirs += extra.get("direction", [])
    return list(dict.fromkeys(dirs))


def table_names(grid: dict) -> list[str]:
    if grid["family"] == "cp":
        return ["cp_tflops.md", "cp_tflops.tex", "cp_breakdown.md", "cp_breakdown.tex"]
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
    return [f"{kind}_{d}" for d in dirs for kind in ("tflops_vs_seqlen", "memory_vs_seqlen", "heatmap")]


def figure_names(grid: dict, formats) -> list[str]:
    return [f"{stem}.{fmt}" for stem in figure_stems(grid) for fmt in formats]
