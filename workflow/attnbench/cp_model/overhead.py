"""Per-call overheads, fitted on measured cells: a grid's compute-only and comm-only runs, and the
emulated runs of an emulated grid.

A multi-GPU CP cell times two variants of its call besides the real one (families/cp/cell.py,
`breakdown`): compute-only (every transfer skipped) and comm-only (every computation skipped);
an emulated cell (cp.emulate) times every rank's computation on one device, a compute-only time
too. The model predicts both from the same schedules. What the kernel records (and the kernel's
own fixed cost per call, fitted on them: kernel_time.py) and the network preset leave out is the
CP framework's cost per call, which dominates on small chunks (the CPU smoke cells):
  * per local-kernel call (`KernelTime.overhead`, per direction of the cells): a part per row x
    head of the accumulator the method updates around the call (merging the partial output,
    adding the gradients: memory-bound elementwise work) and a fixed part (Python, the launches
    of that work);
  * per transfer call (`Network.call_overhead_s`): the call's cost beyond the preset's latency.
The terms (>= 0) minimise the sum over the cells' samples of |log(predicted / measured)|: timing
noise is multiplicative, and a sample slowed many times over by a loaded machine (the first
sample of a CPU cell often is) pulls this fit no more than any other sample. The per-row part is
tried first and the fixed part added only where it lowers that sum by more than 2% (fit_simplest):
where every cell has the same rows per call the two cannot be told apart, and the cells that do
vary (sdpa_flash's at 16K and 64K tokens per GPU) put the cost on the rows. Each direction's term
keeps the rows x heads per call it was fitted on (`Calibration.rows`), so that an answer can say
when it is used outside them. The model is linear in each term, so its slope is measured by
predicting once more with the term switched on (Fit).
leave_one_out refits the terms once per measured cell on every other cell's samples: the validation
of a cell by a model that did not see it, beside the in-sample one. A cell that is the only one
paying a term (the only cell of its direction) gets no refit, and says why.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..grid.spec import CellSpec
from ..masks import Mask
from .predict import predict

DELTA = 1e-3  # the probe (seconds; per row x head: seconds / ROWS) that measures a slope
ROWS = 1e6  # rows x heads the per-row probe is scaled by (DELTA / ROWS per row x head)


@dataclass
class Calibration:
    # direction -> (seconds, seconds per row x head, more per row x head on several rectangles)
    # per local-kernel call
    kernel: dict
    comm_s: float  # seconds per transfer call
    used: dict  # term -> samples it was fitted on
    grid: str = ""  # the grid(s) whose cells were used
    errors: dict = dataclasses.field(default_factory=dict)  # variant -> relative errors after
    # direction -> (fewest, most) rows x heads per call (tokens per GPU x query heads) fitted on
    rows: dict = dataclasses.field(default_factory=dict)

    def text(self) -> str:
        if not self.used:
            return f"none: no compute-only or comm-only measurement in {self.grid}"
        parts = [
            f"{1e6 * a:.1f} us + {1e12 * b:.1f} us per million rows x heads"
            + (f" (+ {1e12 * more[0]:.1f} us on several rectangles)" if more else "")
            + f" per local-kernel call ({d}, {self.used.get(d, 0)} samples{self._rows_text(d)})"
            for d, (a, b, *more) in sorted(self.kernel.items())
        ]
        parts.append(
            f"{1e6 * self.comm_s:.1f} us per transfer call ({self.used.get('comm', 0)} samples)"
        )
        for name, e in self.errors.items():
            a = np.abs(e)
            parts.append(
                f"then {name}: median |error| {100 * np.median(a):.1f}%, "
                f"worst {100 * e[np.argmax(a)]:+.1f}%"
            )
        return f"fitted on the cells of {self.grid}: " + "; ".join(parts)

    def _span(self, direction: str) -> str:
        lo, hi = self.rows.get(direction, (0, 0))
        return f"{lo / 1e6:.2g}M" if lo == hi else f"{lo / 1e6:.2g}M-{hi / 1e6:.2g}M"

    def _rows_text(self, direction: str) -> str:
        if not self.rows.get(direction, (0, 0))[1]:
            return ""
        return f" of {self._span(direction)} rows x heads per call"

    def outside(self, direction: str, rows_heads: float) -> str:
        """Why the term of `direction` is used outside the rows x heads per call it was fitted on
        (empty: inside them, or no term). A forward+backward question asks both directions."""
        out = []
        for d in ("fwd", "bwd") if direction == "fwdbwd" else (direction,):
            if d not in self.kernel:
                out.append(f"no {d} per-call term: no cell of {self.grid} measured one")
                continue
            lo, hi = self.rows.get(d, (0, 0))
            if hi and not lo / 1.001 <= rows_heads <= hi * 1.001:
                out.append(
                    f"the {d} per-call term was fitted on calls of {self._span(d)} rows x heads; "
                    f"used here at {rows_heads / 1e6:.2g}M"
                )
        return "; ".join(out)


def measured_samples(measured) -> list[dict]:
    """Per sample of every measured multi-GPU cell: its realised mask and the compute-only and
    comm-only medians (seconds) its record holds; an emulated cell's time is compute-only and it
    has no comm-only one (None)."""
    out = []
    for _, r in measured[measured["gpus"] > 1].iterrows():
        rec = json.loads(Path(r["record"]).read_text())
        c = rec["cell"]
        emulated = CellSpec.from_dict(c).cp.emulate
        for smp in rec["samples"]:
            compute = smp.get("time_ms_median" if emulated else "compute_only_ms_median")
            if compute is None:
                continue
            comm = None if emulated else smp["comm_only_ms_median"] * 1e-3
            out.append(
                {
                    "method": c["impl"],
                    "gpus": int(c["gpus"]),
                    "direction": c["direction"],
                    "ulysses": int(r["ulysses_degree"]),
                    "windows": int(r["windows"]),
                    "mask": Mask(c["mask"], c["seqlen"], smp["mask_params"], heads_q=c["heads_q"]),
                    "compute_s": compute * 1e-3,
                    "comm_only_s": comm,
                    "rows_heads": int(c["tokens_per_gpu"]) * int(c["heads_q"]),
                    "record": str(r["record"]),  # the cell (leave_one_out leaves it out whole)
                }
            )
    return out


def _predict(x, s, kt, net, max_ring_ranks):
    return predict(
        x["method"],
        x["gpus"],
        x["mask"],
        s,
        x["direction"],
        kt,
        net,
        max_ring_ranks,
        x["ulysses"],
        x["windows"],
    )


def fit_terms(base, slopes, measured) -> np.ndarray:
    """argmin over o >= 0 (one value per row of `slopes`, at most a few) of
    sum(|log((base + o @ slopes) / measured)|). Each term is searched as its median share of
    the measured time: every combination on a logarithmic grid (with 0), then zooming grids
    around the best (each coordinate from x/f to x*f, f shrinking)."""
    base, measured = np.asarray(base, float), np.asarray(measured, float)
    slopes = np.atleast_2d(np.asarray(slopes, float))
    scale = np.array([np.median(sl / measured) for sl in slopes])
    scale[scale <= 0] = np.inf  # a term the model does not depend on stays 0

    def best_of(axes):
        combos = np.array(np.meshgrid(*axes, indexing="ij")).reshape(len(axes), -1)
        pred = base[:, None] + slopes.T @ (combos / scale[:, None])
        loss = np.sum(np.abs(np.log(pred / measured[:, None])), axis=0)
        return combos[:, int(np.argmin(loss))]

    coarse = np.concatenate([[0.0], np.logspace(-5, 2, 71)])
    best = best_of([coarse] * len(slopes))
    f = 10 ** (7 / 70)  # the coarse grid's step
    for _ in range(40):
        axes = [
            np.geomspace(x / f, x * f, 21) if x > 0 else np.concatenate([[0.0], coarse[1:3]])
            for x in best
        ]
        best = best_of(axes)
        f = f**0.7
    return best / scale


def log_loss(base, slopes, measured, o) -> float:
    pred = np.asarray(base, float) + np.asarray(o, float) @ np.atleast_2d(slopes)
    return float(np.sum(np.abs(np.log(pred / np.asarray(measured, float)))))


def fit_simplest(base, slopes, measured, margin: float = 0.02, noise: float = 0.005) -> np.ndarray:
    """fit_terms over the subsets of terms, one term first (in the order given), then more:
    a subset replaces the best so far only if it lowers the loss by more than `margin` of it and
    by more than `noise` per sample (timing noise: a term must explain more than that; where the
    data cannot tell the terms apart, e.g. every cell with the same rows per call, the first term
    alone is kept rather than an arbitrary mix)."""
    slopes = np.atleast_2d(np.asarray(slopes, float))
    n = len(slopes)
    subsets = [s for k in range(1, n + 1) for s in itertools.combinations(range(n), k)]
    best, best_loss = None, np.inf
    for sub in subsets:
        o = np.zeros(n)
        o[list(sub)] = fit_terms(base, slopes[list(sub)], measured)
        loss = log_loss(base, slopes, measured, o)
        if best is None or loss < min((1 - margin) * best_loss, best_loss - noise * len(base)):
            best, best_loss = o, loss
    return best


def arrays_of(samples, key, probes, s, kt0, net0, max_ring_ranks):
    """The model's `key` (compute_s, comm_only_s) per sample without any term, and its slope in
    each probe's term (predicted once more with it switched on)."""
    base = np.array([getattr(_predict(x, s, kt0, net0, max_ring_ranks), key) for x in samples])
    slopes = [
        (np.array([getattr(_predict(x, s, *p, max_ring_ranks), key) for x in samples]) - base)
        / DELTA
        for p in probes
    ]
    return base, np.array(slopes).reshape(len(probes), len(samples))


