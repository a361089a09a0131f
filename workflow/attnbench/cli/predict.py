"""`predict`: the CP throughput model (cp_model/) for a grid, the published benchmarks, or a
user's own question."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import config_of, config_options, parse_length


def cmd_predict(a):
    """The CP throughput model (cp_model/): a grid's table, validation, checks and figures
    (--grid); the published benchmarks (--validate); or a user's own question."""
    from ..cp_model.run import run_predict

    cfg = config_of(a)
    try:
        if a.validate or not a.grid:
            return predict_question(a, cfg)
        out = Path(a.output_dir or cfg["output_dir"])
        res = run_predict(
            cfg,
            a.grid,
            out,
            Path(a.tables_dir or out / "tables" / a.grid),
            None if a.no_figures else Path(a.figures_dir or out / "figures" / a.grid),
            cfg.get("figures", {}),
            progress=lambda m: print(m, file=sys.stderr),
        )
    except ValueError as e:
        sys.exit(f"predict: {e}")
    print("\n".join(res["files"]))
    print(
        "\n".join(
            f"{'PASS' if c['passed'] else 'FAIL'}: {c['name']}: {c['detail']}"
            for c in res["checks"]
        )
    )


# predict's options that are a question's keys (cp_model/question.py)
QUESTION_ARGS = (
    *("mask", "gpus", "tokens_per_gpu", "seqlen", "heads", "head_dim", "dtype", "direction"),
    *("network", "local_kernel", "calls_kernel", "calls_from", "documents", "documents_per_gpu"),
    *("sampler", "samples", "methods"),
)


def predict_question(a, cfg):
    """predict --validate (the published benchmarks' table) or a question (--question FILE and/or
    --mask ... on the command line, the command line's keys over the file's)."""
    from ..cp_model.answer import answer
    from ..cp_model.question import load_question
    from ..cp_model.validation import run_validation

    progress = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if a.validate:
        out = Path(a.output_dir or cfg["output_dir"])
        paths = run_validation(
            cfg, Path(a.tables_dir or out / "tables" / "cp_validation"), out, progress
        )
        print("\n".join(map(str, paths)))
        return
    given = {k: getattr(a, k) for k in QUESTION_ARGS if getattr(a, k) not in (None, False)}
    if not given and not a.question:
        raise ValueError(
            "give --grid G, --validate, or a question (--mask, --gpus, ... or --question FILE)"
        )
    print(answer(load_question(a.question, given), cfg, a.output_dir).text())


def add_parsers(sub) -> None:
    c = sub.add_parser(
        "predict",
        help="CP throughput model to 1024 GPUs for one cp grid (cp_model in config.yaml)",
    )
    config_options(c)
    c.add_argument("--grid", help="a cp grid named in cp_model.grids: its tables and figures")
    c.add_argument(
        "--validate", action="store_true", help="the model against published CP benchmarks"
    )
    c.add_argument(
        "--output-dir",
        help="where the records are (default: the config's output_dir; a question's: "
        "cp_model.records_dir)",
    )
    c.add_argument("--tables-dir", help="default: <output_dir>/tables/<grid>")
    c.add_argument("--figures-dir", help="default: <output_dir>/figures/<grid>")
    c.add_argument("--no-figures", action="store_true", help="the tables only")
    q = c.add_argument_group("a question of your own (docs/cp-model.md)")
    q.add_argument("--question", help="a YAML file of question keys (the options below override)")
    q.add_argument("--mask", help="full, causal, full_document, causal_document, ...")
    q.add_argument("--gpus", type=int, help="GPUs (the world size)")
    q.add_argument("--tokens-per-gpu", type=parse_length, help="e.g. 8K (or --seqlen)")
    q.add_argument("--seqlen", type=parse_length, help="the whole sequence (or --tokens-per-gpu)")
    q.add_argument("--heads", help="query:KV heads, e.g. 32:8 (default 64:8)")
    q.add_argument("--head-dim", type=int, help="default 128")
    q.add_argument("--dtype", help="default bfloat16")
    q.add_argument("--direction", help="fwd, bwd or train (fwd + bwd)")
    q.add_argument("--network", help="a preset of cp_model.networks")
    q.add_argument("--local-kernel", help="the local kernel whose records time the chunks")
    q.add_argument(
        "--calls-from", help="the cp grid(s) whose cells give the per-call terms (a,b: several)"
    )
    q.add_argument(
        "--calls-kernel",
        help="the local kernel whose cells give the per-call terms (default: its own)",
    )
    q.add_argument(
        "--documents",
        action="append",
        help="document lengths (256,7392,544) or cu_seqlens (0,256,7648,8192); repeat for more "
        "realised masks",
    )
    q.add_argument(
        "--documents-per-gpu",
        action="store_true",
        help="the documents are one GPU's; the sequence is each length x the GPUs",
    )
    q.add_argument("--sampler", help="a document sampler of cp_model.samplers")
    q.add_argument("--samples", type=int, help="packs drawn by the sampler")
    q.add_argument("--methods", nargs="+", help="CP methods (default: every modelled one)")
    c.set_defaults(fn=cmd_predict)
