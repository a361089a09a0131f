"""`advise --gpus N` where no grid measured N GPUs: the CP model's answer to the same question
(answer.py), ranked like a measured one and labelled as modelled, with the model's error against
published CP benchmarks for the question's mask family."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from ..masks import CP_MASKS
from .answer import Model, answer
from .question import Question

CANNOT = "--gpus {n}: no grid measured {n} GPUs; the CP model answers it given {need}"


class ModelQuestionError(ValueError):
    """A question the model cannot answer as asked; the message names what it needs."""


def _one(values, flag: str, n: int, default=None):
    if not values:
        if default is None:
            raise ModelQuestionError(CANNOT.format(n=n, need=flag))
        return default
    return values


def model_questions(wanted: dict, gpus: int, local_kernel: str, network: str):
    """The model's questions for an advise question at `gpus`: one per mask, length and direction."""
    masks = _one(wanted.get("mask"), f"--mask (one of {', '.join(CP_MASKS)})", gpus)
    bad = [m for m in masks if m not in CP_MASKS]
    if bad:
        raise ModelQuestionError(
            f"--mask {bad[0]}: the CP model predicts the masks {', '.join(CP_MASKS)}"
        )
    tokens = list(wanted.get("tokens_per_gpu") or [])
    for s in wanted.get("seqlen") or []:
        if s % gpus:
            raise ModelQuestionError(f"--seqlen {s}: not a multiple of --gpus {gpus}")
        tokens.append(s // gpus)
    tokens = _one(tokens, "--seqlen or --tokens-per-gpu", gpus)
    heads = [tuple(map(int, h.split(":"))) for h in wanted.get("heads") or ["64:8"]]
    directions = wanted.get("direction") or ["train"]
    for m in masks:
        for t in tokens:
            for hq, hkv in heads:
                for d in directions:
                    yield Question(
                        m, gpus, int(t), hq, hkv, direction=d, local_kernel=local_kernel,
                        network=network,
                    )  # fmt: skip


def _table(a) -> list[str]:
    """The methods fastest first, with their time over the fastest's and share of one GPU."""
    ok = sorted((m for m in a.methods if m.time_ms is not None), key=lambda m: m.time_ms)
    lines = [f"  {'#':>2} {'method':<16} {'ms':>10} {'x fastest':>10} {'of 1 GPU':>9}  degrees"]
    for i, m in enumerate(ok, 1):
        ratio = m.time_ms / ok[0].time_ms
        deg = f"U{m.ulysses}xR{m.ring}" + (f"/W{m.windows}" if m.windows > 1 else "")
        lines.append(
            f"  {i:>2} {m.method:<16} {m.time_ms:>10.4g} {ratio:>9.2f}x "
            f"{100 * m.share_of_one_gpu:>8.0f}%  {deg}"
        )
    lines += [f"  not run: {m.method}: {m.bottleneck}" for m in a.methods if m.time_ms is None]
    return lines


def defaults_line(a, cfg: dict, local_kernel: str, network: str) -> str:
    """Where the local kernel and the network came from when the question did not name them: the
    config's cp_model defaults, the network with the first words of its preset's source."""
    mc, q, said = cfg.get("cp_model", {}), a.question, []
    if not local_kernel:
        said.append(f"local kernel {a.kernel} ({a.kernel_choice}; --local-kernel K for another)")
    if not network:
        source = " ".join(str(mc.get("networks", {}).get(q.network, {}).get("source", "")).split())
        first = source.split(". ")[0].split(": ", 1)[-1] if source else "no source given"
        said.append(f"network {q.network} (cp_model.network in the config: {first[:90]})")
    return ("defaults: " + "; ".join(said)) if said else ""


def text(a, defaults: str = "") -> str:
    q = a.question
    ok = sorted((m for m in a.methods if m.time_ms is not None), key=lambda m: m.time_ms)
    head = (
        f"{q.mask}, {q.gpus} GPUs x {q.tokens_per_gpu} tokens (S={q.seqlen}), heads "
        f"{q.heads_q}:{q.heads_kv}, {q.direction}; local kernel {a.kernel}; network {q.network}"
    )
    verdict = (
        f"  fastest predicted: {ok[0].method}" + (f" ({ok[1].method} {ok[1].time_ms / ok[0].time_ms:.2f}x)" if len(ok) > 1 else "")
        if ok
        else "  no method can run this question"
    )  # fmt: skip
    lines = [*wrap(head, ""), *(wrap(defaults, "  ") if defaults else []), verdict, *_table(a)]
    for n in a.notes:
        lines += wrap(f"note: {n}", "  ")
    lines += wrap(
        f"error: {a.error.text()}" if a.error else "error: no validation table found", "  "
    )
    return "\n".join(lines)


def wrap(line: str, indent: str) -> list[str]:
    """A line wrapped at 100 characters, continued further in."""
    return textwrap.wrap(line, 100, initial_indent=indent, subsequent_indent=indent + "    ")


def modelled(cfg: dict, records_dir: Path, local_kernel: str = "", network: str = ""):
    """The callable report.question.respond takes: (question, gpus) -> the model's answers."""
    model = Model(cfg, records_dir)

    def respond(q, gpus: int) -> str:
        try:
            found = [
                answer(mq, cfg, model=model)
                for mq in model_questions(q.wanted, gpus, local_kernel, network)
            ]
        except ValueError as e:  # the model's own checks name the bad value and the valid ones
            from ..report.advice import AdviceError

            raise AdviceError(str(e)) from None
        if q.fmt == "json":
            return json.dumps([a.frame().to_dict(orient="records") for a in found], indent=1)
        if q.fmt == "csv":
            return "\n".join(a.frame().to_csv(index=False) for a in found).rstrip("\n")
        return "\n\n".join(text(a, defaults_line(a, cfg, local_kernel, network)) for a in found)

    return respond
