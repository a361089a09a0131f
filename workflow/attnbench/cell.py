"""Run one kernel cell and build its record (spec/measurement.md).

A cell always ends in a record (ok, oom, unsupported, unavailable, incorrect) unless the
process itself fails; then no record is written and the Snakemake job fails.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from datetime import datetime, timezone

import numpy as np

from . import status as S
from .flops import attention_flops
from .kernels import catalog

SCHEMA_VERSION = 1
DTYPES = ("float32", "float16", "bfloat16", "float64")


def stable_hash(obj, n=16) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


def data_seed(spec) -> int:
    """Same seed for every kernel and direction of a grid point: same masks, same inputs."""
    keys = ("seed", "mask", "mask_params", "seqlen", "heads_q", "heads_kv", "head_dim", "dtype")
    return int(stable_hash({k: spec.get(k) for k in keys}, 12), 16)


def n_samples(spec) -> int:
    from .masks import pattern

    return int(spec["samples"][pattern(spec["mask"]).sample_class if spec["mask"] else "single"])


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def base_record(spec, implementation: dict | None = None) -> dict:
    """The fields every record starts with; `implementation` describes what ran (default: the
    kernel of the catalog named by spec['impl'])."""
    if implementation is None:
        info = catalog.get(spec["impl"])
        implementation = {"name": info.name, "family": info.family, "summary": info.summary,
                          "library_version": catalog.library_version(info), "notes": dict(info.notes)}
    return {
        "schema_version": SCHEMA_VERSION,
        "cell_id": stable_hash(spec),
        "config_sha256": stable_hash(spec, 64),  # the cell's whole effective config (cell_id is its short form)
        "cell": spec,
        "kernel": implementation,
        "data_seed": data_seed(spec),
        "started_at": now(),
        "samples": [],
    }


def availability_reason(info, spec) -> str | None:
    """Why the kernel cannot run on this machine at all (library or device), or None."""
    device = spec["device"]
    if device not in info.devices:
        return f"{info.name} runs only on {', '.join(info.devices)}, not on {device}"
    missing = catalog.missing_module(info)
    if missing:
        return f"{info.name} needs the Python module {' or '.join(map(repr, missing.split('|')))}, which is not installed"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device is visible"
        cap = torch.cuda.get_device_capability()
        if info.min_capability and tuple(cap) < tuple(info.min_capability):
            return f"{info.name} needs compute capability {info.min_capability}, the device has {cap}"
    return None


# ---------------------------------------------------------------- inputs and correctness


def torch_dtype(name):
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return getattr(torch, name)


def make_inputs(seed, seqlen, hq, hkv, d, dtype, device):
    """q, k, v, dout ~ N(0, 1) in thd layout, from a generator seeded for this sample."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed % 2**63)
    shapes = [(seqlen, hq, d), (seqlen, hkv, d), (seqlen, hkv, d), (seqlen, hq, d)]
    return [torch.randn(s, generator=gen, device=device, dtype=torch.float32).to(dtype) for s in shapes]


def run_kernel(kernel, fn, q, k, v, dout, direction):
    """(out, (dq, dk, dv) or None) in thd layout, as the timed call computes them."""
    import torch

    from .kernels.base import from_thd, to_thd

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
    from .gate import judge
    from .kernels.naive import Naive
    from .reference import reference_attention

    needs_grad = direction != "fwd"
    ref_out, _, ref_grads = reference_attention(q, k, v, mask, dout if needs_grad else None)
    naive = Naive(catalog.get("naive"), kernel.device, kernel.dtype, kernel.heads_q, kernel.heads_kv, kernel.head_dim)
    names = ("out", "dq", "dk", "dv") if needs_grad else ("out",)
    ref = dict(zip(names, (ref_out, *(ref_grads or ()))))
    results = {}
    for who, kern, f in (("kernel", kernel, fn), ("naive", naive, naive.prepare(mask))):
        out, grads = run_kernel(kern, f, q, k, v, dout, direction)
        results[who] = dict(zip(names, (out, *(grads or ()))))
    return {"seqlen": mask.seqlen, **judge(results["kernel"], results["naive"], ref, q.dtype, factor, k.shape[0])}


