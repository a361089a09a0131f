"""Timing, memory and quantiles: the one place where anything is timed (docs/measurement.md)."""

from __future__ import annotations

import gc
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch


def quantiles(values) -> dict:
    """median, p20 and p80 of a list (for times, p20 is the fast end)."""
    a = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(a)),
        "p20": float(np.percentile(a, 20)),
        "p80": float(np.percentile(a, 80)),
    }


def sample_timings(index: int, mask, head_dim: int, direction: str, times, ranks: int = 1) -> dict:
    """What a timed sample records first: its mask, FLOPs, times (ms) and their quantiles, and
    the median TFLOP/s (per rank where `ranks` share the work)."""
    from .flops import attention_flops

    flops = attention_flops(sum(mask.area_per_head), head_dim, direction)
    tq = quantiles(times)
    return {
        "index": index,
        "mask_params": mask.params,
        "mask_area": mask.area,
        "flops": flops,
        "time_ms": times,
        **{f"time_ms_{k}": v for k, v in tq.items()},
        "tflops_median": flops / (tq["median"] * 1e-3) / 1e12 / ranks,
    }


def release_memory() -> None:
    """Give dropped tensors' memory back now: objects that refer to one another (an emulated world's
    method, its rank context, the closures of its schedule) keep their tensors until Python's cycle
    collector runs, which it does by object counts, not by device memory; then the allocator's cache."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class L2Flush:
    """Overwrites a buffer of twice the L2 size so every timed repetition starts cold."""

    def __init__(self, device):
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", 0) or 64 * 2**20
        self.bytes = 2 * l2
        self.buf = torch.empty(self.bytes // 4, dtype=torch.int32, device=device)

    def __call__(self):
        self.buf.zero_()


def time_ms(fn, warmup: int, reps: int, device, flush: bool = True, before=None) -> list[float]:
    """Milliseconds of `reps` calls of fn() after `warmup` untimed calls.

    GPU: CUDA events around each call, the L2 overwritten (untimed) before each one.
    CPU: perf_counter around each call. `before()` runs untimed before each timed call
    (distributed cells: a barrier and a device synchronisation).
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    out = []
    if torch.device(device).type == "cuda":
        flusher = L2Flush(device) if flush else None
        for _ in range(reps):
            if flusher:
                flusher()
            if before:
                before()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            if before:
                before()
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


# How a GPU call is timed (docs/measurement.md, "Timing"): settled clocks first, then repetitions
# back to back on the stream, then a few calls as a caller sees them.
SETTLE_MIN_S = 0.25  # back-to-back calls before every timed window, at least
SETTLE_MAX_S = 2.0  # ... and at most: a window that did not settle by then says so
SETTLE_TOLERANCE = 0.01  # settled: two successive batches' per-call times within 1%
SETTLE_BATCH_MS = 50.0  # the work in one batch of the settling calls
WALL_REPS = 5  # calls timed as a caller sees them (host synchronised), for the host's overhead
HEAD_START_MAX_MS = 50.0  # the longest the stream is held while the host queues the repetitions


@dataclass
class KernelTiming:
    """One timed window of a call: the device's time per repetition (`device_ms`, what verdicts
    and TFLOP/s use), the call's wall time as a caller sees it (`wall_ms`; None on a CPU, where
    the two are one), how the GPU was settled before it and what NVML read during it.
    `queued_ahead`: the host had queued every repetition while the stream was still held, so no
    repetition waited for the host (False: some may have; None on a CPU)."""

    device_ms: list[float]
    wall_ms: list[float] | None = None
    settle: dict | None = None
    head_start_ms: float | None = None
    window: dict | None = None
    queued_ahead: bool | None = None

    @property
    def host_overhead_ms(self) -> float | None:
        """The caller's median time over the device's: launch and Python work a caller pays."""
        if not self.wall_ms:
            return None
        return float(np.median(self.wall_ms) - np.median(self.device_ms))

    def sample_fields(self) -> dict:
        """What a sample records beyond its device times (sample_timings)."""
        if self.wall_ms is None:
            return {"timing": "host_clock", "settle": self.settle}
        return {
            "timing": "device_back_to_back",
            "wall_ms": self.wall_ms,
            "host_overhead_ms": self.host_overhead_ms,
            "settle": self.settle,
            "head_start_ms": self.head_start_ms,
            "queued_ahead": self.queued_ahead,
            "gpu_window": self.window,
        }


