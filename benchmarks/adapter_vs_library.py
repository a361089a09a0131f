"""Each kernel adapter against its library called by hand: is the adapter the library at its best?

For every kernel it knows whose library is installed, every mask and length, this draws one mask and
one set of inputs, then times the adapter's prepared call (`Kernel.prepare(mask)`, what a cell
times) and a hand-written call of the same library on the same mask and inputs: the library's plain
documented usage, written here from the mask's definition (docs/masks.md) and the library's docs,
independently of the adapter. Both run through the same timing routine
(`triton.testing.do_bench`, median, on CUDA; perf_counter medians on the CPU) and the same
direction (fwd: no autograd; bwd: the backward of one retained forward; fwdbwd: both). A ratio
(adapter / hand-written) above 1 says the adapter loses time its library would not; `out max diff`
is the largest difference of the two forward outputs (the same mask computed twice).

The hand-written calls:
  flex            torch.compile(flex_attention, dynamic=False) (attention-gym's benchmark) with
                  create_block_mask(mask_mod) at flex's default block size; the mask_mod as the
                  docs write one: per-token document_id tables, Python-int parameters
  sdpa*           F.scaled_dot_product_attention with is_causal, else a boolean attn_mask from
                  create_mask(mask_mod) (attention-gym's benchmark), under sdpa_kernel(backend)
  fa2, fa3        flash_attn_func(causal=, window_size=) on one sequence; flash_attn_varlen_func
                  with cu_seqlens for packed documents (the 6 regular masks)
  fa4             flash_attn.cute's flash_attn_func / flash_attn_varlen_func, the same way (the
                  regular masks; its mask_mod masks need a CuTe DSL mask_mod: not written here)
  flashmask       flashmask_attention(startend_row_indices=) with each mask's column intervals
                  as FlashMask's docs define them; window_size= for the two window masks
  ffa             flex_flash_attn_func(q_ranges, k_ranges, attn_type_map) with each mask's slices
  cudnn_te        TransformerEngine DotProductAttention (cuDNN fused backend forced, as the
                  adapter): bshd with no_mask/causal and window_size on one sequence, thd with
                  padding/padding_causal and cu_seqlens for documents

    python benchmarks/adapter_vs_library.py --device cpu --seqlen 1024 2048 \\
        --kernels flex sdpa --masks causal_document share_question global_sliding_window
    python benchmarks/adapter_vs_library.py --seqlen 8192 32768 --directions fwd bwd   # a GPU

Its output on this project's 2-core CPU container (flex and sdpa, four masks, 1K and 2K, forward:
flex has no CPU backward) is the example in docs/kernels.md ("Called as the authors call them"):
ratios 0.90-1.06, the same numbers from both calls. Defaults: on CUDA GQA 64:8, head dim 128,
bfloat16, 8K, fwd and bwd; on the CPU GQA 8:2, head dim 64, float32, 1K, fwd. Masks are drawn with
the paper's window and block of 1024 (S/8 where that is shorter), seed 0.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from attnbench.harness.inputs import make_inputs
from attnbench.kernels import catalog
from attnbench.kernels.base import from_thd, load, to_thd
from attnbench.masks import STATIC_MASKS, sample_mask
from attnbench.masks.lengths import packaged_histograms
from attnbench.record.status import Unavailable, Unsupported

KERNELS = (
    "flex",
    "sdpa",
    "sdpa_math",
    "sdpa_efficient",
    "sdpa_cudnn",
    "sdpa_flash",
    "fa2",
    "fa3",
    "fa4",
    "flashmask",
    "ffa",
    "cudnn_te",
)
REGULAR = (
    "full",
    "causal",
    "full_document",
    "causal_document",
    "sliding_window",
    "sliding_window_causal",
)
DIRECTIONS = ("fwd", "bwd", "fwdbwd")


class NotWritten(Exception):
    """No hand-written call of this library for this mask (the row says why)."""


@dataclass(frozen=True)
class Problem:
    device: str
    dtype: torch.dtype
    heads_q: int
    heads_kv: int
    head_dim: int

    @property
    def gqa(self) -> bool:
        return self.heads_q != self.heads_kv


@dataclass(frozen=True)
class HandCall:
    """A hand-written call of a library: fn(q, k, v) on tensors in `layout` (base.LAYOUTS)."""

    fn: Callable
    layout: str
    # True where the library's graph frees itself in its backward (TransformerEngine's)
    backward_once: bool = False


# ---------------------------------------------------------------- the masks, from docs/masks.md


@dataclass(frozen=True)
class Draw:
    """One realised mask read from its parameters as docs/masks.md defines it."""

    name: str
    seqlen: int
    params: dict

    @property
    def lengths(self) -> list[int]:
        return [int(n) for n in self.params.get("doc_lengths") or [self.seqlen]]

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """[c_d, c_{d+1}) of every document."""
        ends = np.cumsum(self.lengths).tolist()
        return list(zip([0, *ends[:-1]], ends))

    def cu_seqlens(self, device) -> torch.Tensor:
        return torch.tensor(
            [0, *np.cumsum(self.lengths).tolist()], dtype=torch.int32, device=device
        )


def tables(draw: Draw, device):
    """(document_id, offsets) as FlexAttention's document-masking examples make them, padded past
    S to a multiple of 256 (flex reads indices past the end in a cut last tile)."""
    lengths = draw.lengths
    pad = -(-draw.seqlen // 256) * 256 - draw.seqlen
    counts = torch.tensor(lengths + [pad], device=device)
    document_id = torch.repeat_interleave(torch.arange(len(counts), device=device), counts)
    offsets = torch.tensor([0, *np.cumsum(lengths + [pad]).tolist()], device=device)
    return document_id, offsets


def docs_mask_mod(draw: Draw, device):
    """The mask's mask_mod as FlexAttention's docs write one: straight from the definition."""
    from torch.nn.attention.flex_attention import noop_mask

    p, s = draw.params, draw.seqlen
    doc, offsets = tables(draw, device)
    w, prefix = p.get("window"), p.get("prefix")

    def causal(b, h, q, kv):
        return q >= kv

    def same_doc(b, h, q, kv):
        return doc[q] == doc[kv]

    def local(i):  # j - s(j): the offset in its document
        return i - offsets[doc[i]]

    if draw.name == "full":
        return noop_mask
    if draw.name == "causal":
        return causal
    if draw.name == "full_document":
        return same_doc
    if draw.name == "causal_document":
        return lambda b, h, q, kv: same_doc(b, h, q, kv) & causal(b, h, q, kv)
    if draw.name == "sliding_window":
        return lambda b, h, q, kv: (q - kv).abs() <= w
    if draw.name == "sliding_window_causal":
        return lambda b, h, q, kv: (q >= kv) & (q - kv <= w)
    if draw.name == "share_question":
        return lambda b, h, q, kv: (
            ((doc[kv] == 0) & (doc[q] != 0)) | (same_doc(b, h, q, kv) & causal(b, h, q, kv))
        )
    if draw.name == "causal_blockwise":
        last, last_start = len(draw.lengths) - 1, s - draw.lengths[-1]
        return lambda b, h, q, kv: (
            ((doc[q] == last) & (kv < last_start)) | (same_doc(b, h, q, kv) & causal(b, h, q, kv))
        )
    if draw.name == "prefix_lm_causal":
        return lambda b, h, q, kv: (kv < prefix) | (q >= kv)
    if draw.name == "prefix_lm_document":
        return lambda b, h, q, kv: same_doc(b, h, q, kv) & ((local(kv) < prefix) | (q >= kv))
    if draw.name == "global_sliding_window":
        g = p["global_tokens"]
        return lambda b, h, q, kv: ((q - kv).abs() <= w) | (q < g) | (kv < g)
    if draw.name == "block_causal_document":
        blk = p["block"]
        return lambda b, h, q, kv: same_doc(b, h, q, kv) & (local(kv) // blk <= local(q) // blk)
    raise NotWritten(f"no mask_mod written for {draw.name}")


def flashmask_columns(draw: Draw):
    """(startend_row_indices [1, 1, S, n] int32 numpy, causal) as FlashMask's docs define them: per
    key column j, the rows masked in the lower triangle (i >= j) [LTS, LTE) and in the upper one
    (i < j) [UTS, UTE). None for the window masks (their own window_size argument)."""
    s, p = draw.seqlen, draw.params
    j = np.arange(s)
    doc_start = np.zeros(s, int)
    doc_end = np.zeros(s, int)
    for a, b in draw.bounds:
        doc_start[a:b], doc_end[a:b] = a, b
    full_s = np.full(s, s)
    if draw.name == "full":
        cols, causal = [full_s, np.zeros(s, int)], False
    elif draw.name == "causal":
        cols, causal = [full_s], True
    elif draw.name == "full_document":
        cols, causal = [doc_end, doc_start], False
    elif draw.name == "causal_document":
        cols, causal = [doc_end], True
    elif draw.name == "share_question":  # the question's columns are seen by every later row
        cols, causal = [np.where(j < draw.lengths[0], s, doc_end)], True
    elif draw.name == "causal_blockwise":  # rows of the last document see every earlier column
        c = s - draw.lengths[-1]
        cols, causal = [np.where(j < c, doc_end, s), np.where(j < c, c, s)], True
    elif draw.name == "prefix_lm_causal":
        cols, causal = [full_s, np.where(j < p["prefix"], 0, j)], False
    elif draw.name == "prefix_lm_document":
        in_prefix = j - doc_start < p["prefix"]
        cols, causal = [doc_end, np.where(in_prefix, doc_start, j)], False
    elif draw.name == "global_sliding_window":
        w, g = p["window"], min(p["global_tokens"], s)
        glob = j < g
        lts = np.where(glob, s, np.minimum(j + w + 1, s))
        lte = full_s
        uts = np.where(glob, 0, g)
        ute = np.where(glob, 0, np.maximum(j - w, g))
        cols, causal = [lts, lte, uts, ute], False
    elif draw.name == "block_causal_document":
        b = p["block"]
        block_start = doc_start + (j - doc_start) // b * b
        cols, causal = [doc_end, block_start], False
    elif draw.name in ("sliding_window", "sliding_window_causal"):
        return None, draw.name == "sliding_window_causal"
    else:
        raise NotWritten(f"no column intervals written for {draw.name}")
    return np.stack(cols, axis=1).astype(np.int32).reshape(1, 1, s, len(cols)), causal


def ffa_slices(draw: Draw):
    """[(q0, q1, k0, k1, type)] with FFA's types (0 full, 1 causal bottom-right, 2 inverse causal,
    3 bidirectional causal), disjoint and non-empty, written from the mask's definition."""
    s, p = draw.seqlen, draw.params
    out = []
    if draw.name in ("full", "full_document"):
        out = [(a, b, a, b, 0) for a, b in draw.bounds]
    elif draw.name in ("causal", "causal_document"):
        out = [(a, b, a, b, 1) for a, b in draw.bounds]
    elif draw.name in ("sliding_window", "sliding_window_causal"):
        out = band(0, s, p["window"], upper=draw.name == "sliding_window")
    elif draw.name == "share_question":
        c1 = draw.lengths[0]
        out = [(a, b, a, b, 1) for a, b in draw.bounds] + [(c1, s, 0, c1, 0)]
    elif draw.name == "causal_blockwise":
        c = s - draw.lengths[-1]
        out = [(a, b, a, b, 1) for a, b in draw.bounds] + [(c, s, 0, c, 0)]
    elif draw.name == "prefix_lm_causal":
        out = [(0, p["prefix"], 0, p["prefix"], 0), (p["prefix"], s, 0, s, 1)]
    elif draw.name == "prefix_lm_document":
        for a, b in draw.bounds:
            e = a + min(p["prefix"], b - a)
            out += [(a, e, a, e, 0), (e, b, a, b, 1)]
    elif draw.name == "global_sliding_window":
        g = min(p["global_tokens"], s)
        out = [(0, g, 0, s, 0), (g, s, 0, g, 0)] + band(g, s, p["window"], upper=True)
    elif draw.name == "block_causal_document":
        for a, e in draw.bounds:
            out += [
                (q0, min(q0 + p["block"], e), a, min(q0 + p["block"], e), 0)
                for q0 in range(a, e, p["block"])
            ]
    else:
        raise NotWritten(f"no slices written for {draw.name}")
    return [x for x in out if x[1] > x[0] and x[3] > x[2]]


