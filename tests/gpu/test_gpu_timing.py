"""On a CUDA machine: the harness's device time against triton.testing.do_bench on the same call at
1K and 32K (docs/measurement.md, "Timing"), and what a timed window records. Skipped without CUDA.

do_bench queues its repetitions back to back with the L2 cleared between them, as the harness
does, and takes their median: on a call of a few milliseconds (32K) the two must agree closely; at
1K (tens of microseconds) the harness's head start keeps the host out, so it must not be slower
than do_bench by more than a few percent (the old loop, synchronised after every call, was 1.4x)."""

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attnbench.harness import measure
from attnbench.harness.control import drift, time_controls

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def causal_sdpa(seqlen, direction):
    """SDPA's cuDNN backend, causal, GQA 64:8, D 128, bf16: the call and its inputs."""
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(1, h, seqlen, 128, device="cuda", generator=g, dtype=torch.bfloat16)  # noqa: E731
    q, k, v = (x.requires_grad_(direction == "bwd") for x in (mk(64), mk(8), mk(8)))
    backend = torch.nn.attention.SDPBackend.CUDNN_ATTENTION

    def fwd():
        with torch.nn.attention.sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    if direction == "fwd":
        return lambda: fwd().detach()
    out, dout = fwd(), torch.randn(1, 64, seqlen, 128, device="cuda", dtype=torch.bfloat16)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


@pytest.mark.parametrize(
    "seqlen,direction,slack",
    [(1024, "fwd", 0.10), (1024, "bwd", 0.10), (32768, "fwd", 0.03), (32768, "bwd", 0.03)],
)
def test_device_time_agrees_with_do_bench(seqlen, direction, slack):
    from triton.testing import do_bench

    fn = causal_sdpa(seqlen, direction)
    ours = measure.time_gpu_call(fn, warmup=5, reps=20, device="cuda")
    # do_bench right after, on the settled GPU; rep in ms of calls (at least 20 repetitions)
    theirs = do_bench(
        fn, warmup=25, rep=max(100, int(20 * np.median(ours.device_ms))), return_mode="median"
    )
    ratio = float(np.median(ours.device_ms)) / theirs
    print(
        f"S={seqlen} {direction}: harness {np.median(ours.device_ms):.4f} ms, do_bench {theirs:.4f} ms, "
        f"ratio {ratio:.3f}; wall {np.median(ours.wall_ms):.4f} ms, host overhead "
        f"{ours.host_overhead_ms:.4f} ms; settle {ours.settle}; window {ours.window}"
    )
    assert 1 - slack <= ratio <= 1 + slack
    assert ours.settle["settled"], ours.settle
    assert ours.wall_ms and min(ours.wall_ms) > 0
    assert ours.queued_ahead is True


def test_a_slow_host_is_caught_and_queued_again():
    """A host that queues each repetition 0.3 ms late (busy-waiting in `before`) runs past the
    head start the settle measured: the window is queued again behind a longer one, says it got
    ahead, and its device time still agrees with do_bench."""
    from triton.testing import do_bench

    fn = causal_sdpa(1024, "fwd")

    def slow_host():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 3e-4:
            pass

    ours = measure.time_gpu_call(fn, warmup=5, reps=20, device="cuda", before=slow_host)
    theirs = do_bench(fn, warmup=25, rep=100, return_mode="median")
    ratio = float(np.median(ours.device_ms)) / theirs
    print(f"slow host: head start {ours.head_start_ms:.2f} ms, harness/do_bench {ratio:.3f}")
    assert ours.queued_ahead is True
    assert ours.head_start_ms > 1.0 + 20 * 3e-1  # the second window's head start covered the host
    assert 0.9 <= ratio <= 1.1


def test_a_window_records_the_gpu_and_the_host():
    fn = causal_sdpa(8192, "fwd")
    t = measure.time_gpu_call(fn, warmup=5, reps=10, device="cuda")
    fields = t.sample_fields()
    assert fields["timing"] == "device_back_to_back"
    assert len(fields["wall_ms"]) == measure.WALL_REPS
    assert fields["host_overhead_ms"] == pytest.approx(
        np.median(t.wall_ms) - np.median(t.device_ms)
    )
    window = fields["gpu_window"]
    assert window is not None, (
        "nvidia-ml-py (pynvml) is installed on the GPU image: NVML must read"
    )
    assert window["readings"] >= 2 and window["sm_clock_mhz"]["min"] > 0
    assert isinstance(window["throttled"], bool)


def test_control_calls_hold_within_a_quiet_minute():
    before, after = time_controls("cuda"), time_controls("cuda")
    d = drift(before, after)
    print(before, after, d)
    assert before["gemm_ms"] > 0 and before["sdpa_causal_ms"] > 0
    assert abs(d["worst"]) < 0.05  # back to back on a settled GPU; the flag's limit is 3%