def _events(n: int):
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


_SLEEP_CYCLES_PER_MS: dict = {}


def sleep_cycles_per_ms(device) -> float:
    """torch.cuda._sleep's cycles per millisecond on this GPU, measured once per process."""
    key = str(torch.device(device))
    if key not in _SLEEP_CYCLES_PER_MS:
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # a first call loads it
        start, end = _events(2)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_MS[key] = cycles / max(start.elapsed_time(end), 1e-3)
    return _SLEEP_CYCLES_PER_MS[key]


def settle(fn, warmup: int, device, min_s: float = SETTLE_MIN_S) -> dict:
    """Back-to-back calls until the GPU runs the call at its steady clocks and power, never from
    idle: at least `warmup` calls and SETTLE_MIN_S, in batches of about SETTLE_BATCH_MS of work,
    until two successive batches' per-call device times agree within SETTLE_TOLERANCE (else
    SETTLE_MAX_S, and `settled` is false). Also measures what queueing one call costs the host."""
    for _ in range(warmup):  # a first call's compilation or autotuning is not settling
        fn()
    t0 = time.perf_counter()
    start, end = _events(2)
    start.record()
    fn()
    end.record()
    end.synchronize()
    per_call = max(start.elapsed_time(end), 1e-3)
    n = max(1, int(SETTLE_BATCH_MS / per_call))
    batches, enqueue, calls = [], [], warmup + 1
    while True:
        start, end = _events(2)
        start.record()
        h0 = time.perf_counter()
        for _ in range(n):
            fn()
        enqueue.append((time.perf_counter() - h0) * 1e3 / n)
        end.record()
        end.synchronize()
        batches.append(start.elapsed_time(end) / n)
        calls += n
        elapsed = time.perf_counter() - t0
        settled = len(batches) >= 2 and abs(batches[-1] / batches[-2] - 1) <= SETTLE_TOLERANCE
        if (settled and elapsed >= min_s) or elapsed >= SETTLE_MAX_S:
            break
    return {
        "calls": calls,
        "seconds": round(elapsed, 3),
        "settled": settled,
        "last_batches_ms": [round(b, 5) for b in batches[-2:]],
        "enqueue_ms": float(np.median(enqueue)),
    }


def time_gpu_call(
    fn,
    warmup: int,
    reps: int,
    device,
    flush: bool = True,
    before=None,
    settle_min_s: float | None = None,
) -> KernelTiming:
    """The device's time of `reps` calls of fn() and a caller's time of WALL_REPS more, after the
    GPU is settled (settle).

    Device time: the repetitions are queued back to back with no host synchronisation between
    them, each between two CUDA events, the L2 overwritten before each (outside its events), as
    triton.testing.do_bench does. The stream is first held by a sleep long enough for the host
    to queue every repetition (at most HEAD_START_MAX_MS), so that no repetition waits for the
    host: the events measure the call's work on the GPU alone. Checked, not assumed: an event
    recorded after the sleep must still be pending when the last repetition is queued; where it is
    not (the host queued slower than during the settle), the window is queued once more behind
    twice the host's queueing time, and `queued_ahead` says how the kept one went. Wall time: each call between two
    synchronisations, as a caller that waits for its result sees it. `before()` runs before each
    call, outside both (a backward's forward, where the graph frees itself)."""
    from .machine import WindowSampler

    state = settle(fn, warmup, device, SETTLE_MIN_S if settle_min_s is None else settle_min_s)
    flusher = L2Flush(device) if flush else None
    head_start = min(HEAD_START_MAX_MS, 1.0 + 1.25 * reps * state["enqueue_ms"])
    with WindowSampler(device) as window:
        device_ms, queue_ms, ahead = _queued_window(fn, reps, device, flusher, before, head_start)
        if not ahead and queue_ms < HEAD_START_MAX_MS / 2:
            # the host queued slower than during the settle (a busy host, the first window of a
            # process): once more with room for what it took; a call that waits for the GPU
            # itself queues as long as the window runs and is not retried
            head_start = min(HEAD_START_MAX_MS, 1.0 + 2.0 * queue_ms)
            device_ms, queue_ms, ahead = _queued_window(
                fn, reps, device, flusher, before, head_start
            )
        wall = []
        for _ in range(WALL_REPS):
            if flusher:
                flusher()
            if before:
                before()
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            wall.append((time.perf_counter() - t0) * 1e3)
    return KernelTiming(device_ms, wall, state, head_start, window.summary, ahead)