def band(lo: int, hi: int, w: int, upper: bool):
    """Slices of 0 <= i - j <= w (and, if upper, 1 <= j - i <= w) for i, j in [lo, hi)."""
    head = min(hi, lo + w + 1)
    out = [(lo, head, lo, head, 1), (lo + w + 1, hi, lo + 1, hi, 3)]  # rows i - w >= lo + 1
    if upper and w >= 1:
        tail = max(lo, hi - w)
        out += [(lo, tail, lo + 1, hi, 3), (tail, hi, tail + 1, hi, 2)]  # rows whose i + w < hi
    return out


# ---------------------------------------------------------------- the hand-written calls


@functools.cache
def compiled_flex():
    """flex_attention compiled as attention-gym's benchmark compiles it."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def hand_flex(draw: Draw, pb: Problem) -> HandCall:
    from torch.nn.attention.flex_attention import create_block_mask

    # _compile: the docs' advice for long sequences (no S x S mask in memory)
    block_mask = create_block_mask(
        docs_mask_mod(draw, pb.device),
        None,
        None,
        draw.seqlen,
        draw.seqlen,
        device=pb.device,
        _compile=pb.device == "cuda",
    )
    flex = compiled_flex()
    return HandCall(
        lambda q, k, v: flex(q, k, v, block_mask=block_mask, enable_gqa=pb.gqa), "bhsd"
    )


SDPA_BACKENDS = {
    "sdpa": None,
    "sdpa_math": "MATH",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
}


def hand_sdpa(kernel: str):
    def build(draw: Draw, pb: Problem) -> HandCall:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.flex_attention import create_mask

        kwargs = {"enable_gqa": pb.gqa} if pb.gqa else {}
        if draw.name == "causal":
            kwargs["is_causal"] = True
        elif draw.name != "full":
            if kernel == "sdpa_flash":
                raise NotWritten("SDPA's FLASH backend takes no attn_mask")
            s = draw.seqlen
            kwargs["attn_mask"] = create_mask(
                docs_mask_mod(draw, pb.device), 1, 1, s, s, pb.device
            )
        backend = SDPA_BACKENDS[kernel]

        def fn(q, k, v):
            ctx = (
                sdpa_kernel(getattr(SDPBackend, backend)) if backend else contextlib.nullcontext()
            )
            with ctx:
                return F.scaled_dot_product_attention(q, k, v, **kwargs)

        return HandCall(fn, "bhsd")

    return build


def flash_window(draw: Draw, unbounded) -> dict:
    """FlashAttention's causal and window_size for a regular mask."""
    if draw.name not in REGULAR:
        raise NotWritten(f"{draw.name} has no causal/window/varlen form")
    w = draw.params.get("window")
    causal = draw.name in ("causal", "causal_document", "sliding_window_causal")
    if draw.name == "sliding_window":
        return {"causal": False, "window_size": (w, w)}
    if draw.name == "sliding_window_causal":
        return {"causal": True, "window_size": (w, 0)}
    return {"causal": causal, "window_size": (unbounded, unbounded)}


