"""Local attention kernels: (q, k, v, chunk) -> (out, lse), with an explicit backward.

Layout thd: q [ql, Hq, D], k and v [kl, Hkv, D] (GQA: Hq a multiple of Hkv). forward returns
out [ql, Hq, D] in q's dtype and lse [Hq, ql] (float32; float64 for float64 inputs), natural log,
-inf (and out 0) for rows that see no key in the chunk. backward(dout, q, k, v, out, lse, chunk)
takes the FINAL output and LSE of these query rows (merged over every chunk they saw) and returns
this chunk's share of (dq, dk, dv): with P = exp(s - lse) for the final lse, the shares of all
chunks sum to the true gradients. That is what lets the ring methods run backward step by step.

Here: the protocol, the two ways a chunk reaches a library (PackedKernel: one call over the
rectangles' rows, dense for one rectangle, varlen with cu_seqlens for several; RectangleKernel:
one call per rectangle, merged by LSE), the CPU kernels `math` (explicit, float32/float64) and
`cpu_flash` (aten's CPU flash kernel with a dense mask, real logsumexp), and FlexAttention (`flex`,
return_lse, backward by recomputation). The GPU libraries' adapters are in gpu_kernels.py. Each
library's LSE convention is converted at its adapter; what a local kernel returns and consumes is
always the [Hq, ql] natural-log form above.
"""

from __future__ import annotations

import functools
import importlib
import math

import torch

from ..kernels.base import bhsd_view, to_thd
from ..masks.ranges import Slice
from ..status import Unsupported
from .catalog import LocalKernelInfo
from .chunks import Chunk
from .merge import accumulator_dtype, merge_into


def load(info: LocalKernelInfo, device, dtype, head_dim) -> "LocalKernel":
    module, cls = info.impl.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)(
        info, device, dtype, head_dim
    )


