"""A kernel's libraries known to import in this environment, so that a job need not import them.

A kernel cell's job imports torch and the kernel's libraries to judge whether they load before it
waits for a GPU (families/kernel/cell.py, import_failure). With a warm worker measuring, that import
is all the job does: 4-15 s a cell on the H200 (FlashAttention-4's CuTe DSL, MagiAttention,
TransformerEngine), against 0.2-0.3 s of GPU time at short lengths. Once a job has seen them load, a
marker file says so to the next jobs of the same environment. Its name hashes the interpreter,
sys.path, each module's top-level package (where it is, its size and modification time; found,
never imported) and the kernel's distributions' versions: reinstalling or editing a library, or
another PYTHONPATH, gives another name. Only success is remembered. A library that stops loading
anyway is still caught where it is imported, by the process that measures (`unavailable`).
Torch-free, like the catalog.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from .catalog import KernelInfo
from .libraries import first_version


def memo_path(info: KernelInfo) -> Path:
    """The marker of this kernel's libraries as they are installed here (under the temporary folder,
    so TMPDIR moves it)."""
    parts = [sys.executable, *sys.path, info.name]
    for entry in info.modules:
        for module in entry.split("|"):
            parts.append(f"{module}: {_package_state(module.split('.')[0])}")
    parts += [first_version((dist,)) for dist in info.dists]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"attnbench-loads-{os.getuid()}" / f"{info.name}-{digest}"


def _package_state(top: str) -> str:
    """Where a top-level module is and its file's size and mtime, or 'absent'; imports nothing."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "absent"
    if not spec.origin or not os.path.exists(spec.origin):  # a namespace package: its place only
        return str(spec.origin)
    st = os.stat(spec.origin)
    return f"{spec.origin} {st.st_size} {st.st_mtime_ns}"


def known_to_load(info: KernelInfo) -> bool:
    return bool(info.modules) and memo_path(info).exists()


def remember_loads(info: KernelInfo) -> None:
    path = memo_path(info)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:  # a read-only temporary folder: the next job imports again
        pass
