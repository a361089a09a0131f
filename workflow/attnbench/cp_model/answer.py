"""The CP model's answer to one question (question.py): per CP method the predicted time per call
and per-GPU TFLOP/s, the one-GPU baseline, what the answer rests on, and the model's validated
error on published benchmarks for the question's mask family.

    from attnbench.cp_model.answer import Model, answer
    from attnbench.cp_model.question import Question
    a = answer(Question("causal", gpus=16, tokens_per_gpu=8192, heads_q=32, heads_kv=8), cfg)
    a.methods        # MethodAnswer per method: time_ms, tflops_per_gpu, share_of_one_gpu, ...
    a.local          # the bare local kernel on one GPU over one GPU's tokens
    a.error          # ValidatedError of the mask family (validation.py's committed table), or None
    print(a.text())

`cfg` is a loaded config.yaml (families.load_config); the records (kernel records of
cp_model.kernel_grids and the cells of the per-call grid) are read from `records_dir`
(default: cp_model.records_dir). A Model keeps the fitted kernels between questions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..cp.catalog import AUTO
from ..harness.environment import REPO
from ..masks import Mask
from .network import Network
from .predict import LOCAL, Setting, predict, predict_local, realised_masks
from .question import DIRECTIONS, Question, sampler

VALIDATION_TABLE = Path("tables") / "cp_validation" / "published.csv"


@dataclass(frozen=True)
class MethodAnswer:
    method: str
    gpus: int
    time_ms: float | None  # per call (mean over the realised masks); None: the method cannot run
    tflops_per_gpu: float | None
    share_of_one_gpu: float | None  # tflops_per_gpu / the one-GPU baseline's TFLOP/s
    bottleneck: str  # or why it cannot run
    ulysses: int
    ring: int
    windows: int
    peak_mem_gib: float | None = None


@dataclass(frozen=True)
class ValidatedError:
    """The model against the published points of one mask family (validation.py)."""

    family: str  # "full/causal" or "documents"
    points: int
    within_10: float  # share of the points within +-10%
    within_25: float
    median_abs_error: float  # median |predicted / published - 1|
    worst: float  # the worst predicted / published - 1
    table: str  # where it was read

    def text(self) -> str:
        return (
            f"validated on {self.points} published {self.family} points ({self.table}): "
            f"{100 * self.within_10:.0f}% within +-10%, {100 * self.within_25:.0f}% within +-25%, "
            f"median |error| {100 * self.median_abs_error:.1f}%, worst {100 * self.worst:+.0f}%"
        )


@dataclass(frozen=True)
class Answer:
    question: Question
    local: MethodAnswer
    methods: tuple  # MethodAnswer per method asked
    kernel: str
    network: str  # the preset, in words
    terms: str  # the per-call terms used and where they were fitted
    notes: tuple  # the assumptions the answer rests on, terms used outside their fitted rows
    error: ValidatedError | None
    masks: int  # realised masks averaged over
    kernel_choice: str = ""  # for local kernel auto: why this kernel, and the others' times

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([dataclasses.asdict(m) for m in (self.local, *self.methods)])

    def text(self) -> str:
        q = self.question
        docs = f", {self.masks} realised masks" if q.documented else ""
        head = (
            f"{q.mask}, {q.gpus} GPUs x {q.tokens_per_gpu} tokens, heads {q.heads_q}:"
            f"{q.heads_kv}, D {q.head_dim}, {q.dtype}, {q.direction}{docs}; local kernel "
            f"{self.kernel}; network {q.network}: {self.network}"
        )
        df = self.frame()
        df["share_of_one_gpu"] = df["share_of_one_gpu"].map(
            lambda x: f"{100 * x:.1f}%" if x == x and x is not None else ""
        )
        cols = ["method", "gpus", "time_ms", "tflops_per_gpu", "share_of_one_gpu", "bottleneck"]
        cols += ["ulysses", "ring", "windows", "peak_mem_gib"]
        lines = [head, "", df[cols].round(3).to_markdown(index=False), ""]
        lines.append(f"per-call terms: {self.terms}")
        lines += [f"note: {n}" for n in self.notes]
        lines.append(
            f"error: {self.error.text()}" if self.error else "error: no validation table found"
        )
        return "\n".join(lines)


class Model:
    """The fitted pieces of the model, kept between questions: per (kernel, per-call grid) the
    kernel's time fit and its per-call terms."""

    def __init__(self, cfg: dict, records_dir=None):
        from .run import read_records

        self.cfg, self.mc = cfg, cfg["cp_model"]
        self.records_dir = Path(records_dir or self.mc.get("records_dir") or cfg["output_dir"])
        if not self.records_dir.is_absolute() and not self.records_dir.exists():
            self.records_dir = REPO / self.records_dir
        cp_grids = [g for g, v in cfg["grids"].items() if v.get("family") == "cp"]
        grids = list(dict.fromkeys([*self.mc["kernel_grids"], *cp_grids]))
        self.recs = read_records(self.records_dir, grids)
        self._fits = {}

    def fitted(self, kernel: str, calls_from: tuple):
        """(KernelTime with the per-call terms, Calibration, Setting of the records): the
        per-call terms fitted on every cell of `kernel` in the grids `calls_from`."""
        from .run import calibration_network, fitted_kernel, model_config, setting_of

        key = (kernel, tuple(calls_from))
        if key not in self._fits:
            mc = {"mask_samples": 2, "max_ring_ranks": 64, "seed": 0}
            mc.update(model_config(self.cfg, calls_from[0]))
            s, _ = setting_of(mc["grid"])
            net = calibration_network(self.cfg, calls_from[0], list(calls_from), s, kernel)
            kt, _, cal = fitted_kernel(self.recs, kernel, s, list(calls_from), net, mc)
            self._fits[key] = (kt, cal, s)
        return self._fits[key]

    def kernel_time(self, kernel: str, calls_from: tuple):
        """The bare kernel's time fit (no per-call terms) at the setting of the records of the
        per-call grid `calls_from[0]`; ValueError where the kernel has no records to fit it."""
        from .kernel_time import KernelTime
        from .run import model_config, setting_of

        key = ("bare", kernel, calls_from[0])
        if key not in self._fits:
            s, _ = setting_of(model_config(self.cfg, calls_from[0])["grid"])
            self._fits[key] = KernelTime.from_table(
                self.recs, kernel, s.heads_q, s.heads_kv, s.head_dim, s.dtype
            )
        return self._fits[key]

    def network(self, name: str) -> Network:
        return Network.from_config(name, self.mc["networks"][name])

    def busiest_kernel(self, direction: str, calls_from: tuple) -> str | None:
        """The local kernel with the most cells of `direction` in the grids `calls_from`."""
        from .run import measured_cells

        counts = {}
        for g in calls_from:
            cells = measured_cells(self.recs, g, None)
            cells = cells[(cells["direction"] == direction) & (cells["gpus"] > 1)]
            for k, n in cells.groupby("local_kernel").size().items():
                counts[k] = counts.get(k, 0) + n
        return max(counts, key=lambda k: (counts[k], k)) if counts else None

    def call_terms(self, kernel: str, calls_kernel: str, calls_from: tuple, direction: str):
        """(KernelTime of `kernel` with the per-call terms, Calibration whose terms they are,
        notes): the terms fitted on the cells of `calls_kernel` (default: `kernel`); a direction
        the kernel has no cell of borrows the terms of the kernel with the most cells of it (the
        CP framework's work around a call is the same code whatever the kernel)."""
        kt, cal, s = self.fitted(kernel, calls_from)
        notes = []
        if calls_kernel and calls_kernel != kernel:
            have = sorted(
                {self.busiest_kernel(d, calls_from) for d in ("fwd", "bwd", "fwdbwd")} - {None}
            )
            cal = self.fitted(calls_kernel, calls_from)[1]
            if not cal.kernel:
                raise ValueError(
                    f"calls_kernel {calls_kernel!r}: no cell of it in {', '.join(calls_from)} "
                    f"(kernels with cells there include: {', '.join(have) or 'none'})"
                )
            notes.append(f"the per-call terms are {calls_kernel}'s (fitted on its cells)")
        terms, rows, used = dict(cal.kernel), dict(cal.rows), dict(cal.used)
        for d in ("fwd", "bwd") if direction == "fwdbwd" else (direction,):
            if d in terms:
                continue
            other = self.busiest_kernel(d, calls_from)
            if other is None or other == (calls_kernel or kernel):
                continue
            borrowed = self.fitted(other, calls_from)[1]
            terms[d], rows[d], used[d] = borrowed.kernel[d], borrowed.rows[d], borrowed.used[d]
            notes.append(
                f"no {d} cell of {calls_kernel or kernel} in {', '.join(calls_from)}: its {d} "
                f"per-call terms are {other}'s (the kernel with the most {d} cells there)"
            )
        cal = dataclasses.replace(cal, kernel=terms, rows=rows, used=used)
        return kt.with_overhead(terms), cal, s, notes