def finite_lse(lse):
    """The final LSE as backward kernels take it: rows that saw nothing get 0 (their keys are all
    masked, so every P is exp(-inf) = 0 either way) instead of -inf (which gives NaN)."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).contiguous()


class LocalKernel:
    def __init__(self, info: LocalKernelInfo, device, dtype, head_dim: int):
        self.info, self.name = info, info.name
        self.device, self.dtype = torch.device(device), dtype
        self.scale = 1.0 / math.sqrt(head_dim)
        self.acc = accumulator_dtype(dtype)

    def forward(self, q, k, v, chunk: Chunk):
        if chunk.empty:
            return (
                q.new_zeros(q.shape),
                torch.full(
                    (q.shape[1], q.shape[0]), float("-inf"), dtype=self.acc, device=q.device
                ),
            )
        return self._forward(q, k, v, chunk)

    def backward(self, dout, q, k, v, out, lse, chunk: Chunk):
        """(dq, dk, dv) of this chunk, or None when it has no visible pair."""
        if chunk.empty:
            return None
        return self._backward(dout, q, k, v, out, lse, chunk)

    def _forward(self, q, k, v, chunk):
        raise NotImplementedError

    def _backward(self, dout, q, k, v, out, lse, chunk):
        raise NotImplementedError


def _groups(x, hkv):
    """[S, Hq, D] -> [Hkv, g, S, D] (query heads of one KV head together)."""
    s, hq, d = x.shape
    return x.view(s, hkv, hq // hkv, d).permute(1, 2, 0, 3)


def _ungroup(x):
    """[Hkv, g, S, D] -> [S, Hq, D]."""
    hkv, g, s, d = x.shape
    return x.permute(2, 0, 1, 3).reshape(s, hkv * g, d)


class MathKernel(LocalKernel):
    """softmax(q k^T * scale) v over the chunk's painted matrix, in float32 (float64 for
    float64 inputs), and the textbook backward. Memory Hq x ql x kl: small sizes only."""

    def _scores(self, q, k, chunk):
        hkv = k.shape[1]
        qg = _groups(q.to(self.acc), hkv)
        kf = k.to(self.acc).permute(1, 0, 2)
        s = torch.einsum("hgqd,hkd->hgqk", qg, kf) * self.scale
        return qg, s.masked_fill(~chunk.visible(q.device), float("-inf"))

    def _forward(self, q, k, v, chunk):
        _, s = self._scores(q, k, chunk)
        # logsumexp of a row of -inf has a NaN gradient: take it over zeros there, then set -inf.
        has = chunk.rows_with_keys(q.device).view(1, 1, -1, 1)
        lse = torch.logsumexp(torch.where(has, s, torch.zeros_like(s)), dim=-1).masked_fill(
            ~has[..., 0], float("-inf")
        )
        p = torch.exp(s - finite_lse(lse).unsqueeze(-1))
        out = torch.einsum("hgqk,hkd->hgqd", p, v.to(self.acc).permute(1, 0, 2))
        return _ungroup(out).to(q.dtype), lse.reshape(-1, q.shape[0])

    def _backward(self, dout, q, k, v, out, lse, chunk):
        hkv = k.shape[1]
        qg, s = self._scores(q, k, chunk)
        lse_g = lse.to(self.acc).view(hkv, -1, q.shape[0])
        p = torch.exp(s - lse_g.unsqueeze(-1))
        do = _groups(dout.to(self.acc), hkv)
        vf = v.to(self.acc).permute(1, 0, 2)
        dp = torch.einsum("hgqd,hkd->hgqk", do, vf)
        delta = (do * _groups(out.to(self.acc), hkv)).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        dq = torch.einsum("hgqk,hkd->hgqd", ds, k.to(self.acc).permute(1, 0, 2)) * self.scale
        dk = torch.einsum("hgqk,hgqd->khd", ds, qg) * self.scale
        dv = torch.einsum("hgqk,hgqd->khd", p, do)
        return _ungroup(dq), dk, dv


class CpuFlash(LocalKernel):
    """aten._scaled_dot_product_flash_attention_for_cpu: a real CPU flash kernel that returns the
    logsumexp; the chunk goes in as an additive mask (0 / -inf). The kernel reports lse 0 (not
    -inf) for a row with every key masked, so such rows are set to -inf from the chunk."""

    def _mask(self, chunk, dtype, device):
        cache = chunk.__dict__.setdefault("_cpu_flash_mask", {})
        if dtype not in cache:
            vis = chunk.visible(device)
            cache[dtype] = torch.zeros(vis.shape, dtype=dtype, device=device).masked_fill_(
                ~vis, float("-inf")
            )
        return cache[dtype]

    def _forward(self, q, k, v, chunk):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            bhsd_view(q),
            bhsd_view(k),
            bhsd_view(v),
            attn_mask=self._mask(chunk, q.dtype, q.device),
            scale=self.scale,
        )
        lse = lse[0].to(self.acc).masked_fill(~chunk.rows_with_keys(q.device), float("-inf"))
        return to_thd(out, "bhsd"), lse

    def _backward(self, dout, q, k, v, out, lse, chunk):
        lse_k = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32).unsqueeze(0)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            bhsd_view(dout),
            bhsd_view(q),
            bhsd_view(k),
            bhsd_view(v),
            bhsd_view(out),
            lse_k,
            0.0,
            False,
            attn_mask=self._mask(chunk, q.dtype, q.device),
            scale=self.scale,
        )
        return to_thd(dq, "bhsd"), to_thd(dk, "bhsd"), to_thd(dv, "bhsd")


# ---------------------------------------------------------------- how a chunk reaches a library


def take(x, rows, dim=0):
    """The rows of x a call uses (Varlen.q_rows / k_rows): all, a slice (a view) or gathered."""
    if rows is None:
        return x
    if isinstance(rows, slice):
        return x.narrow(dim, rows.start, rows.stop - rows.start)
    return x.index_select(dim, rows)


def place(part, rows, total: int, fill, dim=0):
    """The inverse of take: part's rows at `rows` of a tensor of `total` rows, the rest `fill`."""
    if rows is None:
        return part
    shape = list(part.shape)
    shape[dim] = total
    out = torch.full(shape, fill, dtype=part.dtype, device=part.device)
    if isinstance(rows, slice):
        out.narrow(dim, rows.start, rows.stop - rows.start).copy_(part)
    else:
        out.index_copy_(dim, rows, part)
    return out


def lse_rows(lse, heads: int, rows: int, library: str):
    """A library's LSE as [Hq, rows]: (b=1, h, s), (b=1, h, s, 1) (cuDNN) and (h, total) (varlen)
    all hold the same numbers; anything else (a padded LSE) is refused, naming the library."""
    if lse.numel() != heads * rows:
        raise RuntimeError(
            f"{library}: expected an LSE of {heads} heads x {rows} rows, got shape {tuple(lse.shape)}"
        )
    return lse.reshape(heads, rows)


