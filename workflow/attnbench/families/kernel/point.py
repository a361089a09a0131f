"""A point's contenders measured side by side: every kernel cell of one grid point (heads, mask,
length, dtype, direction) in one job, on one GPU, interleaved draw by draw in a rotating order
(draw 0: A B C, draw 1: B C A, ...), so that a slow minute of the machine falls on all of them
(docs/measurement.md, "Side by side").

Records stay one per kernel, each as its own cell would write it, plus what the job shared: the
point and its contenders, the kernel's place in each draw's order, the machine at the job's start
and end, and the control calls timed before and after (harness.control: a drift past its limit
flags every record).

Two processes. The job's (`run_point`) starts a child that measures (`measure_point`) and reports
each draw as it begins on a progress file. A contender that crashes the child (a segfault, an
illegal memory access, an exception that is not an out-of-memory) gets a `crashed` record, and one
that outlives its time budget (its grid's cell_timeout_s, counted over its own draws) a `timeout`
one; a new child then measures the other contenders again from their first draw, side by side.
The job writes one file, the point's records (a bundle); Snakemake's per-cell rule takes each
record out of it (workflow/rules/kernels.smk).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ... import status as S
from ...grid.spec import CellSpec

POLL_S = 0.2
# A draw's repetitions are taken in ROUNDS windows, each contender's in turn (the order rotating
# from round to round), so that a slow second of the machine falls on every contender's
# repetitions, not on one's whole draw; windows after the first settle for LATER_SETTLE_S only (the
# device is busy with the point already).
ROUNDS = 7  # one draw: 7 of 7 windows slower is p = 1/128 (report/paired.py), either way 1.6%
LATER_SETTLE_S = 0.05


def rounds(reps: int) -> list[int]:
    """The repetitions of each round: `reps` over ROUNDS windows (fewer where reps is small)."""
    n = max(1, min(ROUNDS, reps))
    return [reps // n + (1 if k < reps % n else 0) for k in range(n)]


CHILD_OK, CHILD_CONTENDER_CRASHED = 0, 3


@dataclass(frozen=True)
class Contender:
    """One cell of the point: its spec, its record's path and its time budget (s)."""

    spec: CellSpec
    out: str
    timeout_s: float

    def to_dict(self) -> dict:
        return {"spec": self.spec.to_dict(), "out": self.out, "timeout_s": self.timeout_s}

    @classmethod
    def from_dict(cls, d: dict) -> Contender:
        return cls(CellSpec.from_dict(d["spec"]), d["out"], float(d["timeout_s"]))


def read_point(path) -> tuple[str, list[Contender]]:
    """The point file a job reads (grid.json_files: `FILE#NAME`, or a file of its own): its id
    and contenders."""
    from ...grid.json_files import read_json_arg

    d = read_json_arg(str(path), "--point")
    return d["point"], [Contender.from_dict(c) for c in d["contenders"]]


def point_file_content(point: str, contenders: list[Contender]) -> dict:
    return {"point": point, "contenders": [c.to_dict() for c in contenders]}


def rotation(names: list[str], draw: int) -> list[str]:
    """The order of draw `draw`: the contenders' list turned by `draw` places."""
    k = draw % len(names) if names else 0
    return names[k:] + names[:k]


# ------------------------------------------------------------------------- the child: measuring


class _Running:
    """A contender being measured: its record so far, its kernel, its draws' random stream."""

    def __init__(self, c: Contender, record: dict, kernel, rng, t0: float):
        self.c, self.record, self.kernel, self.rng, self.t0 = c, record, kernel, rng, t0
        self.outcome: tuple[str, str | None] | None = None  # (status, reason) once it ends


def _emit(progress, **event) -> None:
    progress.write(json.dumps(event, default=str) + "\n")
    progress.flush()


