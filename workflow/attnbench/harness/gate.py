"""The correctness gate: one function that decides whether a result agrees with float64.

Used by kernel cells (cell.check_correctness) and by context-parallel cells and verify
(cp.run.compare). docs/measurement.md explains the criterion and its bounds.

Tensors out, dq, dk, dv: [S, H, D]. The statistic is the largest per-row relative error,
over every (position, head) row: a mask wrong by one token makes a few rows (or every row by
a little, with heavy-tailed spikes) systematically wrong, which a Frobenius norm averages away.
It must stay within `factor` x the same statistic of plain attention in the same dtype on the
same rows (the yardstick), never below the dtype's unit roundoff or float32 accumulation's error.

Per head, the scale of the error along the true head: b_h = <x_h - ref_h, ref_h> / ||ref_h||^2
(`head_scale`). Rounding is nearly orthogonal to the reference, so its b_h is a small part of the
head's whole error; one head scaled by 1 + e (a wrong scale, a wrong normaliser on one head) gives
b_h = e. It must stay within naive attention's largest per-head relative error in the same dtype
(never below the same floors): a per-row maximum lets one head be off by several percent in bf16.

LSE: [S, H], natural log, compared by its largest absolute error against a bound derived from
float32 arithmetic (LSE is a log quantity: an absolute error is a relative error of the sum).
"""

from __future__ import annotations

import torch

from .reference import rel_err, unit_roundoff

CRITERION = "row_max_rel"
HEAD_CRITERION = "head_scale"
LSE_CRITERION = "max_abs_fp32"
# Which rule judged a record: 1, relative Frobenius error within factor x naive's (records whose
# check has no `criterion`); 2, row_max_rel (and max_abs_fp32 for an LSE); 3, also head_scale.
GATE_VERSION = 3
# A row whose reference norm is below this share of the tensor's RMS row norm is measured
# against that floor instead of its own norm: rows whose true value is (nearly) zero by
# cancellation (dq of a row that sees one key) hold only rounding noise, relative to nothing.
ROW_FLOOR = 0.5
FP32_U = 2.0**-24


def row_rel_errors(x, ref):
    """Per (position, head) row: ||x - ref|| / max(||ref||, ROW_FLOOR x RMS row norm of ref).
    A row with a NaN or Inf gives inf. x, ref: [S, H, D]. Computed where the reference lies: on a
    GPU this takes milliseconds, on one CPU thread seconds at 4K x 64 heads (most of a cell's check)."""
    x64, r64 = x.detach().to(ref.device, torch.float64), ref.detach().to(torch.float64)
    diff = (x64 - r64).norm(dim=-1)
    norms = r64.norm(dim=-1)
    rms = norms.square().mean().sqrt() if norms.numel() else norms.new_zeros(())
    denom = norms.clamp_min(ROW_FLOOR * rms)
    errs = torch.where(denom > 0, diff / torch.where(denom > 0, denom, 1.0), diff)
    bad = ~torch.isfinite(x64).all(dim=-1)
    return errs.masked_fill(bad, float("inf"))


def _heads64(x, ref):
    """x, ref in float64 on the reference's device, as [H, S*D] (one row per head)."""
    x64, r64 = x.detach().to(ref.device, torch.float64), ref.detach().to(torch.float64)
    return x64.transpose(0, 1).flatten(1), r64.transpose(0, 1).flatten(1)


def _head_norms_floored(r64):
    """Each head's reference norm, never below ROW_FLOOR x the RMS head norm (a head that sees
    nothing, of a block-sparse mask, is measured against its neighbours' size)."""
    norms = r64.norm(dim=-1)
    rms = norms.square().mean().sqrt() if norms.numel() else norms.new_zeros(())
    return norms.clamp_min(ROW_FLOOR * rms)


def head_rel_errors(x, ref) -> list[float]:
    """Per head: ||x_h - ref_h|| / ||ref_h|| over its [S, D] (floored as above); inf where x_h
    holds a NaN or Inf. x, ref: [S, H, D]."""
    x64, r64 = _heads64(x, ref)
    denom = _head_norms_floored(r64)
    errs = (x64 - r64).norm(dim=-1) / torch.where(denom > 0, denom, 1.0)
    errs = errs.masked_fill(~torch.isfinite(x64).all(dim=-1), float("inf"))
    return [float(e) for e in errs]


def head_scales(x, ref) -> list[float]:
    """Per head: <x_h - ref_h, ref_h> / ||ref_h||^2 (floored as above), the relative size of the
    error's component along the true head; inf where x_h holds a NaN or Inf."""
    x64, r64 = _heads64(x, ref)
    denom = _head_norms_floored(r64).square()
    b = ((x64 - r64) * r64).sum(dim=-1) / torch.where(denom > 0, denom, 1.0)
    b = b.masked_fill(~torch.isfinite(x64).all(dim=-1), float("inf"))
    return [float(v) for v in b]