class Fit:
    """What the per-call terms are fitted from, computed once: per sample, the model's time
    without any overhead and its slope in each term (the model is linear in them). fitted(keep)
    fits on the samples `keep` selects: all of them (calibrate) or all but one cell's (the
    leave-one-out validation, leave_one_out)."""

    def __init__(self, samples: list[dict], s, kt, net, max_ring_ranks: int):
        self.samples = samples
        kt0, net0 = kt.with_overhead({}), dataclasses.replace(net, call_overhead_s=0.0)

        def arrays(key, probes):
            return arrays_of(samples, key, probes, s, kt0, net0, max_ring_ranks)

        self.directions = sorted({x["direction"] for x in samples})
        self.direction = np.array([x["direction"] for x in samples])
        self.kernel = {}  # direction -> (base, slopes) of compute_s over every sample
        for d in self.directions:
            probes = [  # per row first (fit_simplest tries the terms in this order)
                (kt.with_overhead({d: (0.0, DELTA / ROWS)}), net0),
                (kt.with_overhead({d: (0.0, 0.0, DELTA / ROWS)}), net0),
                (kt.with_overhead({d: (DELTA, 0.0)}), net0),
            ]
            self.kernel[d] = arrays("compute_s", probes)
        self.has_comm = np.array([x["comm_only_s"] is not None for x in samples], bool)
        probe = (kt0, dataclasses.replace(net0, call_overhead_s=DELTA))
        with_comm = [x for x in samples if x["comm_only_s"] is not None]
        self.comm = None
        if with_comm:
            base, slopes = (
                np.zeros(len(samples)),
                np.zeros((1, len(samples))),
            )
            b, sl = arrays_of(with_comm, "comm_only_s", [probe], s, kt0, net0, max_ring_ranks)
            base[self.has_comm], slopes[:, self.has_comm] = b, sl
            self.comm = (base, slopes)
        self.compute_s = np.array([x["compute_s"] for x in samples])
        self.comm_only_s = np.array(
            [np.nan if x["comm_only_s"] is None else x["comm_only_s"] for x in samples]
        )
        self.rows_heads = np.array([x.get("rows_heads", 0) for x in samples])

    def fitted(self, keep=None) -> tuple[dict, float, dict, dict, dict]:
        """(kernel terms per direction, seconds per transfer call, samples used per term,
        relative errors after the fit per variant, (fewest, most) rows x heads per call of each
        direction's samples) on the samples `keep` selects (all: None)."""
        keep = np.ones(len(self.samples), bool) if keep is None else np.asarray(keep, bool)
        kernel, used, errors, rows = {}, {}, {"compute-only": [], "comm-only": []}, {}

        def fit(base, slopes, measured):
            o = fit_simplest(base, slopes, measured)
            return o, list((base + o @ slopes) / measured - 1)

        for d in self.directions:
            sel = keep & (self.direction == d)
            if not sel.any():  # every sample of this direction was left out: nothing to fit
                continue
            base, slopes = self.kernel[d]
            (per, several, fixed), e = fit(base[sel], slopes[:, sel], self.compute_s[sel])
            kernel[d] = (float(fixed), float(per / ROWS), float(several / ROWS))
            used[d], errors["compute-only"] = int(sel.sum()), errors["compute-only"] + e
            rows[d] = (int(self.rows_heads[sel].min()), int(self.rows_heads[sel].max()))
        comm_s = 0.0
        sel = keep & self.has_comm
        if sel.any():
            base, slopes = self.comm
            (comm_s,), errors["comm-only"] = fit(base[sel], slopes[:, sel], self.comm_only_s[sel])
            used["comm"] = int(sel.sum())
        errors = {k: np.array(v) for k, v in errors.items() if v}
        return kernel, float(comm_s), used, errors, rows


