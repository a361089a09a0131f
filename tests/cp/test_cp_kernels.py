"""Local kernels (q, k, v, chunk) -> (out, lse) and their explicit backward, single process.

A query block is split over two chunks (disjoint key sets, as two ring steps see them); the merged
forward and the SUM of the two backward shares must be attention over the union, vs float64.
"""

import pytest
import torch
from attnbench.cp import catalog
from attnbench.cp.chunks import Chunk
from attnbench.cp.kernels import MathRecompute, load
from attnbench.cp.merge import merge_into, new_accumulator
from attnbench.harness.reference import reference_attention, rel_err
from attnbench.masks.ranges import Slice

QL, KL, HQ, HKV, D = 24, 30, 4, 2, 8
# two chunks of one query block: a causal bottom-right rectangle with more keys than queries, a
# full one, and rows that see nothing in either (padding)
FIRST = Chunk(QL, KL, [Slice(0, 8, 0, 12, "causal"), Slice(10, 20, 12, 22, "causal")], True)
SECOND = Chunk(QL, KL, [Slice(10, 20, 22, 30, "full"), Slice(0, 8, 12, 14, "full")], False)
CPU_KERNELS = [n for n, k in catalog.LOCAL_KERNELS.items() if "cpu" in k.devices]


def kernel(name, dtype):
    if name == "math_recompute":
        return MathRecompute(catalog.local_kernel("math"), "cpu", dtype, D)
    return load(catalog.local_kernel(name), "cpu", dtype, D)


def data(dtype):
    g = torch.Generator().manual_seed(3)
    return [
        torch.randn(s, generator=g).to(dtype)
        for s in [(QL, HQ, D), (KL, HKV, D), (KL, HKV, D), (QL, HQ, D)]
    ]


def test_cpu_local_kernels_are_the_catalogs():
    assert set(CPU_KERNELS) == {"math", "cpu_flash", "flex"}


@pytest.mark.parametrize("name", CPU_KERNELS + ["math_recompute"])
def test_split_chunks_merge_to_attention_over_the_union(name):
    dtype = torch.float64 if name.startswith("math") else torch.float32
    kern = kernel(name, dtype)
    q, k, v, dout = data(dtype)
    out, lse = new_accumulator(QL, HQ, D, dtype, "cpu")
    for ch in (FIRST, SECOND):
        merge_into(out, lse, *kern.forward(q, k, v, ch))
    union = FIRST.visible() | SECOND.visible()
    ref_out, ref_lse, ref_grads = reference_attention(q, k, v, visible=union, dout=dout)
    seen = union.any(1)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert (
        rel_err(out[seen], ref_out[seen]) < tol and rel_err(lse[:, seen], ref_lse[:, seen]) < tol
    )
    assert torch.isneginf(lse[:, ~seen]).all() and (out[~seen] == 0).all()
    if "bwd" not in catalog.local_kernel(name.replace("_recompute", "")).directions["cpu"]:
        with pytest.raises(Exception, match="no backward on CPU"):
            kern.backward(dout, q, k, v, out.to(dtype), lse, FIRST)
        return
    final = out.to(dtype)
    shares = [
        kern.backward(dout, q, k, v, final, lse.masked_fill(torch.isinf(lse), 0), ch)
        for ch in (FIRST, SECOND)
    ]
    for i, n in enumerate(("dq", "dk", "dv")):
        total = sum(s[i].to(torch.float64) for s in shares)
        assert rel_err(total, ref_grads[i]) < tol, n


def test_empty_chunk_gives_nothing_and_no_call():
    kern = kernel("cpu_flash", torch.float32)
    q, k, v, dout = data(torch.float32)
    out, lse = kern.forward(q, k, v, Chunk(QL, KL, [], False))
    assert (out == 0).all() and torch.isneginf(lse).all()
    assert kern.backward(dout, q, k, v, out, lse, Chunk(QL, KL, [], False)) is None


def test_gpu_kernels_say_why_they_cannot_run_here():
    for name in ("sdpa_flash", "sdpa_cudnn", "fa2", "fa3"):
        assert "runs only on cuda" in catalog.unavailable_reason("ring_p2p", name, "cpu")
    assert "runs only on cuda" in catalog.unavailable_reason("torch_cp", "math", "cpu")
