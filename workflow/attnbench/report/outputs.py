"""What the names of a grid's outputs share: a grid's axis values, the report caption beside every
table and figure (`<stem>.caption.rst`), and the figure format the report shows. Each family names
its own files (attnbench.families.<family>.table_stems / figure_stems), known before anything
runs: Snakemake needs them at DAG time, and the writers produce exactly these."""

from __future__ import annotations

CAPTION_SUFFIX = ".caption.rst"

# Every grid's tables include the advice (report.advice), whatever its family.
ADVICE_STEM = "advice"

# Every table is written in these formats (report.tables.write_table; html: its Markdown as a page,
# report.html), and the one the report shows (inline: a Markdown file would be a download link).
TABLE_FORMATS = ("md", "tex", "html")
REPORT_TABLE = ".html"

# Formats the report can show inline, best first.
REPORT_FORMATS = ("png", "svg", "pdf")


def grid_axis(grid: dict, axis: str) -> list:
    values = list(grid.get(axis, []))
    for extra in grid.get("also", []):
        values += extra.get(axis, [])
    return list(dict.fromkeys(values))


def grid_directions(grid: dict) -> list[str]:
    return grid_axis(grid, "direction")


def report_format(formats) -> str:
    """The format of each figure the report shows."""
    for fmt in REPORT_FORMATS:
        if fmt in formats:
            return fmt
    raise ValueError(
        f"no figure format the report can show among {list(formats)}; use one of {REPORT_FORMATS}"
    )
