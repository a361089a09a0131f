import os
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

# Without a GPU, Triton kernels run under Triton's interpreter; it is chosen when triton is
# imported (torch's compiler imports it too), so it is set before anything imports torch.
if not any(Path("/dev").glob("nvidia[0-9]*")):
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def base():
    """The repository's config.yaml, as read (tests deep-copy it before changing it)."""
    return yaml.safe_load((REPO / "config.yaml").read_text())


@pytest.fixture(scope="session")
def histograms():
    from attnbench.masks.lengths import packaged_histograms

    return packaged_histograms()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_configure(config):
    # Two intra-op threads in this process and in every process a test starts (CI has 2 cores).
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    # Before any test computes: the first parallel exp of a process can be inexact otherwise.
    from attnbench.harness.cpu_math import settle_vml

    settle_vml()


# ---------------------------------------------------------------- every test's duration, kept


def pytest_collection_modifyitems(config, items):
    """`slow` follows the measured seconds of each test module (tests/durations.py)."""
    from durations import mark_slow

    mark_slow(items)


def pytest_addoption(parser):
    parser.addoption(
        "--durations-path",
        default=None,
        help="write every test's seconds (setup + call + teardown), slowest first, to this TSV",
    )


_SECONDS: dict = {}


def pytest_runtest_logreport(report):
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--durations-path")
    if not path or not _SECONDS:
        return
    slow = {i.nodeid for i in session.items if i.get_closest_marker("slow")}
    rows = sorted(_SECONDS.items(), key=lambda kv: -kv[1])
    Path(path).write_text(
        "seconds\tslow\ttest\n" + "".join(f"{s:.2f}\t{int(t in slow)}\t{t}\n" for t, s in rows)
    )
