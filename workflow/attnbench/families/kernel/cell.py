"""Run one kernel cell and build its record (docs/measurement.md).

A cell always ends in a record (ok, oom, unsupported, unavailable, incorrect) unless the
process itself fails; then no record is written and the Snakemake job fails.
"""

from __future__ import annotations

import time

import numpy as np

from ... import launch
from ...grid.spec import CellSpec
from ...harness.faults import crash_if_asked, hang_if_asked
from ...harness.inputs import (
    check_mask_rng,
    input_seed,
    make_inputs,
    mask_rng,
    torch_dtype,
)
from ...harness.machine import snapshot
from ...harness.samples import (
    CheckOutOfMemory,
    check_seqlen,
    checked_outcome,
    checked_samples,
    n_samples,
    shorter_check_seqlen,
    spec_mask,
)
from ...kernels import catalog
from ...kernels.import_memo import known_to_load, remember_loads
from ...record import status as S
from ...record.record import base_record, finish_record
from .provenance import provenance


def implementation(spec: CellSpec) -> dict:
    """What a kernel cell runs: the kernel of the catalog named by spec.impl (or your own)."""
    info = kernel_info(spec)
    out = {
        "name": info.name,
        "family": info.family,
        "summary": info.summary,
        "library_version": catalog.library_version(info),
        "notes": dict(info.notes),
    }
    if spec.own_class:  # your own kernel: which code, exactly
        from ...harness.environment import own_kernel_source

        out["source"] = own_kernel_source(spec.own_class)
    return out


def kernel_info(spec: CellSpec) -> "catalog.KernelInfo":
    """The cell's kernel: a built-in one, or your own (imported from spec.own_class)."""
    return catalog.resolve(spec.entry)


def installed_reason(info, device: str) -> str | None:
    """Why the kernel cannot run here, known without touching a device (its devices, its
    library), or None."""
    if device not in info.devices:
        return f"{info.name} runs only on {', '.join(info.devices)}, not on {device}"
    missing = catalog.missing_module(info)
    if missing:
        return f"{info.name} needs the Python module {' or '.join(map(repr, missing.split('|')))}, which is not installed"
    return None


def ends_without_gpu(spec: CellSpec) -> bool:
    """A cell that will only write why it cannot run (library missing, mask unsupported): it
    needs no GPU, so it does not wait for one (claim_gpu_after_start). Libraries an earlier job
    saw load here are not imported again (kernels/import_memo.py)."""
    info = kernel_info(spec)
    if spec.device in info.devices and known_to_load(info):
        return bool(unsupported(info, spec))
    return bool(
        installed_reason(info, spec.device) or unsupported(info, spec) or import_failure(info)
    )


def import_failure(info) -> str | None:
    """Why an installed library of the kernel cannot load here (built for another CUDA, say), or
    None: the cell then records it `unavailable` without a GPU. torch is imported first, as in the
    process that measures: a binary extension may link torch's libraries, which only `import torch`
    loads (block_sparse_attn fails without it; judged unloadable, its cells once measured without
    waiting for their GPU). A kernel of torch alone (no modules of its own) always loads: not
    importing it keeps torch out of a job whose worker measures."""
    from ...kernels.base import LOAD_ERRORS, kernel_class, load_error

    if not info.modules:
        return None
    import torch  # noqa: F401

    try:
        kernel_class(info).import_modules(info)
    except LOAD_ERRORS as e:
        return f"{info.name}: importing {', '.join(info.modules)} failed: {load_error(e)}"
    remember_loads(info)
    return None


def unsupported(info, spec: CellSpec) -> str | None:
    p = spec.problem
    return catalog.unsupported_reason(
        info, p.mask, p.direction, spec.device, p.heads_q, p.heads_kv, p.mask_params
    )


def availability_reason(info, device: str) -> str | None:
    """Why the kernel cannot run on this machine at all (library or device), or None."""
    reason = installed_reason(info, device)
    if reason:
        return reason
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device is visible"
        cap = torch.cuda.get_device_capability()
        if info.min_capability and tuple(cap) < tuple(info.min_capability):
            return (
                f"{info.name} needs compute capability {info.min_capability}, the device has {cap}"
            )
    return None


def run_kernel(kernel, fn, q, k, v, dout, direction):
    """(out, (dq, dk, dv) or None) in thd layout, as the timed call computes them."""
    import torch

    from ...kernels.base import from_thd, to_thd

    lay = kernel.layout
    leaves = [from_thd(x, lay).requires_grad_(direction != "fwd") for x in (q, k, v)]
    if direction == "fwd":
        with torch.no_grad():
            return to_thd(fn(*leaves), lay), None
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, from_thd(dout, lay))
    return to_thd(out.detach(), lay), tuple(to_thd(g, lay) for g in grads)


