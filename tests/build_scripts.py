"""What the subset-build tests (test_build_flash_attn.py, test_build_block_sparse_attn.py) share:
running a script, and a C++ program against a patched static_switch.h (the macros as the libraries
expand them, with a throwing stand-in for torch's TORCH_CHECK)."""

import shutil
import subprocess
import sys

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
