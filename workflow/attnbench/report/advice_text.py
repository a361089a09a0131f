"""The advice in words and tables: a grid's advice.md/.tex, one question's answer in a terminal
(text), Markdown, JSON or CSV, and the one-row-per-mask overview the README shows."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..harness.control import DRIFT_LIMIT
from ..kernels.catalog import KERNELS, mask_note_key
from ..masks.realised import describe as describe_draws
from ..record.validate import file_problems
from . import against_text
from .advice import NO_RECORD, TRAIN, Answer, Choice, grid_answers
from .against import Against
from .labels import STATUS_LABEL, heads_label, seqlen_label
from .outputs import ADVICE_STEM
from .paired import Standing, Verdict, current
from .tables import describe_setup, write_sections
from .tables import fmt_ms as ms
from .tables import fmt_ratio as _ratio

WIDTH = 100  # a terminal answer's widest line


def ratio_text(s: Standing) -> str:
    """Its time over the fastest's, per draw: '1.05x', or '1.04-1.06x' over several draws."""
    lo, hi = _ratio(s.ratio_lo), _ratio(s.ratio_hi)
    return f"{lo}x" if lo == hi else f"{lo}-{hi}x"


def time_text(s: Standing) -> str:
    """Its mean time per call over the draws, with its fastest and slowest draw where they differ."""
    lo, hi = ms(s.min_ms), ms(s.max_ms)
    return ms(s.mean_ms) + ("" if lo == hi else f" [{lo}-{hi}]")


def draws_text(a: Answer) -> str:
    if not a.per_sample:
        return f"{a.draws} (no per-sample data)"
    return str(a.draws)


def verdict_line(a: Answer) -> str:
    """The answer in one sentence, with how it was decided (report.paired.Comparison.how)."""
    what = a.family.what
    if not a.ok:
        return "none ok: no contender has an ok record here"
    if len(a.ok) == 1:
        return f"{a.fastest.name}: the only {what} ok here"
    if a.winner:
        return f"{a.winner.name}: every other {what} is slower ({a.how})"
    tied = a.tied
    slower = len(a.ok) - len(tied)
    rest = f"; {slower} other{'s are' if slower > 1 else ' is'} slower" if slower else ""
    return (
        f"no clear winner: {' ~ '.join(c.name for c in tied)}: none is slower than "
        f"{a.fastest.name}{rest} ({a.how})"
    )


def notes(a: Answer) -> list[str]:
    """How contenders at this point run its mask, where their catalog entry says (sdpa_cudnn:
    a dense boolean mask): 'name: note', for every contender with a record here; then how they
    were measured, where it weakens the answer: contenders measured on different machines, a
    throttled window, a job whose control calls moved past their limit (harness.control)."""
    key = mask_note_key(str(a.point.get("mask", "")))
    out = []
    for c in (*a.ok, *a.not_ok):
        info = KERNELS.get(c.name)
        note = info.notes.get(key) if info else None
        if note and any(r.status != NO_RECORD for r in c.records):
            out.append(f"{c.name}: {note}")
    machines = {c.name: c.machines for c in a.ok if c.machines}
    if len({m for ms in machines.values() for m in ms}) > 1:  # compare like with like
        out.append(
            "measured on different machines, so the comparison mixes them: "
            + "; ".join(f"{n} on {', '.join(ms)}" for n, ms in machines.items())
        )
    throttled = [c.name for c in a.ok if c.throttled]
    if throttled:
        out.append(
            f"throttled (a thermal or hardware slowdown in a timed window): {', '.join(throttled)}"
        )
    waited = [c.name for c in a.ok if c.host_waited]
    if waited:
        out.append(
            "a timed window may include host time (the host had not queued every repetition "
            f"before the GPU reached it): {', '.join(waited)}"
        )
    drifted = {
        c.name: c.control_drift
        for c in a.ok
        if c.control_drift is not None and abs(c.control_drift) > DRIFT_LIMIT
    }
    if drifted:  # side by side, the contenders share one job: one move for all
        same = len(set(drifted.values())) == 1 and len(drifted) == len(a.ok)
        moves = (
            f"{next(iter(drifted.values())):+.1%}"
            if same
            else ", ".join(f"{n} {d:+.1%}" for n, d in drifted.items())
        )
        out.append(f"control calls moved {moves} over the job (limit {DRIFT_LIMIT:.0%})")
    return out


def host_text(a: Answer) -> str:
    """Each ok contender's host overhead (a caller's median time over the device's), where known."""
    known = [(c.name, c.host_overhead_ms) for c in a.ok if c.host_overhead_ms is not None]
    return ", ".join(f"{n} {ms(max(v, 0.0))}" for n, v in known)


