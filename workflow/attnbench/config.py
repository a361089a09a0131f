"""config.yaml: schema validation (with defaults), semantic checks, and grid expansion.

Errors name the bad key and the valid choices. Torch-free, so Snakemake can parse quickly.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import jsonschema
import yaml

from . import masks as M
from .kernels import catalog

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
FAMILIES = ("kernel", "sparse", "cp")
AXES = ("kernels", "methods", "masks", "seqlen", "tokens_per_gpu", "gpus", "heads", "head_dim", "dtype",
        "direction", "block_size", "avg_block", "density")


class ConfigError(ValueError):
    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("invalid config:\n" + "\n".join(f"  - {p}" for p in self.problems))


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _with_defaults(cls):
    validate_props = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    return jsonschema.validators.extend(cls, {"properties": set_defaults})


def schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _schema_problems(cfg) -> list[str]:
    sch = schema()
    validator = _with_defaults(jsonschema.Draft202012Validator)(sch)
    problems = []
    for err in sorted(validator.iter_errors(cfg), key=lambda e: list(map(str, e.absolute_path))):
        msg = err.message
        if err.validator == "additionalProperties" and isinstance(err.schema.get("properties"), dict):
            msg += f"; valid keys: {', '.join(err.schema['properties'])}"
        elif err.validator == "minimum" and err.schema.get("description"):
            msg += f" ({err.schema['description']})"
        problems.append(f"{_path(err.absolute_path)}: {msg}")
    return problems


def _grid_products(grid):
    """The grid's own cross product, then one per `also` entry (overriding some axes)."""
    base = {k: grid[k] for k in AXES if k in grid}
    yield base
    for extra in grid.get("also", []):
        yield {**base, **extra}


def _semantic_problems(cfg) -> list[str]:
    problems = []
    grids = cfg.get("grids", {})
    for i, name in enumerate(cfg.get("run", [])):
        if name not in grids:
            problems.append(f"run[{i}]: unknown grid {name!r}; grids in this config: {', '.join(grids)}")
    for gname, grid in grids.items():
        where = f"grids.{gname}"
        fam = grid.get("family", "kernel")
        problems += _budget_problems(grid, where)
        for j, prod in enumerate(_grid_products(grid)):
            at = where if j == 0 else f"{where}.also[{j - 1}]"
            problems += _product_problems(cfg, grid, prod, fam, at)
    return problems


def cell_timeout_s(grid: dict) -> int:
    """The grid's time budget per cell in seconds (`auto`: 90% of runtime_min, leaving the rest of
    the Slurm time limit for start-up and for writing the timeout record)."""
    budget = grid.get("cell_timeout_s", "auto")
    return int(grid.get("runtime_min", 30) * 60 * 0.9) if budget == "auto" else int(budget)


def _budget_problems(grid, where) -> list[str]:
    budget, runtime_s = grid.get("cell_timeout_s", "auto"), grid.get("runtime_min", 30) * 60
    if budget != "auto" and budget >= runtime_s:
        return [f"{where}.cell_timeout_s: {budget} s is not below runtime_min ({runtime_s} s): Slurm would end the "
                f"job before the cell could record its timeout; choose less than {runtime_s}, or auto"]
    return []


def _product_problems(cfg, grid, prod, fam, at) -> list[str]:
    problems = []
    valid_masks = M.CP_MASKS if fam == "cp" else M.STATIC_MASKS + M.SPARSE_MASKS + tuple(M.CP_PATTERNS)
    for i, m in enumerate(prod.get("masks", [])):
        if m not in valid_masks:
            problems.append(f"{at}.masks[{i}]: unknown mask {m!r} for family {fam}; valid masks: {', '.join(valid_masks)}")
    if fam in ("kernel", "sparse"):
        if "kernels" not in prod:
            problems.append(f"{at}: family {fam} needs 'kernels' (valid kernels: {', '.join(catalog.KERNELS)})")
        for i, k in enumerate(prod.get("kernels", [])):
            if k not in catalog.KERNELS:
                problems.append(f"{at}.kernels[{i}]: unknown kernel {k!r}; valid kernels: {', '.join(catalog.KERNELS)}")
        if "seqlen" not in prod:
            problems.append(f"{at}: family {fam} needs 'seqlen'")
    else:
        from .cp.grid import grid_problems

        problems += grid_problems(grid, prod, at)
    for i, (hq, hkv) in enumerate(prod.get("heads", [])):
        if hq % hkv:
            problems.append(f"{at}.heads[{i}]: {hq} query heads are not a multiple of {hkv} KV heads")
    if any(M.pattern(m).uses_documents for m in prod.get("masks", []) if m in M.PATTERNS):
        for s in _seqlens(prod):
            try:
                from .lengths import choose_histogram

                choose_histogram(s, cfg.get("doc_length_histograms", {}))
            except ValueError as e:
                problems.append(f"{at}.seqlen: {e}")
    for m in prod.get("masks", []):
        if m not in M.PATTERNS:
            continue
        for s in _seqlens(prod):
            for mp in _mask_param_points(m, grid, prod):
                try:
                    M.check_mask(m, s, mp)
                except ValueError as e:
                    problems.append(f"{at}: mask {m} at seqlen {s}: {e}")
    return problems