def first(out):
    """FA3's and FA4's functions return out, or (out, lse), depending on the release."""
    return out[0] if isinstance(out, (tuple, list)) else out


def hand_flash(module_names: tuple, unbounded):
    """FA2 / FA3 / FA4: flash_attn_func on one sequence, flash_attn_varlen_func (cu_seqlens) on
    packed documents; every argument past q, k, v by keyword (FA4 orders them differently)."""

    def build(draw: Draw, pb: Problem) -> HandCall:
        lib = None
        for name in module_names:
            with contextlib.suppress(ImportError):
                lib = importlib.import_module(name)
                break
        if lib is None:
            raise Unavailable(f"none of {', '.join(module_names)} imports")
        kw = flash_window(draw, unbounded)
        if len(draw.lengths) == 1:
            return HandCall(lambda q, k, v: first(lib.flash_attn_func(q, k, v, **kw)), "bshd")
        cu, longest = draw.cu_seqlens(pb.device), max(draw.lengths)
        var = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
        return HandCall(
            lambda q, k, v: first(lib.flash_attn_varlen_func(q, k, v, **var, **kw)), "thd"
        )

    return build


def hand_flashmask(draw: Draw, pb: Problem) -> HandCall:
    from interface_torch import flashmask_attention

    cols, causal = flashmask_columns(draw)
    if cols is None:  # its own sliding-window argument
        w = draw.params["window"]
        return HandCall(
            lambda q, k, v: flashmask_attention(q, k, v, causal=causal, window_size=w), "bshd"
        )
    idx = torch.from_numpy(cols).to(pb.device)
    return HandCall(
        lambda q, k, v: flashmask_attention(q, k, v, startend_row_indices=idx, causal=causal),
        "bshd",
    )