def _not_ok_text(a: Answer) -> str:
    return ", ".join(f"{c.name} {c.why_not()}" for c in a.not_ok)


# ---------------------------------------------------------------- a grid's advice.md


def _standing_text(a: Answer, i: int) -> str:
    c = a.ok[i]
    s = a.standing[c.name]
    return f"{c.label()} {ratio_text(s)}, {s.wins}/{a.draws} won"


def _row(a: Answer) -> dict:
    fastest = a.standing[a.fastest.name] if a.ok else None
    row = {
        **a.family.leading(a.point),
        "direction": a.direction,
        "draws": draws_text(a) if a.ok else "",
        "advice": a.verdict(),
        "fastest, ms": f"{a.fastest.label()} {time_text(fastest)}" if fastest else "",
        "runner-up (x fastest, draws won)": _standing_text(a, 1) if len(a.ok) > 1 else "",
        "others (x fastest)": ", ".join(
            f"{c.name} {ratio_text(a.standing[c.name])}" for c in a.ok[2:]
        ),
        "not ok (do not compete)": _not_ok_text(a),
        "host overhead, ms": host_text(a),
        "notes": "; ".join(notes(a)),
    }
    if a.emulated:
        row["advice"] += " [emulated]"
    return row


def _section_title(a: Answer, varying: list[str]) -> str:
    p = a.point
    title = heads_label(p["heads_q"], p["heads_kv"])
    if "head_dim" in varying:
        title += f", head dim {int(p['head_dim'])}"
    if "dtype" in varying:
        title += f", {p['dtype']}"
    return title


def sections(found: list[Answer]) -> list[tuple[str, pd.DataFrame]]:
    """(title, table) per heads setting (and head dim and dtype where they vary), rows in order."""
    varying = [k for k in ("head_dim", "dtype") if len({str(a.point[k]) for a in found}) > 1]
    groups: dict[str, list[dict]] = {}
    for a in found:
        groups.setdefault(_section_title(a, varying), []).append(_row(a))
    out = []
    for title, rows in groups.items():
        t = pd.DataFrame(rows)
        for col in ("notes", "host overhead, ms"):  # a column only where some point has one
            if not t[col].astype(bool).any():
                t = t.drop(columns=col)
        out.append((title, t.set_index(t.columns[0])))
    return out


def rule_text(v: Verdict) -> str:
    """The rule in one sentence, with its settings (config.yaml report.verdict)."""
    return (
        "contenders compared draw by draw (every contender at a point times the same sampled "
        f"masks): with {v.min_draws} or more draws B is slower than the fastest A where B's "
        f"median is above A's on at least k of the n draws, k the fewest for a one-sided sign "
        f"test at p <= {v.alpha:g} (e.g. 9 of 10), and B/A's geometric mean over the draws is "
        f">= {v.threshold:g}; with fewer draws, where on every draw B's p20 is above A's p80 "
        f"(p20-p80 of the draw's timed repetitions) and the geometric mean is >= {v.threshold:g}; "
        "the fastest (lowest mean time over the draws) is named the winner where every other "
        "contender is slower than it, else 'A ~ B' lists the fastest and each contender that is "
        "not slower"
    )


def caption(
    df: pd.DataFrame, answers: list[Answer], fam, left: str, settings: Verdict | None = None
) -> str:
    """The first line of advice.md: what each row decides and how (`settings`: the rule's,
    default the current ones), and the cells that do not compete."""
    rows, _ = fam.contenders(df)
    bad = rows[rows["status"] != "ok"]["status"].value_counts()
    counts = ", ".join(f"{n} {STATUS_LABEL.get(s, s)}" for s, n in bad.items())
    draws = sorted({a.draws for a in answers if a.ok})
    parts = [
        f"advice: the fastest {fam.what} per {fam.per} and direction (fwd, bwd; train = fwd + bwd "
        "of the same draw)",
        "decided on time per call, ms (the time a user waits)",
        rule_text(settings or current()),
        "draws: how many sampled masks the answer rests on"
        + (f" ({', '.join(map(str, draws))} here)" if draws else "")
        + "; '(one draw)': a single draw, so the answer is that draw's alone",
        "fastest, ms: its mean time over the draws [its fastest-slowest draw]",
        "x fastest: per-draw time over the fastest's on the same draw [min-max over the draws]; "
        "draws won: draws on which it was the fastest of all",
        "notes: how a kernel runs the mask, where its catalog entry says",
        f"only ok cells compete: {int(bad.sum())} of {len(rows)} cells are not ok"
        + (f" ({counts})" if counts else ""),
    ]
    if any(a.emulated for a in answers):
        parts.append(
            "[emulated]: one GPU ran every rank's compute, never a distributed measurement"
        )
    if left:
        parts.append(left)
    if len(df):
        parts.append(describe_setup(df))
    return "; ".join(parts)


