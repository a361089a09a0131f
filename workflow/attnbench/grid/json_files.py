"""JSON a command reads from a file, never from its command line: a cell's spec, a grid's report
settings, the figure style. A command line holds at most 128 KiB per argument (a document-length
histogram of thousands of buckets, or a long description, does not fit), and a value that passes
through a shell must be quoted; a file has neither limit.

A report rule's settings are named by the SHA-256 of their content, under
<output_dir>/.attnbench/json/: once written such a file never changes, and the rule's parameter
(the path) changes exactly when the content does, so that new settings redraw. A cell's spec is
named by its record's path: the specs of the records of one folder are kept together in one file
under <output_dir>/.attnbench/specs/ (the folder's path, .json), and a cell's parameter is
`FILE#RECORD_NAME`. It never changes, since whether a record is current is decided from the record
(attnbench.pipeline.currency), not from Snakemake's memory of a parameter; and a run of 20,000 cells
writes a few hundred files before its first job, not 20,000. Snakemake's process writes both when a
run starts (workflow/rules/common.smk, onstart), holding the output folder's lock, before any job.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .expand import stable_hash

FOLDER = ".attnbench/json"
SPECS = ".attnbench/specs"
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


def spec_file(out_dir, record_path) -> str:
    """Where the spec of the cell whose record is `record_path` (under out_dir) is read from:
    `FILE#NAME`, the file of the record's folder and the record's file name in it."""
    out = str(out_dir).rstrip("/")
    rel = str(record_path)[len(out) + 1 :] if str(record_path).startswith(out + "/") else None
    if rel is None:
        raise ValueError(f"{record_path} is not under the output folder {out_dir}")
    folder, name = os.path.split(rel)
    return f"{out}/{SPECS}/{folder}.json#{name}"


def write_spec_files(out_dir, cells: dict) -> int:
    """Write the specs ({record path: spec}) into their folders' files (spec_file), each file where
    it is missing or differs (atomically). Returns how many files were written."""
    files: dict[str, dict] = {}
    for record_path, spec in cells.items():
        path, name = spec_file(out_dir, record_path).rsplit("#", 1)
        files.setdefault(path, {})[name] = spec
    written = 0
    for path, specs in files.items():
        text = json.dumps(specs, sort_keys=True, default=str)
        path = Path(path)
        if path.exists() and path.read_text() == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written += 1
    return written


def file_named(value: str) -> tuple[Path, str | None]:
    """The file an option's value names and the entry in it: (FILE, NAME) for a folder's spec
    file's `FILE#NAME` (spec_file), (the path, None) for a file of its own."""
    path = Path(value)
    if not path.exists() and "#" in value:
        head, entry = value.rsplit("#", 1)
        return Path(head), entry
    return path, None


def read_json_arg(value: str, option: str):
    """A command-line option's JSON: inline when it starts with '{' or '[' (by hand, in tests),
    else the path of a file holding it, or `FILE#NAME`: the entry NAME of a folder's spec file
    (spec_file). A file named by a hash (json_file) must hold what the hash says. ValueError
    naming the option and the file otherwise."""
    if value.lstrip()[:1] in ("{", "["):
        return json.loads(value)
    path, entry = file_named(value)
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{option} {value}: not a readable JSON file ({e})") from None
    if entry is not None:
        if not isinstance(obj, dict) or entry not in obj:
            raise ValueError(
                f"{option} {value}: {path} holds no spec named {entry!r}; run the workflow "
                "again, which writes it anew"
            )
        return obj[entry]
    if HASH_NAME.fullmatch(path.stem) and stable_hash(obj, 64) != path.stem:
        raise ValueError(
            f"{option} {value}: its content is not the one its name's hash says (edited after it "
            "was written); run the workflow again, which writes it anew"
        )
    return obj
