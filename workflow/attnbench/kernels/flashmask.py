"""FlashMask (PaddlePaddle): a mask as column-wise row intervals (startend_row_indices).

The encoding is derived from the mask's predicate one block of columns at a time (memory
O(S x block), never S x S) and verified: a column whose visible rows are not the intervals the
encoding can express makes the mask `unsupported` for FlashMask. Per column j (paddle docs):
  causal=True,  [LTS]            rows >= LTS masked in the lower triangle (i >= j)
  causal=True,  [LTS, LTE]       rows in [LTS, LTE) masked in the lower triangle
  causal=False, [LTS, UTE]       lower rows >= LTS masked, upper (i < j) rows < UTE masked
  causal=False, [LTS, LTE, UTS, UTE]  lower rows in [LTS, LTE), upper rows in [UTS, UTE) masked
It runs FlashMask V3's PyTorch extension (`interface_torch.flashmask_attention`, module
`flashmask._C`; envs/build_flashmask.sh builds it): bshd tensors, native GQA, its own backward
through autograd. Paddle is not needed.

Also FlashMask's CP local kernel (local_kernel.py's protocol): a chunk's rectangles, packed, as
one batch-1 call whose key columns carry their visible rows (packed_row_intervals), through the
extension's own operators (torch.ops.flashmask.fwd / bwd: LSE [1, Hq, rows], natural log, -inf
for rows that see nothing; the backward takes the final out and LSE, as FA3's does).
"""

from __future__ import annotations

import importlib

import numpy as np
import torch

from ..record.status import Unsupported
from .base import Kernel
from .local_kernel import PackedKernel


def _first_true(x, default):
    """Index of the first True along the last dim, or `default` where there is none."""
    n = x.shape[-1]
    idx = torch.where(x, torch.arange(n, device=x.device), torch.full_like(x, n, dtype=torch.long))
    first = idx.min(dim=-1).values
    return torch.where(first == n, torch.as_tensor(default, device=x.device), first)


def column_intervals(mask, device="cpu", block=1024):
    """[S, 4] int64 (LTS, LTE, UTS, UTE) for every column, exact, or raise Unsupported."""
    s = mask.seqlen
    if mask.sparse:
        raise Unsupported(
            "flashmask: block-sparse masks differ per head; this adapter encodes one mask for all heads"
        )
    pred = mask.predicate(device)
    rows = torch.arange(s, device=device)
    out = torch.empty(s, 4, dtype=torch.long, device=device)
    for c0 in range(0, s, block):
        cols = torch.arange(c0, min(s, c0 + block), device=device)
        vis = pred(None, rows.view(1, -1), cols.view(-1, 1)).expand(len(cols), s)  # [cols, rows]
        lower = rows.view(1, -1) >= cols.view(-1, 1)
        r = rows.view(1, -1)
        # lower triangle: visible [j, LTS) + [LTE, S)
        lts = _first_true(lower & ~vis, s)
        lte = _first_true(lower & vis & (r >= lts.view(-1, 1)), s)
        lte = torch.where(lts == s, torch.full_like(lte, s), lte)
        # upper triangle: visible [0, UTS) + [UTE, j)
        upper = ~lower
        uts = _first_true(upper & ~vis, 0)
        has_masked_upper = (upper & ~vis).any(dim=1)
        ute = _first_true(upper & vis & (r >= uts.view(-1, 1)), 0)
        ute = torch.where(has_masked_upper & (ute == 0), cols, ute)  # masked up to the diagonal
        uts = torch.where(has_masked_upper, uts, torch.zeros_like(uts))
        ute = torch.where(has_masked_upper, ute, torch.zeros_like(ute))
        enc = torch.stack([lts, lte, uts, ute], dim=1)
        if not torch.equal(decode_columns(enc, cols, s), vis):
            bad = int(cols[(decode_columns(enc, cols, s) != vis).any(dim=1)][0])
            raise Unsupported(f"flashmask: column {bad} of {mask.name} is not two row intervals")
        out[c0 : c0 + len(cols)] = enc
    return out


def decode_columns(enc, cols, s):
    """The visible rows [cols, S] that (LTS, LTE, UTS, UTE) per column describe."""
    r = torch.arange(s, device=enc.device).view(1, -1)
    j = cols.view(-1, 1)
    lts, lte, uts, ute = (enc[:, i : i + 1] for i in range(4))
    lower_vis = (r >= j) & ~((r >= lts) & (r < lte))
    upper_vis = (r < j) & ~((r >= uts) & (r < ute))
    return lower_vis | upper_vis


