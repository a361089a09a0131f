"""attnbench: attention kernels and context-parallel methods, measured cell by cell.

Run the grids with `snakemake` (README); these commands are what its rules call, and what a user
asks the results: `advise` (which kernel, which method), `check-config`, `regenerate`, `predict`.
Settings as Snakemake takes them: --configfile FILE (over config.yaml), --config KEY=VALUE."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .families.cell_entry import claim_gpu_after_start, json_option

# Snakemake's `configfile:` reads config.yaml in the folder it runs in; a --config FILE of one's own
# grids is read over it, as `snakemake --configfile FILE` reads it (grid.config.config_files).
WORKFLOW_CONFIG = "config.yaml"


def cmd_peak(a):
    import torch

    from .harness.ceiling import Machine, keep
    from .harness.environment import fingerprint
    from .harness.inputs import torch_dtype
    from .harness.measure import matmul_ceiling
    from .record.record import write_json

    device = a.device
    claim_gpu_after_start(device)
    if device == "cuda" and not torch.cuda.is_available():
        result = {
            "device": device,
            "matmul_peak_tflops": None,
            "reason": "no CUDA device is visible",
        }
    else:
        result = {"device": device, **matmul_ceiling(device, torch_dtype(a.dtype))}
    env = fingerprint(device)
    result.update(device_name=env.get("device_name"), host=env.get("host"))
    if a.keep and result["matmul_peak_tflops"]:
        # a ceiling measured under load is low: the cells get the best this machine ever measured
        machine = Machine(str(result["host"]), str(result["device_name"]), a.dtype)
        result = keep(result, machine, a.keep)
    write_json(result, a.out)  # the ceiling: no cell record
    print(json.dumps(result))


def cmd_collect(a):
    from .report.collect import RecordError, collect, write_cells

    try:
        df = collect(a.records, a.root)
    except RecordError as e:
        sys.exit(f"collect: {e}")
    write_cells(df, a.out)
    print(f"{len(df)} cells -> {a.out}")


def grid_of_table(a) -> None:
    """tables, figures: --grid one of the tidy table's grids, before any file is written."""
    from .report.collect import read_cells

    if a.grid:
        grids = [str(g) for g in dict.fromkeys(read_cells(a.cells)["grid"])]
        known_grids(a.cmd, "--grid", [a.grid], grids, f"in {a.cells}")


def cmd_tables(a):
    from .families import write_tables
    from .report.collect import ReportError

    grid_cfg = json_option(a, "grid_config")
    try:
        grid_of_table(a)
        for p in write_tables(a.cells, a.out_dir, grid=a.grid, grid_cfg=grid_cfg):
            print(p)
    except ReportError as e:
        exit_naming_input("tables", e)


def cmd_figures(a):
    from .families import write_figures
    from .report.collect import ReportError

    style = json_option(a, "style") or {}
    grid_cfg = json_option(a, "grid_config")
    try:
        grid_of_table(a)
        for p in write_figures(a.cells, a.out_dir, style, grid=a.grid, grid_cfg=grid_cfg):
            print(p)
    except ReportError as e:
        exit_naming_input("figures", e)


def exit_naming_input(command: str, e: Exception):
    """The traceback for the log, then one line naming what failed and the input it read."""
    import traceback

    traceback.print_exception(e.__cause__ or e, file=sys.stderr)
    sys.exit(f"{command}: {e}")


def cmd_regenerate(a):
    """Tidy table, tables, figures (and the report) from the records already on disk; runs no cell."""
    import time

    from .pipeline.regenerate import regenerate, write_report
    from .report.collect import RecordError, ReportError
    from .run.lock import RunLock, RunLocked

    t0 = time.perf_counter()
    cfg = config_of(a)
    try:
        with RunLock(cfg["output_dir"]):  # not while a run writes the same folder
            drawn = regenerate(cfg, a.grids, a.jobs)
    except RunLocked as e:
        sys.exit(f"regenerate: {e}")
    except (ValueError, RecordError) as e:
        sys.exit(f"regenerate: {e}")
    except ReportError as e:
        exit_naming_input("regenerate", e)
    if a.report is not None:
        t2 = time.perf_counter()
        report = Path(a.report) if a.report else Path(cfg["output_dir"]) / "report.html"
        try:
            write_report(cfg, list(drawn.grids), report, a.snakefile)
        except ReportError as e:
            sys.exit(str(e))
        print(f"report -> {report} in {time.perf_counter() - t2:.1f} s")
    print(f"regenerated in {time.perf_counter() - t0:.1f} s")