def write_advice(
    df: pd.DataFrame, out: Path, grid: str | None, fam, samples=None, settings=None
) -> list[Path]:
    """advice.md and advice.tex of one grid's rows (`settings`: the rule's, default the current
    ones)."""
    settings = settings or current()
    found, left = grid_answers(df, grid or "(all grids)", fam, samples, settings)
    text = caption(df, found, fam, left, settings)
    return write_sections(sections(found), Path(out) / ADVICE_STEM, text)


def advice_markdown(df: pd.DataFrame, families, samples=None, settings=None) -> str:
    """The whole advice of a tidy table, as Markdown: every grid's caption and tables."""
    settings = settings or current()
    parts = []
    for grid, g in df.groupby("grid", sort=False):
        fam = families(str(g["family"].iloc[0]))
        found, left = grid_answers(g, str(grid), fam, samples, settings)
        parts += [f"## {grid} ({fam.name})", "", caption(g, found, fam, left, settings), ""]
        for title, t in sections(found):
            parts += [f"### {title}", "", t.to_markdown(), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------- one question


def heading(a: Answer) -> str:
    """Where the answer is, in words: grid, point, direction, draws."""
    p = a.point
    parts = [f"{a.grid} ({a.family.name})", *a.family.where(p)]
    parts += [heads_label(p["heads_q"], p["heads_kv"]), f"head dim {int(p['head_dim'])}"]
    parts.append(str(p["dtype"]))
    parts.append("train (fwd + bwd)" if a.direction == TRAIN else a.direction)
    n = f"{a.draws} draw{'s' * (a.draws != 1)}" + ("" if a.per_sample else ", no per-sample data")
    return ", ".join(parts) + (f"; {n}" if a.ok else "")


def ground(a: Answer) -> str:
    """What the answer rests on, in the same words for every answer: measured or emulated (the
    CP model's answers say `modelled` in theirs), on which device and when, and whether its
    records are current (pipeline.currency: a run would make them as they are) or why not."""
    records = [r for c in (*a.ok, *a.not_ok) for r in c.records if r.cell_id]
    if not records:
        return "no records"
    word = "emulated" if any(r.emulated for r in records) else "measured"
    devices = (
        ", ".join(dict.fromkeys(r.device for r in records if r.device)) or "an unnamed device"
    )
    days = sorted(r.finished_at[:10] for r in records if r.finished_at)
    when = "" if not days else f" {days[0]}" + (f" to {days[-1]}" if days[-1] != days[0] else "")
    stale = [r.outdated for r in records if r.outdated]
    if not stale:
        currency = f"its {len(records)} records current"
    else:
        kinds = ", ".join(dict.fromkeys(o.split(":", 1)[0] for o in stale))
        currency = f"{len(stale)} of its {len(records)} records outdated ({kinds}; a run would remake them)"
    drawn = mask_as_drawn(a)
    return f"{word} on {devices}{when}; {currency}" + (
        f"; mask as drawn: {drawn}" if drawn else ""
    )


def mask_as_drawn(a: Answer) -> str:
    """The realised mask parameters of the draws an answer rests on ('window 1,024; 8-25
    documents'), from the first of its timed records that reads as a consistent record (the
    contenders at a point share their draws); '' where the mask draws nothing or no record is
    at hand."""
    for r in (r for c in a.ok for r in c.records if r.timed and r.path):
        record, problems = file_problems(r.path)
        if not problems:
            return describe_draws(s["mask_params"] for s in record["samples"])
    return ""


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _wrap(text: str, indent: str) -> list[str]:
    """Words wrapped at WIDTH."""
    lines, line = [], indent
    for word in text.split(" "):
        if len(line) + len(word) + 1 > WIDTH and line.strip():
            lines.append(line.rstrip())
            line = indent + "  "
        line += word + " "
    return lines + [line.rstrip()]


def _record_line(r) -> str:
    if not r.cell_id:
        return f"{r.direction}: no record"
    ran = f", local kernel {r.ran}" if r.ran else ""
    return f"{r.direction} {r.status}{ran}: {r.path} (cell {r.cell_id})"


def slower_text(s: Standing, draws: int) -> str:
    """The draws on which it is slower than the fastest, and the sign test's p-value of that."""
    return f"{s.slower_on}/{draws}, p {s.p_value:.2g}"


def ranked_rows(a: Answer) -> list[dict]:
    """The ranked table of an answer: contender, ms, ratio to the fastest (per draw, and its
    geometric mean), draws won, draws slower than the fastest (sign-test p), slower or tied."""
    rows = []
    for i, c in enumerate(a.ok, 1):
        s = a.standing[c.name]
        rows.append(
            {
                "#": i,
                a.family.what: c.name,
                "ms, mean [min-max]": time_text(s),
                "x fastest": "1" if i == 1 else ratio_text(s),
                "geo. mean": "1" if i == 1 else f"{_ratio(s.geomean)}x",
                "draws won": f"{s.wins}/{a.draws}",
                "slower on, p": "" if i == 1 else slower_text(s, a.draws),
                "host ms": "" if c.host_overhead_ms is None else ms(max(c.host_overhead_ms, 0.0)),
                "": "slower" if s.slower else ("~" if i > 1 else ""),
            }
        )
    return rows


def explain(choice: Choice, verbose: bool = False) -> str:
    """One answer for a terminal: where, the verdict, the ranked table, what is not ok, the
    other grids that answer the same question."""
    a = choice.answer
    lines = _wrap(heading(a) + (" [emulated]" if a.emulated else ""), "")
    lines += _wrap(f"ground: {ground(a)}", "  ")
    lines += _wrap(verdict_line(a), "  ")
    rows = ranked_rows(a)
    if rows:
        name = a.family.what
        # each column as wide as its widest entry (a contender's name at most 44)
        cols = [k for k in rows[0] if k not in ("#", "")]
        w = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in cols}
        w[name] = min(w[name], 44)
        lines.append(f"  {'#':>2} " + " ".join(f"{k:<{w[k]}}" for k in cols).rstrip())
        for r, c in zip(rows, a.ok):
            cells = [_fit(str(r[k]), w[k]) for k in cols]
            line = " ".join(f"{v:<{w[k]}}" for v, k in zip(cells, cols))
            lines.append(f"  {r['#']:>2} {line} {r['']}".rstrip())
            if verbose:
                lines += [_fit(f"       {_record_line(x)}", 10**6) for x in c.records]
    for ag in choice.against:
        lines += against_lines(ag, verbose)
    if notes(a):
        lines += _wrap("notes: " + "; ".join(notes(a)), "  ")
    if a.not_ok:
        lines += _wrap("not ok: " + "; ".join(f"{c.name} {c.why_not()}" for c in a.not_ok), "  ")
        if verbose:
            lines += [f"       {c.name}: {_record_line(x)}" for c in a.not_ok for x in c.records]
    if choice.others:
        also = ", ".join(
            f"{o.grid} ({len(o.ok)} ok, {o.draws} draw{'s' * (o.draws != 1)})"
            for o in choice.others
        )
        lines += _wrap(f"also answered by: {also} (--all shows them)", "  ")
    return "\n".join(lines)


