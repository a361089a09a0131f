"""CP local kernels: (q, k, v, chunk) -> (out, lse), with an explicit backward.

Layout thd: q [ql, Hq, D], k and v [kl, Hkv, D] (GQA: Hq a multiple of Hkv). forward returns
out [ql, Hq, D] in q's dtype and lse [Hq, ql] (float32; float64 for float64 inputs), natural log,
-inf (and out 0) for rows that see no key in the chunk. backward(dout, q, k, v, out, lse, chunk)
takes the FINAL output and LSE of these query rows (merged over every chunk they saw) and returns
this chunk's share of (dq, dk, dv): with P = exp(s - lse) for the final lse, the shares of all
chunks sum to the true gradients. That is what lets the ring methods run backward step by step.

A chunk (cp/chunks.py's Chunk) says which local query rows see which local key rows: its
`segments` (rectangles, all full or all causal bottom-right), `causal`, `empty`, and its forms
`visible(device)`, `rows_with_keys(device)`, `varlen(device)` (cu_seqlens).

The methods merge a chunk's result into their accumulators through forward_into, which a packed
kernel confines to the chunk's own rows (a chunk of one short document costs its rows, not the
shard's) and which copies instead of merging into accumulators nothing was merged into yet; their
backward shares come as GradShare (backward_share), which a packed kernel leaves on its own rows.

Here: the protocol, the two ways a chunk reaches a library (PackedKernel: one call over the
rectangles' rows, dense for one rectangle, varlen with cu_seqlens for several; RectangleKernel:
one call per rectangle, merged by LSE) and the backward by recomputation (RecomputeBackward). Each
library's local kernel sits in its adapter module beside its kernel adapter (naive.py, sdpa.py,
flex.py, flash_attn.py), listed in catalog.LOCAL_KERNELS; each converts its library's LSE
convention, so what a local kernel returns and consumes is always the [Hq, ql] natural-log form.
"""

from __future__ import annotations

import importlib
import math

import torch

from ..masks.ranges import Slice
from .catalog import LocalKernelInfo
from .lse import accumulator_dtype, finite_lse, lse_rows, merge_into


def load(info: LocalKernelInfo, device, dtype, head_dim) -> "LocalKernel":
    """The local kernel of a LOCAL_KERNELS entry, its class imported from its library's module."""
    module, cls = info.impl.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)(
        info, device, dtype, head_dim
    )


class LocalKernel:
    def __init__(self, info: LocalKernelInfo, device, dtype, head_dim: int):
        self.info, self.name = info, info.name
        self.device, self.dtype = torch.device(device), dtype
        self.scale = 1.0 / math.sqrt(head_dim)
        self.acc = accumulator_dtype(dtype)

    def forward(self, q, k, v, chunk):
        if chunk.empty:
            return (
                q.new_zeros(q.shape),
                torch.full(
                    (q.shape[1], q.shape[0]), float("-inf"), dtype=self.acc, device=q.device
                ),
            )
        return self._forward(q, k, v, chunk)

    def forward_into(self, out, lse, q, k, v, chunk, first: bool) -> bool:
        """This chunk's (out, lse) merged into the accumulators out [ql, Hq, D] and lse [Hq, ql]
        (in place); `first`: nothing was merged into them yet, so the result is copied (the
        same numbers: merging with 0 and -inf is exact). False when the chunk had nothing."""
        if chunk.empty:
            return False
        merge_or_copy(out, lse, *self._forward(q, k, v, chunk), first)
        return True

    def backward(self, dout, q, k, v, out, lse, chunk):
        """(dq, dk, dv) of this chunk, or None when it has no visible pair."""
        if chunk.empty:
            return None
        return self._backward(dout, q, k, v, out, lse, chunk)

    def backward_whole(self, dout, q, k, v, out, lse, chunk):
        """(dq, dk, dv) of a chunk that is the whole story of its rows (no other chunk adds to
        them: a ring-local rank's own documents), from the rows' final (out, lse): the library's
        gradients as they are, zeros where the chunk has no visible pair."""
        grads = self.backward(dout, q, k, v, out, finite_lse(lse), chunk)
        return grads or tuple(torch.zeros_like(x) for x in (q, k, v))

    def backward_share(self, dout, q, k, v, out, lse, chunk) -> "GradShare | None":
        """This chunk's gradient share as the methods add it up (GradShare), or None."""
        res = self.backward(dout, q, k, v, out, lse, chunk)
        return None if res is None else GradShare(*res)

    def _forward(self, q, k, v, chunk):
        raise NotImplementedError

    def _backward(self, dout, q, k, v, out, lse, chunk):
        raise NotImplementedError