def hand_ffa(draw: Draw, pb: Problem) -> HandCall:
    from magi_attention.functional.flex_flash_attn import flex_flash_attn_func

    sl = torch.tensor(ffa_slices(draw), dtype=torch.int32, device=pb.device)
    q_ranges, k_ranges = sl[:, 0:2].contiguous(), sl[:, 2:4].contiguous()
    types = sl[:, 4].contiguous()
    return HandCall(
        lambda q, k, v: flex_flash_attn_func(
            q, k, v, q_ranges=q_ranges, k_ranges=k_ranges, attn_type_map=types
        )[0],
        "thd",
    )


def hand_te(draw: Draw, pb: Problem) -> HandCall:
    if draw.name not in REGULAR:
        raise NotWritten(f"{draw.name} has no causal/window/varlen form")
    # TE's cuDNN fused backend, forced as the adapter forces it (a call it cannot serve fails)
    os.environ.update(NVTE_FLASH_ATTN="0", NVTE_FUSED_ATTN="1", NVTE_UNFUSED_ATTN="0")
    import transformer_engine.pytorch as te

    kw = flash_window(draw, -1)
    causal, (left, right) = kw["causal"], kw["window_size"]
    hq, d = pb.heads_q, pb.head_dim
    common = dict(
        num_attention_heads=hq,
        kv_channels=d,
        num_gqa_groups=pb.heads_kv,
        attention_dropout=0.0,
        window_size=(left, right),
    )
    if len(draw.lengths) == 1:
        module = te.DotProductAttention(
            **common, qkv_format="bshd", attn_mask_type="causal" if causal else "no_mask"
        ).to(pb.device)
        return HandCall(lambda q, k, v: module(q, k, v).view(q.shape), "bshd", backward_once=True)
    module = te.DotProductAttention(
        **common, qkv_format="thd", attn_mask_type="padding_causal" if causal else "padding"
    ).to(pb.device)
    cu, longest = draw.cu_seqlens(pb.device), max(draw.lengths)
    call = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest)
    return HandCall(
        lambda q, k, v: module(q, k, v, **call).view(q.shape), "thd", backward_once=True
    )


