"""Timing, memory and quantiles: the one place where anything is timed (docs/measurement.md)."""

from __future__ import annotations

import gc
import re
import time
from contextlib import contextmanager

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
