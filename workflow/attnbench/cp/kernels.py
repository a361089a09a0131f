"""Local attention kernels: (q, k, v, chunk) -> (out, lse), with an explicit backward.

Layout thd: q [ql, Hq, D], k and v [kl, Hkv, D] (GQA: Hq a multiple of Hkv). forward returns
out [ql, Hq, D] in q's dtype and lse [Hq, ql] (float32; float64 for float64 inputs), natural log,
-inf (and out 0) for rows that see no key in the chunk. backward(dout, q, k, v, out, lse, chunk)
takes the FINAL output and LSE of these query rows (merged over every chunk they saw) and returns
this chunk's share of (dq, dk, dv): with P = exp(s - lse) for the final lse, the shares of all
chunks sum to the true gradients. That is what lets the ring methods run backward step by step.

CPU: `math` (explicit, float32/float64) and `cpu_flash` (aten's CPU flash kernel with a dense
mask, real logsumexp). GPU: `sdpa_flash` (aten flash varlen with cu_seqlens), `sdpa_cudnn`
(aten cuDNN, one rectangle per call), `flex` (FlexAttention, return_lse), `fa2` / `fa3`
(flash_attn / flash_attn_interface varlen, where installed).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math

import torch

from ..kernels.base import bhsd_view, from_thd, to_thd
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


# ---------------------------------------------------------------- GPU kernels (varlen)


class VarlenKernel(LocalKernel):
    """Gathers the chunk's rows when its rectangles leave gaps, runs a cu_seqlens kernel, and
    scatters the results back (key ranges are disjoint, so index_copy is exact)."""

    def _pack(self, chunk, q, k, v):
        vl = chunk.varlen(q.device)
        qg = q if vl.q_index is None else q.index_select(0, vl.q_index)
        kg = k if vl.k_index is None else k.index_select(0, vl.k_index)
        vg = v if vl.k_index is None else v.index_select(0, vl.k_index)
        return vl, qg.contiguous(), kg.contiguous(), vg.contiguous()

    def _forward(self, q, k, v, chunk):
        vl, qg, kg, vg = self._pack(chunk, q, k, v)
        out, lse = self.varlen_forward(qg, kg, vg, vl, chunk.causal)
        if lse.shape != (q.shape[1], qg.shape[0]):
            raise RuntimeError(
                f"{self.name}: expected a varlen LSE of shape {(q.shape[1], qg.shape[0])}, "
                f"got {tuple(lse.shape)}"
            )
        lse = lse.to(self.acc)
        if vl.q_index is None:
            return out, lse
        full_out = q.new_zeros(q.shape).index_copy_(0, vl.q_index, out)
        full_lse = torch.full(
            (q.shape[1], q.shape[0]), float("-inf"), dtype=self.acc, device=q.device
        )
        return full_out, full_lse.index_copy_(1, vl.q_index, lse)

    def _backward(self, dout, q, k, v, out, lse, chunk):
        vl, qg, kg, vg = self._pack(chunk, q, k, v)
        sel = (lambda x: x) if vl.q_index is None else (lambda x: x.index_select(0, vl.q_index))
        lse_g = lse.float() if vl.q_index is None else lse.float().index_select(1, vl.q_index)
        dq, dk, dv = self.varlen_backward(
            sel(dout).contiguous(),
            qg,
            kg,
            vg,
            sel(out).contiguous(),
            lse_g.contiguous(),
            vl,
            chunk.causal,
        )
        if vl.q_index is not None:
            dq = q.new_zeros(q.shape).index_copy_(0, vl.q_index, dq)
        if vl.k_index is not None:
            dk = k.new_zeros(k.shape).index_copy_(0, vl.k_index, dk)
            dv = v.new_zeros(v.shape).index_copy_(0, vl.k_index, dv)
        return dq, dk, dv

    def varlen_forward(self, q, k, v, vl, causal):
        raise NotImplementedError

    def varlen_backward(self, dout, q, k, v, out, lse, vl, causal):
        raise NotImplementedError


class SdpaFlashVarlen(VarlenKernel):
    """torch.ops.aten._flash_attention_forward / _backward (PyTorch's FlashAttention-2 code) with
    cu_seqlens; causal is bottom-right aligned per sequence; GQA native."""

    def varlen_forward(self, q, k, v, vl, causal):
        out, lse, _, _, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, vl.cu_q, vl.cu_k, vl.max_q, vl.max_k, 0.0, causal, False, scale=self.scale
        )
        return out, lse

    def varlen_backward(self, dout, q, k, v, out, lse, vl, causal):
        rng_state = torch.zeros(2, dtype=torch.uint64, device=q.device)  # dropout is 0: unused
        unused = torch.empty(0, device=q.device)
        return torch.ops.aten._flash_attention_backward(
            dout,
            q,
            k,
            v,
            out,
            lse,
            vl.cu_q,
            vl.cu_k,
            vl.max_q,
            vl.max_k,
            0.0,
            causal,
            rng_state,
            unused,
            scale=self.scale,
        )


def _kwargs_for(fn, **candidates):
    """Keyword arguments `fn` accepts, from candidates (library signatures change between releases)."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in candidates.items() if k in params}


class FA2Varlen(VarlenKernel):
    """flash_attn.flash_attn_varlen_func(return_attn_probs=True) returns the LSE; the backward is
    flash_attn's own varlen backward entry (the one its autograd Function calls)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.iface = importlib.import_module("flash_attn.flash_attn_interface")

    def varlen_forward(self, q, k, v, vl, causal):
        res = self.iface.flash_attn_varlen_func(
            q,
            k,
            v,
            vl.cu_q,
            vl.cu_k,
            vl.max_q,
            vl.max_k,
            dropout_p=0.0,
            softmax_scale=self.scale,
            causal=causal,
            return_attn_probs=True,
        )
        return res[0], res[1]

    def varlen_backward(self, dout, q, k, v, out, lse, vl, causal):
        fn = self.iface._flash_attn_varlen_backward
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        kw = _kwargs_for(
            fn,
            dout=dout,
            q=q,
            k=k,
            v=v,
            out=out,
            softmax_lse=lse,
            dq=dq,
            dk=dk,
            dv=dv,
            cu_seqlens_q=vl.cu_q,
            cu_seqlens_k=vl.cu_k,
            max_seqlen_q=vl.max_q,
            max_seqlen_k=vl.max_k,
            dropout_p=0.0,
            softmax_scale=self.scale,
            causal=causal,
            window_size=(-1, -1),
            window_size_left=-1,
            window_size_right=-1,
            softcap=0.0,
            alibi_slopes=None,
            deterministic=False,
            rng_state=None,
        )
        fn(**kw)
        return dq, dk, dv


class FA3Varlen(VarlenKernel):
    """flash_attn_interface (FlashAttention-3, Hopper): varlen forward with the LSE, and its
    backward entry, called with the keywords the installed release declares."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.iface = importlib.import_module("flash_attn_interface")

    def varlen_forward(self, q, k, v, vl, causal):
        fn = self.iface._flash_attn_forward
        kw = _kwargs_for(
            fn,
            q=q,
            k=k,
            v=v,
            cu_seqlens_q=vl.cu_q,
            cu_seqlens_k=vl.cu_k,
            max_seqlen_q=vl.max_q,
            max_seqlen_k=vl.max_k,
            softmax_scale=self.scale,
            causal=causal,
        )
        res = fn(**kw)
        return res[0], res[1]

    def varlen_backward(self, dout, q, k, v, out, lse, vl, causal):
        fn = self.iface._flash_attn_backward
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        kw = _kwargs_for(
            fn,
            dout=dout,
            q=q,
            k=k,
            v=v,
            out=out,
            softmax_lse=lse,
            cu_seqlens_q=vl.cu_q,
            cu_seqlens_k=vl.cu_k,
            max_seqlen_q=vl.max_q,
            max_seqlen_k=vl.max_k,
            dq=dq,
            dk=dk,
            dv=dv,
            softmax_scale=self.scale,
            causal=causal,
            deterministic=False,
        )
        fn(**kw)
        return dq, dk, dv


# ---------------------------------------------------------------- rectangle-at-a-time kernels


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


class RectangleKernel(LocalKernel):
    """One library call per rectangle (full, or causal with as many keys as queries); the
    partial results of a query row are merged by LSE. Backward: one call per rectangle too."""

    def rectangles(self, chunk):
        return [p for s in chunk.segments for p in bottom_right_parts(s)]

    def _forward(self, q, k, v, chunk):
        out = torch.zeros(q.shape, dtype=self.acc, device=q.device)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=self.acc, device=q.device)
        for s in self.rectangles(chunk):
            o, rect_lse = self.rect_forward(
                q[s.q0 : s.q1], k[s.k0 : s.k1], v[s.k0 : s.k1], s.kind == "causal"
            )
            merge_into(out[s.q0 : s.q1], lse[:, s.q0 : s.q1], o, rect_lse)
        return out.to(q.dtype), lse

    def _backward(self, dout, q, k, v, out, lse, chunk):
        dq = torch.zeros(q.shape, dtype=self.acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=self.acc, device=q.device)
        dv = torch.zeros(v.shape, dtype=self.acc, device=q.device)
        for s in self.rectangles(chunk):
            a, b, c = self.rect_backward(
                dout[s.q0 : s.q1],
                q[s.q0 : s.q1],
                k[s.k0 : s.k1],
                v[s.k0 : s.k1],
                out[s.q0 : s.q1],
                lse[:, s.q0 : s.q1],
                s.kind == "causal",
            )
            dq[s.q0 : s.q1] += a
            dk[s.k0 : s.k1] += b
            dv[s.k0 : s.k1] += c
        return dq, dk, dv