def check_correctness(kernel, fn, mask, q, k, v, dout, direction, factor) -> dict:
    """The gate (gate.judge): the kernel's and naive attention's errors in the same dtype
    against float64, the tolerance, the criterion and the verdict."""
    from ...harness.gate import judge
    from ...harness.reference import reference_attention
    from ...kernels.naive import Naive

    needs_grad = direction != "fwd"
    ref_out, _, ref_grads = reference_attention(q, k, v, mask, dout if needs_grad else None)
    naive = Naive(
        catalog.get("naive"),
        kernel.device,
        kernel.dtype,
        kernel.heads_q,
        kernel.heads_kv,
        kernel.head_dim,
    )
    names = ("out", "dq", "dk", "dv") if needs_grad else ("out",)
    ref = dict(zip(names, (ref_out, *(ref_grads or ()))))
    results = {}
    for who, kern, f in (("kernel", kernel, fn), ("naive", naive, naive.prepare(mask))):
        out, grads = run_kernel(kern, f, q, k, v, dout, direction)
        results[who] = dict(zip(names, (out, *(grads or ()))))
    return {
        "seqlen": mask.seqlen,
        **judge(results["kernel"], results["naive"], ref, q.dtype, factor, k.shape[0]),
    }


# ---------------------------------------------------------------- the cell


def measure_sample(kernel, spec: CellSpec, seed: int, index: int, rng) -> dict:
    """Sample `index`: its mask (the next draw of rng), inputs (of the cell's data seed), timings,
    memory, and for a checked sample its check."""
    run = SampleRun(kernel, spec, seed, index, rng)
    return run.finish([run.time(spec.measurement.reps)])


def draw(spec: CellSpec, seed: int, index: int, rng, clock=None):
    """Sample `index`'s mask (the next draw of rng) and inputs (of the cell's data seed): the same
    for every kernel at the point."""
    from contextlib import nullcontext

    p = spec.problem
    with clock.phase("mask") if clock else nullcontext():
        mask = spec_mask(p, p.seqlen, rng)
    with clock.phase("inputs") if clock else nullcontext():
        inputs = make_inputs(
            input_seed(seed, index, p.seqlen),
            p.seqlen,
            p.heads_q,
            p.heads_kv,
            p.head_dim,
            torch_dtype(p.dtype),
            spec.device,
        )
    return mask, inputs


