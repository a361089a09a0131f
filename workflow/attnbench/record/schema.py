"""A cell record's schema: the fields every record has, the one vocabulary of its numbers, which
fields each status carries, and a typed view of a record (Record), checked when a record is written
(record.record.write_record) and when it is read (record.validate, which also checks that a record
agrees with itself).

Which fields each status carries (FIELDS_BY_STATUS; a field absent or null is not carried):

    status                           must carry     may carry
    ok, implausible                  STATISTICS     SUMMARY (what record.summarise writes)
    incorrect                        -              SUMMARY (none where found out before timing)
    oom, unsupported, unavailable    -              -
    timeout                          -              time_budget_s
    crashed                          -              crash

A field of SUMMARY, time_budget_s or crash on a status that does not list it is refused; every other
field (the family's own, cp and table_extra; the worker's; the machine's) any status may carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from ..status import STATUSES, Status

# The fields without which a file is no record at all, and what names its cell.
REQUIRED = ("schema_version", "cell", "status")
CELL_KEYS = ("grid", "family", "impl", "mask", "seqlen", "direction", "device")

# The cell-level numbers (record.summarise), the one list the tables and the checks read: each,
# where the record has it, a finite number >= 0 (a time, a throughput, a count of FLOPs or bytes).
# max_rel_err is not among them: an incorrect kernel's NaN output makes it nan or inf.
STATISTICS = (
    "time_ms_median",
    "time_ms_p20",
    "time_ms_p80",
    "tflops",
    "tflops_p20",
    "tflops_p80",
    "flops",
)
# The tidy table's timing columns, in its order (None where no ceiling was measured).
TIMINGS = (*STATISTICS, "fraction_of_peak")
MEMORY = ("peak_mem_bytes", "peak_mem_increment_bytes")
NUMBERS = (*TIMINGS, *MEMORY, "device_busy_ms")
# Everything record.summarise writes: a cell timed to the end carries it, no other.
SUMMARY = (
    *NUMBERS,
    "mem_source",
    "host_overhead_ms",
    "throttled",
    "host_waited",
    "max_rel_err",
    "check_passed",
)


@dataclass(frozen=True)
class Carries:
    """The fields a status must carry, and those it may; the others of STATUS_FIELDS it must not."""

    must: tuple[str, ...] = ()
    may: tuple[str, ...] = ()

    def allows(self, field: str) -> bool:
        return field in self.must or field in self.may


FIELDS_BY_STATUS = {
    Status.OK: Carries(must=STATISTICS, may=SUMMARY),
    Status.OOM: Carries(),
    Status.UNSUPPORTED: Carries(),
    Status.UNAVAILABLE: Carries(),
    Status.INCORRECT: Carries(may=SUMMARY),
    Status.TIMEOUT: Carries(may=("time_budget_s",)),  # the budget it was stopped at
    Status.CRASHED: Carries(may=("crash",)),  # how its process ended (attnbench.launch)
    Status.IMPLAUSIBLE: Carries(must=STATISTICS, may=SUMMARY),
}
# The fields that belong to some statuses only.
STATUS_FIELDS = tuple(
    dict.fromkeys(f for c in FIELDS_BY_STATUS.values() for f in (*c.must, *c.may))
)


def carried(record: dict, field: str) -> bool:
    return record.get(field) is not None


def number_problems(record: dict) -> list[str]:
    """The record's NUMBERS that are not finite numbers >= 0."""
    out = []
    for key in NUMBERS:
        v = record.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            out.append(f"{key} is {v!r}, not a number")
        elif not math.isfinite(v) or v < 0:
            out.append(f"{key} is {v!r}, not a finite number >= 0")
    return out


def status_field_problems(record: dict, status: Status) -> list[str]:
    """The fields its status must carry that it lacks, and those it carries that its status must
    not (each named with the statuses that carry it)."""
    carries = FIELDS_BY_STATUS[status]
    out = []
    missing = [f for f in carries.must if not carried(record, f)]
    if missing:
        out.append(f"status {status.value!r} without {', '.join(missing)}, which it carries")
    foreign: dict[tuple, list[str]] = {}  # the statuses that carry them: the fields
    for f in STATUS_FIELDS:
        if carried(record, f) and not carries.allows(f):
            owners = tuple(s for s in Status if FIELDS_BY_STATUS[s].allows(f))
            foreign.setdefault(owners, []).append(f)
    out += [
        f"status {status.value!r} with {', '.join(fields)}, which only {', '.join(owners)} carry"
        for owners, fields in foreign.items()
    ]
    return out


def schema_problems(record) -> list[str]:
    """What makes a parsed JSON value not a cell record by its schema, every problem in one pass:
    the fields every record has, a known status, the fields its status carries, its numbers."""
    if not isinstance(record, dict):
        return [f"a JSON {type(record).__name__}, not an object"]
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        return [f"no {', '.join(missing)} (keys present: {', '.join(list(record)[:8]) or 'none'})"]
    problems = []
    cell = record["cell"]
    if not isinstance(cell, dict) or any(k not in cell for k in CELL_KEYS):
        problems.append(f"its 'cell' lacks some of {', '.join(CELL_KEYS)}")
    status = record["status"]
    if status not in STATUSES:
        problems.append(f"status {status!r} is none of {', '.join(STATUSES)}")
    else:
        problems += status_field_problems(record, Status(status))
    return problems + number_problems(record)


class SchemaError(ValueError):
    """A dict that is not a cell record by its schema; `problems` names each field at fault."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Record:
    """A cell record checked against its schema: its status, cell and numbers typed, and every
    field as it was written, in its order (to_dict gives them back, so a record written through
    it is byte-identical to the dict it was made from)."""

    status: Status
    cell: Mapping[str, Any]
    numbers: Mapping[str, float]  # the NUMBERS it carries
    fields: Mapping[str, Any]

    @classmethod
    def from_dict(cls, record) -> Record:
        """The record; SchemaError naming every field at fault where it is not one."""
        problems = schema_problems(record)
        if problems:
            raise SchemaError(problems)
        return cls(
            status=Status(record["status"]),
            cell=MappingProxyType(record["cell"]),
            numbers=MappingProxyType({k: record[k] for k in NUMBERS if carried(record, k)}),
            fields=MappingProxyType(dict(record)),
        )

    def to_dict(self) -> dict:
        return dict(self.fields)

    @property
    def timed(self) -> bool:
        """Whether it carries the statistics of timed samples (an incorrect record may not)."""
        return all(k in self.numbers for k in STATISTICS)
