"""kernels/import_memo.py: a job imports a kernel's libraries once per environment; the next jobs
trust the marker, until the library or the environment changes. Only success is remembered."""

import sys
import tempfile

import pytest
from attnbench.families.kernel import cell
from attnbench.kernels import import_memo
from attnbench.kernels.catalog import KernelInfo


@pytest.fixture
def fakelib(tmp_path, monkeypatch):
    """A library `fakelib` that counts its imports in a file; markers under tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    pkg = tmp_path / "site" / "fakelib"
    pkg.mkdir(parents=True)
    count = tmp_path / "imports.txt"
    (pkg / "__init__.py").write_text(f"open({str(count)!r}, 'a').write('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    info = KernelInfo(
        "fake", "dense", "a stand-in", "naive:Naive", ("full",), {"cpu": ("fwd",)},
        modules=("fakelib",), dists=("fakelib",),
    )  # fmt: skip

    def imports():
        sys.modules.pop("fakelib", None)  # as a new job would find it: not imported
        return len(count.read_text()) if count.exists() else 0

    sys.modules.pop("fakelib", None)
    yield info, pkg, imports
    sys.modules.pop("fakelib", None)


def test_a_library_seen_to_load_is_not_imported_again(fakelib):
    info, _, imports = fakelib
    assert not import_memo.known_to_load(info)
    assert cell.import_failure(info) is None and imports() == 1
    assert import_memo.known_to_load(info) and imports() == 1


def test_a_changed_library_or_path_is_imported_again(fakelib, monkeypatch, tmp_path):
    info, pkg, imports = fakelib
    assert cell.import_failure(info) is None and imports() == 1
    assert import_memo.known_to_load(info)
    (pkg / "__init__.py").write_text((pkg / "__init__.py").read_text() + "# edited\n")
    assert not import_memo.known_to_load(info)
    assert cell.import_failure(info) is None and imports() == 2
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    assert not import_memo.known_to_load(info)


def test_a_library_that_fails_to_load_is_never_remembered(fakelib):
    info, pkg, _ = fakelib
    (pkg / "__init__.py").write_text(
        "raise ImportError('libfoo.so: cannot open shared object file')\n"
    )
    assert "libfoo.so" in cell.import_failure(info)
    assert not import_memo.known_to_load(info)


def test_a_kernel_of_torch_alone_has_nothing_to_remember():
    from attnbench.kernels.catalog import get

    assert cell.import_failure(get("naive")) is None
    assert not import_memo.known_to_load(get("naive"))
