"""Block-sparse attention in Triton, written for this project: forward and backward.

Input: q [B, Hq, S, D], k and v [B, Hkv, S, D] (last dimension contiguous), and the kept blocks
as index lists (`BlockIndex`): for every group g of query heads and query block i, the key
blocks it keeps. Every block is `block` x `block` tokens (64 or 128 on the GPU; any power of two
>= 16 works). GQA: query head h reads KV head h // (Hq / Hkv); its kept blocks are those of group
h // (Hq / G), so per-head (G = Hq) and per-KV-head (G = Hkv) masks both run.

Forward (FlashAttention-2 style): one program per (query tile, head); it walks the kept key
blocks with an online softmax (fp32 statistics and accumulator, tl.dot on bf16/fp16 tiles) and
stores the output and the log-sum-exp (base 2) for the backward.
Backward: delta = rowsum(dO * O); dK/dV: one program per (key tile, KV head) walks the query
blocks that keep its block (the transposed lists, CSR), for every query head of its group, so
GQA gradients are summed in registers. dQ, two ways (`backward=`): "split" walks the kept blocks
again per query tile in a kernel of its own, without atomics but recomputing QK^T and dO V^T (7
matmuls per block pair instead of 5); "atomic" adds each pair's dS K to a float32 dQ in the dK/dV
kernel (FlashAttention-2's way: 5 matmuls, dQ summed in a nondeterministic order), then scales
and casts it. Which mode and tiles run per block size is measured, not guessed (TUNED): on the
H200, split with 128x64 tiles (8 warps) at block 128 and 64x64 (4 warps) at block 64 beat every
atomic setting tried (benchmarks/sparse_bwd_bench.py; results/h200/sparse_bwd_bench.txt).
Tiles are >= 16 in every tl.dot dimension (Hopper's wgmma and mma.sync shapes); fp32 inputs use
IEEE products (no TF32), so they can be checked against float64.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@contextlib.contextmanager
def interpreter_numpy24_fix():
    """Under TRITON_INTERPRET=1: triton 3.6's interpreter converts a 1-element array with int()
    (triton-lang/triton#9171, fixed upstream), which numpy >= 2.4 refuses, so a loop bound loaded
    from memory fails to run; this gives its tensors an __index__ that takes the one element."""
    import triton.runtime.interpreter as interp

    original = interp._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched
    try:
        yield
    finally:
        interp._patch_lang_tensor = original


@dataclass(frozen=True)
class BlockIndex:
    """The kept blocks in the kernel's form (int32, on the kernel's device)."""

    block: int
    kv_indices: (
        torch.Tensor
    )  # [G, nrb, kmax] kept key blocks of each query block (first kv_num valid)
    kv_num: torch.Tensor  # [G, nrb]
    q_offsets: torch.Tensor  # [G * ncb + 1] CSR offsets over (group, key block)
    q_indices: torch.Tensor  # [nnz] query blocks keeping that key block

    @property
    def groups(self) -> int:
        return self.kv_indices.shape[0]

    @property
    def row_blocks(self) -> int:
        return self.kv_indices.shape[1]

    @classmethod
    def from_layout(cls, layout, block: int, device) -> "BlockIndex":
        """From a uniform BlockLayout (masks/sparse.py): O(kept blocks), no S x S anywhere."""
        sizes = torch.cat([layout.row_bounds.diff(dim=1), layout.col_bounds.diff(dim=1)], dim=1)
        if not bool((sizes == block).all()):
            raise ValueError(f"the Triton block-sparse kernel needs uniform {block}-token blocks")
        offsets, rows = layout.key_block_lists(device)

        def i32(t):
            return t.to(device=device, dtype=torch.int32).contiguous()

        return cls(
            block, i32(layout.kv_indices), i32(layout.keep.sum(-1)), i32(offsets), i32(rows)
        )


def _check(q, k, v, index: BlockIndex):
    if (
        q.dim() != 4
        or k.shape != v.shape
        or q.shape[0] != k.shape[0]
        or q.shape[2:] != k.shape[2:]
    ):
        raise ValueError(
            f"expected q [B, Hq, S, D], k and v [B, Hkv, S, D]; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    _, hq, s, d = q.shape
    hkv = k.shape[1]
    if hq % hkv or hq % index.groups:
        raise ValueError(
            f"{hq} query heads are not a multiple of {hkv} KV heads and {index.groups} mask groups"
        )
    if d < 16 or d > 256 or d & (d - 1):
        raise ValueError(f"head dim {d} is not a power of two in 16..256")
    b = index.block
    if b < 16 or b & (b - 1):
        raise ValueError(f"block size {b} is not a power of two >= 16")
    if s != index.row_blocks * b:
        raise ValueError(f"sequence length {s} != {index.row_blocks} blocks x {b}")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("q, k and v need a contiguous last dimension")
    if (
        q.dtype not in (torch.float16, torch.bfloat16, torch.float32)
        or k.dtype != q.dtype
        or v.dtype != q.dtype
    ):
        raise ValueError(
            f"dtypes {q.dtype}, {k.dtype}, {v.dtype}: expected one of float16, bfloat16, float32"
        )


def _precision(dtype) -> str:
    # fp32 tiles: exact IEEE products (the default would be TF32 on the GPU); ignored for 16-bit.
    return "ieee" if dtype == torch.float32 else "tf32"


BACKWARD_MODES = ("split", "atomic")
TILE_PARTS = ("dq", "dkdv")
# Backward settings per block size: {"mode": one of BACKWARD_MODES, "dq": (BLOCK_M, BLOCK_N, warps,
# stages), "dkdv": (BLOCK_N, BLOCK_M, warps, stages)}; each tile divides the block. The pipeline runs
# TUNED, read from triton_bsa_tuned.json beside this file (written by benchmarks/sparse_bwd_bench.py
# --write-tuned on the GPU it measured; a block it does not name keeps the defaults of _tiles).
# BWD_CONFIG, set by that benchmark, replaces TUNED for a block: {} there means the defaults.
TUNED_PATH = Path(__file__).with_name("triton_bsa_tuned.json")
BWD_CONFIG: dict[int, dict] = {}


def check_settings(block: int, settings: dict, where: str) -> dict:
    """settings with tuples for tiles; ValueError naming `where` and the bad value otherwise."""
    out = {}
    for key, value in settings.items():
        if key == "mode":
            if value not in BACKWARD_MODES:
                raise ValueError(
                    f"{where}: block {block}: mode {value!r}; valid: {', '.join(BACKWARD_MODES)}"
                )
            out[key] = value
        elif key in TILE_PARTS:
            tile = tuple(int(x) for x in value)
            if len(tile) != 4 or block % tile[0] or block % tile[1] or min(tile[:2]) < 16:
                raise ValueError(
                    f"{where}: block {block}: {key} {list(value)} is not (tile, tile, warps, "
                    f"stages) with tiles >= 16 that divide the block"
                )
            out[key] = tile
        # other keys (the measurement the file keeps beside the settings) are not settings
    return out


def load_tuned(path: Path = TUNED_PATH) -> dict[int, dict]:
    """{block: settings} of a --write-tuned file; {} where there is none."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {
        int(b): check_settings(int(b), s, str(path)) for b, s in data.get("blocks", {}).items()
    }


