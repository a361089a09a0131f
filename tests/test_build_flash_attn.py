"""envs/build_flash_attn.sh on the real flash-attn sdist, up to (not including) the CUDA compile.

The sdist comes from FLASH_ATTN_SDIST, else pytest's cache, else PyPI through the script's own
download (skipped when pypi.org cannot be reached).
"""

import ast
import os
import re
import shutil
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest
from build_scripts import (
    edited_tarball,
    layout_edits,
    run_build_script,
    run_switch_program,
    subset_lines,
)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "envs" / "build_flash_attn.sh"
VERSION = "2.8.3.post2"
SDIST_NAME = f"flash_attn-{VERSION}.tar.gz"
KERNEL_DIR = "csrc/flash_attn/src"
SUBSET_SOURCES = ["csrc/flash_attn/flash_api.cpp"] + [
    f"{KERNEL_DIR}/flash_{kind}_hdim{d}_bf16{causal}_sm80.cu"
    for kind in ("fwd", "fwd_split", "bwd")
    for d in (64, 128)
    for causal in ("", "_causal")
]


def run_script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run_build_script(SCRIPT, *args, timeout=timeout)


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def sdist(request, tmp_path_factory) -> Path:
    given = os.environ.get("FLASH_ATTN_SDIST")
    if given:
        assert Path(given).is_file(), f"FLASH_ATTN_SDIST={given} is not a file"
        return Path(given)
    cache = getattr(request.config, "cache", None)
    folder = Path(cache.mkdir("flash_attn_sdist")) if cache else tmp_path_factory.mktemp("sdist")
    if (folder / SDIST_NAME).is_file():
        return folder / SDIST_NAME
    if not pypi_reachable():
        pytest.skip(
            f"{SDIST_NAME} is not available locally (set FLASH_ATTN_SDIST) and pypi.org is unreachable"
        )
    download = folder / "download"
    result = run_script(
        "--patch-only", "--version", VERSION, "--work-dir", str(download), timeout=300
    )
    assert result.returncode == 0, result.stderr
    shutil.move(download / "sdist" / SDIST_NAME, folder / SDIST_NAME)
    shutil.rmtree(download)
    return folder / SDIST_NAME


@pytest.fixture(scope="module")
def patched(sdist, tmp_path_factory) -> tuple[Path, str]:
    """The patched source tree of the default build (bf16, head dims 64 and 128), and the output."""
    result = run_script(
        "--patch-only", "--sdist", str(sdist), "--work-dir", str(tmp_path_factory.mktemp("work"))
    )
    assert result.returncode == 0, result.stderr
    tree = re.search(r"Patched source tree: (\S+)", result.stdout)
    assert tree, result.stdout
    return Path(tree.group(1)), result.stdout


