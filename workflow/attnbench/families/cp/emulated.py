"""One emulated CP cell (`cp.emulate: true`): the compute of every rank of an N-rank world in one
process on one device (attnbench.cp.emulate), never a distributed measurement.

    python -m attnbench cp-cell --spec JSON --out FILE     (one process: no torchrun world)

Per sample: the N virtual ranks are built and run once in lockstep (their transfers through the
in-process hub), then each rank is timed alone with its transfers off, the compute-only variant
of a distributed cell, with the harness's timing (warm-up, repetitions, L2 flush on GPU). A
repetition's time is the maximum over ranks of that repetition (what the slowest rank takes, as
a distributed cell's max over ranks), so TFLOP/s per GPU = global FLOPs / (that time x N), as
for the distributed cells. The sample also keeps every rank's times, the slowest rank and the
spread over ranks (slowest / mean of the per-rank medians: the load balance in time).
The correctness check is the distributed cell's (check.max_seqlen, float64, the gate) on the
emulated ranks' rows. Memory is not recorded: the N ranks share one device.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ...cp import catalog, emulate
from ...cp.run import MethodRun
from ...grid.spec import CellSpec
from ...harness.faults import crash_if_asked
from ...harness.inputs import input_seed, mask_rng
from ...harness.measure import quantiles, release_memory, sample_timings
from ...harness.samples import (
    checked_outcome,
    checked_samples,
    n_samples,
    spec_mask,
)
from ...record import status as S
from ...record.record import base_record, finish_record, write_record
from . import cell as C
from .provenance import provenance

MARK = "emulated"  # the word tables and figures put beside every emulated number
WHAT = "compute of every rank emulated on one device (no transfer, no overlap): not a distributed measurement"


def is_emulated(spec: CellSpec) -> bool:
    return spec.cp is not None and spec.cp.emulate


def _agree(world, where):
    st, reason = world.agree(where)
    if st is not None:
        raise C.Failed(st, reason)


def measure_sample(spec: CellSpec, mrun: MethodRun, seed: int, index: int, mask, device) -> dict:
    """Sample `index` on the emulated ranks: the lockstep run, then each rank timed alone."""
    p, how, direction = spec.problem, spec.measurement, spec.problem.direction
    world = emulate.World(mrun, device, spec.cp.emulate_contents, spec.cp.timeout_s)
    world.load(mask)
    _agree(world, "setup")
    inputs = world.inputs(input_seed(seed, index, p.seqlen))
    _agree(world, "setup")
    emulate.prime(world, inputs, direction)  # every buffer as the real run leaves it
    _agree(world, "the lockstep run")
    counted = [
        {
            "sent": rc.comm.total_sent,
            "received": rc.comm.total_received,
            "by_kind_sent": dict(rc.comm.sent),
            "by_kind_received": dict(rc.comm.received),
        }
        for rc in world.rcs
    ]
    times = emulate.time_ranks(world, inputs, direction, how.warmup, how.reps)
    _agree(world, "timing")
    summ = emulate.summary(times)
    ranks = []
    for r, (m, rc) in enumerate(zip(world.methods, world.rcs)):
        one = {
            "rank": r,
            "coords": list(rc.deg.coords(r)),
            "time_ms": times[r],
            "time_ms_median": quantiles(times[r])["median"],
            # the lockstep call's (prime's: forward, and backward unless fwd)
            "bytes": counted[r],
            "bytes_analytic": m.volume("fwd" if direction == "fwd" else "fwdbwd"),
            "work_pairs": m.work(),
            "describe": m.describe(),
        }
        ranks.append(one)
    sample = {
        **sample_timings(
            index, mask, p.head_dim, direction, summ["max_over_ranks_ms"], ranks=world.size
        ),
        "peak_mem_bytes": None,
        "peak_mem_increment_bytes": None,
        "mem_source": f"not measured: {world.size} emulated ranks share one device",
        "emulated": True,
        "emulated_contents": world.contents,
        **{k: v for k, v in summ.items() if k != "max_over_ranks_ms"},
        "ranks": ranks,
    }
    sample.update(C.bytes_summary(ranks))
    work = [r["work_pairs"] for r in ranks]
    sample["work_pairs_total"] = int(sum(work))
    sample["load_balance"] = max(work) / (sum(work) / len(work)) if sum(work) else None
    del world, inputs
    release_memory()  # the world's objects form cycles: collected now, not at some later count
    return sample


def check_sample(spec: CellSpec, mrun: MethodRun, seed: int, index: int, device) -> dict:
    """cell.check_sample on the emulated ranks (emulate.check_method)."""
    factor = spec.measurement.check.tolerance_factor

    def check(mask, inputs_seed):
        return emulate.check_method(mrun, mask, inputs_seed, factor, device)

    return {**C.check_halving(spec, seed, index, check), "emulated": True}


def measure(record, spec: CellSpec, kernel: str, device) -> tuple:
    """Every sample of the cell over `kernel` (its chosen local kernel): (status, reason)."""
    mrun = MethodRun.of_cell(spec, kernel)
    p, how, seed = spec.problem, spec.measurement, record["data_seed"]
    rng = mask_rng(seed)
    try:
        for i in range(n_samples(p, how)):
            mask = spec_mask(p, p.seqlen, rng)
            sample = measure_sample(spec, mrun, seed, i, mask, device)
            if i < checked_samples(p, how):
                verdict = check_sample(spec, mrun, seed, i, device)
                if verdict["status"] not in (S.OK, S.INCORRECT):
                    raise C.Failed(verdict["status"], verdict["reason"])
                sample["check"] = verdict
            record["samples"].append(sample)
    except C.Failed as e:
        return e.status, e.reason
    return checked_outcome(record["samples"])


def emulated_summary(record, spec: CellSpec):
    """cell.cp_summary, with what makes the record an emulation's: `emulated`, its
    contents, the slowest rank's median time and the spread over ranks (medians over samples)."""
    C.cp_summary(record, spec)
    samples = record["samples"]

    def med(key):
        values = [s.get(key) for s in samples]
        return float(np.median(values)) if samples and all(v is not None for v in values) else None

    extra = {
        "emulated": True,
        "emulated_contents": spec.cp.emulate_contents,
        "slowest_rank_ms": med("slowest_rank_ms"),
        "rank_spread": med("rank_spread"),
    }
    record["cp"].update(extra, emulated_note=WHAT)
    record["table_extra"].update(extra)