def cmd_check_config(a):
    cfg = config_of(a, [a.file] if a.file else [])
    from .families import expand_cells, plan_lines
    from .grid.config import config_files

    files = [*([a.file] if a.file else []), *a.configfile] or [WORKFLOW_CONFIG]
    cells = expand_cells(cfg)
    read = " over ".join(str(f) for f in reversed(config_files(files, WORKFLOW_CONFIG)))
    print(f"config ok ({read}): {len(cells)} cells in grids {', '.join(cfg['run'])}")
    from .pipeline.currency import config_report
    from .record.validate import RecordError

    try:
        print(config_report(cfg))
    except RecordError as e:
        sys.exit(f"check-config: {e}")
    print("\n".join(plan_lines(cfg)))


def cmd_records(a):
    """Record paths of the grids' cells still missing or outdated (attnbench.pipeline.currency; not those
    it keeps: outdated_records: keep, or a device this environment cannot run), as Snakemake
    targets: a session with little device time runs the short lengths first
    (tools/offline-gpu/gpu_session.sh), so whatever it does not reach is the longest cells;
    --smallest-first / --budget-s order and cut them by their estimated time, and --calls S
    prints the plan of calls of S seconds instead."""
    from collections import Counter

    from .families import expand_cells
    from .grid.expand import cell_path
    from .pipeline.currency import of_config, to_make_again

    cfg = config_of(a)
    out = Path(cfg["output_dir"])
    from .record.validate import RecordError

    try:
        judged = of_config(cfg, a.grids)[0]
    except RecordError as e:
        sys.exit(f"records: {e}")
    again, _ = to_make_again(judged, cfg["outdated_records"] == "keep")
    outdated = {Path(o.path) for o in again}
    cells = [
        cell
        for cell in expand_cells(cfg, a.grids)
        if all(
            getattr(a, axis) is None or cell.get(key) in getattr(a, axis)
            for axis, key in (("seqlen", "seqlen"), ("kernels", "impl"), ("masks", "mask"))
        )
        and (a.all or not (out / cell_path(cell)).exists() or out / cell_path(cell) in outdated)
    ]
    if a.calls:
        from .families.estimate import calls, write_calls

        plan = calls(cells, out, a.calls)
        for i, (batch, s) in enumerate(plan, 1):
            kinds = Counter(f"{c['impl']} {c['mask']} {c['seqlen']}" for c in batch)
            print(
                f"call {i}: {len(batch)} cells, estimated {s:.0f} s; e.g. {', '.join(list(kinds)[:3])}"
            )
        if a.calls_dir:
            print(f"written: {', '.join(map(str, write_calls(plan, out, Path(a.calls_dir))))}")
        return
    if a.smallest_first or a.budget_s is not None:
        from .families.estimate import smallest_first

        cells = smallest_first(cells, out, a.budget_s)
    for cell in cells:
        print(out / cell_path(cell))


def cmd_predict(a):
    """The CP throughput model (cp_model/): a grid's table, validation, checks and figures
    (--grid); the published benchmarks (--validate); or a user's own question."""
    from .cp_model.run import run_predict

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
    from .cp_model.answer import answer
    from .cp_model.question import load_question
    from .cp_model.validation import run_validation

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