def row_max_rel_err(x, ref) -> float:
    errs = row_rel_errors(x, ref)
    return float(errs.max()) if errs.numel() else 0.0


def lse_abs_err(x, ref) -> float:
    """Largest |x - ref| over rows; rows that see no key (ref -inf) must be -inf too."""
    x64, r64 = x.detach().to(ref.device, torch.float64), ref.detach().to(torch.float64)
    empty = torch.isinf(r64) & (r64 < 0)
    if (
        not torch.equal(empty, torch.isinf(x64) & (x64 < 0))
        or torch.isnan(x64).any()
        or torch.isposinf(x64).any()
    ):
        return float("inf")
    d = (x64 - r64).masked_fill(empty, 0.0).abs()
    return float(d.max()) if d.numel() else 0.0


def lse_bound(ref_lse, q, k, scale) -> float:
    """What float32 arithmetic can get wrong in a correct LSE (docs/measurement.md):
    u32 x (max |lse| + D x scale x max||q_i|| x max||k_j|| + n), n the number of keys: the
    final rounding, a float32 dot product's error over D products (the LSE moves by at most
    the largest score error), and a float32 sum of n exponentials (worst case, any order)."""
    r = ref_lse.detach().to(torch.float64)
    finite = r[torch.isfinite(r)]
    top = float(finite.abs().max()) if finite.numel() else 0.0
    norm = lambda x: float(x.detach().to(torch.float64).norm(dim=-1).max()) if x.numel() else 0.0  # noqa: E731
    return FP32_U * (top + q.shape[-1] * scale * norm(q) * norm(k) + k.shape[0])


def errors_of(results: dict, ref: dict) -> dict:
    """The gate's statistic of each named result against the reference."""
    return {
        n: (lse_abs_err if n == "lse" else row_max_rel_err)(results[n], ref[n]) for n in results
    }


def frobenius_errors(results: dict, ref: dict) -> dict:
    """Relative Frobenius errors, recorded for reading (not what decides)."""
    return {n: rel_err(results[n], ref[n]) for n in results if n != "lse"}


def error_floor(dtype, head_dim: int, n_keys: int) -> float:
    """The least tolerance before the factor: the dtype's unit roundoff, or what float32
    accumulation over D products and n keys can reach (u32 x (D + n)), whichever is larger.
    Naive attention can be exact where a flash kernel is not (dq of a one-key row)."""
    return max(unit_roundoff(dtype), FP32_U * (head_dim + n_keys))


def judge(
    results: dict,
    yardstick: dict,
    ref: dict,
    dtype,
    factor: float,
    n_keys: int,
    lse_tolerance: float | None = None,
) -> dict:
    """Compare `results` (out, dq, dk, dv, lse: whichever are present) with the float64 `ref`.

    Tolerance of a tensor: factor x max(yardstick's row_max_rel error, error_floor); of each of
    its heads' scale (head_scales): max(the yardstick's largest per-head relative error,
    error_floor), no factor; of the LSE: factor x lse_tolerance (lse_bound). NaN/inf never
    passes. Returns what the record keeps: errors, the yardstick's errors, tolerance, the
    per-head statistics of both, criterion, gate version, passed."""
    errs = errors_of(results, ref)
    tensors = [n for n in results if n != "lse"]
    ystick = errors_of({n: yardstick[n] for n in tensors}, ref)
    floor = error_floor(dtype, ref["out"].shape[-1], n_keys)
    tol = {n: factor * max(e, floor) for n, e in ystick.items()}
    if "lse" in results:
        if lse_tolerance is None:
            raise ValueError("an LSE is compared only with its float32 bound (lse_tolerance)")
        tol["lse"] = factor * lse_tolerance
    scales = {n: head_scales(results[n], ref[n]) for n in tensors}
    naive_heads = {n: head_rel_errors(yardstick[n], ref[n]) for n in tensors}
    head_tol = {n: max([*naive_heads[n], floor]) for n in tensors}
    worst_scale = {n: max((abs(b) for b in scales[n]), default=0.0) for n in tensors}
    passed = all(errs[n] <= tol[n] for n in errs) and all(  # NaN/inf never passes
        worst_scale[n] <= head_tol[n] for n in tensors
    )
    return {
        "gate_version": GATE_VERSION,
        "criterion": {
            "tensors": CRITERION,
            "heads": HEAD_CRITERION,
            **({"lse": LSE_CRITERION} if "lse" in results else {}),
        },
        "errors": errs,
        "naive_errors": ystick,
        "tolerance": tol,
        "tolerance_factor": factor,
        "head_scale": worst_scale,
        "head_tolerance": head_tol,
        "heads": {
            n: {
                "scale": scales[n],
                "rel_err": head_rel_errors(results[n], ref[n]),
                "naive_rel_err": naive_heads[n],
            }
            for n in tensors
        },
        "frobenius_errors": frobenius_errors(results, ref),
        "passed": bool(passed),
    }
