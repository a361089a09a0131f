"""config.yaml: reading, schema validation (with defaults) and the semantic checks every family
shares; a family's own checks are given by the caller (attnbench.families.validate).

Errors name the bad key and the valid choices. Torch-free, so Snakemake can parse quickly.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import jsonschema
import yaml

from ..masks.lengths import packaged_histograms
from .expand import grid_products, mask_param_problems

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("invalid config:\n" + "\n".join(f"  - {p}" for p in self.problems))


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _is_integer(_checker, value) -> bool:
    # JSON Schema calls 128.0 an integer; a length or a count of 128.0 fails only later, in a cell
    return isinstance(value, int) and not isinstance(value, bool)


def _with_defaults(cls):
    validate_props = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    return jsonschema.validators.extend(
        cls,
        {"properties": set_defaults},
        type_checker=cls.TYPE_CHECKER.redefine("integer", _is_integer),
    )


def schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _schema_problems(cfg) -> list[str]:
    sch = schema()
    validator = _with_defaults(jsonschema.Draft202012Validator)(sch)
    problems = []
    for err in sorted(validator.iter_errors(cfg), key=lambda e: list(map(str, e.absolute_path))):
        msg = err.message
        if err.validator == "additionalProperties" and isinstance(
            err.schema.get("properties"), dict
        ):
            msg += f"; valid keys: {', '.join(err.schema['properties'])}"
        elif err.validator == "minimum" and err.schema.get("description"):
            msg += f" ({err.schema['description']})"
        elif err.validator == "type" and err.validator_value == "integer":
            msg += " (a whole number, written without a decimal point)"
        problems.append(f"{_path(err.absolute_path)}: {msg}")
    return problems


def _non_finite(value, at=()) -> list[str]:
    """Every number in the config that is not finite (YAML's .inf, .nan): no setting takes one,
    and a tolerance of .inf would call every record edited only after the cells ran."""
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{_path(at)}: {value} is not a finite number; give a finite value"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, (*at, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _non_finite(v, (*at, i))]
    return []


# Grid names become folder names and Snakemake wildcards: letters, digits, _ and - only (ASCII).
GRID_NAME = re.compile(r"[A-Za-z0-9_-]+")
# output_dir reaches shell commands and Snakemake patterns: a plain path of these characters.
OUTPUT_DIR = re.compile(r"[A-Za-z0-9_./+-]+")


def _name_problems(cfg) -> list[str]:
    """Grid names, the run list and output_dir: what would fail at parse time or reach a shell."""
    problems = []
    for name in cfg.get("grids", {}):
        if not GRID_NAME.fullmatch(name):
            problems.append(
                f"grids.{name}: {name!r} is not a valid grid name; a grid name takes letters "
                "A-Z a-z, digits, _ and - only (it names folders and Snakemake wildcards)"
            )
    run = cfg.get("run", [])
    for i, name in enumerate(run):
        if name in run[:i]:
            problems.append(
                f"run[{i}]: grid {name!r} is listed twice (also run[{run.index(name)}]); "
                "list each grid once"
            )
    out = cfg.get("output_dir")
    if isinstance(out, str):
        if not out.strip():
            problems.append("output_dir: empty; name a folder (e.g. results)")
        elif not OUTPUT_DIR.fullmatch(out):
            bad = "".join(dict.fromkeys(c for c in out if not OUTPUT_DIR.fullmatch(c)))
            problems.append(
                f"output_dir: {out!r} has characters a path given to shell commands must not "
                f"({bad!r}); use letters, digits and _ . / + - only"
            )
        elif Path(out).resolve() == Path("/"):
            problems.append(
                f"output_dir: {out!r} is the filesystem root; name a folder of its own (e.g. results)"
            )
    return problems


def _semantic_problems(cfg, product_problems) -> list[str]:
    problems = []
    grids = cfg.get("grids", {})
    for i, name in enumerate(cfg.get("run", [])):
        if name not in grids:
            problems.append(
                f"run[{i}]: unknown grid {name!r}; grids in this config: {', '.join(grids)}"
            )
    for gname, grid in grids.items():
        where = f"grids.{gname}"
        fam = grid.get("family", "kernel")
        problems += _budget_problems(grid, where)
        problems += _single_valued_problems(grid, where)
        problems += mask_param_problems(grid, where)
        for j, prod in enumerate(grid_products(grid)):
            at = where if j == 0 else f"{where}.also[{j - 1}]"
            problems += product_problems(cfg, grid, prod, fam, at)
    return problems


def cell_timeout_s(grid: dict) -> int:
    """The grid's time budget per cell in seconds (`auto`: 90% of runtime_min, leaving the rest of
    the Slurm time limit for start-up and for writing the timeout record)."""
    budget = grid.get("cell_timeout_s", "auto")
    return int(grid.get("runtime_min", 30) * 60 * 0.9) if budget == "auto" else int(budget)


# What a cell may use (Slurm's resources, threads, the worker's lifetime): never what it measures
# or what the tables and figures show.
RESOURCE_KEYS = ("runtime_min", "cell_timeout_s", "mem_mb", "cpu_threads", "worker_idle_s")


def report_settings(grid: dict, cfg: dict | None = None) -> dict:
    """The grid's settings the tables and figures are drawn from: all but RESOURCE_KEYS, so that
    giving cells more time, memory or threads regenerates no table or figure; and, given the whole
    config, its `report:` settings (the verdict rule every answer is decided by), so that changing
    them redraws them."""
    out = {k: v for k, v in grid.items() if k not in RESOURCE_KEYS}
    if cfg is not None:
        out["report"] = copy.deepcopy(cfg.get("report", {}))
    return out


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# The valid range of each setting of report.verdict (report.paired.Verdict): alpha below 1/2 (a
# one-sided test at 1/2 calls a coin toss significant), the threshold a ratio from 1 (none) to 1.5
# (a 50% difference: beyond that no kernel needs a practical threshold).
ALPHA_RANGE = (0.0, 0.5)  # exclusive at both ends
THRESHOLD_RANGE = (1.0, 1.5)  # inclusive


def _report_problems(cfg) -> list[str]:
    """report.verdict: each setting within its range (report.paired.Verdict), named with the bad
    value and the valid range."""

    report = cfg.get("report")
    verdict = report.get("verdict") if isinstance(report, dict) else None
    if not isinstance(verdict, dict):  # the schema names what is wrong with it
        return []
    problems = []
    alpha, threshold = verdict.get("alpha"), verdict.get("threshold")
    if _number(alpha) and not ALPHA_RANGE[0] < alpha < ALPHA_RANGE[1]:
        problems.append(
            f"report.verdict.alpha: {alpha} is out of range; valid: above {ALPHA_RANGE[0]:g} and "
            f"below {ALPHA_RANGE[1]:g} (the sign test's one-sided significance level, e.g. 0.05)"
        )
    if _number(threshold) and not (THRESHOLD_RANGE[0] <= threshold <= THRESHOLD_RANGE[1]):
        problems.append(
            f"report.verdict.threshold: {threshold} is out of range; valid: "
            f"{THRESHOLD_RANGE[0]:g} to {THRESHOLD_RANGE[1]:g} (a ratio: 1.02 calls B slower "
            "from 2% on, 1 from any difference)"
        )
    return problems


# A grid's tables and figures draw one number per kernel (or method), mask, length, heads and
# direction: two dtypes or head dims would put two cells on one point.
SINGLE_VALUED = ("dtype", "head_dim")


def _single_valued_problems(grid, where) -> list[str]:
    out = []
    for axis in SINGLE_VALUED:
        seen = list(dict.fromkeys(v for p in grid_products(grid) for v in p.get(axis, [])))
        if len(seen) > 1:
            out.append(
                f"{where}.{axis}: {', '.join(map(str, seen))} (over the grid and its also: "
                f"entries): a grid takes one {axis}, since its tables and figures draw one number "
                f"per kernel, mask, length, heads and direction; keep one of {', '.join(map(str, seen))} "
                f"and put each other in a grid of its own"
            )
    return out


def _budget_problems(grid, where) -> list[str]:
    budget, runtime_s = grid.get("cell_timeout_s", "auto"), grid.get("runtime_min", 30) * 60
    if budget != "auto" and budget >= runtime_s:
        return [
            f"{where}.cell_timeout_s: {budget} s is not below runtime_min ({runtime_s} s): Slurm would end the "
            f"job before the cell could record its timeout; choose less than {runtime_s}, or auto"
        ]
    return []


def validate(cfg: dict, product_problems) -> dict:
    """Fill defaults and check a config dict in place; raise ConfigError listing every problem.
    `product_problems(cfg, grid, product, family, where)`: the family's own checks of each product."""
    if not isinstance(cfg, dict):
        raise ConfigError([f"(top level): expected a mapping, got {type(cfg).__name__}"])
    if "doc_length_histograms" not in cfg:  # the package's data, validated like a config's own
        cfg["doc_length_histograms"] = packaged_histograms()
    problems = _non_finite(cfg)
    problems += _schema_problems(cfg) + _name_problems(cfg) + _report_problems(cfg)
    if not problems:
        problems = _semantic_problems(cfg, product_problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = (
            deep_merge(out[k], v)
            if isinstance(v, dict) and isinstance(out.get(k), dict)
            else copy.deepcopy(v)
        )
    return out


MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (plain YAML keeps the last one silently,
    so a second grid of the same name would replace the first without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue  # `<<: *anchor`: its keys are defaults the mapping's own keys override
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    [
                        f"key {key!r} appears twice in one mapping (lines {seen[key] + 1} and "
                        f"{key_node.start_mark.line + 1}); keep one"
                    ]
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def yaml_problem(path, e: yaml.YAMLError) -> str:
    """'FILE:LINE:COLUMN: not valid YAML: what' (and where the construct it is in began)."""
    mark = getattr(e, "problem_mark", None)
    if mark is None:
        return f"{path}: not valid YAML: {e}"
    what = getattr(e, "problem", None) or str(e)
    context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
    began = f" ({context} at line {start.line + 1})" if context and start else ""
    return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {what}{began}"


def read_yaml(path) -> dict:
    """A config file's contents; ConfigError naming the file (and the line, for a syntax error) if
    it is not valid YAML, repeats a key or is not a mapping."""
    try:
        data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except OSError as e:
        raise ConfigError([f"{path}: cannot be read: {e.strerror or e}"]) from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            [
                f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                "save the file as UTF-8"
            ]
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError([yaml_problem(path, e)]) from None
    except ConfigError as e:
        raise ConfigError([f"{path}: {m}" for m in e.problems]) from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(
            [
                f"{path}: expected a mapping of settings (grids:, run:, ...), got {type(data).__name__}"
            ]
        )
    return data or {}


def config_files(paths, base=None) -> list[Path]:
    """The files a config is read from, in order: `base` (the workflow's config.yaml, which
    Snakemake's `configfile:` reads) where it exists, then each of `paths` (one path or several)
    over it, later ones over earlier ones, as `snakemake --configfile A B` reads files of one's
    own settings over the defaults; `base` itself given again is not read twice."""
    paths = [paths] if isinstance(paths, str | Path) else list(paths or [])
    files = [Path(base)] if base is not None and Path(base).is_file() else []
    for p in map(Path, paths):
        if not files or p.resolve() not in {f.resolve() for f in files}:
            files.append(p)
    return files


def load_config(paths, product_problems, overrides: dict | None = None, base=None) -> dict:
    """The validated config of `paths` (over `base`: config_files) with `overrides` over all."""
    cfg = {}
    for f in config_files(paths, base):
        cfg = deep_merge(cfg, read_yaml(f))
    return validate(deep_merge(cfg, overrides or {}), product_problems)


def key_values(items) -> dict:
    """`KEY=VALUE` settings as `snakemake --config` takes them, each value read as YAML
    (output_dir=results/h200, run=[h200_sweep], cp_model={network: h100_8x}); ConfigError naming
    an item that is not one, and where it is a file, that a file goes with --configfile."""
    out, problems = {}, []
    for item in items or ():
        key, eq, value = str(item).partition("=")
        if not eq or not key:
            hint = (
                f"; a file of settings is --configfile {item}"
                if Path(item).is_file()
                else " (e.g. --config output_dir=results/h200 'run=[h200_sweep]')"
            )
            problems.append(f"--config {item}: expected KEY=VALUE, as snakemake --config{hint}")
            continue
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError as e:
            problems.append(f"--config {item}: its value is not YAML ({str(e).splitlines()[0]})")
    if problems:
        raise ConfigError(problems)
    return out