def _queued_window(fn, reps, device, flusher, before, head_start_ms):
    """`reps` repetitions queued behind a sleep of `head_start_ms` on the stream: their device
    times, how long the host took to queue them (ms), and whether it finished while the stream was
    still held (an event after the sleep not yet reached), which is what makes each repetition's
    events time the GPU's work alone."""
    starts, ends = _events(reps), _events(reps)
    held = torch.cuda.Event()
    torch.cuda._sleep(int(head_start_ms * sleep_cycles_per_ms(device)))
    held.record()
    h0 = time.perf_counter()
    for i in range(reps):
        if flusher:
            flusher()
        if before:
            before()
        starts[i].record()
        fn()
        ends[i].record()
    queue_ms = (time.perf_counter() - h0) * 1e3
    ahead = not held.query()
    ends[-1].synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)], queue_ms, ahead


# A CPU settles too: its first calls of a shape pay for the allocator's growth, page faults and
# oneDNN's primitive creation (on a 2-core machine the first of two identical kernels timed alone
# came out 1.1-1.8x slower than the second at 256-512 tokens).
CPU_SETTLE_MIN_S = 0.1
CPU_SETTLE_MAX_S = 1.0
CPU_SETTLE_BATCH_MS = 10.0
CPU_SETTLE_TOLERANCE = 0.03


