"""Cell records -> the tidy tables: one row per cell (results/tables/cells.csv) and one row per cell
and sample (results/tables/samples.csv, beside it: what a comparison draw by draw reads)."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..grid.expand import output_root, stable_hash
from ..harness.ceiling import Ceiling, Ceilings
from ..record.schema import MEMORY, TIMINGS
from ..record.validate import RecordError, read_all  # noqa: F401  (RecordError: what collect raises)
from ..status import IMPLAUSIBLE, OK, implausible_reason

# What identifies a cell: the first columns, and the table's sort order.
CELL_KEYS = (
    "grid",
    "family",
    "impl",
    "mask",
    "seqlen",
    "heads_q",
    "heads_kv",
    "head_dim",
    "dtype",
    "direction",
    "gpus",
)
# Fields copied from the record as they are (the peak matmul throughput stands between the two):
# its timings and memory, the record's own numbers (record.schema), and its check.
MEMORY_AND_CHECK = (*MEMORY, "mem_source", "max_rel_err", "check_passed")
# How a GPU cell was measured (docs/measurement.md): a caller's time over the device's, whether a
# timed window was throttled or had repetitions that may have waited for the host, whether its
# job's control calls drifted, side by side or alone, and on which GPU (its UUID) at what median
# SM clock.
MEASURING = (
    "host_overhead_ms",
    "throttled",
    "host_waited",
    "control_drift",
    "side_by_side",
    "gpu_uuid",
    "sm_clock_mhz",
)
# Provenance: the machine and software a record was made on, when, and the hashes of the code
# tree and the cell config that made it.
MACHINE = ("host", "python", "triton", "cuda", "cudnn", "driver")
WHEN_AND_WHAT = ("started_at", "finished_at", "code_sha256", "config_sha256")
# The columns every row has, in this order; more (method-specific) follow.
COLUMNS = [
    *CELL_KEYS,
    "device",
    "device_name",
    "status",
    "status_reason",
    *TIMINGS,
    "matmul_peak_tflops",
    # the ceiling the status was judged against: the record's own, or a higher one measured later
    # on the same machine (attnbench.harness.ceiling), and which
    "ceiling_tflops",
    "ceiling_from",
    *MEMORY_AND_CHECK,
    "samples",
    "mask_area_mean",
    *MEASURING,
    "block_size",
    "avg_block",
    "density",
    "realised_density",
    "library_version",
    "torch",
    "git_commit",
    "cell_id",
    "record",
    # provenance for report captions (docs/measurement.md: what a record carries)
    "warmup",
    "reps",
    *MACHINE,
    "git_dirty",
    *WHEN_AND_WHAT,
]


def _num(x):
    """Records store non-finite floats as strings; bring them back as floats."""
    if isinstance(x, str) and x in ("nan", "inf", "-inf"):
        return float(x)
    return x


def measuring(record: dict) -> dict:
    """The MEASURING columns of a record (None where it predates them, or ran on a CPU)."""
    start = (record.get("machine") or {}).get("start") or {}
    drift = (record.get("control") or {}).get("drift")
    clocks = [
        s["gpu_window"]["sm_clock_mhz"]["median"]
        for s in record.get("samples", [])
        if s.get("gpu_window")
    ]
    return {
        "host_overhead_ms": record.get("host_overhead_ms"),
        "throttled": record.get("throttled"),
        "host_waited": record.get("host_waited"),
        "control_drift": drift["worst"] if drift else None,
        "side_by_side": record["cell"]["impl"]
        in (record.get("side_by_side") or {}).get("measured", ()),
        "gpu_uuid": start.get("uuid"),
        "sm_clock_mhz": float(np.median(clocks)) if clocks else None,
    }


def library_ran(kernel: dict) -> str | None:
    """The library that ran the cell. A kernel that picks one of several packages when it loads
    (vsa: the vsa wheel, else fastvideo-kernel) names it in notes.library, 'name version (why not
    the first)'; the record's library_version is the first of the catalog's packages installed."""
    ran = (kernel.get("notes") or {}).get("library")
    return ran.split(" (")[0] if ran else kernel.get("library_version")


