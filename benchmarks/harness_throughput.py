"""How busy a grid run kept its GPUs, from the records it wrote (docs/results-h200.md).

    python benchmarks/harness_throughput.py results/h200/cells/h200_sweep --gpus 2 --wall-s 540

busy   the device sections of every cell (warm-up and timed repetitions, the memory call, the float64
       check; each record's `device_busy_ms`, the device synchronised at both ends of each section);
       for records written before that field existed, only the timed repetitions (a lower bound)
wall   the run's wall time (--wall-s, e.g. from gpu_session.sh); without it, the span from the first
       record's start to the last one's end (a lower bound: process starts before the first are missing)
share  busy / (wall x GPUs); cells per GPU-minute: records / (wall in minutes x GPUs), all records and
       the timed ones (ok or incorrect)
nvml   with --nvml (nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 500,
       sampled during the run): the driver's own share of time a kernel was running, averaged over
       the samples and GPUs; independent of the records, and blind to how busy each kernel keeps the SMs
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from attnbench.record.status import TIMED


def summarise(records: list[dict], gpus: int, wall_s: float | None) -> dict:
    timed = [r for r in records if r.get("status") in TIMED]
    busy_ms, lower_bound = 0.0, False
    for r in timed:
        if r.get("device_busy_ms") is not None:
            busy_ms += r["device_busy_ms"]
        else:
            busy_ms += sum(t for s in r["samples"] for t in s["time_ms"])
            lower_bound = True
    stamps = [
        (datetime.fromisoformat(r["started_at"]), datetime.fromisoformat(r["finished_at"]))
        for r in records
        if r.get("started_at") and r.get("finished_at")
    ]
    span = (
        (max(e for _, e in stamps) - min(s for s, _ in stamps)).total_seconds() if stamps else None
    )
    wall = wall_s if wall_s is not None else span
    in_process = sum(r.get("process_s") or r.get("wall_s") or 0.0 for r in records)
    minutes = wall / 60 * gpus if wall else None
    return {
        "records": len(records),
        "timed": len(timed),
        "gpus": gpus,
        "wall_s": wall,
        "wall_source": "given" if wall_s is not None else "record timestamps (lower bound)",
        "busy_s": busy_ms / 1e3,
        "busy_source": "timed repetitions only (lower bound)"
        if lower_bound
        else "device sections",
        "in_process_s": in_process,
        "busy_share": busy_ms / 1e3 / (wall * gpus) if wall else None,
        "cells_per_gpu_minute": len(records) / minutes if minutes else None,
        "timed_cells_per_gpu_minute": len(timed) / minutes if minutes else None,
    }


def nvml_share(path) -> float:
    """Mean utilization.gpu (percent of time a kernel ran) of `index, utilization` lines, as a share."""
    values = [
        float(line.split(",")[1])
        for line in Path(path).read_text().splitlines()
        if line.count(",") == 1 and line.split(",")[1].strip().replace(".", "", 1).isdigit()
    ]
    if not values:
        sys.exit(f"no utilization samples in {path}")
    return sum(values) / len(values) / 100


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("records", help="a folder of records (searched recursively)")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--wall-s", type=float, help="the run's wall time in seconds")
    p.add_argument(
        "--since", help="only records started at or after this ISO time (one call of a session)"
    )
    p.add_argument(
        "--nvml", help="nvidia-smi utilization samples taken during the run (see above)"
    )
    p.add_argument("--json", help="also write the summary here")
    a = p.parse_args(argv)
    records = [json.loads(f.read_text()) for f in sorted(Path(a.records).rglob("*.json"))]
    if a.since:
        since = datetime.fromisoformat(a.since)
        records = [r for r in records if datetime.fromisoformat(r["started_at"]) >= since]
    if not records:
        sys.exit(
            f"no records under {a.records}" + (f" started since {a.since}" if a.since else "")
        )
    out = summarise(records, a.gpus, a.wall_s)
    out["records_dir"] = a.records
    if a.nvml:
        out["nvml_busy_share"] = nvml_share(a.nvml)
    for k, v in out.items():
        print(f"{k:28s} {v:.3f}" if isinstance(v, float) else f"{k:28s} {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
