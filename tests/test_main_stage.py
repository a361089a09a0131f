"""make test's main stage, read in its second stage: the `slow` marker (tests/durations.py) kept
every module that took twice the threshold out of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from durations import SLOW_MODULE_S, by_module, read_seconds

MAIN_STAGE = Path(__file__).resolve().parents[1] / ".pytest-durations-main.tsv"

# Marked by hand, the one exception to the measured marker: it reads what the main stage wrote,
# so it runs after it.
pytestmark = pytest.mark.slow


@pytest.mark.skipif(not MAIN_STAGE.exists(), reason="no main stage ran here (make test runs it)")
def test_the_main_stage_ran_no_module_of_twice_the_threshold():
    """A module that took 2 x SLOW_MODULE_S in the main stage is slow, and its measurement in
    tests/durations.tsv is stale."""
    ran = by_module(read_seconds(MAIN_STAGE))
    late = {m: round(s) for m, s in ran.items() if s >= 2 * SLOW_MODULE_S}
    assert not late, (
        f"these modules took {2 * SLOW_MODULE_S:g} s or more in the main stage: {late}; run "
        "`make durations` after `make test`, so that they move to the second stage"
    )