class SdpaCudnn(RectangleKernel):
    """aten._scaled_dot_product_cudnn_attention(compute_log_sumexp=True) and its backward, in
    bhsd layout; KV heads are repeated for GQA (and their gradients summed back)."""

    def _bhsd(self, x, heads=None):
        if heads is not None and x.shape[1] != heads:
            x = x.repeat_interleave(heads // x.shape[1], dim=1)
        return from_thd(x, "bhsd")

    def rect_forward(self, q, k, v, causal):
        hq = q.shape[1]
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(
            self._bhsd(q),
            self._bhsd(k, hq),
            self._bhsd(v, hq),
            None,
            True,
            0.0,
            causal,
            False,
            scale=self.scale,
        )
        out, lse = res[0], res[1]
        return to_thd(out, "bhsd"), lse.reshape(hq, q.shape[0]).to(self.acc)

    def _backward(self, dout, q, k, v, out, lse, chunk):
        # Seen on an H200 (torch 2.11): aten._scaled_dot_product_cudnn_attention_backward takes a
        # non-optional attn_bias, and the empty tensor Python must pass for "none" makes it fail
        # (IndexError: Dimension out of range). Until there is a way to call it without a bias,
        # the backward of this local kernel is refused rather than crashing the job.
        raise Unsupported(
            "sdpa_cudnn local kernel: no callable cuDNN backward entry point without an attention "
            "bias in this torch (IndexError in _scaled_dot_product_cudnn_attention_backward on an "
            "H200 with torch 2.11); use local_kernel sdpa_flash or flex for backward"
        )


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
