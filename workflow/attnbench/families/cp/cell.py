"""One distributed CP cell: every rank runs this under torchrun; rank 0 writes the record.

    python -m attnbench.launch --nproc-per-node N -- python -m attnbench cp-cell --spec JSON --out FILE

Phases (setup, timing, breakdown, memory and bytes, correctness) each end with a status
agreement over all ranks (run.agree), so an out-of-memory error on one rank gives `oom` on
all of them; a failing rank keeps serving its peers' transfers until then (comm.Guard).
A process-group timeout (cp.timeout_s) turns a real hang into a failed job.

Timing (docs/measurement.md): a barrier and a device synchronisation before each repetition;
a repetition's time is the MAXIMUM over ranks; TFLOP/s per GPU = global FLOPs (exact mask
area, padding never counts) / (max-rank time x N).
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time

import numpy as np
import torch
import torch.distributed as dist

from ...cp import catalog, run
from ...cp.choose import choose_local_kernel
from ...cp.run import MethodRun
from ...grid.expand import output_root
from ...grid.spec import CellSpec
from ...harness.faults import crash_if_asked, hang_if_asked
from ...harness.inputs import check_mask_rng, input_seed, mask_rng
from ...harness.measure import peak_memory, quantiles, sample_timings, synchronize, time_ms
from ...harness.samples import (
    CheckOutOfMemory,
    checked_outcome,
    checked_samples,
    n_samples,
    spec_mask,
)
from ...record import status as S
from ...record.record import base_record, finish_record, write_record
from .provenance import provenance

MEMORY_LIMIT_ENV = "ATTNBENCH_CP_MEMORY_LIMIT"


def limit_memory_if_asked(rank: int):
    """Fault injection for tests of the status agreement: '$RANK:$BYTES' in
    $ATTNBENCH_CP_MEMORY_LIMIT lets that rank map only BYTES more address space than it has
    now (RLIMIT_AS), so its next large allocation really fails."""
    spec = os.environ.get(MEMORY_LIMIT_ENV)
    if not spec:
        return
    who, extra = spec.split(":")
    if int(who) != rank:
        return
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + int(extra), resource.RLIM_INFINITY))


def implementation(spec: CellSpec, choice: dict | None = None) -> dict:
    """What ran: the method and the local kernel (`choice`: choose.choose_local_kernel's; without
    it, the kernel the grid named, e.g. for a cell stopped before it chose)."""
    info = method_info(spec)
    choice = choice or {"setting": spec.cp.local_kernel, "local_kernel": None}
    kern = choice["local_kernel"] or choice["setting"]
    known = kern in catalog.LOCAL_KERNELS and catalog.uses_local_kernel(info.name)
    out = {
        "name": info.name,
        "family": "cp",
        "summary": info.summary,
        "local_kernel": kern,
        "local_kernel_setting": choice["setting"],
        "local_kernel_summary": catalog.local_kernel(kern).summary if known else None,
        "library_version": catalog.library_version(kern)
        if known
        else f"torch {torch.__version__}",
    }
    if "reason" in choice:
        out["local_kernel_choice"] = {k: v for k, v in choice.items() if k != "setting"}
    if spec.own_class:  # your own method: which code, exactly
        from ...harness.environment import own_kernel_source

        out["source"] = own_kernel_source(spec.own_class)
    return out


def method_info(spec: CellSpec) -> catalog.MethodInfo:
    """The cell's method: a built-in one, or your own (imported from spec.own_class and
    registered under its name in this process)."""
    return catalog.resolve_method(spec.entry)


def device_name(device: str) -> str:
    """The device's name as records carry it (environment.device_name): auto's evidence must match."""
    if device == "cuda":
        return torch.cuda.get_device_name(int(os.environ.get("LOCAL_RANK", 0)))
    from ...harness.environment import cpu_model

    return cpu_model()


def choose(spec: CellSpec, out_path) -> dict:
    """The local kernel this cell runs (choose.choose_local_kernel), from the records under the
    output folder the cell's record goes to."""
    name = None
    if spec.cp.local_kernel == catalog.AUTO and method_info(spec).runs_local_kernel:
        if spec.device != "cuda" or torch.cuda.is_available():
            name = device_name(spec.device)
    return choose_local_kernel(spec, output_root(out_path, spec.to_dict()), name)


