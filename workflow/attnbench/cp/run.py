"""Running a method on every rank: process group, contexts, inputs, status agreement, correctness.

Shared by the distributed cell (families/cp/cell.py) and the multi-process tests.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..grid.spec import DKV_COMM_DTYPES, CellSpec, Degrees
from ..harness.cpu_math import settle_vml
from ..harness.gate import judge, lse_bound
from ..harness.inputs import local_inputs, torch_dtype
from ..harness.reference import reference_attention
from ..kernels.base import bhsd_view, to_thd
from ..kernels.local_kernel import load as load_kernel
from ..record import status as S
from . import catalog
from .base import RankContext, load
from .comm import Comm, Groups, Guard

TIMEOUT = None  # the job's process-group timeout (init), also given to every group made later
CHECK_OOM = (
    "check_oom"  # a verdict's status when the float64 check itself ran out of memory (rank 0)
)


@dataclass(frozen=True)
class MethodRun:
    """What every rank runs: `method` over the local kernel `kernel` (the one that runs: a cell's
    choice; for torch_cp the SDPA backend it pins) at its `degrees`, on heads_q:heads_kv heads of
    head_dim in `dtype` (a name of harness.inputs.DTYPES), forward only or with the backward, dK/dV
    travelling the ring in dkv_comm_dtype. A cell builds it from its spec (of_cell), verify per
    case; the distributed and the emulated runs take it."""

    method: str
    kernel: str | None
    degrees: Degrees
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    backward: bool
    dkv_comm_dtype: str = DKV_COMM_DTYPES[0]

    @classmethod
    def of_cell(cls, spec: CellSpec, kernel: str | None) -> MethodRun:
        """The cell's method, settings and shapes, over `kernel` (its choice of local kernel)."""
        p, c = spec.problem, spec.cp
        return cls(
            spec.impl,
            kernel,
            c.degrees,
            p.heads_q,
            p.heads_kv,
            p.head_dim,
            p.dtype,
            p.backward,
            c.dkv_comm_dtype,
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def loads_kernel(self) -> bool:
        """Whether the ranks load the local kernel (torch's context_parallel runs SDPA itself)."""
        return self.kernel is not None and catalog.uses_local_kernel(self.method)


# ---------------------------------------------------------------- process group


def init(device: str, timeout_s: float):
    """Join the job's process group (torchrun's environment): gloo on CPU, NCCL on GPU."""
    global TIMEOUT
    settle_vml()
    timeout = TIMEOUT = datetime.timedelta(seconds=timeout_s)
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", timeout=timeout, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return dev


class Session:
    """One process' view: its rank, device, and the groups made so far (per degrees)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._groups = {}

    def context(self, run: MethodRun) -> RankContext:
        """This rank's context for the run: its degrees' groups (made once per degrees), a fresh
        communicator and guard, and the local kernel loaded."""
        deg = run.degrees
        if deg.world != self.world:
            raise ValueError(f"degrees {deg} need {deg.world} ranks, the job has {self.world}")
        if deg not in self._groups:
            self._groups[deg] = Groups(deg, self.rank, TIMEOUT)
        kernel = None
        if run.loads_kernel:
            kernel = load_kernel(
                catalog.local_kernel(run.kernel), self.device, run.torch_dtype, run.head_dim
            )
        return RankContext(
            self.rank,
            self.device,
            deg,
            self._groups[deg],
            Comm(self.device),
            Guard(),
            kernel,
            run.kernel,
            run.dkv_comm_dtype,
        )


def outcome(guard: Guard, rank: int, where: str) -> tuple[str, str] | None:
    """One rank's outcome of a phase: None, or (status, reason) from its guard's error."""
    if guard.error is None:
        return None
    e = guard.error
    st = e.status if isinstance(e, S.CellOutcome) else S.OOM
    why = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
    return st, f"rank {rank} in {where}: {why}"


def first_failure(everyone) -> tuple[str | None, str | None]:
    """Every rank's outcome -> one status for all (the first failing rank's, by severity: oom
    before unsupported), or (None, None)."""
    failed = [x for x in everyone if x is not None]
    if not failed:
        return None, None
    failed.sort(key=lambda x: (x[0] != S.OOM, x[0]))
    return failed[0]


def agree(guard: Guard, where: str) -> tuple[str | None, str | None]:
    """Every rank's outcome of a phase -> one status for all (first_failure). A collective of
    its own, after the phase's transfers."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, outcome(guard, dist.get_rank(), where))
    return first_failure(everyone)


