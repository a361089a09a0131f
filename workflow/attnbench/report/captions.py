"""Report captions (reStructuredText) for every figure and table, written beside it as
`<stem>.caption.rst`: what is plotted (given by the drawing code), and the machine, data,
software and code it comes from, read from the tidy table (never typed in).

Snakemake's report renders a caption through Jinja, then docutils; the text sits in a raw block
so braces in names cannot break it. Any family gets captions: a figure or table without a
description gets a generic one naming it and its grid.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ..record.status import CRASHED, UNAVAILABLE, UNSUPPORTED
from .collect import emulated
from .labels import STATUS_MEANING, heads_label, order, seqlen_label
from .outputs import CAPTION_SUFFIX


def caption_path(out: Path, stem: str) -> Path:
    return Path(out) / f"{stem}{CAPTION_SUFFIX}"


def rst_text(s: str) -> str:
    """Plain text safe in reStructuredText (names like `causal_document` or `a|b` stay literal)."""
    return re.sub(r"([\\*`|_])", r"\\\1", str(s))


def _values(df: pd.DataFrame, col: str) -> list[str]:
    """The distinct values of a column; a multi-line value (nvidia-smi's driver: one line per GPU)
    counts each of its lines."""
    if col not in df:
        return []
    lines = {line.strip() for v in df[col].dropna() for line in str(v).splitlines()}
    return sorted(v for v in lines if v not in ("", "nan", "None"))


def _join(vals, empty="not recorded") -> str:
    return ", ".join(vals) if vals else empty


def machine(df: pd.DataFrame) -> str:
    devs = _values(df, "device_name") or _values(df, "device")
    kind = "CPU" if set(_values(df, "device")) == {"cpu"} else "GPU"
    # an emulated CP cell (cp.emulate) ran its `gpus` ranks on one device
    gpus = df["gpus"].where(~emulated(df), 1) if "gpus" in df else pd.Series(dtype=float)
    gpus = sorted({int(g) for g in gpus.dropna()})
    text = f"{kind}: {_join(devs)}"
    if kind == "GPU" and gpus and gpus != [1]:
        text += f" ({', '.join(map(str, gpus))} GPUs)"
    extra = [
        f"{label} {_join(_values(df, col))}"
        for col, label in (("cuda", "CUDA"), ("cudnn", "cuDNN"), ("driver", "driver"))
        if _values(df, col)
    ]
    if extra:
        text += "; " + ", ".join(extra)
    hosts = _values(df, "host")
    if hosts:
        text += (
            f"; host{'s' * (len(hosts) > 1)} {_join(hosts[:4])}{' ...' if len(hosts) > 4 else ''}"
        )
    return text


def data(df: pd.DataFrame) -> str:
    counts = df["status"].value_counts()
    status = ", ".join(f"{counts[s]} {s}" for s in STATUS_MEANING if s in counts)
    heads = (
        [heads_label(a, b) for a, b in dict.fromkeys(zip(df["heads_q"], df["heads_kv"]))]
        if len(df)
        else []
    )
    lengths = sorted({int(s) for s in df["seqlen"].dropna()})
    parts = [
        f"{len(df)} cells ({status})",
        f"dtype {_join(_values(df, 'dtype'))}",
        f"head dim {_join(sorted({str(int(x)) for x in df['head_dim'].dropna()}))}",
        f"heads {_join(heads)}",
    ]
    if lengths:
        parts.append(f"S {seqlen_label(lengths[0])}..{seqlen_label(lengths[-1])}")
    parts.append(f"directions {_join(list(dict.fromkeys(df['direction'].dropna())))}")
    if "reps" in df and df["reps"].notna().any():
        parts.append(
            f"{_join(sorted({str(int(x)) for x in df['warmup'].dropna()}))} warm-up + "
            f"{_join(sorted({str(int(x)) for x in df['reps'].dropna()}))} timed repetitions per sampled mask"
        )
    return "; ".join(parts)


def _versions(df: pd.DataFrame, col: str) -> str:
    """One value, or each value with how many cells recorded it (a mixed environment shows)."""
    if col not in df:
        return "not recorded"
    counts = df[col].dropna().astype(str).value_counts()
    if len(counts) <= 1:
        return _join(list(counts.index))
    return ", ".join(f"{v} ({n} cells)" for v, n in counts.items())


NOT_LOADED = (UNSUPPORTED, UNAVAILABLE)


def software(df: pd.DataFrame) -> str:
    versions = [f"torch {_versions(df, 'torch')}"]
    versions += [
        f"{label} {_versions(df, col)}"
        for col, label in (("triton", "triton"), ("python", "Python"))
        if _values(df, col)
    ]
    # a kernel's library as recorded by the cells that ran it (an unsupported or unavailable cell
    # never loaded it: it names only the first installed candidate); kernels that never ran: all
    # their cells. Kernels with the same versions share an entry.
    ran = df[~df["status"].isin(NOT_LOADED)] if "status" in df else df
    groups: dict = {}
    for impl in order(df["impl"].dropna()):
        cells = ran[ran["impl"] == impl]
        cells = cells if len(cells) else df[df["impl"] == impl]
        groups.setdefault(_versions(cells, "library_version"), []).append(impl)
    libs = "; ".join(f"{', '.join(impls)}: {v}" for v, impls in groups.items())
    return ", ".join(versions) + (
        f"; kernel libraries as recorded by the cells that ran: {libs}" if libs else ""
    )


def code_hashes(df: pd.DataFrame) -> str:
    """The code trees the cells ran (sha256 of the code files, first 12 hex digits), each with its
    cell count where they differ; cells from before the hash was recorded are counted apart."""
    hashes = df["code_sha256"] if "code_sha256" in df else pd.Series(index=df.index, dtype=object)
    known = hashes.dropna().astype(str).str[:12]
    counts = known.value_counts()
    parts = (
        list(counts.index) if len(counts) == 1 else [f"{h} ({n} cells)" for h, n in counts.items()]
    )
    if len(known) < len(df):
        parts.append(f"not recorded ({len(df) - len(known)} cells)" if parts else "not recorded")
    return ", ".join(parts)


def code(df: pd.DataFrame) -> str:
    commits = _values(df, "git_commit")
    text = "attnbench commit " + _join([c[:10] for c in commits], "unknown")
    if "git_dirty" in df and df["git_dirty"].astype(str).str.lower().eq("true").any():
        text += " (uncommitted changes present)"
    text += f"; code sha256 {code_hashes(df)}"
    starts, ends = _values(df, "started_at"), _values(df, "finished_at")
    if starts and ends:
        text += f"; measured {starts[0][:16].replace('T', ' ')} to {ends[-1][:16].replace('T', ' ')} (UTC)"
    return text


def table_path(source: str | Path | None) -> str:
    """The tidy table's path as a reader finds it: relative to the working directory (the
    repository root, where Snakemake and `make figures` run) when under it."""
    if source is None:
        return "cells.csv"
    path = Path(source)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# Cells named one by one in a caption's lists (the rest are counted).
LISTED = 8


def _cell_name(record_path: str) -> str:
    """A record's path below cells/ (grid/family/impl/mask/point), as captions name a cell."""
    parts = Path(str(record_path)).parts
    return "/".join(parts[parts.index("cells") + 1 :]) if "cells" in parts else str(record_path)


