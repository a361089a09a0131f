"""Masks wrong by one token, and results wrong on one head, to show that the correctness gate
catches them.

A kernel run on `perturbed(mask, ...)` but checked against `mask` is the bug the gate exists
for: a window off by one, a document, prefix or block boundary moved by one token, a missing
diagonal. `scaled_head` keeps the mask and scales one head of the output or of one gradient.
Used by tests/test_gate_sensitivity.py, tests/gpu/test_gpu_gate_heads.py and
benchmarks/gate_sensitivity.py.
"""

from __future__ import annotations

from .. import masks as M


class PerturbedMask(M.Mask):
    """`base` with another predicate. Its name is not the base's, so kernels that special-case
    `full` / `causal` by name (SDPA's is_causal) take its dense form like any other mask."""

    def __init__(self, base: M.Mask, label: str, predicate_of):
        super().__init__(base.name, base.seqlen, base.params, base.heads_q)
        self.base, self.label, self._predicate_of = base, label, predicate_of
        self.name = f"{base.name} ({label})"

    @property
    def sparse(self) -> bool:
        return self.base.sparse

    def predicate(self, device="cpu"):
        return self._predicate_of(device)


def _with_params(mask: M.Mask, label: str, **changes) -> PerturbedMask:
    other = M.Mask(mask.name, mask.seqlen, {**mask.params, **changes}, mask.heads_q)
    return PerturbedMask(mask, label, other.predicate)


def _without_diagonal(mask: M.Mask) -> PerturbedMask:
    def pred_of(device):
        base = mask.predicate(device)
        return lambda h, q, k: base(h, q, k) & (q != k)

    return PerturbedMask(mask, "missing diagonal", pred_of)


def _boundary_moves(mask: M.Mask):
    """Move the document boundary nearest the middle by +-1 token (both documents keep >= 1)."""
    docs = list(mask.params["doc_lengths"])
    if len(docs) < 2:
        return
    ends = [sum(docs[: i + 1]) for i in range(len(docs) - 1)]
    i = min(range(len(ends)), key=lambda j: abs(ends[j] - mask.seqlen / 2))
    for step in (1, -1):
        moved = docs[:i] + [docs[i] + step, docs[i + 1] - step] + docs[i + 2 :]
        if min(moved) >= 1:
            yield _with_params(mask, f"document boundary {step:+d}", doc_lengths=moved)


def perturbations(mask: M.Mask) -> list[PerturbedMask]:
    """Every one-token perturbation of `mask` that changes it (checked on its dense form)."""
    p, s, out = mask.params, mask.seqlen, [_without_diagonal(mask)]
    for step in (1, -1):
        if "window" in p and p["window"] + step >= 0:
            out.append(_with_params(mask, f"window {step:+d}", window=p["window"] + step))
        if "prefix" in p and 0 <= p["prefix"] + step <= s:
            out.append(_with_params(mask, f"prefix {step:+d}", prefix=p["prefix"] + step))
        if "global_tokens" in p and p["global_tokens"] + step >= 0:
            out.append(
                _with_params(
                    mask, f"global tokens {step:+d}", global_tokens=p["global_tokens"] + step
                )
            )
        if "block" in p and p["block"] + step >= 1:
            out.append(_with_params(mask, f"block {step:+d}", block=p["block"] + step))
    if mask.name == "causal":
        out.append(
            PerturbedMask(mask, "one diagonal too many", lambda device: lambda h, q, k: k <= q + 1)
        )
    if mask.name == "full":
        out.append(
            PerturbedMask(mask, "last key hidden", lambda device: lambda h, q, k: k < s - 1)
        )
    if "doc_lengths" in p:
        out.extend(_boundary_moves(mask))
    truth = mask.dense()
    return [m for m in out if not bool((m.dense() == truth).all())]


# ---------------------------------------------------------------- one head scaled

SCALED = ("out", "dq", "dk", "dv")


def head_axis(layout: str) -> int:
    """Where the head axis is in a kernel's layout (kernels.base.LAYOUTS)."""
    return {"thd": 1, "bshd": 2, "bhsd": 1}[layout]


def _one_head(x, axis: int, head: int, factor: float):
    """x with the slice `head` along `axis` multiplied by factor, in float32 and rounded back to
    x's dtype (1.02 itself is 1.0234 in bfloat16)."""
    import torch

    scale = [1.0] * x.shape[axis]
    scale[head] = factor
    shape = [1] * x.dim()
    shape[axis] = -1
    return (x.float() * torch.tensor(scale, device=x.device).view(shape)).to(x.dtype)


def scaled_head(fn, layout: str, which: str, head: int = 0, factor: float = 1.02):
    """A kernel's fn(q, k, v) that is right but for one head of `which` (out, or the gradient
    dq, dk or dv) scaled by `factor`: the per-head bug (a wrong scale or normaliser on one head)
    that a per-row statistic in bf16 lets through. dk and dv count KV heads."""
    import torch

    if which not in SCALED:
        raise ValueError(f"unknown result {which!r}; valid: {', '.join(SCALED)}")
    axis = head_axis(layout)

    class ScaleGrad(torch.autograd.Function):
        """Identity forward; the gradient of one head scaled on the way back."""

        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            return _one_head(g, axis, head, factor)

    def wrong(q, k, v):
        if which == "out":
            return _one_head(fn(q, k, v), axis, head, factor)
        leaves = {"q": q, "k": k, "v": v}
        leaves[which[1]] = ScaleGrad.apply(leaves[which[1]])
        return fn(leaves["q"], leaves["k"], leaves["v"])

    return wrong