def static_outcome(spec: CellSpec, kernel: str | None):
    """(status, reason) known before anything runs (the same on every rank), or (None, None).
    `kernel`: the local kernel the cell runs (None: auto found none that can)."""
    if kernel is None:
        return S.UNSUPPORTED, "no local kernel can run this cell (local_kernel_choice says why)"
    p = spec.problem
    reason = catalog.unavailable_reason(spec.impl, kernel, spec.device, p.direction)
    if reason:
        return S.UNAVAILABLE, reason
    if spec.device == "cuda" and not torch.cuda.is_available():
        return S.UNAVAILABLE, "no CUDA device is visible"
    reason = catalog.unsupported_reason(
        spec.impl,
        kernel,
        p.mask,
        p.direction,
        spec.device,
        spec.cp.degrees,
        p.heads_q,
        p.heads_kv,
        spec.cp.dkv_comm_dtype,
    )
    if reason:
        return S.UNSUPPORTED, reason
    return None, None


class Failed(Exception):
    def __init__(self, status, reason):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _agree(rc, where):
    st, reason = run.agree(rc.guard, where)
    rc.guard.error = None
    if st is not None:
        raise Failed(st, reason)


def _gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _max_over_ranks(values, device):
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def measure_sample(session, rc, spec: CellSpec, mrun: MethodRun, seed: int, index, mask) -> dict:
    """Sample `index` on every rank: its timings (the maximum over ranks per repetition), the
    compute-only and communication-only runs, memory and bytes per rank."""
    device, p, how = session.device, spec.problem, spec.measurement
    direction = p.direction
    g = rc.guard

    method = None
    try:
        method = run.load_method(mrun, rc, mask)
    except S.CellOutcome as e:
        g.error = e
    inputs = None
    if method is not None and g.go:
        with g:
            method.setup(mrun.backward)
            inputs = run.rank_inputs(
                mrun, input_seed(seed, index, p.seqlen), method.positions, device
            )
            if direction == "bwd":
                method.forward(*inputs[:3])  # once, outside the timed region
    _agree(rc, "setup")
    q, k, v, dout = inputs

    if direction == "fwd":

        def call():
            return method.forward(q, k, v)
    elif direction == "bwd":

        def call():
            return method.backward(dout)
    else:

        def call():
            method.forward(q, k, v)
            return method.backward(dout)

    def before():
        dist.barrier()
        synchronize(device)

    times = time_ms(call, how.warmup, how.reps, device, before=before)
    _agree(rc, "timing")
    max_times = _max_over_ranks(times, device)

    split = {}
    if spec.cp.breakdown and session.world > 1 and catalog.uses_local_kernel(spec.impl):
        rc.comm.enabled = False  # compute-only: the same schedule, no transfer
        t_compute = time_ms(call, 1, how.reps, device, before=before)
        rc.comm.enabled = True
        g.compute = False  # communication-only: the same transfers, no computation
        t_comm = time_ms(call, 1, how.reps, device, before=before)
        g.compute = True
        _agree(rc, "the compute-only / communication-only runs")
        split = {
            "compute_only_ms": _max_over_ranks(t_compute, device),
            "comm_only_ms": _max_over_ranks(t_comm, device),
        }

    rc.comm.reset()
    mem = peak_memory(call, device)
    counted = {
        "sent": rc.comm.total_sent,
        "received": rc.comm.total_received,
        "by_kind_sent": dict(rc.comm.sent),
        "by_kind_received": dict(rc.comm.received),
    }
    _agree(rc, "the memory and byte-count run")

    mine = {
        "rank": session.rank,
        "coords": list(rc.deg.coords(session.rank)),
        **mem,
        "time_ms_median": quantiles(times)["median"],
        "bytes": counted,
        "bytes_analytic": method.volume(direction),
        "work_pairs": method.work(),
        "describe": method.describe(),
    }
    if hasattr(method, "replication_bytes"):
        mine["kv_replication_extra_bytes"] = method.replication_bytes(direction)
    ranks = _gather(mine)

    sample = {
        **sample_timings(index, mask, p.head_dim, direction, max_times, ranks=session.world),
        "peak_mem_bytes": max((r["peak_mem_bytes"] or 0) for r in ranks)
        if ranks[0]["peak_mem_bytes"] is not None
        else None,
        "peak_mem_increment_bytes": max((r["peak_mem_increment_bytes"] or 0) for r in ranks)
        if ranks[0]["peak_mem_increment_bytes"] is not None
        else None,
        "mem_source": ranks[0]["mem_source"],
        "ranks": ranks,
    }
    sample.update(_split_summary(split, sample["time_ms_median"]))
    sample.update(bytes_summary(ranks))
    work = [r["work_pairs"] for r in ranks]
    sample["work_pairs_total"] = int(sum(work))
    sample["load_balance"] = max(work) / (sum(work) / len(work)) if sum(work) else None
    return sample


