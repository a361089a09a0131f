"""The code and libraries a cell's record was made with: the package files the cell runs (its
family's cell module, what it imports, transitively, and the kernel's or method's modules loaded
by name; attnbench.codegraph), your own kernel's files, and the versions of the libraries it
depends on. Every record carries them (`code`, `libraries`), and attnbench.pipeline.currency compares them
with what a run would use now.

A file's hash is taken once per process and kept: in the warm worker, which imported the files at
its first cell, a record names the files as they were imported, never as edited since.
Torch-free: Snakemake computes them when it reads the workflow.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from ..codegraph import ROOT, code_files

REPO = ROOT.parents[1]
# Digits of each file's SHA-256 kept in a record: enough to tell any edit, short enough to list
# every file (so that an outdated record can say which files changed).
FILE_DIGITS = 16


@cache
def file_sha256(path: str) -> str:
    """The file's SHA-256, read once per process (see the module's note)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def file_name(path: str) -> str:
    """How a record names a file: the package's relative to its folder (attnbench/...), one in
    the repository relative to the repository, any other as it is."""
    p = Path(path).resolve()
    for base in (ROOT.parent, REPO):
        if p.is_relative_to(base):
            return p.relative_to(base).as_posix()
    return str(p)


@cache
def _package_files(modules: tuple) -> tuple:
    return tuple(code_files(*modules))


def cell_code(modules, own_files=()) -> dict:
    """{"sha256": over every file, "files": {name: first FILE_DIGITS of its sha256}} of the
    package modules given and everything they import, and of your own kernel's files."""
    paths = [*_package_files(tuple(sorted(set(modules)))), *own_files]
    files = {file_name(f): file_sha256(str(f)) for f in paths}
    digest = hashlib.sha256()
    for name in sorted(files):  # length-prefixed, as harness.environment.tree_sha256
        for part in (name.encode(), files[name].encode()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return {
        "sha256": digest.hexdigest(),
        "files": {n: files[n][:FILE_DIGITS] for n in sorted(files)},
    }


def code_changes(recorded: dict, now: dict) -> list[str]:
    """The files whose hash differs between two cell_code()s: edited, added or removed."""
    old, new = recorded.get("files", {}), now.get("files", {})
    return [
        f"{n} {'edited' if n in old and n in new else 'added' if n in new else 'removed'}"
        for n in sorted(old.keys() | new.keys())
        if old.get(n) != new.get(n)
    ]
