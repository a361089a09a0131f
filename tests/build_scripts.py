"""What the subset-build tests (test_build_flash_attn.py, test_build_block_sparse_attn.py) share:
running a script, a source tarball with one edit (a source of another layout), and a C++ program against a patched static_switch.h (the macros as the libraries
expand them, with a throwing stand-in for torch's TORCH_CHECK)."""

import io
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

PREAMBLE = r"""
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <type_traits>
namespace cutlass { struct half_t {}; struct bfloat16_t {}; }
template <typename... Parts> [[noreturn]] void check_failed(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw std::runtime_error(message.str());
}
#define TORCH_CHECK(COND, ...) do { if (!(COND)) check_failed(__VA_ARGS__); } while (0)
#include "static_switch.h"
"""


def layout_edits(top_headdim: int, *more: tuple) -> list[tuple]:
    """(file, old, new, message) edits that give a source of another layout, which the script
    must refuse naming what it did not find: both libraries' HEADDIM_SWITCH (its last case moved)
    and FP16_SWITCH (made to pick another type), then the library's own."""
    headdim = (f"HEADDIM <= {top_headdim}", "HEADDIM <= 80", "HEADDIM_SWITCH dispatches to")
    fp16 = ("using elem_type = cutlass::half_t;", "using elem_type = float;", "FP16_SWITCH")
    return [("static_switch.h", *headdim), ("static_switch.h", *fp16), *more]


def subset_lines(build: str, package: str, head_dims: tuple[int, ...], fp16_dim: int) -> list[str]:
    """What a switch program prints for head dims 32..256 in bf16, then one in fp16, when the
    build has `head_dims` in bf16 only (`build`: how its errors name it; `package`: the full one)."""
    dims = ", ".join(map(str, head_dims))
    only = f"This {build} build has kernels for head dims {dims} only, got {{}}; other head dims need a full {package} build."
    return [
        f"{d} bf16 -> {d} bf16" if d in head_dims else f"{d} bf16 -> error: " + only.format(d)
        for d in (32, 64, 96, 128, 256)
    ] + [
        f"{fp16_dim} fp16 -> error: This {build} build has bf16 kernels only, got fp16; "
        f"fp16 needs a full {package} build."
    ]


def run_switch_program(body: str, include_dir, tmp_path) -> list[str]:
    """The lines the program (PREAMBLE + body) prints; skipped where no C++ compiler is."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler to run the patched static_switch.h")
    (tmp_path / "switch.cpp").write_text(PREAMBLE + body)
    subprocess.run(
        [compiler, "-std=c++17", f"-I{include_dir}", "switch.cpp", "-o", "switch"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=60,
    )
    out = subprocess.run([tmp_path / "switch"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def run_build_script(script, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), "--python", sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def edited_tarball(
    files: dict[str, bytes], path: Path, edit_file: str, old: str, new: str
) -> Path:
    """A tarball at `path` of the given files (name -> bytes), the first `old` in the file named
    `edit_file` replaced by `new` (which must be there: the edit is made to the real source)."""
    with tarfile.open(path, "w:gz") as target:
        for name, data in files.items():
            if name.endswith(edit_file):
                assert old in data.decode(), f"{old!r} not in the real {edit_file}"
                data = data.decode().replace(old, new, 1).encode()
            member = tarfile.TarInfo(name)
            member.size = len(data)
            target.addfile(member, io.BytesIO(data))
    return path


def rewritten_tarball(source: Path, folder: Path, edit_file: str, old: str, new: str) -> Path:
    """The same tarball's files with one edit in one file (a source of another layout)."""
    with tarfile.open(source) as src:
        files = {m.name: src.extractfile(m).read() for m in src if m.isfile()}
    return edited_tarball(files, folder / "edited.tar.gz", edit_file, old, new)


def patch_only(script, source: Path, work: Path, *extra: str) -> tuple[Path, str]:
    """A build script's --patch-only run: the patched source tree it names, and its output."""
    result = run_build_script(
        script, "--patch-only", "--source", str(source), "--work-dir", str(work), *extra
    )
    assert result.returncode == 0, result.stderr
    tree = re.search(r"Patched source tree: (\S+)", result.stdout)
    assert tree, result.stdout
    return Path(tree.group(1)), result.stdout


def tarball_without(source: Path, dest: Path, part: str) -> Path:
    """A copy of a source tarball without the members whose path contains `part`."""
    with tarfile.open(source) as src, tarfile.open(dest, "w:gz") as dst:
        for member in src:
            if part not in member.name:
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    return dest
