"""envs/build_block_sparse_attn.sh on the real Block-Sparse-Attention source, up to (not including)
the CUDA compile.

The library is not on PyPI and its CUTLASS is a git submodule: the source tarball the script's
--make-source writes comes from BSA_SOURCE, else .src/block_sparse_attn-src.tar.gz (an ignored
folder); without either the tests that need it are skipped.
"""

import os
import re
import subprocess
from pathlib import Path

import build_scripts as build
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "envs" / "build_block_sparse_attn.sh"
DEFAULT_SOURCE = REPO / ".src" / "block_sparse_attn-src.tar.gz"
KERNEL_DIR = "csrc/block_sparse_attn/src"


def subset_sources(dims=(128,)):
    return ["csrc/block_sparse_attn/flash_api.cpp"] + [
        f"{KERNEL_DIR}/flash_{kind}_block_hdim{d}_bf16{causal}_sm80.cu"
        for kind in ("fwd", "bwd")
        for d in dims
        for causal in ("", "_causal")
    ]


def run_script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return build.run_build_script(SCRIPT, *args, timeout=timeout)


@pytest.fixture(scope="module")
def source() -> Path:
    given = os.environ.get("BSA_SOURCE")
    if given:
        assert Path(given).is_file(), f"BSA_SOURCE={given} is not a file"
        return Path(given)
    if not DEFAULT_SOURCE.is_file():
        pytest.skip(
            f"no Block-Sparse-Attention source tarball (set BSA_SOURCE or make {DEFAULT_SOURCE} "
            "with the script's --make-source)"
        )
    return DEFAULT_SOURCE


def patch(source: Path, folder: Path, *extra: str) -> tuple[Path, str]:
    return build.patch_only(SCRIPT, source, folder, *extra)


@pytest.fixture(scope="module")
def patched(source, tmp_path_factory) -> tuple[Path, str]:
    """The patched source tree of the default build (bf16, head dim 128), and the output."""
    return patch(source, tmp_path_factory.mktemp("work"))


def test_setup_py_compiles_only_the_bf16_kernels_asked_for(patched, source, tmp_path):
    tree, stdout = patched
    namespace = {}
    setup = (tree / "setup.py").read_text()
    listed = re.search(r"sources=\[\n(.*?)\n\s*\],", setup, re.S).group(1)
    exec(f"sources = [{listed}]", namespace)  # the literal list setup.py hands to CUDAExtension
    assert namespace["sources"] == subset_sources()
    assert re.findall(r"^  (csrc/\S+)$", stdout, re.M) == subset_sources()
    assert all((tree / name).is_file() for name in subset_sources())
    _, two = patch(source, tmp_path, "--head-dims", "128,64")
    assert re.findall(r"^  (csrc/\S+)$", two, re.M) == subset_sources((64, 128))


def test_setup_py_neither_updates_submodules_nor_downloads_build_tools(patched):
    tree, _ = patched
    setup = (tree / "setup.py").read_text()
    assert "git submodule" not in setup
    assert "setup_requires" not in setup
    assert (tree / "csrc/cutlass/include/cute/tensor.hpp").is_file()


def test_launch_templates_build_only_the_variants_measured(patched):
    tree, _ = patched
    fwd = (tree / KERNEL_DIR / "flash_fwd_launch_template.h").read_text()
    bwd = (tree / KERNEL_DIR / "flash_bwd_launch_template.h").read_text()
    off = re.compile(r'ATTNBENCH_OFF_SWITCH\((.*?), (\w+), "([\w-]+)", \[&\]')
    assert sorted((name, what) for _, name, what in off.findall(fwd)) == sorted(
        [("Is_local", "local-window"), ("ReturnSoftmaxConst", "returned-probabilities")]
        + [("Is_exact_streaming", "exact-streaming")]
        + [("Is_dropout", "dropout")] * 3
    )
    assert sorted((name, what) for _, name, what in off.findall(bwd)) == sorted(
        [("Is_local", "local-window")] + [("Is_dropout", "dropout")] * 3
    )
    # the even-size switches stay: the kernels need them for lengths that are not multiples
    for text in (fwd, bwd):
        assert "BOOL_SWITCH(is_even_MN, IsEvenMNConst" in text
        assert "BOOL_SWITCH(is_even_K, IsEvenKConst" in text