class PackedKernel(LocalKernel):
    """One library call over the rows of the chunk's rectangles (a view when they are one
    rectangle or tile the rows, gathered otherwise), with cu_seqlens; the results go back to
    their rows (key ranges are disjoint, so the scatter is exact). Subclasses implement
    packed_forward / packed_backward on packed rows (vl.single: a dense call can do it)."""

    def _forward(self, q, k, v, chunk):
        vl = chunk.varlen(q.device)
        qp = take(q, vl.q_rows).contiguous()
        out, lse = self.packed_forward(
            qp,
            take(k, vl.k_rows).contiguous(),
            take(v, vl.k_rows).contiguous(),
            vl,
            chunk.causal,
        )
        lse = lse_rows(lse, q.shape[1], qp.shape[0], self.name).to(self.acc)
        return place(out, vl.q_rows, q.shape[0], 0.0), place(
            lse, vl.q_rows, q.shape[0], float("-inf"), dim=1
        )

    def _backward(self, dout, q, k, v, out, lse, chunk):
        vl = chunk.varlen(q.device)
        dq, dk, dv = self.packed_backward(
            take(dout, vl.q_rows).contiguous(),
            take(q, vl.q_rows).contiguous(),
            take(k, vl.k_rows).contiguous(),
            take(v, vl.k_rows).contiguous(),
            take(out, vl.q_rows).contiguous(),
            take(lse, vl.q_rows, dim=1).float().contiguous(),
            vl,
            chunk.causal,
        )
        return (
            place(dq, vl.q_rows, q.shape[0], 0.0),
            place(dk, vl.k_rows, k.shape[0], 0.0),
            place(dv, vl.k_rows, v.shape[0], 0.0),
        )

    def packed_forward(self, q, k, v, vl, causal):
        """(out [rows, Hq, D], lse in the library's shape) of the packed rows."""
        raise NotImplementedError

    def packed_backward(self, dout, q, k, v, out, lse, vl, causal):
        """(dq, dk, dv) of the packed rows; lse [Hq, rows] float32."""
        raise NotImplementedError


def bottom_right_parts(seg: Slice):
    """A causal (bottom-right) rectangle with more keys than queries = a full rectangle of the
    leading keys + a causal square (for kernels whose causal is top-left aligned)."""
    extra = seg.kl - seg.ql
    if seg.kind != "causal" or extra <= 0:
        return [seg]
    return [
        Slice(seg.q0, seg.q1, seg.k0, seg.k0 + extra, "full"),
        Slice(seg.q0, seg.q1, seg.k0 + extra, seg.k1, "causal"),
    ]


def _rows(a: int, b: int, total: int):
    return None if (a, b) == (0, total) else slice(a, b)


class RectangleKernel(LocalKernel):
    """One library call per rectangle (full, or causal with as many keys as queries). One
    rectangle: its results as they are (placed in the chunk's rows); several: merged by LSE in
    the accumulator dtype, and their gradient shares summed there."""

    def rectangles(self, chunk):
        return [p for s in chunk.segments for p in bottom_right_parts(s)]

    def _forward(self, q, k, v, chunk):
        rects = self.rectangles(chunk)
        if len(rects) == 1:
            (s,) = rects
            o, rect_lse = self.rect_forward(
                q[s.q0 : s.q1], k[s.k0 : s.k1], v[s.k0 : s.k1], s.kind == "causal"
            )
            rect_lse = lse_rows(rect_lse, q.shape[1], s.ql, self.name).to(self.acc)
            rows = _rows(s.q0, s.q1, q.shape[0])
            return place(o, rows, q.shape[0], 0.0), place(
                rect_lse, rows, q.shape[0], float("-inf"), dim=1
            )
        out = torch.zeros(q.shape, dtype=self.acc, device=q.device)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=self.acc, device=q.device)
        for s in rects:
            o, rect_lse = self.rect_forward(
                q[s.q0 : s.q1], k[s.k0 : s.k1], v[s.k0 : s.k1], s.kind == "causal"
            )
            merge_into(
                out[s.q0 : s.q1],
                lse[:, s.q0 : s.q1],
                o,
                lse_rows(rect_lse, q.shape[1], s.ql, self.name),
            )
        return out.to(q.dtype), lse

    def _backward(self, dout, q, k, v, out, lse, chunk):
        rects = self.rectangles(chunk)
        grads = None
        for s in rects:
            parts = self.rect_backward(
                dout[s.q0 : s.q1],
                q[s.q0 : s.q1],
                k[s.k0 : s.k1],
                v[s.k0 : s.k1],
                out[s.q0 : s.q1],
                lse[:, s.q0 : s.q1].float().contiguous(),
                s.kind == "causal",
            )
            spans = ((s.q0, s.q1, q), (s.k0, s.k1, k), (s.k0, s.k1, v))
            if len(rects) == 1:
                return tuple(
                    place(g, _rows(a, b, x.shape[0]), x.shape[0], 0.0)
                    for g, (a, b, x) in zip(parts, spans)
                )
            if grads is None:
                grads = [torch.zeros(x.shape, dtype=self.acc, device=x.device) for x in (q, k, v)]
            for acc, g, (a, b, _) in zip(grads, parts, spans):
                acc[a:b] += g
        return tuple(grads)

    def rect_forward(self, q, k, v, causal):
        """(out [ql, Hq, D], lse holding Hq x ql values) of one rectangle."""
        raise NotImplementedError

    def rect_backward(self, dout, q, k, v, out, lse, causal):
        """(dq, dk, dv) of one rectangle, given the final out and lse [Hq, ql] float32."""
        raise NotImplementedError