def cmd_advise(a):
    """The answer to a question from the tidy tables (report.question); without filters, the
    whole advice. A question it cannot answer names the valid values (exit 2)."""
    from .families import advice_of
    from .report.advice import AdviceError
    from .report.paired import Verdict, ruled_by
    from .report.question import Question, read_tables, respond

    cells = Path(a.cells) if a.cells else None
    try:
        if cells is None:
            cells = Path(config_of(a)["output_dir"]) / "tables" / "cells.csv"
        df, samples = read_tables(cells)
        wanted = {k: getattr(a, k) for k in ADVISE_FILTERS}
        q = Question(wanted, a.format, a.verbose, a.all, a.overview)
        # the verdict rule's settings: the config's report.verdict (defaults where none is here)
        has_config = a.configfile or a.config or Path(WORKFLOW_CONFIG).is_file()
        with ruled_by(Verdict.of(config_of(a) if has_config else None)):
            print(respond(df, samples, advice_of, q, modelled_answers(a, cells)))
    except AdviceError as e:  # naming the table, where the message does not already
        where = "" if str(cells) in str(e) else f" (in {cells})"
        print(f"advise: {e}{where}", file=sys.stderr)
        sys.exit(2)


def modelled_answers(a, cells: Path):
    """advise's answers at GPU counts no grid measured: the CP model's (cp_model/advise.py), over
    the records of the tidy table's output folder; loaded only when asked."""

    def respond(q, gpus):
        from .cp_model.advise import modelled

        cfg = config_of(a)
        return modelled(cfg, cells.resolve().parent.parent, a.local_kernel, a.network)(q, gpus)

    return respond


ADVISE_FILTERS = (
    "grid",
    "mask",
    "seqlen",
    "tokens_per_gpu",
    "gpus",
    "heads",
    "block_size",
    "density",
    "direction",
)


def config_of(a, files=()):
    """The validated config of a command's --configfile files (and `files` before them) over
    config.yaml, with its --config KEY=VALUE settings over all, as Snakemake reads them; a
    config error, an old spelling, or a --grids name not in it, on stderr and exit 2 (every
    command alike)."""
    from .families import load_config
    from .grid.config import ConfigError, key_values

    try:
        if getattr(a, "overrides", None) is not None:
            raise ConfigError(
                [
                    "--overrides is no option any more: give settings as --config KEY=VALUE "
                    "(values as YAML, e.g. --config output_dir=results/h200), or in a file read "
                    "over config.yaml with --configfile FILE, as snakemake takes them"
                ]
            )
        paths = [*files, *a.configfile] or [WORKFLOW_CONFIG]
        cfg = load_config(paths, key_values(a.config), WORKFLOW_CONFIG)
    except ConfigError as e:
        print(f"{a.cmd}: {e}", file=sys.stderr)
        sys.exit(2)
    known_grids(a.cmd, "--grids", getattr(a, "grids", None), list(cfg["grids"]), "in the config")
    return cfg


def known_grids(cmd: str, flag: str, given, valid: list, where: str) -> None:
    """Before any work: a grid given that is not one of `valid`, named with the valid ones on
    stderr, and exit 2."""
    for g in given or ():
        if g not in valid:
            print(
                f"{cmd}: {flag} {g}: no such grid {where}; valid {flag}: {', '.join(valid)}",
                file=sys.stderr,
            )
            sys.exit(2)


def parse_length(text: str) -> int:
    """A length on the command line: 32768 or 32K."""
    from .report.advice import parse_length as parse

    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a length (e.g. 32768 or 32K)") from None