HAND_WRITTEN = {
    "flex": hand_flex,
    **{k: hand_sdpa(k) for k in SDPA_BACKENDS},
    "fa2": hand_flash(("flash_attn",), -1),
    "fa3": hand_flash(("flash_attn_interface", "fa3_fwd_interface"), -1),
    "fa4": hand_flash(("flash_attn.cute",), None),
    "flashmask": hand_flashmask,
    "ffa": hand_ffa,
    "cudnn_te": hand_te,
}


# ---------------------------------------------------------------- timing, the same for both


def direction_call(fn, leaves, dout, direction: str):
    """What one timed call does in `direction`, as a cell does it (families/kernel/cell.py)."""
    if direction == "fwd":

        def call():
            with torch.no_grad():
                return fn(*leaves)

        return call
    if direction == "bwd":
        out = fn(*leaves)  # one forward, outside the timed calls
        return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return lambda: torch.autograd.grad(fn(*leaves), leaves, dout)


def time_calls(calls, device: str, warmup: int, reps: int) -> list[float]:
    """Median milliseconds of each call(), by one routine: triton's do_bench on CUDA (its own
    warm-up, the L2 flushed before every call); on the CPU, perf_counter around each of `reps`
    calls after `warmup`, the calls taking turns so that a slow spell of the machine falls on all."""
    if device == "cuda":
        from triton.testing import do_bench

        return [float(do_bench(call, return_mode="median")) for call in calls]
    for _ in range(warmup):
        for call in calls:
            call()
    times = [[] for _ in calls]
    for _ in range(reps):
        for call, t in zip(calls, times):
            t0 = time.perf_counter()
            call()
            t.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