def realised(q: Question, cfg: dict) -> tuple[list, list, int]:
    """(the realised masks of the CP sequence, those of the one-GPU baseline, how many GPUs'
    tokens the baseline's masks hold). The baseline is one GPU over one GPU's tokens: the mask at
    tokens_per_gpu, or the documents given per GPU; where documents are given for the whole
    sequence (a list, a sampler, the histograms) one GPU's share of them is not defined, and the
    baseline is the bare kernel over the same documents, its time divided by the GPUs."""
    if not q.documented:
        one = Mask(q.mask, q.tokens_per_gpu, {}, heads_q=q.heads_q)
        return [Mask(q.mask, q.seqlen, {}, heads_q=q.heads_q)], [one], 1

    def of(lengths, seqlen):
        return Mask(q.mask, seqlen, {"doc_lengths": list(lengths)}, heads_q=q.heads_q)

    if q.documents_per_gpu:
        whole = [[x * q.gpus for x in d] for d in q.documents]
        return [of(d, q.seqlen) for d in whole], [of(d, q.tokens_per_gpu) for d in q.documents], 1
    if q.documents:
        masks = [of(d, q.seqlen) for d in q.documents]
    elif q.sampler:
        masks = [of(d, q.seqlen) for d in sampler(cfg, q.sampler).packs(q.seqlen, q.samples)]
    else:
        from .run import histograms_for

        mc, h = cfg["cp_model"], histograms_for(cfg, q.seqlen)
        masks = realised_masks(
            q.mask, q.seqlen, q.samples, mc["seed"], {}, h, q.heads_q, q.heads_kv
        )
    return masks, masks, q.gpus