class Once(argparse.Action):
    """An option of one value: given twice, an error naming it (argparse would keep the last)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = vars(namespace).setdefault("_given_once", set())
        if self.dest in given:
            raise argparse.ArgumentError(
                self, f"given twice ({getattr(namespace, self.dest)}, {values}): give it once"
            )
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def config_options(c) -> None:
    """--configfile and --config, as Snakemake takes them (and the old spelling, refused)."""
    c.add_argument(
        "--configfile",
        action="append",
        default=[],
        metavar="FILE",
        help="a YAML file of settings read over config.yaml (repeat it: later files over "
        "earlier ones), as snakemake --configfile",
    )
    c.add_argument(
        "--config",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="settings over the files, each value YAML (e.g. output_dir=results/h200 "
        "'run=[h200_sweep]'), as snakemake --config",
    )
    c.add_argument(
        "--overrides", help=argparse.SUPPRESS
    )  # the old spelling: refused, naming these


def _grids_parser(sub, name, what, fn):
    """A command over grids of a config (by default the grids of its run list)."""
    c = sub.add_parser(name, help=what, description=what)
    config_options(c)
    c.add_argument(
        "--grids", nargs="*", action="extend", help="these grids (default: the config's run list)"
    )
    c.set_defaults(fn=fn)
    return c


def _report_parser(sub, name, what, fn, grid_config_help):
    """A command that reads the tidy table and writes one grid's report files (tables, figures)."""
    c = sub.add_parser(name, help=what)
    c.add_argument("--cells", required=True, help="the tidy table (samples.csv beside it)")
    c.add_argument("--out-dir", required=True, help="the folder the grid's files go to")
    c.add_argument("--grid", help="only this grid's cells")
    c.add_argument("--grid-config", help=grid_config_help)
    c.set_defaults(fn=fn)
    return c


def main(argv=None):
    from .run.lock import end_with_run

    p = parser()
    a = p.parse_args(argv)
    end_with_run()  # a report step of a run (tables, figures) ends with it
    if a.cmd is None:  # bare `attnbench`: what it can do
        p.print_help()
        return
    a.fn(a)