def against_ground(ag: Against) -> str:
    """The ground of a baseline from another answer (that answer's records); '' at the point."""
    return ground(ag.answer) if ag.answer is not None and not ag.paired else ""


def against_lines(ag: Against, verbose: bool = False) -> list[str]:
    """An answer against one baseline, for a terminal: its lines wrapped, with the ground of the
    answer the baseline comes from, and (verbose) the records of the baseline's fastest."""
    first, *rest = against_text.lines(ag)
    out = _wrap(first, "  ")
    for line in rest:
        out += _wrap(line, "    ")
    ground_ = against_ground(ag)
    if ground_:
        out += _wrap(f"ground: {ground_}", "    ")
    if verbose and ag.theirs is not None:
        out += [f"       {ag.theirs.name}: {_record_line(x)}" for x in ag.theirs.records]
    return out


def _against_dict(ag: Against) -> dict:
    return {**against_text.as_dict(ag), "ground": against_ground(ag) or None}


def _answer_dict(choice: Choice) -> dict:
    a = choice.answer
    return {
        "grid": a.grid,
        "family": a.family.name,
        "point": {k: _plain(v) for k, v in a.point.items()},
        "direction": a.direction,
        "draws": a.draws,
        "per_sample": a.per_sample,
        "emulated": a.emulated,
        "ground": ground(a),
        "verdict": a.verdict(),
        "rule": a.comparison.rule,
        "how": a.how,
        "winner": a.winner.name if a.winner else None,
        "tied": [c.name for c in a.tied],
        "contenders": [
            {
                "name": c.name,
                **{k: _plain(v) for k, v in vars(a.standing[c.name]).items() if k != "name"},
                "records": [
                    {
                        "direction": r.direction,
                        "status": r.status,
                        "cell_id": r.cell_id,
                        "path": r.path,
                    }
                    for r in c.records
                ],
            }
            for c in a.ok
        ],
        "not_ok": [{"name": c.name, "why": c.why_not()} for c in a.not_ok],
        "notes": notes(a),
        "against": [_against_dict(ag) for ag in choice.against],
        "also_answered_by": [o.grid for o in choice.others],
    }