def flashmask_encoding(mask, device="cpu"):
    """(startend_row_indices [1, 1, S, n] int32, causal) in the smallest form that holds the mask."""
    enc = column_intervals(mask, device)
    s = mask.seqlen
    cols = torch.arange(s, device=device)
    no_upper = bool(((enc[:, 2] == 0) & (enc[:, 3] == cols)).all())
    if no_upper:
        pick = [0] if bool((enc[:, 1] == s).all()) else [0, 1]
        causal = True
    elif bool((enc[:, 1] == s).all()) and bool((enc[:, 2] == 0).all()):
        pick, causal = [0, 3], False
    else:
        pick, causal = [0, 1, 2, 3], False
    return enc[:, pick].to(torch.int32).view(1, 1, s, len(pick)).contiguous(), causal


def decode_encoding(indices, causal, s):
    """Dense visible matrix of a startend_row_indices tensor (the inverse, for tests)."""
    n = indices.shape[-1]
    e = indices.view(s, n).long()
    full = torch.full((s,), s, dtype=torch.long, device=e.device)
    zero = torch.zeros(s, dtype=torch.long, device=e.device)
    cols = torch.arange(s, device=e.device)
    if causal:
        lts, lte = e[:, 0], (e[:, 1] if n == 2 else full)
        uts, ute = zero, cols
    elif n == 2:
        lts, lte, uts, ute = e[:, 0], full, zero, e[:, 1]
    else:
        lts, lte, uts, ute = e[:, 0], e[:, 1], e[:, 2], e[:, 3]
    enc = torch.stack([lts, lte, uts, ute], dim=1)
    return decode_columns(enc, cols, s).T  # [rows, cols]


class FlashMask(Kernel):
    layout = "bshd"

    def prepare(self, mask):
        if self.dtype not in (torch.float16, torch.bfloat16):
            self.unsupported(f"needs float16 or bfloat16, got {self.dtype}")
        lib = self.import_library("interface_torch")
        indices, causal = flashmask_encoding(mask, self.device)
        return lambda q, k, v: lib.flashmask_attention(
            q, k, v, startend_row_indices=indices, causal=causal
        )


# ---------------------------------------------------------------- the CP local kernel


def packed_row_intervals(lengths, causal: bool):
    """(startend [K, n] int32 numpy, is_causal) for rectangles packed one after the other (each
    (query rows, key rows); causal ones bottom-right aligned). Every key column of a rectangle sees
    one run of its rows, so one or two bounds per column say it exactly:
      all causal and square: [LTS] = the rectangle's last row + 1, under FlashMask's own causal;
      otherwise: [LTS, UTE] without causal, visible rows [UTE, LTS)."""
    square = all(ql == kl for ql, kl in lengths)
    ends, starts, q0 = [], [], 0
    for ql, kl in lengths:
        c = np.arange(kl)
        ends.append(np.full(kl, q0 + ql))
        # causal bottom-right: row r sees column c when c <= r + (kl - ql)
        starts.append(q0 + (np.clip(c - (kl - ql), 0, None) if causal else np.zeros(kl, int)))
        q0 += ql
    if causal and square:
        return np.concatenate(ends)[:, None].astype(np.int32), True
    return np.stack([np.concatenate(ends), np.concatenate(starts)], 1).astype(np.int32), False


class FlashMaskLocal(PackedKernel):
    """One FlashMask call per chunk over its packed rectangles (module docstring)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        importlib.import_module("flashmask._C")  # registers torch.ops.flashmask
        self.ops = torch.ops.flashmask
        self._bounds = {}  # (lengths, causal) -> (startend on the device, is_causal)

    def bounds(self, vl, causal):
        key = (vl.lengths, causal)
        if key not in self._bounds:
            enc, is_causal = packed_row_intervals(vl.lengths, causal)
            dev = torch.from_numpy(enc).to(self.device)
            self._bounds[key] = (dev.view(1, 1, *enc.shape), is_causal)
        return self._bounds[key]

    def packed_forward(self, q, k, v, vl, causal):
        startend, is_causal = self.bounds(vl, causal)
        out, lse = self.ops.fwd(
            q[None], k[None], v[None], softmax_scale=self.scale, is_causal=is_causal,
            startend_row_indices=startend,
        )  # fmt: skip
        return out[0], lse

    def packed_backward(self, dout, q, k, v, out, lse, vl, causal):
        startend, is_causal = self.bounds(vl, causal)
        dq, dk, dv = self.ops.bwd(
            dout[None], q[None], k[None], v[None], out[None], lse[None],
            startend_row_indices=startend, softmax_scale=self.scale, is_causal=is_causal,
        )  # fmt: skip
        return dq[0], dk[0], dv[0]