@dataclass
class Timed:
    """One way of calling a library on the draw, ready to time."""

    fn: Callable
    layout: str
    backward_once: bool

    def leaves(self, q, k, v, direction: str):
        return [from_thd(x, self.layout).requires_grad_(direction != "fwd") for x in (q, k, v)]

    def output(self, q, k, v):
        with torch.no_grad():
            return to_thd(self.fn(*self.leaves(q, k, v, "fwd")), self.layout).float()

    def call(self, q, k, v, dout, direction: str):
        """The timed call in `direction`, run once (compilation and lazy loading, untimed)."""
        if direction == "bwd" and self.backward_once:
            raise NotWritten("its backward frees the graph: time fwdbwd instead")
        call = direction_call(
            self.fn, self.leaves(q, k, v, direction), from_thd(dout, self.layout), direction
        )
        call()
        return call


def adapter_timed(name: str, mask, pb: Problem) -> Timed:
    kernel = load(
        catalog.get(name),
        device=pb.device,
        dtype=pb.dtype,
        heads_q=pb.heads_q,
        heads_kv=pb.heads_kv,
        head_dim=pb.head_dim,
    )
    return Timed(kernel.prepare(mask), kernel.layout, kernel.backward_once)


def hand_timed(name: str, mask, pb: Problem) -> Timed:
    hand = HAND_WRITTEN[name](Draw(mask.name, mask.seqlen, mask.params), pb)
    return Timed(hand.fn, hand.layout, hand.backward_once)


# ---------------------------------------------------------------- the table


