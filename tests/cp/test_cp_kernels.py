"""Local kernels (q, k, v, chunk) -> (out, lse) and their explicit backward, single process.

1. A query block split over two chunks (disjoint key sets, as two ring steps see them): the merged
   forward and the SUM of the two backward shares must be attention over the union, vs float64.
2. Every chunk the methods make (Ring P2P's zigzag steps at R = 2 and 3, Ring AllGather's two query
   chunks, the bare kernel's whole sequence), run on one device as the methods run them, merged:
   out, lse, dq, dk and dv of every mask the kernel claims through the correctness gate against
   float64 (GQA, documents whose lengths are not multiples of 2R). On the CPU: the CPU kernels, and
   the two ways a chunk reaches a GPU library (PackedKernel, RectangleKernel) over CPU stand-ins of
   the library call. On a GPU (skipped without CUDA): every installed GPU local kernel.

GPU run (the lead's H200): pytest tests/cp/test_cp_kernels.py -k gpu
"""

import numpy as np
import pytest
import torch
from attnbench.cp import catalog
from attnbench.cp.chunks import (
    Chunk,
    allgather_chunks,
    document_lengths,
    is_causal,
    ring_step_chunk,
)
from attnbench.cp.layout import ShardLayout
from attnbench.cp.local import whole_sequence_chunk
from attnbench.cp.run import naive_in_dtype
from attnbench.cp.verify import masks_for
from attnbench.harness.gate import judge, lse_bound
from attnbench.harness.inputs import make_inputs
from attnbench.harness.reference import reference_attention, rel_err
from attnbench.kernels.base import bhsd_view, to_thd
from attnbench.kernels.flashmask import packed_row_intervals
from attnbench.kernels.local_kernel import PackedKernel, RectangleKernel, load
from attnbench.kernels.lse import finite_lse, merge_into, new_accumulator
from attnbench.kernels.naive import MathLocal, MathRecompute
from attnbench.masks import CP_MASKS
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


def test_every_local_kernel_says_which_masks_it_runs_and_why_not_the_others():
    for name, info in catalog.LOCAL_KERNELS.items():
        for mask in CP_MASKS:
            why = catalog.kernel_reason(
                name, mask, "fwd", "cuda" if "cuda" in info.devices else "cpu"
            )
            assert (why is None) == (mask in info.masks), (name, mask)
    why = catalog.kernel_reason("sdpa_cudnn", "causal_document", "bwd", "cuda")
    assert "cannot express the causal_document mask (it runs: full, causal)" in why
    assert "one dense cuDNN call per rectangle" in why


# ---------------------------------------------------------------- the methods' chunks, one device


def rows(x, pos):
    """Rows of a global [S, ...] tensor at positions `pos` (numpy, -1: a zero padding row)."""
    pos = torch.as_tensor(pos, device=x.device)
    out = x.new_zeros((len(pos), *x.shape[1:]))
    keep = pos >= 0
    out[keep] = x[pos[keep]]
    return out


def shards(mask, how: str):
    """Per query shard, the (query positions, key positions, chunk) steps a method computes:
    `whole` (the bare kernel), `ring<R>` (Ring P2P: shard r against every shard s) or
    `allgather<R>` (Ring AllGather: shard r's two query chunks against the padded sequence)."""
    causal = is_causal(mask.name)
    if how == "whole":
        pos = np.arange(mask.seqlen)
        return [[(pos, pos, whole_sequence_chunk(mask))]]
    ring = int(how.removeprefix("ring").removeprefix("allgather"))
    lay = ShardLayout(document_lengths(mask), ring, 1)
    if how.startswith("ring"):
        return [
            [
                (lay.positions(r), lay.positions(s), ring_step_chunk(lay, r, s, causal))
                for s in range(ring)
            ]
            for r in range(ring)
        ]
    return [
        [(lay.positions(r), lay.padded_positions, c) for c in allgather_chunks(lay, r, causal)]
        for r in range(ring)
    ]


