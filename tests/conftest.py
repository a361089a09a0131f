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
    # Many masks compile FlexAttention in one test process; raise Dynamo's recompile limit
    # (the benchmark itself compiles one mask per process and fails rather than fall back).
    os.environ.setdefault("OMP_NUM_THREADS", "2")