def check_seqlen(spec, cap: int | None = None) -> int:
    """The length correctness is checked at: the cell's own, or the largest affordable multiple
    of the mask's granule at or below `cap` (default check.max_seqlen)."""
    s = spec["seqlen"]
    cap = spec["check"]["max_seqlen"] if cap is None else cap
    if s <= cap:
        return s
    granule = mask_granule(spec)
    return max(granule, cap // granule * granule)


def mask_granule(spec) -> int:
    """Check lengths are multiples of this: the block of block masks, else 1."""
    p = spec.get("mask_params", {})
    return {"block_causal_document": p.get("block"), "block_sparse": p.get("block_size"),
            "variable_block_sparse": p.get("avg_block")}.get(spec["mask"]) or 1


def shorter_check_seqlen(spec, s: int) -> int | None:
    """The next length to try when the check at `s` ran out of memory: half, on the granule;
    None when `s` is already the granule."""
    shorter = check_seqlen(spec, s // 2)
    return shorter if shorter < s else None


def checked_samples(spec) -> int:
    """How many samples a cell checks: check.samples, and for masks drawn afresh per sample
    (documents: sample_class other than 'single') at least 3, or all of them if fewer."""
    from .masks import pattern

    n, asked = n_samples(spec), spec["check"]["samples"]
    if spec["mask"] and pattern(spec["mask"]).sample_class != "single":
        return max(asked, min(3, n))
    return asked


class CheckOutOfMemory(RuntimeError):
    """The float64 check ran out of memory even at the shortest length: the check could not be
    made. Not the kernel's `oom` (its timings ran fine): the job fails instead of lying."""


# ---------------------------------------------------------------- the cell


def measure_sample(kernel, spec, index, rng, dtype, device, histograms) -> dict:
    import torch

    from .kernels.base import from_thd
    from .masks import sample_mask
    from .measure import DeviceClock, peak_memory, quantiles, time_ms

    hq, hkv, d, direction = spec["heads_q"], spec["heads_kv"], spec["head_dim"], spec["direction"]
    clock = DeviceClock(device)
    with clock.phase("mask"):
        mask = sample_mask(spec["mask"], spec["seqlen"], spec.get("mask_params", {}), rng, histograms, hq, hkv)
    with clock.phase("inputs"):
        q, k, v, dout = make_inputs(spec["_data_seed"] + index, spec["seqlen"], hq, hkv, d, dtype, device)
    with clock.phase("prepare"):
        fn = kernel.prepare(mask)
    lay = kernel.layout
    leaves = [from_thd(x, lay).requires_grad_(direction != "fwd") for x in (q, k, v)]
    dout_l = from_thd(dout, lay)
    if direction == "fwd":
        def call():
            with torch.no_grad():
                return fn(*leaves)
    elif direction == "bwd":
        with clock.phase("first_call"):
            out = fn(*leaves)  # forward once, outside the timed region

        def call():
            return torch.autograd.grad(out, leaves, dout_l, retain_graph=True)
    else:
        def call():
            return torch.autograd.grad(fn(*leaves), leaves, dout_l)

    with clock.phase("first_call"):  # compilation and lazy loading: one more warm-up, not busy time
        call()
    with clock.phase("timed", busy=True):
        times = time_ms(call, spec["warmup"], spec["reps"], device)
    with clock.phase("memory", busy=True):
        mem = peak_memory(call, device)
    flops = attention_flops(sum(mask.area_per_head), d, direction)
    tq = quantiles(times)
    sample = {
        "index": index,
        "mask_params": mask.params,
        "mask_area": mask.area,
        "flops": flops,
        "time_ms": times,
        **{f"time_ms_{k}": v for k, v in tq.items()},
        "tflops_median": flops / (tq["median"] * 1e-3) / 1e12,
        **mem,
    }
    if index < checked_samples(spec):
        s_check = check_seqlen(spec)
        if s_check != spec["seqlen"]:
            del fn, leaves, dout_l, call, q, k, v, dout
            if direction == "bwd":
                del out
        timed = (mask, q, k, v, dout, fn) if s_check == spec["seqlen"] else None
        with clock.phase("check", busy=True):
            sample["check"] = check_sample(kernel, spec, index, s_check, timed, dtype, device, histograms)
    sample["device_busy_ms"], sample["phases_s"] = clock.ms, clock.phases
    return sample


def check_sample(kernel, spec, index, s_check, timed, dtype, device, histograms) -> dict:
    """The gate at `s_check` (on the timed sample's mask and inputs when `timed` holds them);
    when the check itself runs out of memory, again at a shorter length (never the kernel's oom)."""
    from .masks import sample_mask

    hq, hkv, d = spec["heads_q"], spec["heads_kv"], spec["head_dim"]
    too_long = []
    while True:
        try:
            if s_check == spec["seqlen"]:
                mask, q, k, v, dout, fn = timed
            else:
                crng = np.random.default_rng([spec["_data_seed"], index, s_check])
                mask = sample_mask(spec["mask"], s_check, spec.get("mask_params", {}), crng, histograms, hq, hkv)
                q, k, v, dout = make_inputs(spec["_data_seed"] + index + 7919, s_check, hq, hkv, d, dtype, device)
                fn = kernel.prepare(mask)
            chk = check_correctness(kernel, fn, mask, q, k, v, dout, spec["direction"],
                                    spec["check"]["tolerance_factor"])
            chk["mask_params"] = mask.params if s_check != spec["seqlen"] else "same as the timed sample"
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
        shorter = shorter_check_seqlen(spec, s_check)
        if shorter is None:
            raise CheckOutOfMemory(f"the correctness check ran out of memory at every length down to {s_check}: "
                                   f"{reason}")
        too_long.append(s_check)
        s_check = shorter


def summarise(record, peak, gpus: int = 1):
    """Cell-level statistics from the samples: pooled repetitions, max memory, worst error.
    TFLOP/s are per GPU: FLOPs / (time x gpus) (time: the slowest rank's, for CP cells)."""
    samples = record["samples"]
    times = [t for s in samples for t in s["time_ms"]]
    tflops = [s["flops"] / (t * 1e-3) / 1e12 / gpus for s in samples for t in s["time_ms"]]
    a, b = np.percentile(times, [20, 80]), np.percentile(tflops, [20, 80])
    record.update(
        time_ms_median=float(np.median(times)), time_ms_p20=float(a[0]), time_ms_p80=float(a[1]),
        flops=float(np.mean([s["flops"] for s in samples])),
        tflops=float(np.median(tflops)), tflops_p20=float(b[0]), tflops_p80=float(b[1]),
    )
    mems = [s["peak_mem_bytes"] for s in samples if s.get("peak_mem_bytes") is not None]
    incs = [s["peak_mem_increment_bytes"] for s in samples if s.get("peak_mem_increment_bytes") is not None]
    record["peak_mem_bytes"] = max(mems) if mems else None
    record["peak_mem_increment_bytes"] = max(incs) if incs else None
    record["mem_source"] = samples[0].get("mem_source")
    busy = [s["device_busy_ms"] for s in samples if "device_busy_ms" in s]
    record["device_busy_ms"] = sum(busy) if busy else None
    ceiling = (peak or {}).get("matmul_peak_tflops")
    record["fraction_of_peak"] = record["tflops"] / ceiling if ceiling else None
    checks = [s["check"] for s in samples if "check" in s]
    errs = [e for c in checks for n, e in c["errors"].items() if n != "lse"]  # the LSE's is absolute
    record["max_rel_err"] = max(errs) if errs else None
    record["check_passed"] = all(c["passed"] for c in checks) if checks else None


CRASH_ENV = "ATTNBENCH_CRASH_CELLS"


def crash_if_asked(spec):
    """Fault injection for tests of failure handling: a cell whose '{impl}/{mask}/{point}' matches
    the regex in $ATTNBENCH_CRASH_CELLS dies like a crashed kernel (no record, failed job)."""
    import os
    import re

    from .config import point_id

    pattern = os.environ.get(CRASH_ENV)
    name = f"{spec['impl']}/{spec['mask']}/{point_id(spec)}"
    if pattern and re.search(pattern, name):
        raise RuntimeError(f"crash injected by {CRASH_ENV}={pattern!r} into {name}")


HANG_ENV = "ATTNBENCH_HANG_CELLS"


def hang_if_asked(spec, keep_alive=None):
    """Fault injection for tests of the time budget: a cell whose '{impl}/{mask}/{point}' matches
    the regex in $ATTNBENCH_HANG_CELLS never ends (calling keep_alive, e.g. a barrier, meanwhile)."""
    import os
    import re

    from .config import point_id

    pattern = os.environ.get(HANG_ENV)
    name = f"{spec['impl']}/{spec['mask']}/{point_id(spec)}"
    if not (pattern and re.search(pattern, name)):
        return
    print(f"hanging: {HANG_ENV}={pattern!r} matches {name}", flush=True)
    while True:
        if keep_alive:
            keep_alive()
        time.sleep(0.2)


def run_cell(spec: dict, peak: dict | None = None) -> dict:
    """Measure one cell; return its record. Raises only on a crash (no record then)."""
    crash_if_asked(spec)
    hang_if_asked(spec)
    record = base_record(spec)
    info = catalog.get(spec["impl"])
    t0 = time.perf_counter()
    outcome = availability_reason(info, spec)
    status, reason = (S.UNAVAILABLE, outcome) if outcome else (None, None)
    if status is None:
        reason = catalog.unsupported_reason(info, spec["mask"], spec["direction"], spec["device"],
                                            spec["heads_q"], spec["heads_kv"], spec.get("mask_params"))
        status = S.UNSUPPORTED if reason else None
    if status is None:
        status, reason = _measure(record, info, spec, peak)
    record["status"], record["status_reason"] = status, reason
    if status in S.TIMED:
        summarise(record, peak)
    record["matmul_peak"] = peak
    record["environment"] = _environment(spec["device"])
    record["finished_at"] = now()
    record["wall_s"] = time.perf_counter() - t0
    record.update(process_timing())
    return record


def process_timing() -> dict:
    """Where this process' time went: since it started (imports included), and waiting for a GPU."""
    from . import STARTED, launch

    return {"process_s": time.time() - STARTED, "gpu_wait_s": launch.CLAIM_WAIT_S}


def _environment(device):
    try:
        from .environment import fingerprint

        return fingerprint(device)
    except ImportError as e:  # torch itself missing: still a record
        return {"error": str(e)}


def _measure(record, info, spec, peak):
    import torch

    from .kernels.base import load

    dtype, device = torch_dtype(spec["dtype"]), spec["device"]
    spec = {**spec, "_data_seed": record["data_seed"]}
    kernel = load(info, device=device, dtype=dtype, heads_q=spec["heads_q"], heads_kv=spec["heads_kv"],
                  head_dim=spec["head_dim"])
    rng = np.random.default_rng(record["data_seed"])
    try:
        for i in range(n_samples(spec)):
            record["samples"].append(measure_sample(kernel, spec, i, rng, dtype, device, spec.get("histograms")))
    except S.CellOutcome as e:
        return e.status, e.reason
    except Exception as e:  # noqa: BLE001 - anything else that is an OOM is a record, the rest a crash
        if S.is_oom(e) and not isinstance(e, CheckOutOfMemory):
            if device == "cuda":
                torch.cuda.empty_cache()
            return S.OOM, f"out of memory at sample {len(record['samples'])}: {str(e).splitlines()[0][:300]}"
        raise
    failed = [s["index"] for s in record["samples"] if not s.get("check", {}).get("passed", True)]
    if failed:
        return S.INCORRECT, f"samples {failed} disagree with the float64 reference beyond tolerance"
    return S.OK, None


def json_safe(obj):
    """Non-finite floats become the strings 'nan' / 'inf' (strict JSON has neither)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_record(record: dict, path) -> None:
    """Write atomically: a crash never leaves a half-written record behind."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(json_safe(record), indent=1, allow_nan=False) + "\n")
    tmp.replace(path)
