"""tools/offline-gpu/carry_fa4.py on stand-in wheels: every folder within its call's room, the small
wheels whole, the DSL library's files (not its stubs) in a tar.xz whose parts, joined in their
order as gpu_session.sh joins them, unpack to those files."""

import importlib.util
import io
import lzma
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("carry_fa4", REPO / "tools/offline-gpu/carry_fa4.py")
carry_fa4 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(carry_fa4)


def wheel(path: Path, files: dict) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def test_folders_fit_their_calls_and_the_parts_unpack_to_the_library(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, size in (
        ("flash_attn_4-4.0.0b36-py3-none-any.whl", 300_000),
        ("quack-0.1-py3-none-any.whl", 90_000),
    ):
        wheel(wheels / name, {"x/data.bin": os.urandom(size)})
    library = {
        "nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so": os.urandom(700_000),
        "nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/ir.so": os.urandom(500_000),
    }
    stub = {
        "nvidia_cutlass_dsl/cu13/lib/stubs/aarch64-unknown-linux-gnu/libcute_dsl_runtime.so": b"s"
    }
    wheel(
        wheels / "nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl",
        {**library, **stub},
    )
    monkeypatch.chdir(tmp_path)
    carry_fa4.main(["--wheels", str(wheels), "--first-room", "0.5", "--room", "0.4"])
    folders = sorted(tmp_path.glob(".fa4*"))
    assert [f.name for f in folders][:2] == [".fa4a", ".fa4b"] and len(folders) >= 4
    rooms = [0.5] + [0.4] * (len(folders) - 1)
    for folder, room in zip(folders, rooms):
        assert carry_fa4.carried_mib(list(folder.iterdir())) <= room
    names = sorted(p.name for f in folders for p in f.iterdir())
    assert {"flash_attn_4-4.0.0b36-py3-none-any.whl", "quack-0.1-py3-none-any.whl"} <= set(names)
    parts = sorted(
        (p for f in folders for p in f.glob("*.tar.xz.part*")),
        key=lambda p: int(p.name.split(".part")[1].split("-")[0]),
    )
    n = len(parts)
    assert [p.name.rsplit(".part", 1)[1] for p in parts] == [
        f"{k}-of-{n}" for k in range(1, n + 1)
    ]
    joined = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(joined))) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert got == library  # the stubs left out


def test_a_wheel_larger_than_any_call_is_refused(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels / "big-1.0-py3-none-any.whl", {"a": os.urandom(600_000)})
    tar_xz = tmp_path / "lib.tar.xz"
    tar_xz.write_bytes(b"x")
    with pytest.raises(SystemExit, match="fits in no call"):
        carry_fa4.plan(list(wheels.glob("*.whl")), tar_xz, 0.3, 0.3)