def measure_point(contenders: list[Contender], peak: dict | None, progress) -> dict[str, dict]:
    """Every contender's record (out -> record), measured side by side in this process."""
    from ...harness.control import drift, settle_machine, time_controls
    from ...harness.faults import crash_if_asked, hang_if_asked
    from ...harness.inputs import mask_rng, torch_dtype
    from ...harness.machine import snapshot
    from ...harness.samples import CheckOutOfMemory, checked_outcome, n_samples
    from ...kernels.base import load
    from ...record.record import base_record, finish_record
    from ...run import launch
    from .cell import (
        SampleRun,
        availability_reason,
        draw,
        implementation,
        kernel_info,
        unsupported,
    )
    from .provenance import provenance

    device = contenders[0].spec.device
    names = [c.spec.impl for c in contenders]
    finished: dict[str, tuple[dict, str, str | None, float]] = {}
    running: list[_Running] = []
    for c in contenders:
        spec, t0 = c.spec, time.perf_counter()
        record = base_record(spec, implementation(spec), provenance(spec))
        info = kernel_info(spec)
        why = availability_reason(info, device)
        status = S.UNAVAILABLE if why else None
        if status is None:
            why = unsupported(info, spec)
            status = S.UNSUPPORTED if why else None
        if status is not None:
            finished[c.out] = (record, status, why, t0)
            continue
        p = spec.problem
        kernel = load(
            info,
            device=device,
            dtype=torch_dtype(p.dtype),
            heads_q=p.heads_q,
            heads_kv=p.heads_kv,
            head_dim=p.head_dim,
        )
        running.append(_Running(c, record, kernel, mask_rng(record["data_seed"]), t0))
    shared = {"machine": {}, "control": {}}
    if running:
        shared["machine"]["start"] = snapshot(device)
        shared["machine"]["settle"] = settle_machine(device)
        shared["control"]["before"] = time_controls(device)
        by_name = {r.c.spec.impl: r for r in running}
        draws = max(n_samples(r.c.spec.problem, r.c.spec.measurement) for r in running)
        for i in range(draws):
            order = rotation([r.c.spec.impl for r in running], i)

            def step(r, what, action, i=i, order=order):
                """One step of a contender's draw; its outcome (or its crash) if it fails."""
                _emit(
                    progress,
                    event="draw",
                    out=r.c.out,
                    impl=r.c.spec.impl,
                    sample=i,
                    step=what,
                    t=time.time(),
                )
                try:
                    return action()
                except S.CellOutcome as e:
                    r.outcome = (e.status, e.reason)
                except Exception as e:  # noqa: BLE001 - an OOM is a record; anything else a crash
                    if S.is_oom(e) and not isinstance(e, CheckOutOfMemory):
                        _release(device)
                        r.outcome = (
                            S.OOM,
                            f"out of memory at sample {i}: {str(e).splitlines()[0][:300]}",
                        )
                    else:  # the process may be broken (a CUDA error poisons its context): end it
                        _emit(
                            progress,
                            event="crashed",
                            out=r.c.out,
                            impl=r.c.spec.impl,
                            sample=i,
                            error=traceback.format_exc()[-3000:],
                        )
                        sys.exit(CHILD_CONTENDER_CRASHED)
                return None

            # the draw's mask and inputs, once: every contender times the very same tensors (on a
            # CPU, two copies of the same data in two places timed a few percent apart, steadily)
            first = running[0]
            drawn = draw(first.c.spec, first.record["data_seed"], i, first.rng)

            def prepare(r, i=i, drawn=drawn):
                if i == 1:  # the tests' faults strike mid-point, once the others have begun
                    crash_if_asked(r.c.spec)
                    hang_if_asked(r.c.spec)
                return SampleRun(r.kernel, r.c.spec, r.record["data_seed"], i, None, drawn)

            runs = {}
            for name in order:
                r = by_name[name]
                if r.outcome is None:
                    runs[name] = step(r, "prepare", lambda r=r: prepare(r))
            windows = {name: [] for name in order}
            for k, reps in enumerate(rounds(running[0].c.spec.measurement.reps)):
                for name in rotation(order, k):
                    r, run = by_name[name], runs.get(name)
                    if run is None or r.outcome is not None:
                        continue
                    settle_s = None if k == 0 else LATER_SETTLE_S
                    timing = step(
                        r, f"window {k}", lambda run=run, reps=reps, s=settle_s: run.time(reps, s)
                    )
                    if timing is not None:
                        windows[name].append(timing)
            for name in order:
                r, run = by_name[name], runs.get(name)
                if run is None or r.outcome is not None:
                    continue
                sample = step(r, "finish", lambda run=run, name=name: run.finish(windows[name]))
                if sample is not None:
                    sample["order"] = order.index(name)
                    r.record["samples"].append(sample)
            runs = windows = drawn = None  # this draw's inputs and calls, freed before the next
        shared["control"]["after"] = time_controls(device)
        shared["control"]["drift"] = drift(shared["control"]["before"], shared["control"]["after"])
        shared["machine"]["end"] = snapshot(device)
        for r in running:
            if r.outcome is None:
                r.outcome = checked_outcome(r.record["samples"])
            r.record["kernel"]["notes"].update(getattr(r.kernel, "load_notes", {}))
            finished[r.c.out] = (r.record, *r.outcome, r.t0)
    launch.release_gpus()
    out = {}
    for c in contenders:
        record, status, reason, t0 = finished[c.out]
        record["side_by_side"] = {
            "contenders": names,
            "measured": [r.c.spec.impl for r in running],
            "order": "rotating: draw i starts at the i-th contender",
        }
        if c.out in {r.c.out for r in running}:
            record["machine"] = shared["machine"]
            record["control"] = shared["control"]
        out[c.out] = finish_record(record, status, reason, peak, device, t0=t0)
    return out