class SampleRun:
    """One sample of a kernel cell, in three steps: prepared (its mask, the next draw of rng; its
    inputs, of the cell's data seed; the kernel's call, called once), timed in one or more windows
    (`time`: a side-by-side point times its contenders' windows in turn, families/kernel/point.py),
    and finished (memory, the check, the sample's record)."""

    def __init__(self, kernel, spec: CellSpec, seed: int, index: int, rng, drawn=None):
        from ...harness.measure import DeviceClock

        self.kernel, self.spec, self.seed, self.index = kernel, spec, seed, index
        self.clock = clock = DeviceClock(spec.device)
        if drawn is not None:  # a side-by-side draw: every contender times the very same tensors
            self.mask, self.inputs = drawn
        else:
            self.mask, self.inputs = draw(spec, seed, index, rng, clock)
        self.windows = 0
        self.prepare()

    def prepare(self):
        """The kernel's call on the sample's mask and inputs: prepared (kernel.prepare), its
        tensors in the kernel's layout, called once (compilation and lazy loading)."""
        import torch

        from ...kernels.base import from_thd

        kernel, clock, direction = self.kernel, self.clock, self.spec.problem.direction
        q, k, v, dout = self.inputs
        with clock.phase("prepare"):
            fn = self.fn = kernel.prepare(self.mask)
        lay = kernel.layout
        leaves = [from_thd(x, lay).requires_grad_(direction != "fwd") for x in (q, k, v)]
        dout_l = from_thd(dout, lay)
        self.before = None
        if direction == "fwd":

            def call():
                with torch.no_grad():
                    return fn(*leaves)
        elif direction == "bwd" and kernel.backward_once:
            # its graph frees itself in the backward (TransformerEngine's): a new forward before each
            # timed backward, outside the timed region (time_ms's `before`)
            with clock.phase("first_call"):
                graph = [well_formed(fn(*leaves), leaves[0], lay)]

            def before():
                if graph[0] is None:
                    graph[0] = fn(*leaves)

            def call():
                before()  # the untimed calls (warm-up) have no `before` of their own
                out, graph[0] = graph[0], None
                return torch.autograd.grad(out, leaves, dout_l)

            self.before = before
        elif direction == "bwd":
            with clock.phase("first_call"):
                out = well_formed(
                    fn(*leaves), leaves[0], lay
                )  # forward once, outside the timed region

            def call():
                return torch.autograd.grad(out, leaves, dout_l, retain_graph=True)
        else:
            with clock.phase("first_call"), torch.no_grad():
                well_formed(fn(*leaves), leaves[0], lay)  # before the backward fails on it

            def call():
                return torch.autograd.grad(fn(*leaves), leaves, dout_l)

        self.call = call
        with clock.phase(
            "first_call"
        ):  # compilation and lazy loading: one more warm-up, not busy time
            first = call()
        if direction == "fwd":
            well_formed(first, leaves[0], lay)

    def time(self, reps: int, settle_min_s: float | None = None):
        """One timed window of `reps` repetitions (harness.measure.time_call). On a CPU a window
        after the first prepares the call again: where the kernel's buffers land moves a CPU call
        by several percent for as long as they live (two copies of one kernel timed 2-7% apart,
        steadily), so each window gets new ones; a GPU's timing, its L2 flushed, does not see it."""
        from ...harness.measure import time_call

        if self.windows and self.spec.device == "cpu":
            self.prepare()
        self.windows += 1
        with self.clock.phase("timed", busy=True):
            return time_call(
                self.call,
                self.spec.measurement.warmup,
                reps,
                self.spec.device,
                before=self.before,
                settle_min_s=settle_min_s,
            )

    def finish(self, timings: list) -> dict:
        """The sample: its windows' times, memory, and for a checked sample its check."""
        from ...harness.measure import merge_timings, peak_memory, sample_timings

        p, how, device = self.spec.problem, self.spec.measurement, self.spec.device
        timing = merge_timings(timings)
        with self.clock.phase("memory", busy=True):
            if self.before:
                self.before()
            mem = peak_memory(self.call, device)
        sample = {
            **sample_timings(self.index, self.mask, p.head_dim, p.direction, timing.device_ms),
            **timing.sample_fields(),
            **mem,
        }
        if len(timings) > 1:  # side by side: each window's median, for the verdict on few draws
            sample["window_medians_ms"] = [float(np.median(t.device_ms)) for t in timings]
        if self.index < checked_samples(p, how):
            s_check = check_seqlen(p, how.check.max_seqlen)
            timed = (self.mask, *self.inputs, self.fn) if s_check == p.seqlen else None
            # what the timed call held is freed before a check at another length
            self.fn = self.call = self.before = self.inputs = None
            with self.clock.phase("check", busy=True):
                sample["check"] = check_sample(
                    self.kernel, self.spec, self.seed, self.index, s_check, timed
                )
        self.fn = self.call = self.before = self.inputs = None
        sample["device_busy_ms"], sample["phases_s"] = self.clock.ms, self.clock.phases
        return sample