def validated_error(records_dir: Path, family: str) -> ValidatedError | None:
    path = records_dir / VALIDATION_TABLE
    if not path.is_file():
        return None
    t = pd.read_csv(path)
    t = t[(t["family"] == family) & t["ratio"].notna()]
    if t.empty:
        return None
    e = t["ratio"] - 1
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return ValidatedError(
        family,
        len(t),
        float((e.abs() <= 0.10).mean()),
        float((e.abs() <= 0.25).mean()),
        float(e.abs().median()),
        float(e.iloc[int(np.argmax(e.abs().to_numpy()))]),
        str(shown),
    )


def family_of(mask: str) -> str:
    return "full/causal" if mask in ("full", "causal") else "documents"


def answer(q: Question, cfg: dict, records_dir=None, model: Model | None = None) -> Answer:
    """The model's answer to `q` (its defaults from cfg's cp_model filled in and checked first)."""
    model = model or Model(cfg, records_dir)
    q = q.with_defaults(cfg["cp_model"])
    q.check(cfg)
    direction = DIRECTIONS[q.direction]
    net = model.network(q.network)
    masks, local_masks, share = realised(q, cfg)
    choice = ""
    if q.local_kernel == AUTO:
        best, choice = fastest_local_kernel(model, q, local_masks, direction, net)
        q = dataclasses.replace(q, local_kernel=best)
    kt, cal, s_rec, notes = model.call_terms(
        q.local_kernel, q.calls_kernel, q.calls_from, direction
    )
    if q.network == cfg["cp_model"].get("grids", {}).get(q.calls_from[0]):
        # the per-call grid's own network: its per-transfer term applies too
        net = dataclasses.replace(net, call_overhead_s=cal.comm_s)
    s = Setting(q.heads_q, q.heads_kv, q.head_dim, q.dtype)
    if (q.head_dim, q.dtype) != (s_rec.head_dim, s_rec.dtype):
        raise ValueError(
            f"the records of {q.local_kernel} are at head dim {s_rec.head_dim}, "
            f"{s_rec.dtype}; this question asks head dim {q.head_dim}, {q.dtype}"
        )
    if (q.heads_q, q.heads_kv) != (s_rec.heads_q, s_rec.heads_kv):
        notes.append(
            f"heads {q.heads_q}:{q.heads_kv}: the kernel's time per visible pair and query head, "
            f"and the per-call terms per row and query head, are carried over from the records' "
            f"{s_rec.heads_q}:{s_rec.heads_kv} (assumed independent of the heads' number and "
            f"grouping)"
        )
    if net.compute_scale != 1:
        notes.append(
            f"kernel times x {net.compute_scale:g}: network {net.name}'s compute scale against "
            "the device of the records"
        )
    if share > 1:
        notes.append(
            "the one-GPU baseline is the bare kernel over the same documents, its time / "
            f"{share} GPUs (one GPU's share of documents given for the whole sequence is not defined)"
        )
    mrr = cfg["cp_model"].get("max_ring_ranks", 64)
    rows = []
    locals_ = [predict_local(m, s, direction, kt, net) for m in local_masks]
    local_tflops = float(np.mean([p.tflops_per_gpu for p in locals_]))
    local = MethodAnswer(
        LOCAL,
        1,
        float(np.mean([p.time_s for p in locals_])) * 1e3 / share,
        local_tflops,
        1.0,
        "compute",
        1,
        1,
        1,
    )
    for m in q.methods:
        preds = [predict(m, q.gpus, mk, s, direction, kt, net, mrr) for mk in masks]
        p0 = preds[0]
        ok = p0.tflops_per_gpu is not None
        tflops = float(np.mean([p.tflops_per_gpu for p in preds])) if ok else None
        rows.append(
            MethodAnswer(
                m,
                q.gpus,
                float(np.mean([p.time_s for p in preds])) * 1e3 if ok else None,
                tflops,
                tflops / local_tflops if ok else None,
                p0.bottleneck,
                p0.degrees["ulysses"],
                p0.degrees["ring"],
                p0.degrees["windows"],
                max(p.peak_mem_bytes for p in preds) / 2**30 if ok else None,
            )
        )
    terms = cal.text()
    if net.call_overhead_s == 0 and cal.comm_s:
        terms += (
            f" (the per-kernel-call terms only: network {q.network} gets no per-transfer term)"
        )
    fixed = "; ".join(kt.fixed_fit.values()) or "none (no document-mask records of the kernel)"
    terms += f". The kernel's own fixed cost per call: {fixed}"
    outside = cal.outside(direction, q.tokens_per_gpu * q.heads_q)
    if outside:
        notes.append(outside)
    return Answer(
        q,
        local,
        tuple(rows),
        kt.kernel,
        net.text(),
        terms,
        tuple(notes),
        validated_error(model.records_dir, family_of(q.mask)),
        len(masks),
        choice,
    )