def _release(device) -> None:
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def child_main(
    point_path: str,
    remaining: list[str],
    peak_path: str | None,
    progress_path: str,
    threads: int | None,
) -> None:
    """The child: measure the contenders named in `remaining` (record paths), append their
    records to the progress file."""
    from ...harness.cpu_math import settle_vml

    if threads:
        import torch

        torch.set_num_threads(threads)
    settle_vml()
    _, contenders = read_point(point_path)
    mine = [c for c in contenders if c.out in set(remaining)]
    peak = json.loads(Path(peak_path).read_text()) if peak_path else None
    with open(progress_path, "a") as progress:
        records = measure_point(mine, peak, progress)
        for out, record in records.items():
            _emit(progress, event="record", out=out, record=record)
        _emit(progress, event="done")


# ------------------------------------------------------------------------- the job: supervising


@dataclass
class _Watch:
    """What the job knows of its child from the progress file."""

    current: tuple[str, float] | None = None  # (record path, since) of the draw being measured
    crashed: dict | None = None
    done: bool = False
    got: dict = field(default_factory=dict)  # the records it reported (record path -> record)

    def take(self, events: list[dict], spent: dict) -> None:
        """The child's events: each step's start (the time since the last goes to its contender),
        a crash, a record, the end."""
        for e in events:
            if e["event"] == "draw":
                if self.current:
                    spent[self.current[0]] += e["t"] - self.current[1]
                self.current = (e["out"], e["t"])
            elif e["event"] == "crashed":
                self.crashed = e
            elif e["event"] == "record":
                self.got[e["out"]] = e["record"]
            elif e["event"] == "done":
                self.done = True


def _read_events(progress_path: Path, offset: int) -> tuple[list[dict], int]:
    with open(progress_path) as f:
        f.seek(offset)
        text = f.read()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line], offset + len(complete)