def well_formed(out, q, layout: str):
    """The kernel's output, if it is a tensor of the query's shape (attention gives each query
    token heads_q x head_dim values, in the kernel's layout) and of the cell's dtype; else the
    cell is `incorrect` (S.Incorrect), naming what was expected."""
    import torch

    if not isinstance(out, torch.Tensor):
        raise S.Incorrect(f"the kernel returned a {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(q.shape):
        raise S.Incorrect(
            f"the kernel's output has shape {list(out.shape)}; expected {list(q.shape)}, the "
            f"query's in its layout {layout}"
        )
    if out.dtype != q.dtype:
        raise S.Incorrect(
            f"the kernel's output is {str(out.dtype).removeprefix('torch.')}; expected "
            f"{str(q.dtype).removeprefix('torch.')}, the cell's dtype"
        )
    return out


def check_sample(kernel, spec: CellSpec, seed: int, index: int, s_check: int, timed) -> dict:
    """The gate at `s_check` (on the timed sample's mask and inputs when `timed` holds them);
    when the check itself runs out of memory, again at a shorter length (never the kernel's oom)."""
    p, device = spec.problem, spec.device
    too_long = []
    while True:
        try:
            if s_check == p.seqlen:
                mask, q, k, v, dout, fn = timed
            else:
                mask = spec_mask(p, s_check, check_mask_rng(seed, index, s_check))
                q, k, v, dout = make_inputs(
                    input_seed(seed, index, s_check),
                    s_check,
                    p.heads_q,
                    p.heads_kv,
                    p.head_dim,
                    torch_dtype(p.dtype),
                    device,
                )
                fn = kernel.prepare(mask)
            factor = spec.measurement.check.tolerance_factor
            chk = check_correctness(kernel, fn, mask, q, k, v, dout, p.direction, factor)
            chk["mask_params"] = mask.params if s_check != p.seqlen else "same as the timed sample"
            if too_long:
                chk["out_of_memory_at_seqlen"] = too_long
            return chk
        except Exception as e:  # noqa: BLE001 - an OOM of the check retries shorter; the rest propagates
            if not S.is_oom(e):
                raise
            reason = str(e).splitlines()[0][:300]
        # outside the except block, so the traceback (and the tensors its frames hold) is freed
        mask = q = k = v = dout = fn = None
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()
        shorter = shorter_check_seqlen(p, s_check)
        if shorter is None:
            raise CheckOutOfMemory(
                f"the correctness check ran out of memory at every length down to {s_check}: "
                f"{reason}"
            )
        too_long.append(s_check)
        s_check = shorter


def run_cell(spec: CellSpec, peak: dict | None = None, measure: bool = True) -> dict:
    """Measure one cell; return its record. Raises only on a crash (no record then).
    measure=False: the job holds no GPU (ends_without_gpu): the record says why the cell cannot
    run, and a kernel that loads after all is an error, never measured without its GPU."""
    crash_if_asked(spec)
    hang_if_asked(spec)
    code = provenance(spec)  # before implementation() imports your own kernel
    record = base_record(spec, implementation(spec), code)
    info = kernel_info(spec)
    t0 = time.perf_counter()
    outcome = availability_reason(info, spec.device)
    status, reason = (S.UNAVAILABLE, outcome) if outcome else (None, None)
    if status is None:
        reason = unsupported(info, spec)
        status = S.UNSUPPORTED if reason else None
    if status is None and not measure:
        reason = import_failure(info)
        if reason is None:
            raise RuntimeError(
                f"{spec.impl}: the job judged that this cell ends without a GPU, but its "
                "kernel loads: not measuring it without holding the GPU"
            )
        status = S.UNAVAILABLE
    if status is None:
        record["machine"] = {"start": snapshot(spec.device)}
        status, reason = _measure(record, info, spec)
        record["machine"]["end"] = snapshot(spec.device)
    launch.release_gpus()  # the rest writes the record: the next cell may take the GPU
    finish_record(record, status, reason, peak, spec.device, t0=t0)
    record.update(process_timing())
    return record


def process_timing() -> dict:
    """Where this process' time went: since it started (imports included), and waiting for a GPU."""
    from ... import STARTED

    return {"process_s": time.time() - STARTED, "gpu_wait_s": launch.CLAIM_WAIT_S}


def _measure(record, info, spec: CellSpec):
    from ...kernels.base import load

    p = spec.problem
    kernel = load(
        info,
        device=spec.device,
        dtype=torch_dtype(p.dtype),
        heads_q=p.heads_q,
        heads_kv=p.heads_kv,
        head_dim=p.head_dim,
    )
    try:
        return _measure_samples(record, kernel, spec)
    finally:  # how the library was loaded, also when it could not be
        record["kernel"]["notes"].update(getattr(kernel, "load_notes", {}))


def _measure_samples(record, kernel, spec: CellSpec):
    import torch

    seed = record["data_seed"]
    rng = mask_rng(seed)
    try:
        for i in range(n_samples(spec.problem, spec.measurement)):
            record["samples"].append(measure_sample(kernel, spec, seed, i, rng))
    except S.CellOutcome as e:
        return e.status, e.reason
    except Exception as e:  # noqa: BLE001 - anything else that is an OOM is a record, the rest a crash
        if S.is_oom(e) and not isinstance(e, CheckOutOfMemory):
            if spec.device == "cuda":
                torch.cuda.empty_cache()
            return (
                S.OOM,
                f"out of memory at sample {len(record['samples'])}: {str(e).splitlines()[0][:300]}",
            )
        raise
    return checked_outcome(record["samples"])


def record_skeleton(spec) -> dict:
    """The record a cell (grid.spec.CellSpec) starts with."""
    from ...record.record import base_record
    from .provenance import provenance

    return base_record(spec, implementation(spec), provenance(spec))