def row(record: dict, path: str, ceilings: Ceilings | None = None) -> dict:
    cell, env = record["cell"], record.get("environment", {})
    samples = record.get("samples", [])
    mp = cell.get("mask_params", {})
    dens = [
        s["mask_params"].get("realised_density")
        for s in samples
        if "realised_density" in s.get("mask_params", {})
    ]
    r = {
        **{k: cell.get(k) for k in (*CELL_KEYS, "device")},
        "device_name": env.get("device_name"),
        "status": record["status"],
        "status_reason": record.get("status_reason"),
        **{k: _num(record.get(k)) for k in (*TIMINGS, *MEMORY_AND_CHECK)},
        "matmul_peak_tflops": (record.get("matmul_peak") or {}).get("matmul_peak_tflops"),
        "samples": len(samples),
        "mask_area_mean": sum(s["mask_area"] for s in samples) / len(samples) if samples else None,
        **measuring(record),
        "block_size": mp.get("block_size"),
        "avg_block": mp.get("avg_block"),
        "density": mp.get("density"),
        "realised_density": sum(dens) / len(dens) if dens else None,
        "library_version": library_ran(record.get("kernel", {})),
        "torch": env.get("torch"),
        "git_commit": env.get("git_commit"),
        "cell_id": record.get("cell_id"),
        "record": path,
        "warmup": cell.get("warmup"),
        "reps": cell.get("reps"),
        **{k: env.get(k) for k in ("host", "python", "cuda", "cudnn", "driver", "git_dirty")},
        "triton": (env.get("libraries") or {}).get("triton"),
        "started_at": record.get("started_at"),
        "finished_at": record.get("finished_at"),
        "code_sha256": env.get("code_sha256"),
        "config_sha256": record.get("config_sha256"),
    }
    r.update(record.get("table_extra", {}))  # family-specific columns (e.g. context parallelism)
    j = judged(record, path, ceilings or Ceilings())
    r.update(status=j.status, status_reason=j.reason)
    r["ceiling_tflops"] = j.ceiling.tflops if j.ceiling else None
    r["ceiling_from"] = j.ceiling.source if j.ceiling else None
    return r


@dataclass(frozen=True)
class Judged:
    """A record's status in the tables, and the matmul ceiling that judged its plausibility."""

    status: str
    reason: str | None
    ceiling: Ceiling | None


def judged(record: dict, path: str, ceilings: Ceilings) -> Judged:
    """The record's status against the highest matmul ceiling known for its machine in its
    output folder (attnbench.harness.ceiling). An ok record above it is implausible (also one made before
    cells judged it); a record made implausible against a lower ceiling (one measured under load)
    that is within this one reads ok, its reason saying so. The record itself keeps what it saw."""
    status, reason = record["status"], record.get("status_reason")
    ceiling = ceilings.judging(record, output_root(path, record["cell"]))
    why = implausible_reason(_num(record.get("tflops")), ceiling.tflops) if ceiling else None
    if why and status == OK:
        status, reason = IMPLAUSIBLE, why
    # only an ok cell is ever made implausible (record.summarise): its check passed
    elif ceiling and not why and status == IMPLAUSIBLE and record.get("check_passed") is not False:
        status = OK
        reason = (
            f"recorded implausible against a lower ceiling ({reason}); within the ceiling "
            f"measured on this machine since ({ceiling.tflops:.4g} TFLOP/s, {ceiling.source})"
        )
    return Judged(status, reason, ceiling)


# The per-sample table: the cell's identity, then one sampled mask (a draw) and its timings.
SAMPLE_COLUMNS = [
    *CELL_KEYS,
    "cell_id",
    "status",
    "sample",
    "draw",
    "per_sample",
    "mask_area",
    "flops",
    "reps",
    "time_ms_median",
    "time_ms_p20",
    "time_ms_p80",
    "tflops",
    # a caller's median time over the device's on this draw; the contender's place in the draw's
    # order where the point was measured side by side (0: first)
    "host_overhead_ms",
    "order",
    # side by side: the median of each of its windows, in the order they were taken (space-separated)
    "window_medians_ms",
]
SAMPLES_CSV = "samples.csv"
# The column naming the records a run would not make as they are (pipeline/currency.py): last.
OUTDATED = "outdated"


def draw_fingerprint(mask_params: dict) -> str:
    """The id of one draw: a hash of the sample's realised mask parameters. Every kernel and method
    at a grid point draws the same masks in the same order (one data seed), so equal fingerprints
    are the same mask, and a comparison can be made draw by draw."""
    return stable_hash(mask_params, 12)


def _sample_stats(s: dict) -> tuple[float, float, float, int]:
    """(median, p20, p80, repetitions) of one sample's timed repetitions."""
    times = [float(t) for t in s.get("time_ms") or []]
    med, p20, p80 = (s.get(k) for k in ("time_ms_median", "time_ms_p20", "time_ms_p80"))
    if times and (p20 is None or p80 is None or med is None):
        med, p20, p80 = np.median(times), *np.percentile(times, [20, 80])
    return float(med), float(p20), float(p80), len(times)