def _split_summary(split, full_ms) -> dict:
    if not split:
        return {}
    c, m = (
        quantiles(split["compute_only_ms"])["median"],
        quantiles(split["comm_only_ms"])["median"],
    )
    hidden = c + m - full_ms
    return {
        "compute_only_ms": split["compute_only_ms"],
        "comm_only_ms": split["comm_only_ms"],
        "compute_only_ms_median": c,
        "comm_only_ms_median": m,
        # the share of the shorter of the two that the schedule hid behind the other
        "overlap_ratio": hidden / min(c, m) if min(c, m) > 0 else None,
    }


def bytes_summary(ranks) -> dict:
    sent = [r["bytes"]["sent"] for r in ranks]
    analytic = [r["bytes_analytic"]["sent"] for r in ranks]
    if analytic[0] is None:
        return {"bytes_counted": False}
    match = all(
        r["bytes"]["sent"] == r["bytes_analytic"]["sent"]
        and r["bytes"]["received"] == r["bytes_analytic"]["received"]
        for r in ranks
    )
    return {
        "bytes_counted": True,
        "bytes_sent_max": max(sent),
        "bytes_received_max": max(r["bytes"]["received"] for r in ranks),
        "bytes_analytic_max": max(analytic),
        "bytes_match_analytic": bool(match),
    }


def check_sample(session, spec: CellSpec, mrun: MethodRun, seed: int, index: int) -> dict:
    """Correctness at an affordable length: every rank's out, lse, dq, dk, dv vs float64."""
    factor = spec.measurement.check.tolerance_factor

    def check(mask, inputs_seed):
        return run.check_method(session, mrun, mask, inputs_seed, factor)

    return check_halving(spec, seed, index, check)


def check_halving(spec: CellSpec, seed: int, index: int, check) -> dict:
    """check(mask, input seed) -> verdict at the check's length; when the float64 check runs out
    of memory, again at half the length (never the method's oom). The distributed and the
    emulated cells share it."""
    p = spec.problem
    s, too_long = min(p.seqlen, spec.measurement.check.max_seqlen), []
    while True:
        if not catalog.uses_local_kernel(spec.impl):  # torch's context_parallel pads nothing
            s -= s % (2 * spec.gpus)
        if s < 1:
            raise CheckOutOfMemory(
                f"the float64 check ran out of memory at every length down to {too_long[-1]}"
            )
        mask = _check_mask(spec, seed, index, s)
        verdict = check(mask, input_seed(seed, index, s))
        if verdict["status"] != run.CHECK_OOM:
            break
        too_long.append(s)
        s //= 2
    verdict["mask_params"] = mask.params if s != p.seqlen else "same as the timed sample"
    if too_long:
        verdict["out_of_memory_at_seqlen"] = too_long
    return verdict


def _check_mask(spec: CellSpec, seed: int, index: int, s: int):
    """At the cell's own length, the timed sample's mask (the index-th draw); else one of its own."""
    if s == spec.problem.seqlen:
        rng, draws = mask_rng(seed), index + 1
    else:
        rng, draws = check_mask_rng(seed, index, s), 1
    for _ in range(draws):
        mask = spec_mask(spec.problem, s, rng)
    return mask