def run_emulated_cell(spec: CellSpec, out_path, peak: dict | None = None):
    """The emulated cell's record (cell.run_cp_cell's steps, one process, no process group)."""
    crash_if_asked(spec)
    t0 = time.perf_counter()
    C.method_info(spec)  # your own method: registered before anything looks it up by name
    choice = C.choose(spec, out_path)
    record = base_record(
        spec, {**C.implementation(spec, choice), "emulated": True}, provenance(spec)
    )
    status, reason = C.static_outcome(spec, choice["local_kernel"])
    if status is None and not catalog.uses_local_kernel(spec.impl):
        status, reason = (
            S.UNSUPPORTED,
            f"{spec.impl} runs torch's own collectives: it cannot be emulated in one process",
        )
    if status is None:
        device = torch.device("cuda") if spec.device == "cuda" else torch.device("cpu")
        # what runs: the chosen local kernel (the record's cell keeps the grid's setting)
        status, reason = measure(record, spec, choice["local_kernel"], device)
    finish_record(
        record,
        status,
        reason,
        peak,
        spec.device,
        gpus=spec.gpus,
        t0=t0,
        summary=lambda r: emulated_summary(r, spec),
    )
    write_record(record, out_path)
    return record


def record_skeleton(spec) -> dict:
    """The record with what ran (method and local kernel) and the CP tables' columns."""
    if is_emulated(spec):  # cp.emulate: the record says so whatever its status
        record = base_record(spec, {**C.implementation(spec), "emulated": True}, provenance(spec))
        emulated_summary(record, spec)
        return record
    record = base_record(spec, C.implementation(spec), provenance(spec))
    C.cp_summary(record, spec)
    return record