# ---------------------------------------------------------------- one correctness run


def run_once(method, inputs, backward: bool) -> dict:
    """Forward (and backward) on this rank's rows; the local results, detached copies."""
    q, k, v, dout = inputs
    out, lse = method.forward(q, k, v)
    res = {"positions": np.asarray(method.positions)}
    if method.guard.go:
        res["out"] = out.detach().clone()
        if lse is not None:  # torch_cp's SDPA returns no LSE
            res["lse"] = lse.detach().clone()
    if backward:
        grads = method.backward(dout)
        if method.guard.go:
            res.update(
                dq=grads[0].detach().clone(),
                dk=grads[1].detach().clone(),
                dv=grads[2].detach().clone(),
            )
    return res


def check_method(session: Session, run: MethodRun, mask, seed: int, factor: float) -> dict:
    """Run the method once on this rank, on `mask` and the inputs of `seed`, and compare every
    rank's results with the float64 reference (computed on rank 0; the gate's `factor`). Every
    rank returns the same dict: status and errors."""
    rc = session.context(run)
    try:
        method = load_method(run, rc, mask)
    except S.CellOutcome as e:
        rc.guard.error = e
        method = None
    if method is not None:
        if rc.guard.go:
            with rc.guard:
                method.setup(run.backward)
        inputs = rank_inputs(run, seed, method.positions, session.device)
        res = run_counted(method, rc, inputs, run.backward)
    st, reason = agree(rc.guard, "the correctness run")
    if st is not None:
        return {"status": st, "reason": reason}
    gathered = [None] * session.world
    dist.all_gather_object(gathered, on_cpu(res))
    verdict = None
    if session.rank == 0:
        verdict = checked(gathered, mask, seed, run, factor, session.device)
    box = [verdict]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load_method(run: MethodRun, rc: RankContext, mask):
    """The run's method built on this rank for `mask` (cp.base.load)."""
    info = catalog.method(run.method)
    return load(info, rc, mask, run.heads_q, run.heads_kv, run.head_dim, run.torch_dtype)


def rank_inputs(run: MethodRun, seed: int, positions, device) -> tuple:
    """q, k, v, dout at a rank's global positions (harness.inputs.local_inputs)."""
    return local_inputs(
        seed, positions, run.heads_q, run.heads_kv, run.head_dim, run.torch_dtype, device
    )


def run_counted(method, rc: RankContext, inputs, backward: bool) -> dict:
    """run_once, with the bytes this rank's communicator counted and the schedule's formula."""
    res = run_once(method, inputs, backward)
    res["bytes"] = {
        "sent": rc.comm.total_sent,
        "received": rc.comm.total_received,
        "by_kind": dict(rc.comm.sent),
        "analytic": method.volume("fwdbwd" if backward else "fwd"),
        "work_pairs": method.work(),
    }
    return res


def on_cpu(res: dict) -> dict:
    return {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in res.items()}


def checked(gathered, mask, seed: int, run: MethodRun, factor: float, device) -> dict:
    """compare(), with an out-of-memory error of the float64 check itself as CHECK_OOM."""
    try:
        return compare(gathered, mask, seed, run, factor, device)
    except Exception as e:  # noqa: BLE001 - the reference's OOM is the check's, not the method's
        if not S.is_oom(e):
            raise
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        return {
            "status": CHECK_OOM,
            "reason": f"rank 0, float64 check at {mask.seqlen}: {str(e).splitlines()[0][:300]}",
        }