def run_point(
    point_path: str, peak_path: str | None, threads: int | None, log_tail
) -> dict[str, dict]:
    """Every contender's record: measured side by side by children of this process, each
    crashed or timed-out contender recorded as such and the others measured again without it."""
    from ...record.not_run import not_run_record
    from ...run.launch import how_it_ended
    from .cell import record_skeleton

    _, contenders = read_point(point_path)
    peak = json.loads(Path(peak_path).read_text()) if peak_path else None
    by_out = {c.out: c for c in contenders}
    records: dict[str, dict] = {}
    spent = {c.out: 0.0 for c in contenders}  # seconds of each contender's draws so far
    from ...grid.json_files import file_named

    # beside the point's file (a folder's spec file where it is `FILE#NAME`), one per job
    progress_path = Path(f"{file_named(point_path)[0]}.progress.{os.getpid()}")
    while len(records) < len(contenders):
        remaining = [c.out for c in contenders if c.out not in records]
        progress_path.write_text("")
        for out in remaining:  # measured again from their first draw
            spent[out] = 0.0
        cmd = [
            sys.executable,
            "-m",
            "attnbench",
            "point-child",
            "--point",
            point_path,
            "--progress",
            str(progress_path),
            "--remaining",
            json.dumps(remaining),
        ]
        cmd += ["--peak", peak_path] if peak_path else []
        cmd += ["--threads", str(threads)] if threads else []
        child = subprocess.Popen(cmd)
        watch, offset = _Watch(), 0
        while True:
            events, offset = _read_events(progress_path, offset)
            now = time.time()
            watch.take(events, spent)
            if watch.current and child.poll() is None:
                out, since = watch.current
                if spent[out] + now - since > by_out[out].timeout_s:
                    child.kill()
                    child.wait()
                    budget = by_out[out].timeout_s
                    records[out] = not_run_record(
                        by_out[out].spec, record_skeleton, peak, timed_out_after_s=budget
                    )
                    print(
                        f"point: {out} still measuring after {budget:g} s, its time budget; stopped, "
                        "the others measured again without it",
                        flush=True,
                    )
                    break
            if child.poll() is not None:
                events, offset = _read_events(progress_path, offset)
                watch.take(events, spent)
                if watch.done and child.returncode == CHILD_OK:
                    records.update(watch.got)
                elif watch.current or watch.crashed:
                    out = (watch.crashed or {}).get("out") or watch.current[0]
                    ended = how_it_ended(child.returncode)
                    tail = (watch.crashed or {}).get("error", "").splitlines() or log_tail()
                    records[out] = not_run_record(
                        by_out[out].spec,
                        record_skeleton,
                        peak,
                        crash={**ended, "log_tail": tail[-20:]},
                    )
                    print(
                        f"point: {out} crashed its process ({ended['how']}); the others measured again "
                        "without it",
                        flush=True,
                    )
                else:  # it died before any draw: nobody to blame, nothing to measure again
                    raise RuntimeError(
                        f"the point's measuring process {how_it_ended(child.returncode)['how']} "
                        "before its first draw"
                    )
                break
            time.sleep(POLL_S)
    progress_path.unlink(missing_ok=True)
    return records


def write_point_record(point_records: str, out: str, log: str | None = None) -> None:
    """The record at `out`, taken from its point's file of records (rule point_record); `log`
    says so (the cell's log: where its point's job logged it)."""
    from ...record.record import write_record

    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(
            f"measured side by side in {point_records}; its log: "
            f"{point_records.replace('/points/', '/logs/points/').removesuffix('.json')}.log\n"
        )
    records = json.loads(Path(point_records).read_text())["records"]
    if out not in records:
        raise ValueError(
            f"{point_records} holds no record for {out}: the point was measured "
            f"with other contenders ({', '.join(records)}); run the workflow again"
        )
    if _keeps_its_measurement(out, records[out]):
        if log:
            with open(log, "a") as f:
                f.write(
                    f"kept {out}: a measurement this machine cannot make, never replaced by `unavailable`\n"
                )
        return
    write_record(records[out], out)


def _keeps_its_measurement(out: str, new: dict) -> bool:
    """Whether the record at `out` stays: a measurement (on a GPU, say) where the point's job here
    could only say `unavailable` (attnbench.pipeline.currency keeps such records too: kept: in outdated.txt)."""
    if new.get("status") != S.UNAVAILABLE or not Path(out).exists():
        return False
    try:
        old = json.loads(Path(out).read_text())
    except (OSError, ValueError):
        return False
    return old.get("status") not in (S.UNAVAILABLE, S.CRASHED) and bool(old.get("samples"))
