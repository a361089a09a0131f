"""The device's matmul ceiling, kept per machine (docs/measurement.md, "Timing": the ceiling is the
best measured on the machine).

A ceiling measured while something else runs on the machine is low, and a cell judged against it
looks faster than the device: `implausible`. So every measurement (`python -m attnbench peak`) is
added to one file per machine (host and device name) and dtype, under the output folder
(<output_dir>/device/machines/), and the ceiling is the highest measurement kept there. The cells
are judged against the ceiling when their record is made (record.record.summarise); collect judges
them again against the highest ceiling kept for their own machine (`judging`), so that a ceiling
measured later, higher, takes back a judgement made against a low one. The record keeps the ceiling
it saw; the tidy table says which one judged it (`ceiling_tflops`, `ceiling_from`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

# The per-machine files, under an output folder.
KEPT = Path("device") / "machines"
# A record's own ceiling (the one its cell was judged against), in the table's `ceiling_from`.
FROM_RECORD = "record"


def kept_folder(output_root) -> Path:
    return Path(output_root) / KEPT


@dataclass(frozen=True)
class Machine:
    """What a ceiling belongs to: the machine (host, device name) and the matmul's dtype."""

    host: str
    device_name: str
    dtype: str

    def file(self, folder) -> Path:
        def slug(s: str) -> str:
            return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_") or "_"

        return (
            Path(folder) / f"{slug(self.host)}--{slug(self.device_name)}--{slug(self.dtype)}.json"
        )

    def owns(self, kept: dict) -> bool:
        """Whether a kept file is this machine's (not another's whose name has the same slug)."""
        return (kept.get("host"), kept.get("device_name"), kept.get("dtype")) == (
            self.host,
            self.device_name,
            self.dtype,
        )

    @classmethod
    def of_record(cls, record: dict) -> Machine | None:
        """The machine a record ran on (its environment) and its cell's dtype; None if unknown."""
        env, cell = record.get("environment") or {}, record.get("cell") or {}
        if not (env.get("host") and env.get("device_name") and cell.get("dtype")):
            return None
        return cls(str(env["host"]), str(env["device_name"]), str(cell["dtype"]))


@dataclass(frozen=True)
class Ceiling:
    """A matmul ceiling (TFLOP/s) and where it comes from: FROM_RECORD, or the kept file and
    when its best measurement was made."""

    tflops: float
    source: str


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_kept(machine: Machine, folder) -> dict | None:
    """The machine's kept file, or None where there is none (or it is another machine's)."""
    path = machine.file(folder)
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return kept if machine.owns(kept) else None


def keep(measured: dict, machine: Machine, folder) -> dict:
    """Add one measurement (matmul_peak_tflops and how it was made) to the machine's file; the
    ceiling the cells are given: the highest measurement kept (when it was made: measured_at),
    with this one's TFLOP/s, how many are kept and where."""
    entry = {"measured_at": now(), **measured}
    kept = read_kept(machine, folder) or {
        "host": machine.host,
        "device_name": machine.device_name,
        "dtype": machine.dtype,
        "measurements": [],
    }
    kept["measurements"].append(entry)
    best = max(kept["measurements"], key=lambda m: m["matmul_peak_tflops"])
    kept.update(matmul_peak_tflops=best["matmul_peak_tflops"], best=best)
    path = machine.file(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    # whole or not at all: a file beside it, renamed over it (one run per output folder writes it)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(kept, indent=1) + "\n")
    os.replace(tmp, path)
    return {
        **best,
        "measured_now_tflops": measured["matmul_peak_tflops"],
        "measurements": len(kept["measurements"]),
        "kept": str(path),
    }


class Ceilings:
    """The highest ceiling known for each record's machine: read once per kept file."""

    def __init__(self):
        self._kept: dict[tuple, Ceiling | None] = {}

    def kept(self, machine: Machine, folder) -> Ceiling | None:
        key = (machine, str(folder))
        if key not in self._kept:
            k = read_kept(machine, folder)
            self._kept[key] = (
                Ceiling(
                    float(k["matmul_peak_tflops"]),
                    f"{machine.file(folder)} ({(k.get('best') or {}).get('measured_at', '?')})",
                )
                if k and k.get("matmul_peak_tflops")
                else None
            )
        return self._kept[key]

    def judging(self, record: dict, output_root) -> Ceiling | None:
        """The ceiling a record is judged against: the higher of its own and the one kept for its
        machine under `output_root` (None: the record is not in an output folder); a ceiling
        kept for another machine never judges it."""
        own = (record.get("matmul_peak") or {}).get("matmul_peak_tflops")
        best = Ceiling(float(own), FROM_RECORD) if own else None
        machine = Machine.of_record(record)
        if machine is not None and output_root is not None:
            kept = self.kept(machine, kept_folder(output_root))
            if kept is not None and (best is None or kept.tflops > best.tflops):
                best = kept
        return best