def parser() -> argparse.ArgumentParser:
    """Every command, its options and their help."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("attnbench")
    except PackageNotFoundError:  # a bare checkout, not installed
        release = "not installed"
    p = argparse.ArgumentParser(prog="attnbench", description=__doc__)
    p.add_argument("--version", action="version", version=f"attnbench {release}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    from .families.cp import commands as cp_commands
    from .families.kernel import commands as kernel_commands

    kernel_commands.add_parsers(sub)  # run through __main__ before this parser (its CELL_COMMANDS)
    cp_commands.add_parsers(sub)
    c = sub.add_parser("peak", help="measure the device's dense matmul ceiling")
    c.add_argument("--device", required=True, help="cpu or cuda")
    c.add_argument("--dtype", required=True, help="the matmul's dtype, e.g. bfloat16")
    c.add_argument("--out", required=True, help="the JSON file written")
    c.add_argument(
        "--keep",
        metavar="FOLDER",
        help="add the measurement to this machine's file there (<output_dir>/device/machines) "
        "and write the highest ceiling kept (attnbench.harness.ceiling)",
    )
    c.set_defaults(fn=cmd_peak)
    c = sub.add_parser("collect", help="cell records -> one tidy CSV")
    c.add_argument("records", nargs="*", help="record files")
    c.add_argument("--root", help="collect every record under this folder instead")
    c.add_argument("--out", required=True, help="the tidy table (CSV) written")
    c.set_defaults(fn=cmd_collect)
    _report_parser(
        sub,
        "tables",
        "tidy CSV -> Markdown and LaTeX tables",
        cmd_tables,
        "the grid's config as JSON (its family and description)",
    )
    c = _report_parser(
        sub,
        "figures",
        "tidy CSV -> PNG and PDF figures",
        cmd_figures,
        "the grid's config as JSON (checks the expected files were written)",
    )
    c.add_argument("--style", help="figure style settings as JSON")
    c = sub.add_parser(
        "check-config",
        help="validate a config before any cell runs: its grids, cells, records outdated and "
        "the device time its records estimate",
    )
    c.add_argument(
        "file", nargs="?", help="a config file read over config.yaml (the same as --configfile)"
    )
    config_options(c)
    c.set_defaults(fn=cmd_check_config)
    c = _grids_parser(
        sub,
        "regenerate",
        "tidy table, tables and figures from the records on disk (no cell runs)",
        cmd_regenerate,
    )
    c.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes drawing (default 2)",
    )
    c.add_argument(
        "--report",
        nargs="?",
        const="",
        help="also write the Snakemake HTML report (default path: <output_dir>/report.html)",
    )
    c.add_argument("--snakefile", default="Snakefile", help="for --report")
    c = _grids_parser(
        sub,
        "records",
        "record paths of the grids' cells not on disk or outdated (Snakemake targets)",
        cmd_records,
    )
    c.add_argument("--seqlen", nargs="*", type=int, help="only kernel cells of these lengths")
    c.add_argument("--kernels", nargs="*", help="only these kernels (or CP methods)")
    c.add_argument("--masks", nargs="*", help="only these masks")
    c.add_argument("--all", action="store_true", help="also the records already on disk")
    c.add_argument(
        "--smallest-first",
        action="store_true",
        help="in order of the time records of the same points on disk estimate, smallest first",
    )
    c.add_argument(
        "--budget-s",
        type=float,
        help="only the smallest-first cells whose estimates add up to at most this many seconds",
    )
    c.add_argument(
        "--calls",
        type=float,
        metavar="SECONDS",
        help="print the plan instead: the missing cells, smallest first, in calls of SECONDS each",
    )
    c.add_argument(
        "--calls-dir",
        help="with --calls: also write each call's record paths to DIR/callNN.txt, and every cell's "
        "estimate and path in order to DIR/order.tsv (a device call that carries them needs no "
        "records to plan from)",
    )
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
    c = sub.add_parser(
        "advise",
        help="which kernel or CP method, for a mask, length, direction (and GPUs): from the tidy "
        "tables, compared draw by draw, with the records it rests on; without filters, the "
        "whole advice",
        description="A question that several grids answer is answered from one: --grid, else "
        "the grid with the most ok contenders there, then the most draws, then the newest "
        "records (--all shows the others). Emulated answers come in a block of their own. "
        "--gpus N that no grid measured is answered by the CP model (with --mask and --seqlen "
        "or --tokens-per-gpu), labelled modelled, with its validated error. Every filter takes "
        "one or more values (--mask causal full, or --mask causal --mask full).",
    )
    many = dict(nargs="+", action="extend")  # a filter: its values, of every time it is given
    c.add_argument("--mask", **many, help="mask patterns, e.g. causal_document")
    c.add_argument("--seqlen", **many, type=parse_length, help="whole sequences, e.g. 32K")
    c.add_argument("--direction", **many, help="fwd, bwd, or train (fwd + bwd of the same draw)")
    c.add_argument("--gpus", **many, type=int, help="1: the one-GPU grids; 2 or more: CP")
    c.add_argument("--tokens-per-gpu", **many, type=parse_length, help="context parallelism only")
    c.add_argument("--heads", **many, help="query:KV heads, e.g. 64:8")
    c.add_argument("--block-size", **many, type=int, help="block-sparse: block (or average)")
    c.add_argument("--density", **many, type=float, help="block-sparse: kept block density")
    c.add_argument("--grid", **many, help="answer from these grids only")
    c.add_argument("--all", action="store_true", help="also every other grid's answer, labelled")
    c.add_argument("--verbose", action="store_true", help="with the record paths")
    c.add_argument(
        "--format",
        action=Once,
        default="text",
        choices=["text", "md", "json", "csv"],
        help="default: text",
    )
    c.add_argument(
        "--overview",
        action="store_true",
        help="one row per mask, the verdict and runner-up per length (direction: train)",
    )
    c.add_argument(
        "--local-kernel",
        action=Once,
        default="",
        help="--gpus beyond the measured: the CP model's local kernel (default cp_model's)",
    )
    c.add_argument(
        "--network",
        action=Once,
        default="",
        help="--gpus beyond the measured: the CP model's network preset (default cp_model's)",
    )
    c.add_argument(
        "--cells", action=Once, help="the tidy table (default: <output_dir>/tables/cells.csv)"
    )
    config_options(c)  # output_dir without --cells; the CP model's settings for --gpus
    c.set_defaults(fn=cmd_advise)
    return p


if __name__ == "__main__":
    main()