def unfinished(df: pd.DataFrame, missing=()) -> str:
    """The grid's cells that were not measured to the end: crashed (their process ended without
    a record; the next run retries them) and missing (no record: their job did not finish)."""
    parts = []
    crashed = df[df["status"] == CRASHED] if "status" in df else df.iloc[:0]
    if len(crashed):
        names = [_cell_name(p) for p in crashed.get("record", pd.Series(dtype=str))[:LISTED]]
        more = f" and {len(crashed) - LISTED} more" if len(crashed) > LISTED else ""
        parts.append(f"{len(crashed)} crashed, not drawn: {', '.join(names)}{more}")
    if missing:
        names = [_cell_name(p) for p in list(missing)[:LISTED]]
        more = f" and {len(missing) - LISTED} more" if len(missing) > LISTED else ""
        parts.append(f"{len(missing)} without a record, not drawn: {', '.join(names)}{more}")
    return "; ".join(parts)


def outdated(df: pd.DataFrame) -> str:
    """How many records a run would not make as they are (attnbench.currency), and why."""
    if "outdated" not in df:
        return ""
    why = df["outdated"].dropna().astype(str)
    why = why[why.str.strip() != ""]
    if not len(why):
        return ""
    kinds = why.str.split(":").str[0].value_counts()
    return (
        f"{len(why)} of {len(df)} records are outdated relative to the current config, code or "
        f"libraries ({', '.join(f'{n} {k}' for k, n in kinds.items())}); e.g. "
        f"{_cell_name(df.loc[why.index[0], 'record']) if 'record' in df else ''}: {why.iloc[0]}"
    )


def caption_text(
    what: str,
    df: pd.DataFrame,
    grid: str | None = None,
    grid_cfg: dict | None = None,
    extra_rst: str = "",
    source: str | Path | None = None,
    missing=(),
) -> str:
    desc = (grid_cfg or {}).get("description")
    fields = [
        ("Machine", machine(df)),
        (
            "Grid data",
            (f"grid {grid}" + (f" ({desc})" if desc else "") + "; " if grid else "") + data(df),
        ),
        ("Not measured to the end", unfinished(df, missing)),
        ("Outdated", outdated(df)),
        ("Software", software(df)),
        ("Code", code(df)),
        ("Source", f"the tidy table {table_path(source)}; each row names its cell record"),
    ]
    fields = [(k, v) for k, v in fields if v]
    body = rst_text(what) + "\n\n" + "\n".join(f":{k}: {rst_text(v)}" for k, v in fields) + "\n"
    if extra_rst:
        body += "\n" + extra_rst.strip("\n") + "\n"
    return "{% raw %}\n" + body + "{% endraw %}\n"


def write_captions(
    out: Path,
    stems,
    whats: dict,
    df: pd.DataFrame,
    kind: str,
    grid: str | None = None,
    grid_cfg: dict | None = None,
    extras: dict | None = None,
    source: str | Path | None = None,
    missing=(),
) -> list[Path]:
    """One caption file per stem; stems without a description get a generic one. `source`: the
    tidy table the rows came from; `missing`: the record paths of the grid's cells without one."""
    paths = []
    for stem in stems:
        what = whats.get(stem) or f"{kind.capitalize()} {stem} of grid {grid or '(all grids)'}."
        p = caption_path(out, stem)
        extra = (extras or {}).get(stem, "")
        p.write_text(caption_text(what, df, grid, grid_cfg, extra, source, missing))
        paths.append(p)
    return paths