# After switch_program.PREAMBLE: the patched switches as the launch templates and flash_api.cpp
# use them; prints what each case dispatches to.
SWITCH_PROGRAM = r"""
template <typename F> void report(F f) {
  try { f(); } catch (const std::runtime_error& error) { std::printf("error: %s\n", error.what()); }
}

int main() {
  for (int head_dim : {32, 64, 96, 128, 256}) {
    std::printf("%d bf16 -> ", head_dim);
    report([&] {
      FP16_SWITCH(false, [&] {
        HEADDIM_SWITCH(head_dim, [&] {
          std::printf("%d %s\n", kHeadDim, std::is_same_v<elem_type, cutlass::bfloat16_t> ? "bf16" : "other");
        });
      });
    });
  }
  std::printf("128 fp16 -> ");
  report([&] { FP16_SWITCH(true, [&] { std::printf("ran\n"); }); });
  for (float p_dropout : {1.f, 0.9f}) {  // params.p_dropout is the keep probability
    std::printf("keep %.1f -> ", p_dropout);
    report([&] {
      ATTNBENCH_OFF_SWITCH(p_dropout < 1.f, Is_dropout, "dropout", [&] {
        static_assert(!Is_dropout);
        std::printf("no dropout\n");
      });
    });
  }
}
"""


def test_switches_dispatch_only_the_subset_and_reject_the_rest(patched, tmp_path):
    tree, _ = patched
    lines = build.run_switch_program(SWITCH_PROGRAM, tree / KERNEL_DIR, tmp_path)
    assert lines == [
        *build.subset_lines("block_sparse_attn", "block_sparse_attn", (128,), 128),
        "keep 1.0 -> no dropout",
        "keep 0.9 -> error: This block_sparse_attn build has no dropout kernels; "
        "dropout needs a full block_sparse_attn build.",
    ]


@pytest.mark.parametrize(
    "option, value, choices",
    [("--head-dims", "64,96", "32 64 128"), ("--archs", "90;86", "80 90 100 110 120")],
)
def test_choices_outside_the_library_are_rejected(option, value, choices):
    result = run_script(option, value, "--patch-only", "--source", str(SCRIPT))
    bad = value.replace(";", ",").split(",")[-1]
    assert result.returncode != 0
    assert f"'{bad}'" in result.stderr and choices in result.stderr


@pytest.mark.parametrize(
    "edit_file, old, new, message",
    build.layout_edits(
        64,
        (
            "flash_fwd_launch_template.h",
            "BOOL_SWITCH(return_softmax, ReturnSoftmaxConst",
            "BOOL_SWITCH(params.return_softmax, ReturnSoftmaxConst",
            "0 occurrences of 'BOOL_SWITCH(return_softmax, ReturnSoftmaxConst, [&]'",
        ),
        (
            "setup.py",
            '"csrc/block_sparse_attn/src/flash_bwd_block_hdim32_fp16_sm80.cu",\n',
            "",
            "missing ['csrc/block_sparse_attn/src/flash_bwd_block_hdim32_fp16_sm80.cu']",
        ),
        (
            "setup.py",
            'subprocess.run(["git", "submodule"',
            'subprocess.check_call(["git", "submodule"',
            "0 occurrences of 'subprocess.run",
        ),
    ),
)
def test_sources_of_another_layout_fail_loudly(source, tmp_path, edit_file, old, new, message):
    fake = build.rewritten_tarball(source, tmp_path, edit_file, old, new)
    result = run_script("--patch-only", "--source", str(fake), "--work-dir", str(tmp_path / "w"))
    assert result.returncode != 0
    assert f"{edit_file} does not look as expected" in result.stderr
    assert message in result.stderr


def test_a_tarball_without_cutlass_is_refused(source, tmp_path):
    fake = build.tarball_without(source, tmp_path / "no_cutlass.tar.gz", "/csrc/cutlass/")
    result = run_script("--patch-only", "--source", str(fake), "--work-dir", str(tmp_path / "w"))
    assert result.returncode != 0 and "has no csrc/cutlass/include" in result.stderr