def sample_rows(record: dict, path: str, ceilings: Ceilings | None = None) -> list[dict]:
    """One row per sample with timings. A timed record without per-sample data is read as one
    sample (per_sample False, no fingerprint): its cell-level median and p20-p80. The status is
    the cells table's (judged)."""
    cell = record["cell"]
    head = {k: cell.get(k) for k in CELL_KEYS}
    status = judged(record, path, ceilings or Ceilings()).status
    head.update(cell_id=record.get("cell_id"), status=status)
    gpus = int(cell.get("gpus") or 1)
    rows = []
    for s in record.get("samples", []):
        if s.get("time_ms_median") is None and not s.get("time_ms"):
            continue  # a sample that ended before its timings (out of memory, say)
        med, p20, p80, reps = _sample_stats(s)
        flops = s.get("flops")
        rows.append(
            {
                **head,
                "sample": int(s.get("index", len(rows))),
                "draw": draw_fingerprint(s.get("mask_params", {})),
                "per_sample": True,
                "mask_area": s.get("mask_area"),
                "flops": flops,
                "reps": reps,
                "time_ms_median": med,
                "time_ms_p20": p20,
                "time_ms_p80": p80,
                "tflops": flops / (med * 1e-3) / 1e12 / gpus if flops and med > 0 else None,
                "host_overhead_ms": s.get("host_overhead_ms"),
                "order": s.get("order"),
                "window_medians_ms": " ".join(
                    f"{w:.6g}" for w in s.get("window_medians_ms") or []
                ),
            }
        )
    if not rows and _num(record.get("time_ms_median")) is not None:
        rows.append(
            {
                **head,
                "sample": 0,
                "draw": "",
                "per_sample": False,
                "mask_area": None,
                "flops": record.get("flops"),
                "reps": None,
                **{
                    k: _num(record.get(k))
                    for k in ("time_ms_median", "time_ms_p20", "time_ms_p80")
                },
                "tflops": _num(record.get("tflops")),
            }
        )
    return rows


def read_records(paths=(), root=None) -> dict:
    """{path: record} of the given records (or of every *.json under root); RecordError naming
    every file that is not a consistent record of its own cell, all in one pass."""
    paths = list(paths) or sorted(str(p) for p in Path(root).rglob("*.json"))
    return read_all(paths, "no table was written")


def _sorted(df: pd.DataFrame, keys) -> pd.DataFrame:
    return df.sort_values(list(keys), kind="stable", na_position="last").reset_index(drop=True)


def collect(paths=(), root=None, records: dict | None = None) -> pd.DataFrame:
    """The tidy table of the given records (or of every *.json under root); stops, having
    written nothing, at a file that is not a record or not its cell's (RecordError naming it)."""
    records = read_records(paths, root) if records is None else records
    ceilings = Ceilings()  # each machine's kept ceiling, read once
    df = pd.DataFrame([row(r, p, ceilings) for p, r in records.items()])
    cols = COLUMNS + [c for c in df.columns if c not in COLUMNS]
    return _sorted(df.reindex(columns=cols), CELL_KEYS)


def collect_samples(records: dict) -> pd.DataFrame:
    """The per-sample table of the records: one row per cell and timed sample."""
    ceilings = Ceilings()  # each machine's kept ceiling, read once
    rows = [s for p, r in records.items() for s in sample_rows(r, p, ceilings)]
    return _sorted(pd.DataFrame(rows, columns=SAMPLE_COLUMNS), (*CELL_KEYS, "sample"))


def samples_path(cells_csv) -> Path:
    """The per-sample table beside a tidy table."""
    return Path(cells_csv).with_name(SAMPLES_CSV)


class TidyFiles(tuple):
    """A tidy table given as several files (each grid's own: pipeline/tidy.py), read as their
    union, each with its per-sample table beside it; a message names its files."""

    def __str__(self) -> str:
        return ", ".join(map(str, self))


def table_files(cells_csv) -> list[Path]:
    """The files of a tidy table given as one path or as several (TidyFiles)."""
    if isinstance(cells_csv, (str, os.PathLike)):
        return [Path(cells_csv)]
    return [Path(p) for p in cells_csv]


def named(cells_csv) -> str:
    """The tidy table's files as a message names them."""
    return ", ".join(map(str, table_files(cells_csv)))


