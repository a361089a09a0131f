"""The GPU a record was measured on, read from NVML (nvidia-ml-py): its identity, clocks, power and
temperature at a job's start and end, and sampled during each timed window, with the reasons the
driver gives for holding its clocks down.

A GPU at its power limit holds its clocks down by design (`sw_power_cap`): that is the steady state
of a training step, recorded but not a fault. Thermal slowdowns and hardware slowdowns (`hw_*`,
`sw_thermal`) make a window slower than the same GPU running cool: a window with one is
`throttled`, and so is its record. Without NVML (a CPU, or the package missing) every reading is
None, and the record says so.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

# NVML's clock-event reason bits (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*)
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}
# the reasons that make a window slower than the same GPU at its steady state
THROTTLES = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
SAMPLE_EVERY_S = 0.02


def reasons(bits: int) -> list[str]:
    return [name for name, bit in REASON_BITS.items() if bits & bit]


def _nvml():
    """The pynvml module, initialised, or None where it is missing or finds no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no package, no driver, no GPU: no readings
        return None


def _handle(nv, device):
    """NVML's handle of the torch device (found by UUID: CUDA_VISIBLE_DEVICES renumbers devices)."""
    import torch

    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    if uuid:
        try:
            return nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # noqa: BLE001 - an older torch gives the UUID in another form
            pass
    return nv.nvmlDeviceGetHandleByIndex(torch.device(device).index or 0)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def reading(nv, h) -> dict:
    """One reading of the GPU's state."""
    clock = nv.nvmlDeviceGetClockInfo
    bits = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    bits = bits(h)
    return {
        "sm_clock_mhz": clock(h, nv.NVML_CLOCK_SM),
        "mem_clock_mhz": clock(h, nv.NVML_CLOCK_MEM),
        "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "reasons": reasons(bits),
    }


def snapshot(device) -> dict | None:
    """The GPU's identity and state now; None without NVML or on a CPU."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    nv = _nvml()
    if nv is None:
        return {"nvml": "unavailable"}
    h = _handle(nv, device)
    return {
        "host": socket.gethostname(),
        "name": _text(nv.nvmlDeviceGetName(h)),
        "uuid": _text(nv.nvmlDeviceGetUUID(h)),
        "driver": _text(nv.nvmlSystemGetDriverVersion()),
        "max_sm_clock_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **reading(nv, h),
    }


def summary(readings: list[dict]) -> dict | None:
    """What a window's readings say: SM clock min/median/max, power median/max, hottest
    temperature, every reason seen, and whether any was a throttle (THROTTLES)."""
    if not readings:
        return None
    clocks = [r["sm_clock_mhz"] for r in readings]
    power = [r["power_w"] for r in readings]
    seen = sorted({x for r in readings for x in r["reasons"]}, key=list(REASON_BITS).index)
    return {
        "readings": len(readings),
        "sm_clock_mhz": {
            "min": min(clocks),
            "median": statistics.median(clocks),
            "max": max(clocks),
        },
        "mem_clock_mhz": statistics.median(r["mem_clock_mhz"] for r in readings),
        "power_w": {"median": statistics.median(power), "max": max(power)},
        "temperature_c_max": max(r["temperature_c"] for r in readings),
        "reasons": seen,
        "throttled": any(x in THROTTLES for x in seen),
    }


class WindowSampler:
    """Reads the GPU every SAMPLE_EVERY_S on a thread while a timed window runs (the thread only
    reads NVML; the timed calls run on the caller's thread). `summary` is None without NVML."""

    def __init__(self, device):
        import torch

        self.nv = _nvml() if torch.device(device).type == "cuda" else None
        self.handle = _handle(self.nv, device) if self.nv else None
        self.readings: list[dict] = []
        self._stop = threading.Event()
        self._thread = None

    def _run(self):
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.readings.append(reading(self.nv, self.handle))

    def __enter__(self):
        if self.nv:
            # the first reading here, before any timed call is queued: a cold NVML's first
            # queries are the slowest, and the thread's start with them competed with the host
            # queueing the first window of a process (a 1K call read 3.6x do_bench once)
            self.readings.append(reading(self.nv, self.handle))
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread:
            self._stop.set()
            self._thread.join()
            self.readings.append(reading(self.nv, self.handle))  # the window's end, too

    @property
    def summary(self) -> dict | None:
        return summary(self.readings)


def merge(summaries: list[dict]) -> dict | None:
    """Several windows' summaries as one: their readings' extremes, the median of their medians,
    every reason seen, throttled if any was."""
    if not summaries:
        return None
    seen = {x for s in summaries for x in s["reasons"]}
    return {
        "readings": sum(s["readings"] for s in summaries),
        "sm_clock_mhz": {
            "min": min(s["sm_clock_mhz"]["min"] for s in summaries),
            "median": statistics.median(s["sm_clock_mhz"]["median"] for s in summaries),
            "max": max(s["sm_clock_mhz"]["max"] for s in summaries),
        },
        "mem_clock_mhz": statistics.median(s["mem_clock_mhz"] for s in summaries),
        "power_w": {
            "median": statistics.median(s["power_w"]["median"] for s in summaries),
            "max": max(s["power_w"]["max"] for s in summaries),
        },
        "temperature_c_max": max(s["temperature_c_max"] for s in summaries),
        "reasons": sorted(seen, key=list(REASON_BITS).index),
        "throttled": any(s["throttled"] for s in summaries),
    }
