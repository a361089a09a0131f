"""The `slow` marker follows measured seconds (tests/durations.py): the rule on a file of its own,
the measured file against the suite, and conftest.py's marking against the rule."""

from __future__ import annotations

from pathlib import Path

from durations import MEASURED, by_module, read_seconds, slow_modules

REPO = Path(__file__).resolve().parents[1]


def test_a_module_is_slow_when_its_tests_together_reach_the_threshold(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text(
        "seconds\ttest\n"
        "12.0\ttests/a.py::test_one\n9.0\ttests/a.py::test_two\n"  # 21 s in all
        "19.9\ttests/b.py::test_one\n"
        "0.1\ttests/c.py::test_one[x]\n25.0\ttests/c.py::test_one[y]\n"
    )
    assert slow_modules(path, threshold=20.0) == {"tests/a.py", "tests/c.py"}
    assert slow_modules(tmp_path / "none.tsv") == set()


def test_the_measured_file_names_only_tests_that_exist():
    """tests/durations.tsv is a measurement of this suite: each module it names is here."""
    modules = by_module(read_seconds(MEASURED))
    gone = sorted(m for m in modules if not (REPO / m).exists())
    assert not gone, f"{MEASURED.name} names modules that are gone: {gone}; run make durations"


def test_the_slow_marker_is_on_the_measured_modules_tests():
    """Every test of a measured slow module is marked (conftest.py calls mark_slow), no other."""
    from durations import mark_slow

    class Item:
        def __init__(self, nodeid):
            self.nodeid, self.marks = nodeid, []

        def add_marker(self, mark):
            self.marks.append(mark.name)

    slow = sorted(slow_modules())
    assert slow, f"{MEASURED.name} makes no module slow"
    fast = sorted(set(by_module(read_seconds(MEASURED))) - set(slow))
    items = [Item(f"{m}::test_x[1]") for m in slow + fast]
    mark_slow(items)
    assert [i.marks for i in items] == [["slow"]] * len(slow) + [[]] * len(fast)
