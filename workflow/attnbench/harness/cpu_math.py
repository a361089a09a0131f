"""CPU math that is right from a process' first call.

ATen hands float unary ops on contiguous CPU tensors (exp, log, sqrt, ...) to oneMKL's vector
math (VML), which picks each function's kernel on that function's first call. When that first
call runs on several intra-op threads at once, a thread can run a low-accuracy kernel for its
share of the call (pytorch/pytorch#188792). Here (torch 2.13, 2 threads, a loaded 2-core machine)
the first torch.exp of a process was off by up to 1.5e-4 relative in about one process in
twenty: the first logsumexp of a correctness check came out 4e-5 high on every row, which the
float32 gate rightly failed. One single-element call per function and dtype, which runs on one
thread, settles the choice before any parallel call: every process that computes calls
`settle_vml()` before its first tensor op.
"""

from __future__ import annotations

# ATen's unary ops that may reach VML (a superset is harmless: one tiny call each).
VML_OPS = (
    "abs",
    "acos",
    "asin",
    "atan",
    "cos",
    "cosh",
    "erf",
    "erfc",
    "erfinv",
    "exp",
    "expm1",
    "lgamma",
    "log",
    "log10",
    "log1p",
    "log2",
    "reciprocal",
    "rsqrt",
    "sigmoid",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
)

_settled = False


def settle_vml() -> None:
    """Call every VML_OPS function once on one float32 and one float64 element (idempotent)."""
    global _settled
    if _settled:
        return
    import torch

    for dtype in (torch.float32, torch.float64):
        x = torch.full((1,), 0.5, dtype=dtype)
        for name in VML_OPS:
            getattr(torch, name)(x)
    _settled = True