def fastest_local_kernel(model: Model, q: Question, local_masks, direction: str, net) -> tuple:
    """(kernel, why) for local kernel auto: of the local kernels with records to fit their time
    from, the one whose bare kernel is fastest on the one-GPU baseline's masks (the question's
    mask over one GPU's tokens, or the sequence's documents: realised()), by the records' time per
    visible pair at those lengths, and the others' times as multiples of it."""
    from ..kernels.catalog import LOCAL_KERNELS

    s = Setting(q.heads_q, q.heads_kv, q.head_dim, q.dtype)
    times, left_out = {}, []
    for name in LOCAL_KERNELS:
        try:
            kt = model.kernel_time(name, q.calls_from)
        except ValueError:  # no ok full or causal records of it at this setting
            left_out.append(name)
            continue
        times[name] = float(
            np.mean([predict_local(m, s, direction, kt, net).time_s for m in local_masks])
        )
    if not times:
        raise ValueError(
            f"local kernel {AUTO}: no local kernel has records to fit its time from under "
            f"{model.records_dir} (local kernels: {', '.join(LOCAL_KERNELS)})"
        )
    ranked = sorted(times, key=times.get)
    best = ranked[0]
    others = ", ".join(f"{k} {times[k] / times[best]:.2f}x" for k in ranked[1:])
    why = (
        f"{AUTO}: by their records, the fastest of {len(times)} local kernels on {q.mask} "
        f"{q.direction} over {local_masks[0].seqlen} tokens, the one-GPU baseline's"
        + (f" (then {others})" if others else "")
        + (f"; no records to fit: {', '.join(left_out)}" if left_out else "")
    )
    return best, why