def simulate(kern, steps, q, k, v, dout, backward: bool, entry="methods") -> dict:
    """Run the steps as the methods do (merge by LSE; backward with the final out and LSE, each
    chunk's share of dk, dv going to its keys) and put every result at its global position.
    entry: `methods` through forward_into / backward_share (what the methods call), `direct`
    through forward / backward (whole-row results, merged and added here)."""
    S, hq, d = q.shape
    got = {"out": torch.zeros_like(q), "lse": torch.full((hq, S), float("-inf"), device=q.device)}
    grads = [torch.zeros(x.shape, dtype=torch.float64, device=q.device) for x in (q, k, v)]
    for shard in steps:
        qpos = torch.as_tensor(shard[0][0], device=q.device)
        keep = qpos >= 0
        qr, dr = rows(q, shard[0][0]), rows(dout, shard[0][0])
        out, lse = new_accumulator(len(qpos), hq, d, q.dtype, q.device)
        merged = False
        for _, kpos, ch in shard:
            kr, vr = rows(k, kpos), rows(v, kpos)
            if entry == "methods":
                merged = kern.forward_into(out, lse, qr, kr, vr, ch, first=not merged) or merged
            else:
                merge_into(out, lse, *kern.forward(qr, kr, vr, ch))
        out = out.to(q.dtype)
        got["out"][qpos[keep]] = out[keep]
        got["lse"][:, qpos[keep]] = lse[:, keep].float()
        if not backward:
            continue
        for _, kpos, ch in shard:
            kr, vr = rows(k, kpos), rows(v, kpos)
            if entry == "methods":
                share = kern.backward_share(dr, qr, kr, vr, out, finite_lse(lse), ch)
                if share is None:
                    continue
                res = [
                    torch.zeros(x.shape, dtype=torch.float64, device=q.device)
                    for x in (qr, kr, vr)
                ]
                share.add_q(res[0])
                share.add_kv(res[1], res[2])
            else:
                res = kern.backward(dr, qr, kr, vr, out, finite_lse(lse), ch)
                if res is None:
                    continue
            kp = torch.as_tensor(kpos, device=q.device)
            grads[0][qpos[keep]] += res[0][keep].double()
            for g, x in zip(grads[1:], res[1:]):
                g.index_add_(0, kp[kp >= 0], x[kp >= 0].double())
    if backward:
        got.update(zip(("dq", "dk", "dv"), grads))
    return got


def gate(mask, q, k, v, dout, got) -> dict:
    """The cells' correctness gate (harness.gate.judge) on the whole sequence."""
    backward = "dq" in got
    ref_out, ref_lse, ref_grads = reference_attention(q, k, v, mask, dout if backward else None)
    nv_out, nv_lse, nv_grads = naive_in_dtype(
        q, k, v, dout if backward else None, mask.dense(q.device)
    )
    ref, nv = {"out": ref_out, "lse": ref_lse.T}, {"out": nv_out, "lse": nv_lse.T}
    if backward:
        ref.update(zip(("dq", "dk", "dv"), ref_grads))
        nv.update(zip(("dq", "dk", "dv"), nv_grads))
    mine = {n: (x.T if n == "lse" else x) for n, x in got.items()}
    lse_tol = lse_bound(ref_lse, q, k, q.shape[-1] ** -0.5)
    return judge(mine, nv, ref, q.dtype, 5.0, q.shape[0], lse_tolerance=lse_tol)


HOWS = ("whole", "ring2", "ring3", "allgather2")


def check_every_way(kern, mask, q, k, v, dout, backward):
    for how in HOWS:
        for entry in ("methods", "direct"):
            got = simulate(kern, shards(mask, how), q, k, v, dout, backward, entry)
            v_ = gate(mask, q, k, v, dout, got)
            assert v_["passed"], (kern.name, mask.name, how, entry, v_["errors"], v_["tolerance"])


class CpuFlashRectangles(RectangleKernel):
    """The rectangle path (sdpa_cudnn's) over aten's CPU flash kernel: causal top-left, LSE
    (1, H, s); a CPU stand-in for the cuDNN call."""

    def rect_forward(self, q, k, v, causal):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            bhsd_view(q), bhsd_view(k), bhsd_view(v), is_causal=causal, scale=self.scale
        )
        return to_thd(out, "bhsd"), lse

    def rect_backward(self, dout, q, k, v, out, lse, causal):
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *(bhsd_view(x) for x in (dout, q, k, v, out)),
            lse[None],
            0.0,
            causal,
            scale=self.scale,
        )
        return tuple(to_thd(g, "bhsd") for g in grads)


class MathPacked(PackedKernel):
    """The packed path (sdpa_flash's, fa2's, fa3's) over the math kernel, one rectangle per
    cu_seqlens entry, returning the dense LSE shape (1, H, s) for one rectangle and the varlen
    (H, total) for several, as FlashAttention does; a CPU stand-in for the library call."""

    def __init__(self, *a):
        super().__init__(*a)
        self.math = MathLocal(*a)

    @staticmethod
    def _chunk(vl, causal, ql, kl):
        cq, ck = vl.cu_q.tolist(), vl.cu_k.tolist()
        kind = "causal" if causal else "full"
        segs = [Slice(cq[i], cq[i + 1], ck[i], ck[i + 1], kind) for i in range(len(cq) - 1)]
        return Chunk(ql, kl, segs, causal)

    def packed_forward(self, q, k, v, vl, causal):
        out, lse = self.math.forward(q, k, v, self._chunk(vl, causal, q.shape[0], k.shape[0]))
        return out, (lse[None] if vl.single else lse)

    def packed_backward(self, dout, q, k, v, out, lse, vl, causal):
        ch = self._chunk(vl, causal, q.shape[0], k.shape[0])
        return self.math.backward(dout, q, k, v, out, lse, ch)


def flashmask_rule(startend, is_causal, ql, kl):
    """Visible [ql, kl] as FlashMask's kernel applies bounds (flash_mask.hpp): causal (bottom-right)
    with rows >= LTS masked, or without causal rows >= LTS and rows < UTE masked."""
    r = torch.arange(ql).view(-1, 1)
    c = torch.arange(kl).view(1, -1)
    b = torch.as_tensor(startend, dtype=torch.long)
    vis = r < b[:, 0].view(1, -1)
    if is_causal:
        return vis & (c <= r + (kl - ql))
    return vis & (r >= b[:, 1].view(1, -1))


