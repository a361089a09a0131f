"""The CP model against published CP benchmarks (data/published_cp.yaml): every published point
the project can express, asked as a question (question.py) and answered by the model (answer.py).

A test set: nothing is fitted on these numbers. `python -m attnbench predict --validate` (rule
cp_validation) writes <output_dir>/tables/cp_validation/published.{csv,md}: per point its
configuration, the published value, the predicted one and their ratio, and per mask family the
share within +-10% and +-25%, the median |error| and the worst.

Units: MagiAttention publishes TFLOP/s per GPU (compared as such); ring-flash-attention publishes
"% of one GPU" (theoretic flash_attn: 8 x one GPU's time over one GPU's tokens / the ring's time),
compared as 100 x GPUs x (the baseline's mean time) / (the method's mean time), both means over
the realised masks, as its benchmark cycles through its document lists.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .answer import Model, answer, family_of
from .documents import published
from .question import Question

COLUMNS = [
    "source",
    "family",
    "mask",
    "direction",
    "gpus",
    "method",
    "configuration",
    "unit",
    "published",
    "reading_error",
    "predicted",
    "ratio",
    "bottleneck",
    "cause",
]


def questions(data: dict) -> list[tuple[str, Question, dict]]:
    """(source, question, {method: (published, reading error, published_as)}) per published
    configuration."""
    out = []
    magi = data["magiattention_h100"]
    base = dict(magi["question"])
    heads = base.pop("heads")
    for key, by_gpus in magi["points"].items():
        mask, direction = key.split("/")
        for gpus, row in by_gpus.items():
            q = Question(
                mask,
                int(gpus),
                base["tokens_per_gpu"],
                heads[0],
                heads[1],
                base["head_dim"],
                base["dtype"],
                direction,
                base["network"],
                base["local_kernel"],
                sampler=base["sampler"] if mask != "full" and mask != "causal" else "",
                samples=base["samples"] if mask not in ("full", "causal") else 1,
                methods=tuple(row),
            )
            pts = {m: (v, magi["reading_error_tflops"], m) for m, v in row.items()}
            out.append(("magiattention_h100", q, pts))
    rfa = data["ring_flash_attention_h800"]
    base = dict(rfa["question"])
    heads = base.pop("heads")
    for p in rfa["points"]:
        docs = rfa["documents_per_gpu"] if p["api"] == "varlen" else ()
        q = Question(
            p["mask"],
            base["gpus"],
            base["tokens_per_gpu"],
            heads[0],
            heads[1],
            base["head_dim"],
            base["dtype"],
            p["direction"],
            base["network"],
            base["local_kernel"],
            documents=tuple(tuple(d) for d in docs),
            documents_per_gpu=bool(docs),
            methods=(p["method"],),
        )
        pts = {p["method"]: (p["percent"], 0.05, f"{p['published_as']} ({p['api']} API)")}
        out.append(("ring_flash_attention_h800", q, pts))
    return out


def configuration(q: Question) -> str:
    docs = ""
    if q.sampler:
        docs = f", {q.samples} packs of sampler {q.sampler}"
    elif q.documents:
        docs = f", {len(q.documents)} document lists" + (" per GPU" if q.documents_per_gpu else "")
    return (
        f"{q.gpus} GPUs x {q.tokens_per_gpu // 1024}K, {q.heads_q}:{q.heads_kv}, {q.local_kernel}, "
        f"{q.network}{docs}"
    )


def validation_table(cfg: dict, records_dir=None, progress=print) -> pd.DataFrame:
    """One row per published point the model expresses (data/published_cp.yaml)."""
    data = published()
    model = Model(cfg, records_dir)
    causes = data.get("causes", {})
    rows = []
    for source, q, pts in questions(data):
        a = answer(q, cfg, model=model)
        for ma in a.methods:
            pub, err, shown = pts[ma.method]
            if source == "ring_flash_attention_h800":
                unit = "percent_of_one_gpu"
                pred = 100 * q.gpus * a.local.time_ms / ma.time_ms if ma.time_ms else np.nan
            else:
                unit = "tflops_per_gpu"
                pred = ma.tflops_per_gpu if ma.tflops_per_gpu is not None else np.nan
            rows.append(
                {
                    "source": source,
                    "family": family_of(q.mask),
                    "mask": q.mask,
                    "direction": q.direction,
                    "gpus": q.gpus,
                    "method": ma.method if shown == ma.method else f"{ma.method} ({shown})",
                    "configuration": configuration(q),
                    "unit": unit,
                    "published": pub,
                    "reading_error": err,
                    "predicted": pred,
                    "ratio": pred / pub,
                    "bottleneck": ma.bottleneck,
                    "cause": cause_of(causes, source, q, ma.method),
                }
            )
        progress(f"{source}: {q.mask} {q.direction} {q.gpus} GPUs")
    return pd.DataFrame(rows, columns=COLUMNS)


def cause_of(causes: dict, source: str, q: Question, method: str) -> str:
    """The named cause of a point the model misses (data/published_cp.yaml `causes`): the first
    entry whose every given key matches."""
    for c in causes.get(source, []):
        keys = {"mask": q.mask, "direction": q.direction, "method": method, "gpus": q.gpus}
        if all(c[k] == v for k, v in keys.items() if k in c):
            return c["cause"]
    return ""


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per source and mask family, and per family over every source: points, share within
    +-10% and +-25%, median |error|, the worst point."""
    out = []
    groups = [
        *(((s, f), g) for (s, f), g in table.groupby(["source", "family"], sort=False)),
        *((("all", f), g) for f, g in table.groupby("family", sort=False)),
    ]
    for (source, family), g in groups:
        g = g.dropna(subset=["ratio"])
        e = g["ratio"] - 1
        worst = g.iloc[int(np.argmax(e.abs().to_numpy()))]
        out.append(
            {
                "source": source,
                "family": family,
                "points": len(g),
                "within_10": float((e.abs() <= 0.10).mean()),
                "within_25": float((e.abs() <= 0.25).mean()),
                "median_abs_error": float(e.abs().median()),
                "worst_ratio": float(worst["ratio"]),
                "worst_point": f"{worst['method']}, {worst['mask']} {worst['direction']}, "
                f"{worst['gpus']} GPUs",
            }
        )
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame, summ: pd.DataFrame, data: dict) -> str:
    lines = [
        "# The CP model against published CP benchmarks",
        "",
        "A test set: nothing in the model is fitted on these points (cp_model/validation.py, "
        "rule cp_validation; the points and their sources: "
        "workflow/attnbench/cp_model/data/published_cp.yaml).",
        "",
    ]
    for name in ("magiattention_h100", "ring_flash_attention_h800"):
        src = data[name]
        lines += [f"- `{name}`: {src['source']} Read: {src['read']}."]
        lines += [f"  Not expressed: {k}: {v}." for k, v in src.get("not_expressed", {}).items()]
    s = summ.copy()
    for c in ("within_10", "within_25", "median_abs_error"):
        s[c] = s[c].map(
            lambda x: f"{100 * x:.0f}%" if c != "median_abs_error" else f"{100 * x:.1f}%"
        )
    lines += ["", "## Per mask family", "", s.round(3).to_markdown(index=False), ""]
    lines += ["## Every point", "", table.round(3).to_markdown(index=False), ""]
    return "\n".join(lines)


def run_validation(cfg: dict, tables_dir: Path, records_dir=None, progress=print) -> list[Path]:
    table = validation_table(cfg, records_dir, progress)
    summ = summary(table)
    tables_dir.mkdir(parents=True, exist_ok=True)
    paths = [tables_dir / "published.csv", tables_dir / "published.md"]
    table.to_csv(paths[0], index=False)
    paths[1].write_text(markdown(table, summ, published()))
    return paths
