"""envs/build_flash_attn_3.sh and envs/build_flashmask.sh on the real sources, up to (not including)
the CUDA compile: what each compiles, the edits they make, and what they refuse.

Both libraries build from a source tarball their --make-source writes from two git repositories
(the library and the CUTLASS its submodule pins): FA3_SOURCE / FLASHMASK_SOURCE, else
.src/flash_attn_3-src.tar.gz and .src/flashmask-src.tar.gz (an ignored folder); without one the
tests of that library are skipped.
"""

import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import build_scripts as build
import pytest

REPO = Path(__file__).resolve().parents[1]
V3 = "flashmask/flash_mask/flashmask_attention_v3"


@dataclass(frozen=True)
class Library:
    script: str
    env: str
    tarball: str
    setup: str  # the setup script inside the tree
    cutlass: str  # the CUTLASS submodule's path inside the tree
    head_dims: str  # the valid choices as the script's errors list them

    def units(self, dims=(128,)) -> list[str]:
        if self.script == "build_flash_attn_3.sh":
            return ["hopper/flash_api_stable.cpp", "hopper/flash_prepare_scheduler.cu"] + [
                f"hopper/instantiations/flash_{kind}_hdim{d}_bf16{variant}_sm90.cu"
                for d in dims
                for kind, variant in (("fwd", ""), ("fwd", "_packgqa"), ("bwd", ""))
            ]
        units = [f"{V3}/flash_api_torch.cpp", f"{V3}/flash_api_cuda_torch.cu"]
        units.append(f"{V3}/flash_prepare_scheduler.cu")
        for d in dims:
            units.append(f"{V3}/instantiations/flash_fwd_hdim{d}_bf16_sm90.cu")
            units += [
                f"{V3}/instantiations/flash_bwd_hdim{d}_bf16{c}{det}_sm90.cu"
                for c in ("", "_causal")
                for det in ("", "_determ")
            ]
        return units


FA3 = Library(
    "build_flash_attn_3.sh",
    "FA3_SOURCE",
    "flash_attn_3-src.tar.gz",
    "hopper/setup.py",
    "csrc/cutlass",
    "64 96 128 192 256",
)
FLASHMASK = Library(
    "build_flashmask.sh",
    "FLASHMASK_SOURCE",
    "flashmask-src.tar.gz",
    f"{V3}/setup_torch.py",
    f"{V3}/cutlass",
    "64 128 256",
)
LIBRARIES = pytest.mark.parametrize("lib", [FA3, FLASHMASK], ids=["fa3", "flashmask"])


def run_script(lib: Library, *args: str) -> build.subprocess.CompletedProcess:
    return build.run_build_script(REPO / "envs" / lib.script, *args)


def source_of(lib: Library) -> Path:
    given = os.environ.get(lib.env)
    if given:
        assert Path(given).is_file(), f"{lib.env}={given} is not a file"
        return Path(given)
    default = REPO / ".src" / lib.tarball
    if not default.is_file():
        pytest.skip(f"no source tarball (set {lib.env} or make {default} with --make-source)")
    return default


def patch(lib: Library, source: Path, work: Path, *extra: str) -> tuple[Path, str]:
    return build.patch_only(REPO / "envs" / lib.script, source, work, *extra)


def listed_units(stdout: str) -> list[str]:
    return re.findall(r"^  ((?:hopper|flashmask)/\S+)$", stdout, re.M)


@LIBRARIES
def test_only_the_bf16_sm90_units_of_the_head_dims_asked_for_are_compiled(lib, tmp_path):
    source = source_of(lib)
    tree, stdout = patch(lib, source, tmp_path / "a")
    assert listed_units(stdout) == lib.units()
    assert all((tree / unit).is_file() for unit in lib.units())
    _, two = patch(lib, source, tmp_path / "b", "--head-dims", "256,128")
    assert listed_units(two) == lib.units((128, 256))
    disabled = re.search(r"^Disabled: (.*)$", two, re.M).group(1).split()
    assert not any(flag.endswith(("_HDIM128", "_HDIM256")) for flag in disabled)
    assert any(flag.endswith("_HDIM64") for flag in disabled)
    assert any(flag.endswith("_DISABLE_SPLIT") for flag in disabled)