def settle_cpu(fn, warmup: int, min_s: float = CPU_SETTLE_MIN_S) -> dict:
    """Back-to-back calls on the CPU until two successive batches of about CPU_SETTLE_BATCH_MS agree
    within CPU_SETTLE_TOLERANCE per call, and at least CPU_SETTLE_MIN_S (at most CPU_SETTLE_MAX_S)."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    per_call = max((time.perf_counter() - t0) * 1e3, 1e-3)
    n = max(1, int(CPU_SETTLE_BATCH_MS / per_call))
    batches, calls = [], warmup + 1
    while True:
        b0 = time.perf_counter()
        for _ in range(n):
            fn()
        batches.append((time.perf_counter() - b0) * 1e3 / n)
        calls += n
        elapsed = time.perf_counter() - t0
        settled = len(batches) >= 2 and abs(batches[-1] / batches[-2] - 1) <= CPU_SETTLE_TOLERANCE
        if (settled and elapsed >= min_s) or elapsed >= CPU_SETTLE_MAX_S:
            return {
                "calls": calls,
                "seconds": round(elapsed, 3),
                "settled": settled,
                "last_batches_ms": [round(x, 5) for x in batches[-2:]],
            }


def time_call(
    fn, warmup: int, reps: int, device, before=None, settle_min_s: float | None = None
) -> KernelTiming:
    """A kernel cell's timed window: time_gpu_call on a GPU; on a CPU, settle_cpu then time_ms (the
    host is the device there). `settle_min_s`: a shorter settle for a window that follows others
    of the same sample on a busy device (None: the device's default)."""
    if torch.device(device).type == "cuda":
        return time_gpu_call(fn, warmup, reps, device, before=before, settle_min_s=settle_min_s)
    state = settle_cpu(fn, warmup, CPU_SETTLE_MIN_S if settle_min_s is None else settle_min_s)
    return KernelTiming(time_ms(fn, 0, reps, device, before=before), settle=state)


def merge_timings(timings: list[KernelTiming]) -> KernelTiming:
    """One sample's windows as one timing: their repetitions and calls together, each window's
    settle, NVML's readings of all of them (machine.merge)."""
    from .machine import merge

    if len(timings) == 1:
        return timings[0]
    wall = [w for t in timings for w in (t.wall_ms or [])]
    return KernelTiming(
        [d for t in timings for d in t.device_ms],
        wall or None,
        {"windows": [t.settle for t in timings]},
        max((t.head_start_ms or 0.0) for t in timings) if wall else None,
        merge([t.window for t in timings if t.window]),
        all(t.queued_ahead for t in timings) if wall else None,
    )


class DeviceClock:
    """Where a cell's time goes, phase by phase (seconds, the device synchronised at both ends of
    each), and the part of it the device was kept busy: the warm-up and timed repetitions, the memory
    call and the correctness check (`busy=True` phases), the numerator of the harness's busy share
    (benchmarks/harness_throughput.py). A kernel's first call (compilation, lazy loading) is a phase
    of its own and not counted as busy."""

    def __init__(self, device):
        self.device, self.ms, self.phases = device, 0.0, {}

    @contextmanager
    def phase(self, name: str, busy: bool = False):
        synchronize(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            dt = time.perf_counter() - t0
            self.phases[name] = self.phases.get(name, 0.0) + dt
            if busy:
                self.ms += dt * 1e3


def _proc_status_bytes(field: str):
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{field}:\s+(\d+)\s+kB", f.read(), re.M)
        return int(m.group(1)) * 1024 if m else None
    except OSError:
        return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the VmHWM high-water mark to the current RSS
        return True
    except OSError:
        return False


def peak_memory(fn, device) -> dict:
    """Peak bytes during one untimed call: absolute and the increment over what was there before.

    GPU: the caching allocator's peak of allocated bytes. CPU: the process' resident-set
    high-water mark (Linux), which also counts what the allocator had not returned.
    """
    if torch.device(device).type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        return {
            "peak_mem_bytes": int(peak),
            "peak_mem_increment_bytes": int(peak - before),
            "mem_source": "cuda_allocator",
        }
    # The baseline is the high-water mark just after its reset (the RSS then). The kernel's RSS
    # counters are approximate (per-thread caches synced now and then), so the mark read after the
    # call can still fall a few pages below it when memory is freed: the call held at least what
    # the process held as it began, hence the peak is at least the baseline.
    before = _proc_status_bytes("VmHWM") if _reset_peak_rss() else None
    if before is None:
        fn()
        return {
            "peak_mem_bytes": None,
            "peak_mem_increment_bytes": None,
            "mem_source": "unavailable",
        }
    fn()
    peak = max(_proc_status_bytes("VmHWM"), before)
    return {
        "peak_mem_bytes": peak,
        "peak_mem_increment_bytes": peak - before,
        "mem_source": "process_rss",
    }


def matmul_peak_tflops(device, dtype, n: int | None = None, reps: int = 10) -> dict:
    """The device's dense matmul ceiling in `dtype`: the best of `reps` n x n x n products."""
    dev = torch.device(device)
    n = n or (8192 if dev.type == "cuda" else 1024)
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, generator=gen).to(dtype)
    b = torch.randn(n, n, device=dev, generator=gen).to(dtype)
    times = time_ms(lambda: a @ b, warmup=3, reps=reps, device=dev, flush=False)
    best = min(times)
    return {
        "matmul_n": n,
        "matmul_dtype": str(dtype).replace("torch.", ""),
        "matmul_ms_best": best,
        "matmul_peak_tflops": 2.0 * n**3 / (best * 1e-3) / 1e12,
    }


def matmul_ceiling(device, dtype, runs: int = 3, pause_s: float = 1.0) -> dict:
    """The best of `runs` matmul_peak_tflops measurements, `pause_s` apart: load that comes and
    goes on a shared machine lowers some of them, not the best (attnbench.harness.ceiling keeps the best
    over every run of the command too). Each run's TFLOP/s are listed."""
    found = []
    for i in range(runs):
        if i:
            time.sleep(pause_s)
        found.append(matmul_peak_tflops(device, dtype))
    best = max(found, key=lambda m: m["matmul_peak_tflops"])
    return {**best, "runs_tflops": [m["matmul_peak_tflops"] for m in found]}