def _plain(v):
    """JSON-able: numpy numbers as Python numbers."""
    return v.item() if hasattr(v, "item") else v


def render(choices: list[Choice], fmt: str, verbose: bool = False) -> str:
    """The answers in a format: text (a terminal), md, json or csv."""
    if fmt == "json":
        return json.dumps([_answer_dict(c) for c in choices], indent=1)
    if fmt == "csv":
        rows = []
        for ch in choices:
            a = ch.answer
            head = {"grid": a.grid, **a.point, "direction": a.direction, "draws": a.draws}
            head["verdict"] = a.verdict()
            head["ground"] = ground(a)
            after = {}  # the answer against its baselines, the same on each of its rows
            for ag in ch.against:
                after.update(against_text.csv_columns(ag, against_ground(ag)))
            rows += [{**head, **r, **after} for r in ranked_rows(a)]
        return pd.DataFrame(rows).to_csv(index=False).rstrip("\n")
    if fmt == "md":
        parts = []
        for ch in choices:
            a = ch.answer
            parts += [f"**{heading(a)}**", "", f"ground: {ground(a)}", "", verdict_line(a), ""]
            rows = ranked_rows(a)
            if rows:
                parts += [pd.DataFrame(rows).set_index("#").to_markdown(), ""]
            for ag in ch.against:
                first, *rest = against_text.lines(ag)
                ground_ = against_ground(ag)
                rest += [f"ground: {ground_}"] if ground_ else []
                parts += [f"- {first}", *(f"  {x}" for x in rest), ""]
            if notes(a):
                parts += ["notes: " + "; ".join(notes(a)), ""]
            if a.not_ok:
                parts += ["not ok: " + _not_ok_text(a), ""]
        return "\n".join(parts).rstrip()
    return "\n\n".join(explain(c, verbose) for c in choices)


def verdict_lines(choices: list[Choice]) -> str:
    """One line per answer: where and the verdict (a question that spans many points)."""
    out = []
    for ch in choices:
        a = ch.answer
        p = a.point
        line = f"{a.grid}: {a.family.short(p)} {heads_label(p['heads_q'], p['heads_kv'])} {a.direction}: "
        line += a.verdict() + (" [emulated]" if a.emulated else "")
        if len(a.ok) > 1:
            line += f"; runner-up {_standing_text(a, 1)}"
        out.append(_fit(line, WIDTH))
        if ch.against:  # the speed-up over each baseline, on a line of its own
            words = "; ".join(against_text.summary(ag) for ag in ch.against)
            mine = next((ag.mine.name for ag in ch.against if ag.mine), "")
            out.append(_fit(f"  {mine + ' ' if mine else ''}against {words}", WIDTH))
    return "\n".join(out)


# ---------------------------------------------------------------- the overview (README)


def overview(found: list[Answer], direction: str = TRAIN) -> pd.DataFrame:
    """One row per mask, two columns per length: the verdict in `direction` and the runner-up
    with its ratio to the fastest (its per-draw range) and the draws it won."""
    rows: dict[str, dict] = {}
    several = len({a.heads for a in found}) > 1
    for a in found:
        if a.direction != direction:
            continue
        s = seqlen_label(a.seqlen)
        p = a.point
        mask = p["mask"] + (f" ({heads_label(p['heads_q'], p['heads_kv'])})" if several else "")
        row = rows.setdefault(mask, {"mask": mask})
        verdict = a.verdict()
        if a.winner and len(a.ok) > 1 and a.draws > 1:
            verdict += f" ({a.standing[a.winner.name].wins}/{a.draws})"
        row[f"{s} {direction}"] = verdict
        if len(a.ok) > 1:
            r = a.standing[a.ok[1].name]
            row[f"{s} runner-up"] = f"{a.ok[1].name} {ratio_text(r)}"
        else:
            row[f"{s} runner-up"] = ""
    return pd.DataFrame(list(rows.values())).set_index("mask") if rows else pd.DataFrame()