@LIBRARIES
def test_the_setup_script_neither_updates_submodules_nor_pins_what_the_flags_decide(lib, tmp_path):
    tree, _ = patch(lib, source_of(lib), tmp_path)
    setup = (tree / lib.setup).read_text()
    calls = [
        ln for ln in setup.splitlines() if "submodule" in ln and not ln.lstrip().startswith("#")
    ]
    assert calls == [], calls
    assert (tree / lib.cutlass / "include/cute/tensor.hpp").is_file()
    if lib is FLASHMASK:  # upstream pins head dims 64, 128 and 256 in code, whatever the flags say
        assert not re.search(r"^DISABLE_HDIM(64|128|256) = False", setup, re.M)
        assert 'local = os.environ.get("FLASH_ATTN_LOCAL_VERSION")' in setup


@LIBRARIES
@pytest.mark.parametrize("option, value", [("--head-dims", "128,80"), ("--archs", "80")])
def test_choices_outside_the_library_are_rejected(lib, option, value):
    result = run_script(lib, option, value, "--patch-only", "--source", str(REPO))
    bad = value.split(",")[-1]
    choices = lib.head_dims if option == "--head-dims" else "90"
    assert result.returncode != 0
    assert f"'{bad}'" in result.stderr and choices in result.stderr


EDITS = [
    # a flag the build sets that the setup script no longer reads would silently build everything
    (FA3, "hopper/setup.py", '"FLASH_ATTENTION_DISABLE_SOFTCAP"', '"SOFTCAP_OFF"', "not found"),
    (
        FA3,
        "hopper/setup.py",
        'subprocess.run(["git", "submodule", "update", "--init", "../csrc/cutlass"])',
        'subprocess.check_call(["git", "submodule", "update", "--init", "../csrc/cutlass"])',
        "0 occurrences of 'subprocess.run",
    ),
    (FLASHMASK, "setup_torch.py", '"FLASH_MASK_V3_DISABLE_PACKGQA"', '"PACKGQA_OFF"', "not found"),
    (FLASHMASK, "setup_torch.py", "DISABLE_HDIM64 = False", "DISABLE_HDIM64 = 0", "0 pins"),
    (
        FLASHMASK,
        "setup_torch.py",
        '    return "3.0.0b1"\n',
        '    return "3.0.1"\n',
        "0 occurrences",
    ),
]


@pytest.mark.parametrize(
    "lib, edit_file, old, new, message", EDITS, ids=[f"{e[0].script}-{e[4]}" for e in EDITS]
)
def test_sources_of_another_layout_fail_loudly(lib, edit_file, old, new, message, tmp_path):
    fake = build.rewritten_tarball(source_of(lib), tmp_path, edit_file, old, new)
    result = run_script(
        lib, "--patch-only", "--source", str(fake), "--work-dir", str(tmp_path / "w")
    )
    assert result.returncode != 0
    assert "does not look as expected" in result.stderr and message in result.stderr


@LIBRARIES
def test_a_folder_is_a_source_too_and_is_left_as_it_was(lib, tmp_path):
    with tarfile.open(source_of(lib)) as src:
        src.extractall(tmp_path / "checkout", filter="data")
    (folder,) = (tmp_path / "checkout").iterdir()
    before = (folder / lib.setup).read_text()
    _, stdout = patch(lib, folder, tmp_path / "w")
    assert listed_units(stdout) == lib.units()
    assert (folder / lib.setup).read_text() == before


@LIBRARIES
def test_a_source_without_cutlass_is_refused(lib, tmp_path):
    fake = tmp_path / "no_cutlass.tar.gz"
    with tarfile.open(source_of(lib)) as src, tarfile.open(fake, "w:gz") as dst:
        for member in src:
            if f"/{lib.cutlass}/" not in member.name:
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    result = run_script(
        lib, "--patch-only", "--source", str(fake), "--work-dir", str(tmp_path / "w")
    )
    assert result.returncode != 0 and f"has no {lib.cutlass}/include" in result.stderr
