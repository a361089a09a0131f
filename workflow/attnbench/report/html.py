"""A table's Markdown file as a page of its own (`<stem>.html`), for `snakemake --report`: the report
shows an HTML file inline (in a frame) but a Markdown file only as a link to download.

Reads the Markdown the tables are written in (report.tables.write_table and the advice): a first
line or paragraph of caption, `#`-headings, and pipe tables with an alignment row (pandas'
to_markdown); any other line is kept as a paragraph. Inline `code` is the only markup read.
"""

from __future__ import annotations

import html
import re

STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; color: #222; margin: 12px; }
p.caption { color: #444; max-width: 110em; }
h1, h2, h3 { font-size: 14px; margin: 18px 0 6px; }
table { border-collapse: collapse; margin-bottom: 12px; }
th, td { border: 1px solid #d4d4d4; padding: 2px 6px; white-space: nowrap; }
th { background: #eef1f5; position: sticky; top: 0; }
tbody tr:nth-child(even) { background: #f7f8fa; }
td.r, th.r { text-align: right; font-variant-numeric: tabular-nums; }
td.c, th.c { text-align: center; }
code { font-size: 12px; background: #f0f0f0; padding: 0 2px; }
"""

_ALIGN = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def _inline(text: str) -> str:
    """Escaped text with `code` spans."""
    parts = re.split(r"`([^`]*)`", text)
    return "".join(
        f"<code>{html.escape(p, quote=False)}</code>" if i % 2 else html.escape(p, quote=False)
        for i, p in enumerate(parts)
    )


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _alignments(line: str) -> list[str]:
    """'l', 'r' or 'c' per column of a Markdown alignment row."""
    out = []
    for c in _cells(line):
        left, right = c.startswith(":"), c.endswith(":")
        out.append("c" if left and right else "r" if right else "l")
    return out


def _table(rows: list[str]) -> str:
    """A pipe table (its header, alignment row and body lines) as an HTML table."""
    head, align, body = _cells(rows[0]), _alignments(rows[1]), [_cells(r) for r in rows[2:]]

    def cell(tag, text, i):
        cls = align[i] if i < len(align) else "l"
        attr = "" if cls == "l" else f' class="{cls}"'
        return f"<{tag}{attr}>{_inline(text)}</{tag}>"

    out = ["<table>", "<thead><tr>"]
    out += [cell("th", h, i) for i, h in enumerate(head)]
    out += ["</tr></thead>", "<tbody>"]
    for r in body:
        out.append("<tr>" + "".join(cell("td", c, i) for i, c in enumerate(r)) + "</tr>")
    out += ["</tbody>", "</table>"]
    return "\n".join(out)


def markdown_page(text: str, title: str) -> str:
    """A whole HTML document of a table file's Markdown."""
    lines = text.splitlines()
    out, para, first = [], [], True
    i = 0

    def flush():
        nonlocal para, first
        if para:
            cls = ' class="caption"' if first else ""
            out.append(f"<p{cls}>{_inline(' '.join(para))}</p>")
            para, first = [], False

    while i < len(lines):
        line = lines[i]
        if line.startswith("|") and i + 1 < len(lines) and _ALIGN.match(lines[i + 1]):
            flush()
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            first = False
            i = j
            continue
        heading = re.match(r"^(#{1,6})\s+(.*)$", line)
        if heading:
            flush()
            level = min(3, len(heading.group(1)))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            first = False
        elif line.strip():
            para.append(line.strip())
        else:
            flush()
        i += 1
    flush()
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(out)
        + "\n</body></html>\n"
    )