def calibrate(samples: list[dict], s, kt, net, max_ring_ranks: int, grid: str):
    """(KernelTime, Network, Calibration): the per-call overheads fitted on `samples`. The
    Calibration keeps its Fit (leave_one_out refits on it)."""
    fit = Fit(samples, s, kt, net, max_ring_ranks)
    kernel, comm_s, used, errors, rows = fit.fitted()
    cal = Calibration(kernel, comm_s, used, grid, errors, rows)
    cal.fit = fit
    return kt.with_overhead(kernel), dataclasses.replace(net, call_overhead_s=cal.comm_s), cal


def leave_one_out(cal: Calibration, kt, net) -> dict:
    """record -> (KernelTime, Network) with the per-call terms refitted without that record's
    samples: the model of a cell that did not see it (one entry per cell fitted on). Where no
    other cell is left to fit a term the cell pays, the entry is why (a str), not a term of 0."""
    fit = getattr(cal, "fit", None)
    if fit is None:
        return {}
    cells = np.array([x.get("record", "") for x in fit.samples])
    out = {}
    for rec in dict.fromkeys(cells):
        if not rec:
            continue
        kernel, comm_s, used, _, _ = fit.fitted(cells != rec)
        unfitted = [
            f"{d} local-kernel call"
            for d in sorted(set(fit.direction[cells == rec]))
            if d not in used
        ]
        pays_comm = fit.has_comm[cells == rec].any()
        unfitted += [] if "comm" in used or not pays_comm else ["transfer call"]
        if unfitted:
            out[rec] = (
                f"no other {kt.kernel} cell of {cal.grid} to fit the overhead per "
                f"{' and per '.join(unfitted)} on"
            )
            continue
        out[rec] = (kt.with_overhead(kernel), dataclasses.replace(net, call_overhead_s=comm_s))
    return out
