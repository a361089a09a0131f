"""Peak memory per GPU of one call of a CP method: what the cells measure (`peak_mem_bytes`, the
CUDA caching allocator's peak during one call, families/cp/cell.py), from the same schedules.

Resident through the call (allocated before it, as families/cp/cell.py and the methods' `setup` do):
  * the rank's inputs q, k, v and dout (dout in every direction);
  * the method's persistent buffers (cp/hybrid.py, cp/ring.py, cp/ring_allgather.py `setup`):
    the KV shard, the ring's double buffers (inner; outer with windows), their float32 dK/dV
    buffers in backward, Ulysses' all-to-all send/receive buffers, the all-gathered K/V and the
    float32 reduce-scatter buffers of Ring AllGather;
  * what the forward saved for the backward (its output and LSE), in a backward call; in a
    forward call only when `previous_output` (a 1-GPU cell: no compute-only or comm-only run
    replaced the previous call's saved output before memory was measured).
On top of that, the largest of the moments inside the call (the ring steps are the schedule's
compute pairs):
  * forward: the float32 accumulator (out and LSE), plus either the local kernel's own
    allocations (rows copied when a chunk is several rectangles with gaps, its output and LSE,
    the full-size output and LSE they are placed into when it uses part of the rows) or the
    merge (kernels/lse.py: the partial output in float32, its weighted product, and eight
    LSE-sized temporaries);
  * backward: the finite LSE, float32 dq and dK/dV accumulators (and the window's dK/dV total
    after a window's first step), plus the local kernel's backward: its copied rows and
    FlashAttention-2 varlen's workspace (float32 dq_accum and softmax_d over rows + 128 per
    sequence, dK/dV expanded to the query heads under GQA) and outputs, or placing them back;
  * the output copies a method makes at its end (Ulysses' all-to-all back).
The local kernel's workspace is FlashAttention-2 varlen's (sdpa_flash and fa2 call it); for other
local kernels it is an assumption. Allocator rounding and the CUDA context are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cp.catalog import ALLGATHER_SCHEDULE, kv_replication
from ..cp.catalog import method as method_info

LSE_MERGE_TEMPS = (
    7  # kernels/lse.py: hi, lo, safe_hi, new, safe_new, w_old, w_new (+ the bool `seen`)
)
FA2_SEQ_PAD = 128  # FlashAttention-2 varlen backward: dq_accum / softmax_d rows per sequence extra


@dataclass(frozen=True)
class Sizes:
    heads_q: int
    heads_kv: int
    head_dim: int
    elem: int  # bytes of the input dtype
    acc: int  # bytes of the accumulation dtype (kernels/lse.accumulator_dtype)

    @property
    def head_dim_rounded(self) -> int:
        """FlashAttention-2's head_size_rounded (the dq_accum row width)."""
        d = self.head_dim
        return -(-d // 32) * 32 if d <= 192 else 256


@dataclass
class Memory:
    peak_bytes: int  # the worst modelled rank
    resident_bytes: int  # that rank's bytes allocated before the call
    rank: int
    by_rank: dict  # rank -> peak bytes


def inputs(rows: int, z: Sizes) -> int:
    """q, k, v, dout of `rows` local rows (families/cp/cell.py allocates dout in every direction)."""
    return rows * z.head_dim * z.elem * (2 * z.heads_q + 2 * z.heads_kv)


def merge_bytes(rows: int, heads: int, z: Sizes) -> int:
    """kernels/lse.merge_into's temporaries while it runs (besides the two operands)."""
    lse = heads * rows
    out = rows * heads * z.head_dim * z.acc
    return (z.elem != z.acc) * out + out + LSE_MERGE_TEMPS * lse * z.acc + lse


def kernel_forward_bytes(c, rows: int, hq: int, hkv: int, z: Sizes) -> int:
    """What one local-kernel forward (kernels/local_kernel.PackedKernel._forward) holds at its peak, and
    what it returns (the full-size output and LSE), for a chunk of `rows` query rows."""
    D, e, a = z.head_dim, z.elem, z.acc
    full = rows * hq * D * e + hq * rows * a
    if c.empty:
        return full
    gq, gk = c.rows_q, c.rows_k
    held = c.gathers_q * gq * hq * D * e + c.gathers_k * 2 * gk * hkv * D * e  # copied rows
    held += gq * hq * D * e + hq * gq * 4  # the kernel's output and float32 LSE
    return held + c.subset_q * full  # placed back into a full-size output and LSE


def kernel_backward_bytes(c, rows: int, keys: int, hq: int, hkv: int, z: Sizes) -> int:
    """One local-kernel backward (PackedKernel._backward + FlashAttention-2 varlen's workspace)."""
    if c.empty:
        return 0
    D, e = z.head_dim, z.elem
    gq, gk, padded = c.rows_q, c.rows_k, c.rows_q + FA2_SEQ_PAD * c.nseg
    copied = c.gathers_q * 3 * gq * hq * D * e + c.gathers_k * 2 * gk * hkv * D * e  # dout, q, out
    copied += c.subset_q * hq * gq * 4  # the LSE's columns (a slice of them is not contiguous)
    outputs = gq * hq * D * e + 2 * gk * hkv * D * e
    workspace = padded * hq * z.head_dim_rounded * 4 + hq * padded * 4
    workspace += (hq != hkv) * 2 * gk * hq * D * e  # dk, dv expanded to the query heads (GQA)
    placed = c.subset_q * rows * hq * D * e + c.subset_k * 2 * keys * hkv * D * e
    return outputs + max(copied + workspace, placed)


def _hybrid(deg, geo, rank_phases, z: Sizes, direction: str):
    U, R, W = deg.ulysses, deg.ring, deg.windows
    w = R // W
    rep = kv_replication(U, z.heads_kv)
    hq, hkv = z.heads_q // U, z.heads_kv * rep // U
    M, m, D, e, a = geo.shard_len, geo.piece_len, z.head_dim, z.elem, z.acc
    kv = 2 * M * hkv * D
    bwd = direction != "fwd"
    resident = inputs(m, z) + kv * e  # inputs, the KV shard
    resident += ((w > 1) + (W > 1)) * 2 * kv * e  # the ring's double buffers
    resident += bwd * ((w > 1) + (W > 1)) * 2 * kv * a  # their dK/dV buffers (float32)
    if U > 1:
        shard, piece = M * hq * D * e, U * m * hq * D * e
        resident += 2 * shard + 2 * piece + 2 * U * 2 * m * hkv * D * e + 2 * U * hq * m * a
        resident += bwd * (2 * shard + 2 * piece + 2 * U * 2 * m * hkv * D * e)
    saved = (M * hq * D * e if U == 1 else 0) + hq * M * a  # out (U > 1: a buffer) and LSE
    acc = M * hq * D * a + hq * M * a
    peaks = {}
    if "fwd" in rank_phases:
        moments = [kv * e * (U > 1)]  # KV out of the all-to-all buffer, reordered
        for st in rank_phases["fwd"]:
            for c, _ in st.compute:
                ret = M * hq * D * e + hq * M * a
                k = kernel_forward_bytes(c, M, hq, hkv, z)
                moments.append(acc + max(k, ret + merge_bytes(M, hq, z)))
        moments.append(acc + M * hq * D * e + (U > 1) * hq * M * a)  # the output at the end
        peaks["fwd"] = max(moments)
    if "bwd" in rank_phases:
        base = hq * M * a + M * hq * D * a + kv * a  # finite LSE, dq, dK/dV home
        moments, t = [], 0
        for st in rank_phases["bwd"]:
            for c, _ in st.compute:
                window_total = kv * a if (t % w) and w > 1 else 0
                moments.append(base + window_total + kernel_backward_bytes(c, M, M, hq, hkv, z))
                t += 1
        # the gradients in the input dtype at the end (U > 1: out of the all-to-all buffers)
        moments.append(M * hq * D * a + kv * a + M * hq * D * e + 2 * m * z.heads_kv * rep * D * e)
        peaks["bwd"] = max(moments)
    return resident, saved, peaks


def _allgather(deg, geo, rank_phases, z: Sizes, direction: str):
    R, M, P = deg.ring, geo.shard_len, geo.padded_len
    hq, hkv, D, e, a = z.heads_q, z.heads_kv, z.head_dim, z.elem, z.acc
    kv = 2 * M * hkv * D
    bwd = direction != "fwd"
    resident = inputs(M, z) + kv * e + R * kv * e + bwd * (R * kv * a + kv * a)
    saved = M * hq * D * e + hq * M * a
    kgvg = 2 * P * hkv * D * e  # K and V reordered into the padded global order
    peaks = {}
    if "fwd" in rank_phases:
        acc = M * hq * D * a + hq * M * a
        moments = [acc + M * hq * D * e]
        for st in rank_phases["fwd"]:
            for c, _ in st.compute:
                ret = M * hq * D * e + hq * M * a
                k = kernel_forward_bytes(c, M, hq, hkv, z)
                moments.append(acc + max(k, ret + merge_bytes(M, hq, z)))
        peaks["fwd"] = kgvg + max(moments)
    if "bwd" in rank_phases:
        base = kgvg + hq * M * a + M * hq * D * a + 2 * P * hkv * D * a  # + lse, dq, dk, dv
        res = M * hq * D * e + 2 * P * hkv * D * e  # one chunk's (dq, dk, dv), held into the next
        moments, held = [base + M * hq * D * e + kv * e + res], 0
        for st in rank_phases["bwd"]:
            for c, _ in st.compute:
                moments.append(base + held + kernel_backward_bytes(c, M, P, hq, hkv, z))
                held = 0 if c.empty else res
        peaks["bwd"] = max(moments)
    return resident, saved, peaks


def peak_memory(
    method: str, deg, geo, per_rank: dict, z: Sizes, direction: str, previous_output=False
) -> Memory:
    """The largest per-rank peak over the modelled ranks (`per_rank`: rank -> phases)."""
    allgather = method_info(method).model_schedule == ALLGATHER_SCHEDULE
    fn = _allgather if allgather else _hybrid
    best, by_rank = None, {}
    for rank, phases in per_rank.items():
        resident, saved, peaks = fn(deg, geo, phases, z, direction)
        before = resident + saved * (previous_output or direction == "bwd")
        # a forward runs beside the previous call's saved output if it is still held; a
        # backward beside its forward's
        peak = before + peaks["fwd"] if "fwd" in peaks else 0
        if "bwd" in peaks:
            peak = max(peak, resident + saved + peaks["bwd"])
        by_rank[rank] = int(peak)
        if best is None or peak > best.peak_bytes:
            best = Memory(int(peak), int(before), rank, by_rank)
    return best