def cuda_extension_call(setup_py: Path) -> ast.Call:
    """The CUDA (not ROCm) extension: the CUDAExtension call whose sources are a literal list."""
    calls = [
        node
        for node in ast.walk(ast.parse(setup_py.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "CUDAExtension"
        and any(kw.arg == "sources" and isinstance(kw.value, ast.List) for kw in node.keywords)
    ]
    assert len(calls) == 1
    return calls[0]


def test_setup_py_compiles_only_the_twelve_bf16_kernels(patched):
    tree, stdout = patched
    call = cuda_extension_call(tree / "setup.py")
    sources = next(kw.value for kw in call.keywords if kw.arg == "sources")
    assert [elt.value for elt in sources.elts] == SUBSET_SOURCES
    assert all((tree / name).is_file() for name in SUBSET_SOURCES)
    assert re.findall(r"^  (csrc/\S+)$", stdout, re.M) == SUBSET_SOURCES


def test_setup_py_disables_the_features_for_both_compilers(patched):
    tree, _ = patched
    module = ast.parse((tree / "setup.py").read_text())
    defines = next(
        node.value
        for node in module.body
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", None) == "SUBSET_BUILD_DEFINES"
    )
    assert [elt.value for elt in defines.elts] == [
        f"-DFLASHATTENTION_DISABLE_{name}" for name in ("DROPOUT", "ALIBI", "SOFTCAP", "UNEVEN_K")
    ]
    args = next(
        kw.value
        for kw in cuda_extension_call(tree / "setup.py").keywords
        if kw.arg == "extra_compile_args"
    )
    for compiler, flags in zip(args.keys, args.values):
        assert "SUBSET_BUILD_DEFINES" in ast.unparse(flags), compiler.value


# After switch_program.PREAMBLE: the patched FP16_SWITCH/HEADDIM_SWITCH as flash_api.cpp uses them;
# prints what each (head dim, dtype) dispatches to.
SWITCH_PROGRAM = r"""
void dispatch(int head_dim, bool is_fp16) {
  std::printf("%d %s -> ", head_dim, is_fp16 ? "fp16" : "bf16");
  try {
    FP16_SWITCH(is_fp16, [&] {
      HEADDIM_SWITCH(head_dim, [&] {
        bool bf16 = std::is_same_v<elem_type, cutlass::bfloat16_t>;
        std::printf("%d %s\n", kHeadDim, bf16 ? "bf16" : "other");
      });
    });
  } catch (const std::runtime_error& error) {
    std::printf("error: %s\n", error.what());
  }
}

int main() {
  for (int head_dim : {32, 64, 96, 128, 256}) dispatch(head_dim, false);
  dispatch(64, true);
}
"""


def test_switches_dispatch_only_the_subset_and_reject_the_rest(patched, tmp_path):
    tree, _ = patched
    lines = run_switch_program(SWITCH_PROGRAM, tree / KERNEL_DIR, tmp_path)
    assert lines == subset_lines("FlashAttention", "flash-attn", (64, 128), 64)


@pytest.mark.parametrize(
    "option, value, choices",
    [
        ("--head-dims", "64,80", "32 64 96 128 192 256"),
        ("--archs", "90;86", "80 90 100 120"),
    ],
)
def test_choices_outside_flash_attn_are_rejected(option, value, choices):
    result = run_script(option, value, "--patch-only", timeout=30)
    bad = value.replace(";", ",").split(",")[-1]
    assert result.returncode != 0
    assert f"'{bad}'" in result.stderr and choices in result.stderr


@pytest.fixture(scope="module")
def script_inputs(sdist) -> dict[str, bytes]:
    """The files of the real sdist that the script reads, by their path in the archive."""
    top = f"flash_attn-{VERSION}"
    wanted = {
        f"{top}/{name}"
        for name in ["PKG-INFO", "setup.py", f"{KERNEL_DIR}/static_switch.h"] + SUBSET_SOURCES
    }
    with tarfile.open(sdist) as source:
        return {
            member.name: source.extractfile(member).read()
            for member in source
            if member.name in wanted
        }


def fake_sdist(files: dict[str, bytes], folder: Path, edit_file: str, old: str, new: str) -> Path:
    """An sdist holding only the given files, with one edit."""
    return edited_tarball(files, folder / "fake.tar.gz", edit_file, old, new)


@pytest.mark.parametrize(
    "edit_file, old, new, message",
    layout_edits(
        96,
        (
            "setup.py",
            '"csrc/flash_attn/src/flash_bwd_hdim96_bf16_sm80.cu",\n',
            "",
            "missing ['csrc/flash_attn/src/flash_bwd_hdim96_bf16_sm80.cu']",
        ),
        (
            "setup.py",
            '"cxx": compiler_c17_flag,',
            '"cxx": compiler_c17_flag + ["-g"],',
            "compiler_c17_flag",
        ),
    ),
)
def test_sources_of_another_layout_fail_loudly(
    script_inputs, tmp_path, edit_file, old, new, message
):
    fake = fake_sdist(script_inputs, tmp_path, edit_file, old, new)
    result = run_script(
        "--patch-only", "--sdist", str(fake), "--work-dir", str(tmp_path / "work"), timeout=30
    )
    assert result.returncode != 0
    assert f"{edit_file} does not look as expected" in result.stderr
    assert message in result.stderr


def test_an_sdist_of_another_version_than_asked_is_rejected(script_inputs, tmp_path):
    fake = fake_sdist(script_inputs, tmp_path, "PKG-INFO", f"Version: {VERSION}", "Version: 2.9.0")
    result = run_script(
        "--patch-only",
        "--sdist",
        str(fake),
        "--version",
        VERSION,
        "--work-dir",
        str(tmp_path / "work"),
        timeout=30,
    )
    assert result.returncode != 0
    assert f"the sdist is flash-attn 2.9.0 but version {VERSION} was asked for" in result.stderr
