"""A progress bar for the project's long steps (regenerate, the CP model, verify) on a terminal,
and nothing where stderr is not one (a log file, CI), so that logs hold no bar. A leaf module:
any stage may use it."""

from __future__ import annotations

import sys


def bar(iterable, total: int | None = None, desc: str = ""):
    """`iterable` with a progress bar on a terminal (tqdm); as it is elsewhere."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, disable=not sys.stderr.isatty(), leave=False)
