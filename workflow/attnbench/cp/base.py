"""What every context-parallel method provides, and the per-rank context it runs in.

A method is built per realised mask (its layout and buffers depend on the document lengths):
    m = load(info, rc, mask, heads_q, heads_kv, head_dim, dtype)
    m.positions          # global position of each local input row (-1: padding)
    m.setup(backward)    # persistent communication buffers (allocated once, outside timing)
    out, lse = m.forward(q, k, v)      # local rows: q [rows, Hq, D], k/v [rows, Hkv, D]
    dq, dk, dv = m.backward(dout)      # uses what the last forward saved
Every tensor that crosses a process boundary lives in a persistent buffer, so a rank whose
computation failed (Guard) can keep serving transfers with them until the phase ends.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

import torch

from ..grid.spec import DKV_COMM_DTYPES, Degrees
from ..kernels.lse import accumulator_dtype
from ..record.status import Unsupported
from . import schedule
from .catalog import MethodInfo, mask_reason
from .comm import Comm, Groups, Guard


@dataclass
class RankContext:
    rank: int
    device: torch.device
    deg: Degrees
    groups: Groups
    comm: Comm
    guard: Guard
    kernel: object  # LocalKernel (None for torch_cp, which runs SDPA itself)
    # torch_cp: the SDPA backend to pin (sdpa_flash, sdpa_cudnn); torch_cp_auto: auto
    kernel_name: str | None = None
    # the dtype dK/dV travel the ring in (grid.spec.DKV_COMM_DTYPES): accumulator or input
    dkv_comm_dtype: str = DKV_COMM_DTYPES[0]


class CPMethod:
    name = ""

    def __init__(
        self,
        info: MethodInfo,
        rc: RankContext,
        mask,
        heads_q: int,
        heads_kv: int,
        head_dim: int,
        dtype,
    ):
        self.info, self.rc, self.mask = info, rc, mask
        self.hq, self.hkv, self.d, self.dtype = heads_q, heads_kv, head_dim, dtype
        self.acc = accumulator_dtype(dtype)
        self.device = rc.device

    # ------------------------------------------------------------ the protocol

    positions = None  # numpy int64 [rows]: global position of each local row, -1 = padding

    def setup(self, backward: bool):
        raise NotImplementedError

    def forward(self, q, k, v):
        raise NotImplementedError

    def backward(self, dout):
        raise NotImplementedError

    def volume(self, direction: str) -> dict:
        """Bytes this rank sends and receives in one call, from the schedule's formula."""
        raise NotImplementedError

    def work(self) -> int:
        """Visible (query, key) pairs this rank computes, summed over its query heads."""
        raise NotImplementedError

    def describe(self) -> dict:
        """Method-specific facts for the record (degrees, layout, replication...)."""
        return {}

    # ------------------------------------------------------------ helpers

    def empty(self, *shape, dtype=None):
        return torch.empty(shape, dtype=dtype or self.dtype, device=self.device)

    @property
    def guard(self):
        return self.rc.guard

    @property
    def comm(self):
        return self.rc.comm

    @property
    def elem(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def dkv_dtype(self):
        """The dtype dK/dV accumulators travel the ring in; every rank sums in self.acc."""
        return self.dtype if self.rc.dkv_comm_dtype == "input" else self.acc


class ScheduledMethod(CPMethod):
    """A method whose bytes and work are read off its schedule (cp/schedule.py)."""

    def schedule(self, direction: str) -> dict:
        """This rank's steps: chunks computed and bytes moved, per phase."""
        raise NotImplementedError

    def volume(self, direction: str) -> dict:
        """The schedule's bytes per rank (sent = received: every pattern here is symmetric)."""
        return schedule.volume(self.schedule(direction))

    def work(self) -> int:
        return schedule.work(self.schedule("fwd")["fwd"])


def method_class(info: MethodInfo) -> type[CPMethod]:
    """The implementation: "module:Class" of attnbench.cp, or of any importable module (your own)."""
    module, cls = info.impl.split(":")
    local = importlib.util.find_spec(f"{__package__}.{module}") if "." not in module else None
    return getattr(importlib.import_module(f"{__package__}.{module}" if local else module), cls)


def load(info: MethodInfo, rc: RankContext, mask, heads_q, heads_kv, head_dim, dtype) -> CPMethod:
    """The method built for this mask; `Unsupported` for a mask it cannot express, whoever calls."""
    why = mask_reason(info, mask.name)
    if why:
        raise Unsupported(why)
    return method_class(info)(info, rc, mask, heads_q, heads_kv, head_dim, dtype)