def mask_cfg(seqlen: int, args) -> dict:
    """The grid settings the masks read: window and block as given, else the paper's 1024 or S/8
    where that is shorter (so a short sequence still shows the pattern)."""
    fallback = min(1024, max(1, seqlen // 8))
    return {"window": args.window or fallback, "block": args.block or fallback}


def skip_reason(name: str, mask: str, direction: str, args) -> str | None:
    info = catalog.get(name)
    if args.device not in info.devices:
        return f"no {args.device} kernel"
    if (missing := catalog.missing_module(info)) is not None:
        return f"{missing} not installed"
    hq, hkv = args.heads
    return catalog.unsupported_reason(info, mask, direction, args.device, hq, hkv)


def rows(args):
    hq, hkv = args.heads
    pb = Problem(args.device, args.dtype, hq, hkv, args.head_dim)
    histograms = packaged_histograms()
    for s in args.seqlen:
        for mask_name in args.masks:
            mask = sample_mask(
                mask_name,
                s,
                mask_cfg(s, args),
                np.random.default_rng(args.seed),
                histograms,
                hq,
                hkv,
            )
            q, k, v, dout = make_inputs(
                args.seed, s, hq, hkv, args.head_dim, args.dtype, args.device
            )
            for name in args.kernels:
                runnable = [
                    d for d in args.directions if not skip_reason(name, mask_name, d, args)
                ]
                if not runnable:
                    why = skip_reason(name, mask_name, args.directions[0], args)
                    yield [name, mask_name, s, ",".join(args.directions), "", "", "", "", why]
                    continue
                yield from kernel_rows(name, mask, pb, q, k, v, dout, runnable, args)


def kernel_rows(name, mask, pb, q, k, v, dout, directions, args):
    s = mask.seqlen
    try:
        ours, theirs = adapter_timed(name, mask, pb), hand_timed(name, mask, pb)
        diff = (ours.output(q, k, v) - theirs.output(q, k, v)).abs().max().item()
    except NotWritten as e:
        yield [name, mask.name, s, ",".join(directions), "", "", "", "", str(e)]
        return
    except Exception as e:  # noqa: BLE001 - a library that refuses or fails to load: its row says so
        yield [name, mask.name, s, ",".join(directions), "", "", "", "", failure(e)]
        return
    for direction in directions:
        try:
            calls = [t.call(q, k, v, dout, direction) for t in (ours, theirs)]
            a, h = time_calls(calls, args.device, args.warmup, args.reps)
        except Exception as e:  # noqa: BLE001 - an out-of-memory or a refusal: its row says so
            yield [name, mask.name, s, direction, "", "", "", f"{diff:.1e}", failure(e)]
            continue
        finally:
            calls = None  # the retained graphs of a bwd
            if args.device == "cuda":
                torch.cuda.empty_cache()
        yield [
            name,
            mask.name,
            s,
            direction,
            f"{a:.3f}",
            f"{h:.3f}",
            f"{a / h:.2f}",
            f"{diff:.1e}",
            "",
        ]


def failure(e: Exception) -> str:
    """A failure's first line, for the table's note."""
    if isinstance(e, NotWritten | Unsupported | Unavailable):
        return str(getattr(e, "reason", e))
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


HEADER = [
    "kernel",
    "mask",
    "S",
    "direction",
    "adapter ms",
    "hand-written ms",
    "ratio",
    "out max diff",
    "note",
]


def markdown(table) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in table]
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--seqlen",
        type=int,
        nargs="+",
        default=None,
        help="default: 8192 on CUDA, 1024 on the CPU",
    )
    ap.add_argument("--masks", nargs="+", default=list(STATIC_MASKS), choices=STATIC_MASKS)
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    ap.add_argument(
        "--directions",
        nargs="+",
        default=None,
        choices=DIRECTIONS,
        help="default: fwd and bwd on CUDA, fwd on the CPU",
    )
    ap.add_argument(
        "--heads",
        type=lambda x: tuple(map(int, x.split(":"))),
        default=None,
        help="HQ:HKV; default 64:8 on CUDA, 8:2 on the CPU",
    )
    ap.add_argument(
        "--head-dim", type=int, default=None, help="default 128 on CUDA, 64 on the CPU"
    )
    ap.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument(
        "--window", type=int, default=None, help="window masks' w (default min(1024, S/8))"
    )
    ap.add_argument(
        "--block", type=int, default=None, help="block_causal_document's b (same default)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2, help="CPU only (do_bench warms up itself)")
    ap.add_argument("--reps", type=int, default=5, help="CPU only (do_bench repeats itself)")
    args = ap.parse_args(argv)
    gpu = args.device == "cuda"
    args.seqlen = args.seqlen or [8192 if gpu else 1024]
    args.directions = args.directions or (["fwd", "bwd"] if gpu else ["fwd"])
    args.heads = args.heads or ((64, 8) if gpu else (8, 2))
    args.head_dim = args.head_dim or (128 if gpu else 64)
    args.dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    return args


def main(argv=None):
    args = parse_args(argv)
    # one process compiles flex twice (adapter, hand-written) per mask and draw
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1000)
    table = []
    for row in rows(args):
        table.append(row)
        print(" ".join(str(c) for c in row), flush=True)  # progress; the table comes at the end
    print()
    print(markdown(table))


if __name__ == "__main__":
    main()
