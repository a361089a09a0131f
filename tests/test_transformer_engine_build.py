"""envs/build_transformer_engine_torch.sh (TransformerEngine's PyTorch extension from its sdist) and
tools/offline-gpu/keep_one_arch.py (its core wheel made small enough to carry), on the CPU.

The script's refusals run against this environment's torch (a CPU build here, which it must refuse
before compiling); the arch tool runs on a real shared library with a fatbin section added by
objcopy, of the layout CUDA's fatbinary uses (entries of sm_75, sm_90 and sm_100 code)."""

import base64
import hashlib
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import build_scripts as build
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "envs" / "build_transformer_engine_torch.sh"
KEEP = REPO / "tools" / "offline-gpu" / "keep_one_arch.py"


def test_an_unknown_option_is_refused_naming_it():
    out = build.run_build_script(SCRIPT, "--source", str(SCRIPT), "--frobnicate")
    assert out.returncode != 0 and "unknown option '--frobnicate'" in out.stderr


def test_a_missing_source_is_refused_naming_it(tmp_path):
    out = build.run_build_script(SCRIPT, "--source", str(tmp_path / "nowhere.tar.gz"))
    assert out.returncode != 0 and "nowhere.tar.gz' is neither a file nor a folder" in out.stderr


@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch is a CUDA build")
def test_a_cpu_torch_is_refused_before_compiling(tmp_path):
    out = build.run_build_script(SCRIPT, "--source", str(SCRIPT), "--check-only")
    assert out.returncode != 0
    assert "is not a CUDA build; use --python with a CUDA torch" in out.stderr


def test_bad_jobs_are_refused():
    out = build.run_build_script(SCRIPT, "--source", str(SCRIPT), "--jobs", "many")
    assert (
        out.returncode != 0
        and "--jobs/MAX_JOBS must be a positive integer, got 'many'" in out.stderr
    )


def fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    """One fatbin: its header, then (kind, arch, payload) entries of 64-byte headers."""
    body = b""
    for kind, arch, payload in entries:
        header = struct.pack(
            "<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(payload), 0, 0, 0, 0, arch, 0, 0, 0, 0, 0
        )
        body += header + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def wheel_with_fatbin(tmp_path, entries) -> tuple[Path, bytes]:
    objcopy = shutil.which("objcopy")
    if objcopy is None or shutil.which("readelf") is None:
        pytest.skip("binutils (objcopy, readelf) not installed")
    blob = tmp_path / "fatbin.bin"
    blob.write_bytes(fatbin(entries) + b"\0" * 8 + fatbin(entries[:1]))
    lib = tmp_path / "libdemo.so"
    shutil.copy(Path(sys.executable).resolve(), tmp_path / "base")
    subprocess.run(
        [objcopy, "--add-section", f".nv_fatbin={blob}", str(tmp_path / "base"), str(lib)],
        check=True,
    )
    data = lib.read_bytes()
    whl = tmp_path / "in" / "demo-1.0-py3-none-any.whl"
    whl.parent.mkdir()
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("demo/lib/libdemo.so", data)
        z.writestr("demo/__init__.py", "")
        z.writestr("demo-1.0.dist-info/RECORD", "stale\n")
    return whl, data


def test_other_archs_are_blanked_and_the_kept_code_and_the_rest_stay_byte_for_byte(tmp_path):
    sm75, sm90, sm100 = b"\x75" * 4096, bytes(range(256)) * 16, b"\x10" * 8192
    whl, before = wheel_with_fatbin(tmp_path, [(2, 75, sm75), (2, 90, sm90), (2, 100, sm100)])
    out = subprocess.run(
        [sys.executable, KEEP, whl, "--arch", "90", "--out-dir", tmp_path / "out"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "sm_90 0.0 MiB kept" in out.stdout and "sm_100 0.0 MiB blanked" in out.stdout
    with zipfile.ZipFile(tmp_path / "out" / whl.name) as z:
        after = z.read("demo/lib/libdemo.so")
        record = z.read("demo-1.0.dist-info/RECORD").decode()
    assert len(after) == len(before)
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    # only the sm_75 and sm_100 payloads (in both fatbins) changed, to zeros; sm_90's is still there
    assert len(changed) == 2 * len(sm75) + len(sm100)
    assert all(after[i] == 0 for i in changed) and sm90 in after and sm75 not in after
    digest = hashlib.sha256(after).digest()
    assert (
        f"demo/lib/libdemo.so,sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(after)}"
        in record
    )


def test_a_fatbin_with_ptx_or_without_the_arch_is_refused(tmp_path):
    whl, _ = wheel_with_fatbin(tmp_path, [(2, 80, b"a" * 64), (1, 80, b"ptx" * 8)])
    out = subprocess.run(
        [sys.executable, KEEP, whl, "--out-dir", tmp_path / "out"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "holds PTX (sm_80)" in out.stderr
    (tmp_path / "b").mkdir()
    whl, _ = wheel_with_fatbin(tmp_path / "b", [(2, 80, b"a" * 64)])
    out = subprocess.run(
        [sys.executable, KEEP, whl, "--out-dir", tmp_path / "out2"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "no sm_90 code in the fatbins; found ['sm_80']" in out.stderr