def naive_in_dtype(q, k, v, dout, visible):
    """Plain PyTorch attention in the inputs' dtype: out, lse and grads (the tolerance yardstick)."""
    from ..kernels.naive import naive_attention

    leaves = [bhsd_view(x).detach().requires_grad_(dout is not None) for x in (q, k, v)]
    with torch.enable_grad():
        out = naive_attention(*leaves, visible)
        grads = torch.autograd.grad(out, leaves, bhsd_view(dout)) if dout is not None else None
    g = q.shape[1] // k.shape[1]
    s = (leaves[0] @ leaves[1].repeat_interleave(g, dim=1).transpose(-1, -2)) * q.shape[-1] ** -0.5
    lse = torch.logsumexp(s.detach().masked_fill(~visible, float("-inf")), dim=-1)[0]
    return (
        to_thd(out.detach(), "bhsd"),
        lse,
        tuple(to_thd(x, "bhsd") for x in grads) if grads is not None else None,
    )


def compare(gathered, mask, seed: int, run: MethodRun, factor: float, device="cpu") -> dict:
    """Every rank's rows (out, lse, dq, dk, dv) through the gate (gate.judge) against float64,
    with naive attention in the same dtype on the same rows as the yardstick and the LSE's
    float32 bound. The references run on `device` (float64 on a GPU for GPU cells), then move
    to the CPU."""
    S_, dtype, d, backward = mask.seqlen, run.torch_dtype, run.head_dim, run.backward
    q, k, v, dout = rank_inputs(run, seed, np.arange(S_), device)
    ref_out, ref_lse, ref_grads = reference_attention(q, k, v, mask, dout if backward else None)
    lse_tol = lse_bound(ref_lse, q, k, d**-0.5)
    vis = mask.dense(device)
    nv_out, nv_lse, nv_grads = naive_in_dtype(q, k, v, dout if backward else None, vis)
    names = tuple(n for n in ("out", "lse", "dq", "dk", "dv") if n in gathered[0])
    ref = {"out": ref_out, "lse": ref_lse.transpose(0, 1)}
    nv = {"out": nv_out, "lse": nv_lse.transpose(0, 1)}
    if backward:
        ref.update(zip(("dq", "dk", "dv"), ref_grads))
        nv.update(zip(("dq", "dk", "dv"), nv_grads))
    ref = {n: x.cpu() for n, x in ref.items()}
    nv = {n: x.cpu() for n, x in nv.items()}
    per_rank = []
    passed = True
    for r, res in enumerate(gathered):
        pos = torch.as_tensor(res["positions"])
        keep = pos >= 0
        p = pos[keep]
        mine = {n: (res[n].transpose(0, 1) if n == "lse" else res[n])[keep] for n in names}
        verdict = judge(
            mine,
            {n: nv[n][p] for n in names},
            {n: ref[n][p] for n in names},
            dtype,
            factor,
            S_,
            lse_tolerance=lse_tol,
        )
        passed &= verdict["passed"]
        per_rank.append(
            {
                "rank": r,
                "rows": int(keep.sum()),
                **{
                    k_: verdict[k_]
                    for k_ in ("errors", "naive_errors", "tolerance", "frobenius_errors", "passed")
                },
            }
        )
        criterion = verdict["criterion"]
    covered = sorted(int(x) for res in gathered for x in res["positions"] if x >= 0)
    if covered != list(range(S_)):
        passed = False
    worst = {n: max(pr["errors"][n] for pr in per_rank) for n in names}
    counted = [res["bytes"] for res in gathered]
    bytes_match = (
        None
        if counted[0]["analytic"]["sent"] is None
        else all(
            b["sent"] == b["analytic"]["sent"] and b["received"] == b["analytic"]["received"]
            for b in counted
        )
    )
    return {
        "status": S.OK if passed else S.INCORRECT,
        "seqlen": S_,
        "errors": worst,
        "ranks": per_rank,
        "criterion": criterion,
        "tolerance_factor": factor,
        "lse_bound": lse_tol if "lse" in names else None,
        "passed": bool(passed),
        "every_row_once": covered == list(range(S_)),
        "bytes": counted,
        "bytes_match_analytic": bytes_match,
        "work_pairs_total": sum(b["work_pairs"] for b in counted),
        "mask_area_all_heads": int(sum(mask.area_per_head)),
    }