TUNED = load_tuned()


def _settings(block: int) -> dict:
    return BWD_CONFIG[block] if block in BWD_CONFIG else TUNED.get(block, {})


def backward_mode(block: int) -> str:
    """The backward mode the pipeline runs at this block size."""
    return _settings(block).get("mode", "split")


def _tiles(block: int):
    """(forward BLOCK_M, BLOCK_N, warps), dQ (BLOCK_M, BLOCK_N, warps, stages), dK/dV (BLOCK_N,
    BLOCK_M, warps, stages)."""
    fwd_m = min(block, 128)
    t = min(block, 64)
    given = _settings(block)
    return (
        (fwd_m, min(block, 64), 8 if fwd_m == 128 else 4),
        tuple(given.get("dq", (t, t, 4, 2))),
        tuple(given.get("dkdv", (t, t, 8, 2))),
    )


def describe_backward(block: int) -> str:
    """What the backward runs at this block size, for a record's notes."""
    _, dq, dkdv = _tiles(block)
    source = (
        "BWD_CONFIG"
        if block in BWD_CONFIG
        else f"tuned ({TUNED_PATH.name})"
        if block in TUNED
        else "defaults"
    )
    tiles = f"dkdv {dkdv[0]}x{dkdv[1]} w{dkdv[2]} s{dkdv[3]}"
    mode = backward_mode(block)
    if mode == "split":
        tiles = f"dq {dq[0]}x{dq[1]} w{dq[2]} s{dq[3]}, " + tiles
    return f"{mode}: {tiles}; {source}"


