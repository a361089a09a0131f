"""JSON a command reads from a file, never from its command line: a cell's spec, a grid's report
settings, the figure style. A command line holds at most 128 KiB per argument (a document-length
histogram of thousands of buckets, or a long description, does not fit), and a value that passes
through a shell must be quoted; a file has neither limit.

Each file is named by the SHA-256 of its content, under <output_dir>/.attnbench/json/: once
written it never changes, and a rule's parameter (the path) changes exactly when the content does.
Snakemake's process writes them when a run starts (workflow/rules/common.smk, onstart), holding the
output folder's lock, and removes those no rule of that run names.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .expand import stable_hash

FOLDER = ".attnbench/json"
HASH_NAME = re.compile(r"[0-9a-f]{64}")


def json_file(out_dir, obj) -> str:
    """Where `obj` is written under the output folder `out_dir` (a path relative to the working
    directory where out_dir is)."""
    return f"{str(out_dir).rstrip('/')}/{FOLDER}/{stable_hash(obj, 64)}.json"


def write_json_files(out_dir, objs) -> int:
    """Write each object to its json_file (those missing; atomically), and remove the files of the
    folder that are none of them. Returns how many were written."""
    folder = Path(out_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    wanted, written = {}, 0
    for obj in objs:
        wanted.setdefault(Path(json_file(out_dir, obj)).name, obj)
    for name, obj in wanted.items():
        path = folder / name
        if path.exists():
            continue
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(obj, sort_keys=True, default=str))
        tmp.replace(path)
        written += 1
    for path in folder.iterdir():
        if path.name not in wanted:
            path.unlink(missing_ok=True)
    return written


def read_json_arg(value: str, option: str):
    """A command-line option's JSON: inline when it starts with '{' or '[' (by hand, in tests),
    else the path of a file holding it. A file named by a hash (json_file) must hold what the hash
    says. ValueError naming the option and the file otherwise."""
    if value.lstrip()[:1] in ("{", "["):
        return json.loads(value)
    path = Path(value)
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{option} {value}: not a readable JSON file ({e})") from None
    if HASH_NAME.fullmatch(path.stem) and stable_hash(obj, 64) != path.stem:
        raise ValueError(
            f"{option} {value}: its content is not the one its name's hash says (edited after it "
            "was written); run the workflow again, which writes it anew"
        )
    return obj