# ---------------------------------------------------------------- FlexAttention


class RecomputeBackward:
    """Backward of a kernel whose library exposes no backward taking the final LSE: recompute
    this chunk's (out_t, lse_t) under autograd and back-propagate the final loss's gradient into
    them: with w = exp(lse_t - lse), d/d out_t = w dout and d/d lse_t = w <dout, out_t - out>.
    (One extra forward per step; recorded as the method's cost, not hidden.)"""

    def differentiable_forward(self, q, k, v, chunk):
        raise NotImplementedError

    def _backward(self, dout, q, k, v, out, lse, chunk):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        with torch.enable_grad():
            out_t, lse_t = self.differentiable_forward(*leaves, chunk)
            w = torch.exp(
                lse_t.detach().to(self.acc) - lse.to(self.acc)
            )  # [H, ql]; 0 where lse_t = -inf
            wt = w.transpose(0, 1).unsqueeze(-1)
            g_out = (dout.to(self.acc) * wt).to(out_t.dtype)
            g_lse = (
                w
                * (dout.to(self.acc) * (out_t.detach().to(self.acc) - out.to(self.acc)))
                .sum(-1)
                .transpose(0, 1)
            ).to(lse_t.dtype)
            return torch.autograd.grad((out_t, lse_t), leaves, (g_out, g_lse))


class MathRecompute(RecomputeBackward, MathKernel):
    """The math kernel with the recomputation backward (tests the recomputation on CPU)."""

    def differentiable_forward(self, q, k, v, chunk):
        return MathKernel._forward(self, q, k, v, chunk)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # One compilation per chunk shape / mask_mod closure (a few per ring); past the limit Dynamo
    # would run flex eagerly, a different computation: fail instead, with room for a long ring.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return torch.compile(flex_attention, dynamic=False)


class Flex(RecomputeBackward, LocalKernel):
    """FlexAttention with the LSE; the BlockMask comes from the chunk's rectangles (segment ids
    per row, causal offset per row). Compiled on GPU; eager on CPU (forward only there)."""

    def _block_mask(self, chunk, device):
        cache = chunk.__dict__.setdefault("_flex", {})
        if str(device) in cache:
            return cache[str(device)]
        from torch.nn.attention.flex_attention import create_block_mask

        q_seg = torch.full((chunk.ql,), -1, dtype=torch.int32, device=device)
        k_seg = torch.full((chunk.kl,), -2, dtype=torch.int32, device=device)
        q_off = torch.zeros(chunk.ql, dtype=torch.int32, device=device)
        k_off = torch.zeros(chunk.kl, dtype=torch.int32, device=device)
        for i, s in enumerate(chunk.segments):
            q_seg[s.q0 : s.q1] = i
            k_seg[s.k0 : s.k1] = i
            q_off[s.q0 : s.q1] = torch.arange(s.ql, device=device, dtype=torch.int32) + (
                s.kl - s.ql
            )
            k_off[s.k0 : s.k1] = torch.arange(s.kl, device=device, dtype=torch.int32)
        causal = chunk.causal

        def mask_mod(b, h, qi, ki):
            same = q_seg[qi] == k_seg[ki]
            return same & (k_off[ki] <= q_off[qi]) if causal else same

        bm = create_block_mask(mask_mod, None, None, chunk.ql, chunk.kl, device=device)
        cache[str(device)] = bm
        return bm

    def differentiable_forward(self, q, k, v, chunk):
        from torch.nn.attention.flex_attention import flex_attention

        fn = _compiled_flex() if q.device.type == "cuda" else flex_attention
        out, lse = fn(
            bhsd_view(q),
            bhsd_view(k),
            bhsd_view(v),
            block_mask=self._block_mask(chunk, q.device),
            scale=self.scale,
            enable_gqa=q.shape[1] != k.shape[1],
            return_lse=True,
        )
        lse = lse[0].to(self.acc).masked_fill(~chunk.rows_with_keys(q.device), float("-inf"))
        return to_thd(out, "bhsd"), lse

    def _forward(self, q, k, v, chunk):
        with torch.no_grad():
            return self.differentiable_forward(q, k, v, chunk)

    def _backward(self, dout, q, k, v, out, lse, chunk):
        if q.device.type != "cuda":
            raise Unsupported("FlexAttention has no backward on CPU")
        return RecomputeBackward._backward(self, dout, q, k, v, out, lse, chunk)