# ----------------------------------------------------------------------------- forward


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    Out,
    LSE,
    KV_IDX,
    KV_NUM,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_ob,
    stride_oh,
    stride_os,
    seqlen,
    n_heads,
    n_row_blocks,
    max_kept,
    heads_per_group,
    heads_per_kv,
    qk_scale,
    BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    row_block = (pid_m * BLOCK_M) // BLOCK
    group = h // heads_per_group
    kv_head = (h // heads_per_kv).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    q = tl.load(
        Q
        + b * stride_qb
        + h.to(tl.int64) * stride_qh
        + offs_m[:, None] * stride_qs
        + offs_d[None, :]
    )
    k_base = K + b * stride_kb + kv_head * stride_kh
    v_base = V + b * stride_vb + kv_head * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    row = group * n_row_blocks + row_block
    n_kept = tl.load(KV_NUM + row)
    idx = KV_IDX + row.to(tl.int64) * max_kept
    for t in range(0, n_kept):
        col_block = tl.load(idx + t)
        for sub in tl.static_range(BLOCK // BLOCK_N):
            cols = col_block * BLOCK + sub * BLOCK_N + offs_n
            k = tl.load(k_base + cols[:, None] * stride_ks + offs_d[None, :])
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # base-2 logits
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + cols[:, None] * stride_vs + offs_d[None, :])
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
            m_i = m_new

    empty = l_i == 0.0  # a query block that keeps no key block: output 0, LSE -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    tl.store(
        Out
        + b * stride_ob
        + h.to(tl.int64) * stride_oh
        + offs_m[:, None] * stride_os
        + offs_d[None, :],
        out.to(Out.dtype.element_ty),
    )
    tl.store(LSE + (b * n_heads + h) * seqlen + offs_m, lse)