# ---------------------------------------------------------------- how a chunk reaches a library


class Ranges(tuple):
    """Rows that are a few contiguous ranges, in order: a tuple of slices (start < stop), which
    the kernels read and write as narrow() views, with no index tensor."""


def take(x, rows, dim=0):
    """The rows of x a call uses (Varlen.q_rows / k_rows): all, a slice (a view), Ranges (their
    views concatenated) or gathered by an index."""
    if rows is None:
        return x
    if isinstance(rows, slice):
        return x.narrow(dim, rows.start, rows.stop - rows.start)
    if isinstance(rows, Ranges):
        return torch.cat([x.narrow(dim, r.start, r.stop - r.start) for r in rows], dim)
    return x.index_select(dim, rows)


def range_spans(rows: Ranges):
    """(start in the full rows, start in the packed rows, length) of each range."""
    at = 0
    for r in rows:
        yield r.start, at, r.stop - r.start
        at += r.stop - r.start


def place(part, rows, total: int, fill, dim=0):
    """The inverse of take: part's rows at `rows` of a tensor of `total` rows, the rest `fill`."""
    if rows is None:
        return part
    shape = list(part.shape)
    shape[dim] = total
    out = torch.full(shape, fill, dtype=part.dtype, device=part.device)
    if isinstance(rows, slice):
        out.narrow(dim, rows.start, rows.stop - rows.start).copy_(part)
    elif isinstance(rows, Ranges):
        for a, at, n in range_spans(rows):
            out.narrow(dim, a, n).copy_(part.narrow(dim, at, n))
    else:
        out.index_copy_(dim, rows, part)
    return out


def add_rows(dst, part, rows):
    """dst[rows] += part, rows as take() has them, in dst's dtype."""
    if rows is None:
        dst += part
    elif isinstance(rows, slice):
        dst[rows] += part
    elif isinstance(rows, Ranges):
        if torch.promote_types(part.dtype, dst.dtype) != dst.dtype:
            part = part.to(dst.dtype)  # a wider part is rounded first, as the index path does
        # otherwise add_ widens part exactly, as .to() would, with no copy of it
        for a, at, n in range_spans(rows):
            dst.narrow(0, a, n).add_(part.narrow(0, at, n))
    else:
        dst.index_add_(0, rows, part.to(dst.dtype))


def merge_rows(out, lse, out_t, lse_t, rows, first: bool):
    """merge_or_copy of the packed (out_t, lse_t) into the accumulators' `rows` only (as take()
    has them): on views for a slice or Ranges (merging is row by row, so range by range gives
    the same numbers), gathered and put back for an index."""
    if rows is None or isinstance(rows, slice):
        rows = rows or slice(0, out.shape[0])
        merge_or_copy(out[rows], lse[:, rows], out_t, lse_t, first)
    elif isinstance(rows, Ranges):
        for a, at, n in range_spans(rows):
            o, lo = out_t.narrow(0, at, n), lse_t.narrow(1, at, n)
            merge_or_copy(out.narrow(0, a, n), lse.narrow(1, a, n), o, lo, first)
    elif first:
        out.index_copy_(0, rows, out_t.to(out.dtype))
        lse.index_copy_(1, rows, lse_t)
    else:
        acc_out, acc_lse = out.index_select(0, rows), lse.index_select(1, rows)
        merge_into(acc_out, acc_lse, out_t, lse_t)
        out.index_copy_(0, rows, acc_out)
        lse.index_copy_(1, rows, acc_lse)