class FlashMaskRules(MathPacked):
    """FlashMask's local kernel's bounds (flashmask.packed_row_intervals) decoded by the kernel's
    rule must paint exactly the packed rectangles; then the math kernel computes them."""

    def packed_forward(self, q, k, v, vl, causal):
        startend, is_causal = packed_row_intervals(vl.lengths, causal)
        painted = self._chunk(vl, causal, q.shape[0], k.shape[0]).visible()
        assert torch.equal(flashmask_rule(startend, is_causal, q.shape[0], k.shape[0]), painted)
        return super().packed_forward(q, k, v, vl, causal)


def test_flashmask_bounds_pick_its_causal_form_only_for_square_causal_rectangles():
    assert packed_row_intervals(((3, 3), (2, 2)), True)[0].tolist() == [[3]] * 3 + [[5]] * 2
    assert packed_row_intervals(((3, 3), (2, 2)), True)[1] is True
    enc, is_causal = packed_row_intervals(((2, 4),), True)  # two leading keys every row sees
    assert not is_causal and enc.tolist() == [[2, 0], [2, 0], [2, 0], [2, 1]]
    enc, is_causal = packed_row_intervals(((2, 3), (1, 1)), False)
    assert not is_causal and enc.tolist() == [[2, 0]] * 3 + [[3, 2]]


CPU_HEADS, CPU_D = (8, 2), 16


@pytest.fixture(scope="module")
def cpu_masks():
    return masks_for(2, 2 * 40 + 3, 0)  # verify's masks: odd documents, an odd length


@pytest.mark.parametrize("name", ["cpu_flash", "math", "rectangles", "packed", "flashmask_rules"])
@pytest.mark.parametrize("mask_name", CP_MASKS)
def test_cpu_kernels_under_every_methods_chunks(name, mask_name, cpu_masks):
    mask = next(m for m in cpu_masks if m.name == mask_name)
    stand_in = name in ("rectangles", "packed", "flashmask_rules")
    info = catalog.local_kernel("cpu_flash" if stand_in else name)
    cls = {
        "rectangles": CpuFlashRectangles,
        "packed": MathPacked,
        "flashmask_rules": FlashMaskRules,
    }.get(name)
    kern = (
        cls(info, "cpu", torch.float32, CPU_D) if cls else load(info, "cpu", torch.float32, CPU_D)
    )
    q, k, v, dout = make_inputs(5, mask.seqlen, *CPU_HEADS, CPU_D, torch.float32, "cpu")
    check_every_way(kern, mask, q, k, v, dout, backward=True)


@pytest.mark.parametrize("mask_name", ["full", "causal_document"])
def test_flex_forward_on_the_cpu_under_every_methods_chunks(mask_name, cpu_masks):
    mask = next(m for m in cpu_masks if m.name == mask_name)
    kern = load(catalog.local_kernel("flex"), "cpu", torch.float32, CPU_D)
    q, k, v, dout = make_inputs(5, mask.seqlen, *CPU_HEADS, CPU_D, torch.float32, "cpu")
    check_every_way(kern, mask, q, k, v, dout, backward=False)


# ---------------------------------------------------------------- GPU (skipped without CUDA)

GPU_KERNELS = [n for n, k in catalog.LOCAL_KERNELS.items() if k.devices == ("cuda",)]
GPU_HEADS, GPU_D = (8, 2), 128  # GQA; a head dim every FlashAttention build has


@pytest.fixture(scope="module")
def gpu_masks():
    return masks_for(2, 1024 + 3, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", GPU_KERNELS)
@pytest.mark.parametrize("mask_name", CP_MASKS)
def test_gpu_local_kernel_under_every_methods_chunks(name, mask_name, gpu_masks):
    """out and lse (forward), dq, dk and dv (backward) against float64 through the gate, bf16,
    GQA 8:2, D 128, 1027 tokens in documents of 1..47; the masks the kernel does not claim must say
    so, and a backward whose library is missing (fa3-fwd has none) is skipped naming it."""
    why = catalog.unavailable_reason("ring_p2p", name, "cuda")
    if why:
        pytest.skip(why)
    if why := catalog.kernel_reason(name, mask_name, "fwd", "cuda"):
        assert name == "sdpa_cudnn" and "document" in mask_name, why
        return
    mask = next(m for m in gpu_masks if m.name == mask_name)
    kern = load(catalog.local_kernel(name), "cuda", torch.bfloat16, GPU_D)
    q, k, v, dout = make_inputs(5, mask.seqlen, *GPU_HEADS, GPU_D, torch.bfloat16, "cuda")
    backward = catalog.unavailable_reason("ring_p2p", name, "cuda", "bwd") is None
    check_every_way(kern, mask, q, k, v, dout, backward=backward)
    if not backward:
        pytest.skip(catalog.unavailable_reason("ring_p2p", name, "cuda", "bwd"))