def _seqlens(prod):
    if "seqlen" in prod:
        return prod["seqlen"]
    return sorted({t * g for t in prod.get("tokens_per_gpu", []) for g in prod.get("gpus", [])})


def _mask_param_points(mask, grid, prod):
    """The mask's settings: grid.mask_params restricted to what the pattern reads, crossed
    with the block-sparse axes (block_size / avg_block x density) where it reads those."""
    keys = M.pattern(mask).cfg_keys
    fixed = {k: v for k, v in grid.get("mask_params", {}).items() if k in keys}
    axes = [a for a in ("block_size", "avg_block", "density") if a in keys]
    for values in itertools.product(*(prod.get(a, grid.get(a)) for a in axes)):
        yield {**fixed, **dict(zip(axes, values))}


def validate(cfg: dict) -> dict:
    """Fill defaults and check a config dict in place; raise ConfigError listing every problem."""
    if not isinstance(cfg, dict):
        raise ConfigError([f"(top level): expected a mapping, got {type(cfg).__name__}"])
    problems = _schema_problems(cfg)
    if not problems:
        problems = _semantic_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (plain YAML keeps the last one silently,
    so a second grid of the same name would replace the first without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError([f"key {key!r} appears twice in one mapping (lines {seen[key] + 1} and "
                                   f"{key_node.start_mark.line + 1}); keep one"])
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def read_yaml(path) -> dict:
    """A config file's contents; ConfigError (naming the file) if it is not valid YAML or repeats a key."""
    try:
        return yaml.load(Path(path).read_text(), Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        raise ConfigError([f"{path}: not valid YAML: {e}"]) from None
    except ConfigError as e:
        raise ConfigError([f"{path}: {m}" for m in e.problems]) from None


def load_config(path, overrides: dict | None = None) -> dict:
    return validate(deep_merge(read_yaml(path), overrides or {}))


# ---------------------------------------------------------------- expansion into cells


def point_id(cell: dict) -> str:
    """The cell's file name: every axis that is not already a folder (grid/family/impl/mask)."""
    p = f"s{cell['seqlen']}-h{cell['heads_q']}x{cell['heads_kv']}-d{cell['head_dim']}-{cell['dtype']}-{cell['direction']}"
    mp = cell.get("mask_params", {})
    if "block_size" in mp:
        p += f"-b{mp['block_size']}"
    if "avg_block" in mp:
        p += f"-a{mp['avg_block']}"
    if "density" in mp:
        p += f"-r{mp['density']}"
    if cell["family"] == "cp":
        p += f"-g{cell['gpus']}"
    return p


def _histograms_for(cfg, mask, seqlen):
    if not M.pattern(mask).uses_documents:
        return None
    from .lengths import choose_histogram

    name = choose_histogram(seqlen, cfg["doc_length_histograms"])
    return {name: cfg["doc_length_histograms"][name]}


def expand_grid(cfg: dict, gname: str) -> list[dict]:
    grid = cfg["grids"][gname]
    fam = grid["family"]
    if fam == "cp":
        from .cp.grid import expand_cp_grid

        return expand_cp_grid(cfg, gname)
    common = {k: grid[k] for k in ("device", "samples", "warmup", "reps", "seed", "check")}
    cells = {}
    for prod in _grid_products(grid):
        for impl, mask, seqlen, (hq, hkv), d, dtype, direction in itertools.product(
            prod["kernels"], prod["masks"], prod["seqlen"], prod["heads"], prod["head_dim"], prod["dtype"],
            prod["direction"],
        ):
            for mp in _mask_param_points(mask, grid, prod):
                cell = {"grid": gname, "family": fam, "impl": impl, "mask": mask, "mask_params": mp,
                        "seqlen": seqlen, "heads_q": hq, "heads_kv": hkv, "head_dim": d, "dtype": dtype,
                        "direction": direction, "gpus": 1, **common,
                        "histograms": _histograms_for(cfg, mask, seqlen)}
                cells[cell_path(cell)] = cell
    return list(cells.values())


def cell_path(cell: dict) -> str:
    """Relative to the output folder: cells/{grid}/{family}/{impl}/{mask}/{point}.json."""
    return f"cells/{cell['grid']}/{cell['family']}/{cell['impl']}/{cell['mask']}/{point_id(cell)}.json"


def expand_cells(cfg: dict, grids=None) -> list[dict]:
    out = []
    for g in grids or cfg["run"]:
        out += expand_grid(cfg, g)
    return out