def measure(record, session, spec: CellSpec, kernel: str) -> tuple:
    """Every sample of the cell over `kernel` (its chosen local kernel): (status, reason)."""
    mrun = MethodRun.of_cell(spec, kernel)
    rc = session.context(mrun)
    limit_memory_if_asked(session.rank)  # after the groups (and their threads) exist
    p, how, seed = spec.problem, spec.measurement, record["data_seed"]
    rng = mask_rng(seed)
    try:
        for i in range(n_samples(p, how)):
            mask = spec_mask(p, p.seqlen, rng)
            sample = measure_sample(session, rc, spec, mrun, seed, i, mask)
            if i < checked_samples(p, how):
                verdict = check_sample(session, spec, mrun, seed, i)
                if verdict["status"] not in (S.OK, S.INCORRECT):
                    raise Failed(verdict["status"], verdict["reason"])
                sample["check"] = verdict
            record["samples"].append(sample)
    except Failed as e:
        return e.status, e.reason
    return checked_outcome(record["samples"])


def cp_summary(record, spec: CellSpec):
    """Cell-level CP facts (medians over samples), and the tidy-table columns. The local kernel
    is the one that ran (record["kernel"]), its setting the grid's (auto or a name)."""
    samples = record["samples"]
    ran = record["kernel"].get("local_kernel")

    def med(key):
        values = [s.get(key) for s in samples]
        return float(np.median(values)) if samples and all(v is not None for v in values) else None

    c, deg = spec.cp, spec.cp.degrees
    out = {
        "degrees": dataclasses.asdict(deg),  # every field, split_documents at its default too
        "local_kernel": ran,
        "local_kernel_setting": c.local_kernel,
        "dkv_comm_dtype": c.dkv_comm_dtype,
        "nodes": c.nodes,
        "nproc_per_node": c.nproc_per_node,
    }
    if samples:
        out.update(
            compute_only_ms=med("compute_only_ms_median"),
            comm_only_ms=med("comm_only_ms_median"),
            overlap_ratio=med("overlap_ratio"),
            load_balance=med("load_balance"),
            bytes_sent_max=med("bytes_sent_max"),
            bytes_analytic_max=med("bytes_analytic_max"),
            bytes_match_analytic=all(s.get("bytes_match_analytic", False) for s in samples)
            if samples[0].get("bytes_counted")
            else None,
            kv_replication_extra_bytes=max(
                r.get("kv_replication_extra_bytes", 0) for s in samples for r in s["ranks"]
            ),
        )
    record["cp"] = out
    record["table_extra"] = {
        "method": spec.impl,
        "local_kernel": ran,
        "local_kernel_setting": c.local_kernel,
        "dkv_comm_dtype": c.dkv_comm_dtype,
        "ulysses_degree": deg.ulysses,
        "ring_degree": deg.ring,
        "windows": deg.windows,
        "placement": deg.placement,
        "split_documents": deg.split_documents,
        "nodes": c.nodes,
        "tokens_per_gpu": spec.tokens_per_gpu,
        "tflops_per_gpu": record.get("tflops"),
        **{
            k: out.get(k)
            for k in (
                "compute_only_ms",
                "comm_only_ms",
                "overlap_ratio",
                "load_balance",
                "bytes_sent_max",
                "bytes_analytic_max",
                "bytes_match_analytic",
                "kv_replication_extra_bytes",
            )
        },
    }


def run_cp_cell(spec: CellSpec, out_path, peak: dict | None = None):
    crash_if_asked(spec)
    t0 = time.perf_counter()
    rank = int(os.environ.get("RANK", 0))
    method_info(spec)  # your own method: registered before anything looks it up by name
    choice = choose(spec, out_path)
    record = base_record(spec, implementation(spec, choice), provenance(spec))
    status, reason = static_outcome(spec, choice["local_kernel"])
    session = None
    if status is None:
        device = run.init(spec.device, spec.cp.timeout_s)
        session = run.Session(device)
        hang_if_asked(
            spec, keep_alive=dist.barrier
        )  # a hang inside the process group, collectives running
        # what runs: the chosen local kernel (the record's cell keeps the grid's setting)
        status, reason = measure(record, session, spec, choice["local_kernel"])
    finish_record(
        record,
        status,
        reason,
        peak,
        spec.device,
        gpus=spec.gpus,
        t0=t0,
        summary=lambda r: cp_summary(r, spec),
    )
    if rank == 0:
        write_record(record, out_path)
    if session is not None:
        dist.barrier()
        dist.destroy_process_group()
    return record