def forward(q, k, v, index: BlockIndex, scale: float):
    """(out [B, Hq, S, D], lse2 [B, Hq, S] fp32, base-2 log-sum-exp of the scaled logits)."""
    _check(q, k, v, index)
    bsz, hq, s, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(bsz, hq, s, dtype=torch.float32, device=q.device)
    (bm, bn, warps), _, _ = _tiles(index.block)
    grid = (s // bm, hq, bsz)
    _fwd_kernel[grid](
        q,
        k,
        v,
        out,
        lse,
        index.kv_indices,
        index.kv_num,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        s,
        hq,
        index.row_blocks,
        index.kv_indices.shape[-1],
        hq // index.groups,
        hq // k.shape[1],
        scale * LOG2E,
        BLOCK=index.block,
        BLOCK_M=bm,
        BLOCK_N=bn,
        HEAD_DIM=d,
        PRECISION=_precision(q.dtype),
        num_warps=warps,
        num_stages=3,
    )
    return out, lse


# ----------------------------------------------------------------------------- backward


@triton.jit
def _bwd_delta_kernel(
    Out,
    DO,
    DELTA,
    stride_ob,
    stride_oh,
    stride_os,
    stride_db,
    stride_dh,
    stride_ds,
    seqlen,
    n_heads,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    o = tl.load(
        Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :]
    )
    do = tl.load(
        DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_ds + offs_d[None, :]
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + (b * n_heads + h) * seqlen + offs_m, delta)


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    DQ,
    LSE,
    DELTA,
    KV_IDX,
    KV_NUM,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_db,
    stride_dh,
    stride_ds,
    seqlen,
    n_heads,
    n_row_blocks,
    max_kept,
    heads_per_group,
    heads_per_kv,
    qk_scale,
    sm_scale,
    BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    row_block = (pid_m * BLOCK_M) // BLOCK
    group = h // heads_per_group
    kv_head = (h // heads_per_kv).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    h64 = h.to(tl.int64)

    q = tl.load(
        Q + b * stride_qb + h64 * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :]
    )
    do = tl.load(
        DO + b * stride_db + h64 * stride_dh + offs_m[:, None] * stride_ds + offs_d[None, :]
    )
    stats = (b * n_heads + h) * seqlen + offs_m
    lse = tl.load(LSE + stats)
    delta = tl.load(DELTA + stats)
    k_base = K + b * stride_kb + kv_head * stride_kh
    v_base = V + b * stride_vb + kv_head * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    row = group * n_row_blocks + row_block
    n_kept = tl.load(KV_NUM + row)
    idx = KV_IDX + row.to(tl.int64) * max_kept
    for t in range(0, n_kept):
        col_block = tl.load(idx + t)
        for sub in tl.static_range(BLOCK // BLOCK_N):
            cols = col_block * BLOCK + sub * BLOCK_N + offs_n
            k = tl.load(k_base + cols[:, None] * stride_ks + offs_d[None, :])
            v = tl.load(v_base + cols[:, None] * stride_vs + offs_d[None, :])
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
            p = tl.exp2(s - lse[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    dq = dq * sm_scale
    tl.store(
        DQ + b * stride_qb + h64 * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
        dq.to(DQ.dtype.element_ty),
    )


@triton.jit
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    DK,
    DV,
    LSE,
    DELTA,
    Q_OFF,
    Q_IDX,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_db,
    stride_dh,
    stride_ds,
    seqlen,
    n_heads,
    n_col_blocks,
    heads_per_group,
    heads_per_kv,
    qk_scale,
    sm_scale,
    DQ_ACC,  # float32 [B, Hq, S, D] contiguous, or unused
    BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
):
    pid_n = tl.program_id(0)
    kv_head = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    col_block = (pid_n * BLOCK_N) // BLOCK
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    kv64 = kv_head.to(tl.int64)

    k = tl.load(
        K + b * stride_kb + kv64 * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :]
    )
    v = tl.load(
        V + b * stride_vb + kv64 * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :]
    )
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    for hh in range(0, heads_per_kv):  # every query head reading this KV head (GQA)
        h = kv_head * heads_per_kv + hh
        h64 = h.to(tl.int64)
        seg = (h // heads_per_group) * n_col_blocks + col_block
        start = tl.load(Q_OFF + seg)
        end = tl.load(Q_OFF + seg + 1)
        q_base = Q + b * stride_qb + h64 * stride_qh
        do_base = DO + b * stride_db + h64 * stride_dh
        stats_base = (b * n_heads + h64) * seqlen
        for t in range(start, end):
            row_block = tl.load(Q_IDX + t)
            for sub in tl.static_range(BLOCK // BLOCK_M):
                rows = row_block * BLOCK + sub * BLOCK_M + offs_m
                q = tl.load(q_base + rows[:, None] * stride_qs + offs_d[None, :])
                do = tl.load(do_base + rows[:, None] * stride_ds + offs_d[None, :])
                lse = tl.load(LSE + stats_base + rows)
                delta = tl.load(DELTA + stats_base + rows)
                s_t = (
                    tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale
                )  # [BLOCK_N, BLOCK_M]
                p_t = tl.exp2(s_t - lse[None, :])
                dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
                dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
                ds_t = p_t * (dp_t - delta[None, :])
                dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
                if ATOMIC_DQ:  # dQ[rows] += dS K, scaled: one float32 add per element
                    dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k, input_precision=PRECISION)
                    acc = (b * n_heads + h64) * seqlen * HEAD_DIM
                    tl.atomic_add(
                        DQ_ACC + acc + rows[:, None] * HEAD_DIM + offs_d[None, :],
                        dq * sm_scale,
                        sem="relaxed",
                    )
    dk = dk * sm_scale
    tl.store(
        DK + b * stride_kb + kv64 * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :],
        dk.to(DK.dtype.element_ty),
    )
    tl.store(
        DV + b * stride_vb + kv64 * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
    )


def backward(dout, q, k, v, out, lse, index: BlockIndex, scale: float, mode: str = "split"):
    """(dq, dk, dv) in the inputs' dtype and layout; `mode` as BACKWARD_MODES (module doc)."""
    if mode not in BACKWARD_MODES:
        raise ValueError(f"unknown backward mode {mode!r}; valid: {', '.join(BACKWARD_MODES)}")
    bsz, hq, s, d = q.shape
    hkv = k.shape[1]
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty_like(lse)
    _, (dq_m, dq_n, dq_warps, dq_stages), (kv_n, kv_m, kv_warps, kv_stages) = _tiles(index.block)
    if q.dtype == torch.float32:
        # the settings were tuned in bf16: float32 tiles take twice the shared memory, and with
        # 3 stages the dQ kernel asked an H200 for 288 KiB of its 227; one stage fits
        dq_stages = kv_stages = 1
    prec = _precision(q.dtype)
    atomic = mode == "atomic"
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if atomic else dq
    _bwd_delta_kernel[(s // dq_m, hq, bsz)](
        out,
        dout,
        delta,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        dout.stride(0),
        dout.stride(1),
        dout.stride(2),
        s,
        hq,
        BLOCK_M=dq_m,
        HEAD_DIM=d,
    )
    strides = (
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        dout.stride(0),
        dout.stride(1),
        dout.stride(2),
    )
    assert dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride()
    if not atomic:
        _dq_split(
            q,
            k,
            v,
            dout,
            dq,
            lse,
            delta,
            index,
            strides,
            scale,
            prec,
            (dq_m, dq_n, dq_warps, dq_stages),
        )
    n_col_blocks = (index.q_offsets.numel() - 1) // index.groups
    _bwd_dkdv_kernel[(s // kv_n, hkv, bsz)](
        q,
        k,
        v,
        dout,
        dk,
        dv,
        lse,
        delta,
        index.q_offsets,
        index.q_indices,
        *strides,
        s,
        hq,
        n_col_blocks,
        hq // index.groups,
        hq // hkv,
        scale * LOG2E,
        scale,
        dq_acc,
        BLOCK=index.block,
        BLOCK_N=kv_n,
        BLOCK_M=kv_m,
        HEAD_DIM=d,
        PRECISION=prec,
        ATOMIC_DQ=atomic,
        num_warps=kv_warps,
        num_stages=kv_stages,
    )
    if atomic:
        dq.copy_(dq_acc)
    return dq, dk, dv


def _dq_split(q, k, v, dout, dq, lse, delta, index, strides, scale, prec, tiles):
    """dQ in a kernel of its own (backward mode "split")."""
    bsz, hq, s, d = q.shape
    hkv = k.shape[1]
    dq_m, dq_n, warps, stages = tiles
    _bwd_dq_kernel[(s // dq_m, hq, bsz)](
        q,
        k,
        v,
        dout,
        dq,
        lse,
        delta,
        index.kv_indices,
        index.kv_num,
        *strides,
        s,
        hq,
        index.row_blocks,
        index.kv_indices.shape[-1],
        hq // index.groups,
        hq // hkv,
        scale * LOG2E,
        scale,
        BLOCK=index.block,
        BLOCK_M=dq_m,
        BLOCK_N=dq_n,
        HEAD_DIM=d,
        PRECISION=prec,
        num_warps=warps,
        num_stages=stages,
    )


class BlockSparseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, index, scale, mode):
        out, lse = forward(q, k, v, index, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.index, ctx.scale, ctx.mode = index, scale, mode
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        grads = backward(dout, q, k, v, out, lse, ctx.index, ctx.scale, ctx.mode)
        return (*grads, None, None, None)


def block_sparse_attention(
    q, k, v, index: BlockIndex, scale: float | None = None, backward: str | None = None
):
    """softmax(q k^T * scale over the kept blocks) v, differentiable in q, k and v; `backward`
    picks how dQ is computed (BACKWARD_MODES; None: backward_mode of the block size)."""
    backward = backward_mode(index.block) if backward is None else backward
    if backward not in BACKWARD_MODES:
        raise ValueError(f"unknown backward mode {backward!r}; valid: {', '.join(BACKWARD_MODES)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return BlockSparseAttention.apply(q, k, v, index, scale, backward)