def text_union(paths) -> pd.DataFrame:
    """Tables read as text and put one after another in the order given: every value as it was
    written, columns in the order they first appear and the `outdated` column last (where the
    records of one grid write it). ReportError naming a file that is not readable CSV."""
    frames = []
    for path in paths:
        try:
            frames.append(pd.read_csv(path, dtype=str, keep_default_na=False))
        except (OSError, UnicodeDecodeError, pd.errors.EmptyDataError, pd.errors.ParserError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ReportError(f"{path}: not a readable tidy table ({why})") from None
    columns = list(dict.fromkeys(c for f in frames for c in f.columns))
    columns = [c for c in columns if c != OUTDATED] + [OUTDATED] * (OUTDATED in columns)
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(
        [f.reindex(columns=columns, fill_value="") for f in frames], ignore_index=True
    )


def _one_text(paths) -> Path | io.StringIO:
    """One file as it is; several as the text of their union, to be read as one table."""
    if len(paths) == 1:
        return paths[0]
    return io.StringIO(text_union(paths).to_csv(index=False))


def read_samples(cells_csv) -> pd.DataFrame:
    """The per-sample table beside `cells_csv` (beside each of its files); an empty one where
    there is none (every record is then read as one sample, and the answers say so)."""
    paths = [p for p in map(samples_path, table_files(cells_csv)) if p.exists()]
    if not paths:
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    return pd.read_csv(_one_text(paths), dtype={"draw": str, "cell_id": str}, keep_default_na=True)


# Versions and names stay text ("12.10" is not 12.1, "570.00" not 570.0).
TEXT_COLUMNS = ("device_name", "library_version", "torch", "git_commit", *MACHINE, *WHEN_AND_WHAT)


def write_cells(df: pd.DataFrame, path) -> None:
    """Write a tidy table (cells or samples) whole or not at all: to a file beside it, then
    renamed over it, so that a failure leaves the table that was there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        df.to_csv(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class ReportError(RuntimeError):
    """A table or figure that could not be drawn, named with the tidy table it was drawn from."""


def read_cells(cells_csv) -> pd.DataFrame:
    """The tidy table (the union of its files, where several); ReportError in one line naming
    the file when it is empty, not text or CSV, or lacks the columns every tidy table has."""
    paths = table_files(cells_csv)
    try:
        df = pd.read_csv(
            _one_text(paths), keep_default_na=True, dtype={c: str for c in TEXT_COLUMNS}
        )
    except (OSError, UnicodeDecodeError, pd.errors.EmptyDataError, pd.errors.ParserError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ReportError(f"{named(paths)}: not a readable tidy table ({why})") from None
    missing = [c for c in ("grid", "impl", "status") if c not in df]
    if missing:
        raise ReportError(f"{named(paths)}: not a tidy table (no column {', '.join(missing)})")
    return df


def grid_rows(
    cells_csv, grid: str | None = None, family: str | None = None, grid_cfg: dict | None = None
):
    """The grid's rows of the tidy table (all rows without a grid), and the family they belong to:
    the one named, else the grid's, else the rows' own."""
    df = read_cells(cells_csv)
    if grid:
        df = df[df["grid"] == grid]
    name = (
        family or (grid_cfg or {}).get("family") or (df["family"].iloc[0] if len(df) else "kernel")
    )
    return df, name


POINT = ["impl", "mask", "seqlen", "heads_q", "heads_kv", "direction"]


def emulated(df: pd.DataFrame) -> pd.Series:
    """Whether each row is an emulated cell (the tidy table's optional `emulated` column)."""
    if "emulated" not in df:
        return pd.Series(False, index=df.index)
    return df["emulated"].map(lambda v: str(v).strip().lower() in ("true", "1", "1.0"))


def one_row_per_point(df: pd.DataFrame, what: str) -> pd.DataFrame:
    """The kernel figures and tables draw one number per (kernel, mask, length, heads, direction);
    a grid that varies another axis (dtype, head dim, mask parameters) must be split, not averaged."""
    dup = df[df.duplicated(POINT, keep=False)]
    if len(dup):
        varying = [
            c
            for c in ("dtype", "head_dim", "block_size", "avg_block", "density", "gpus")
            if c in dup and dup.groupby(POINT)[c].nunique(dropna=False).max() > 1
        ]
        first = dup[(dup[POINT] == dup[POINT].iloc[0]).all(axis=1)]
        files = ", ".join(map(str, first["record"])) if "record" in first else "not named"
        raise ValueError(
            f"{what}: {len(dup)} rows share a (kernel, mask, length, heads, direction); they differ in "
            f"{', '.join(varying) or 'no recorded column'}; use one value of those per grid "
            f"(the first such point's records: {files})"
        )
    return df