class GradShare:
    """A chunk's share of (dq, dk, dv): the rows it computed and where they go (q_rows, k_rows as
    take() has them), so that adding it up touches those rows only."""

    def __init__(self, dq, dk, dv, q_rows=None, k_rows=None):
        self.dq, self.dk, self.dv = dq, dk, dv
        self.q_rows, self.k_rows = q_rows, k_rows

    def add_q(self, dq):
        add_rows(dq, self.dq, self.q_rows)

    def add_kv(self, dk, dv):
        add_rows(dk, self.dk, self.k_rows)
        add_rows(dv, self.dv, self.k_rows)


def merge_or_copy(out, lse, out_t, lse_t, first: bool):
    if first:
        out.copy_(out_t)
        lse.copy_(lse_t)
    else:
        merge_into(out, lse, out_t, lse_t)


class PackedKernel(LocalKernel):
    """One library call over the rows of the chunk's rectangles (a view when they are one
    rectangle or tile the rows, copied range by range when they are a few ranges, gathered
    otherwise), with cu_seqlens; the results go back to their rows (key ranges are disjoint, so
    the scatter is exact). Subclasses implement packed_forward / packed_backward on packed rows
    (vl.single: a dense call can do it)."""

    def _packed(self, q, k, v, vl, causal):
        """(out, lse in the accumulator dtype) of the packed rows."""
        qp = take(q, vl.q_rows).contiguous()
        out, lse = self.packed_forward(
            qp, take(k, vl.k_rows).contiguous(), take(v, vl.k_rows).contiguous(), vl, causal
        )
        return out, lse_rows(lse, q.shape[1], qp.shape[0], self.name).to(self.acc)

    def _forward(self, q, k, v, chunk):
        vl = chunk.varlen(q.device)
        out, lse = self._packed(q, k, v, vl, chunk.causal)
        return place(out, vl.q_rows, q.shape[0], 0.0), place(
            lse, vl.q_rows, q.shape[0], float("-inf"), dim=1
        )

    def forward_into(self, out, lse, q, k, v, chunk, first: bool) -> bool:
        """Only the chunk's rows of the accumulators are touched (a document chunk of a few rows
        costs a few rows, not the whole shard): merge_rows."""
        if chunk.empty:
            return False
        vl = chunk.varlen(q.device)
        merge_rows(out, lse, *self._packed(q, k, v, vl, chunk.causal), vl.q_rows, first)
        return True

    def _packed_grads(self, dout, q, k, v, out, lse, vl, causal):
        return self.packed_backward(
            take(dout, vl.q_rows).contiguous(),
            take(q, vl.q_rows).contiguous(),
            take(k, vl.k_rows).contiguous(),
            take(v, vl.k_rows).contiguous(),
            take(out, vl.q_rows).contiguous(),
            take(lse, vl.q_rows, dim=1).float().contiguous(),
            vl,
            causal,
        )

    def _backward(self, dout, q, k, v, out, lse, chunk):
        vl = chunk.varlen(q.device)
        dq, dk, dv = self._packed_grads(dout, q, k, v, out, lse, vl, chunk.causal)
        return (
            place(dq, vl.q_rows, q.shape[0], 0.0),
            place(dk, vl.k_rows, k.shape[0], 0.0),
            place(dv, vl.k_rows, v.shape[0], 0.0),
        )

    def backward_share(self, dout, q, k, v, out, lse, chunk):
        """The packed rows' gradients, not placed into full-size tensors."""
        if chunk.empty:
            return None
        vl = chunk.varlen(q.device)
        grads = self._packed_grads(dout, q, k, v, out, lse, vl, chunk.causal)
        return GradShare(*grads, vl.q_rows, vl.k_rows)

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


# ---------------------------------------------------------------- backward by recomputation


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
