"""tools/offline-gpu/take_call_results.sh: a GPU call's results.tgz taken into the tree between calls."""

import json
import subprocess
import tarfile

NOT_INSTALLED = "fa3 needs the Python module 'flash_attn_3', which is not installed"


def take(repo, files_at, tree):
    """Run take_call_results.sh on the call's files `files_at`, from the tree `tree`."""
    return subprocess.run(
        ["bash", str(repo / "tools/offline-gpu/take_call_results.sh"), str(files_at)],
        cwd=tree,
        capture_output=True,
        text=True,
    )


def files_at(tmp_path):
    """The call's $OUT as the device hands it back: tmp_path/call/results packed as results.tgz."""
    at = tmp_path / "files_at"
    at.mkdir()
    with tarfile.open(at / "results.tgz", "w:gz") as tar:
        tar.add(tmp_path / "call/results", arcname="results")
    return at


def record(path, status, reason=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": status, "status_reason": reason}))


def test_new_records_are_taken_and_only_new_not_installed_ones_dropped(repo, tmp_path):
    tree = tmp_path / "tree"
    cells = tree / "results/h200/cells/g"
    (tree / "workflow/attnbench/kernels").mkdir(parents=True)
    # already here: a kernel never installed on that machine stays unavailable
    record(
        cells / "te/full/s1.json", "unavailable", "transformer_engine ... which is not installed"
    )
    # what the call packed: the tree it started from plus its new records and a tuned file
    call = tmp_path / "call/results/h200"
    record(
        call / "cells/g/te/full/s1.json",
        "unavailable",
        "transformer_engine ... which is not installed",
    )
    record(call / "cells/g/flex/full/s1.json", "ok")
    record(call / "cells/g/fa3/full/s1.json", "unavailable", NOT_INSTALLED)
    record(
        call / "cells/g/vsa/full/s1.json",
        "unavailable",
        "vsa: importing vsa failed: undefined symbol",
    )
    (call / "sparse_bwd_tuned.json").write_text('{"blocks": {}}')
    at = files_at(tmp_path)
    done = take(repo, at, tree)
    assert done.returncode == 0, done.stderr
    assert "removed 1 new records" in done.stdout
    assert (cells / "te/full/s1.json").exists()  # was here before the call
    assert (cells / "flex/full/s1.json").exists()
    assert (cells / "vsa/full/s1.json").exists()  # unavailable for another reason: a result
    assert not (cells / "fa3/full/s1.json").exists()  # its library comes in a later call
    tuned = tree / "workflow/attnbench/kernels/triton_bsa_tuned.json"
    assert tuned.read_text() == '{"blocks": {}}'


def test_a_folder_without_results_is_refused(repo, tmp_path):
    done = take(repo, tmp_path, tmp_path)
    assert done.returncode == 1 and "no results.tgz in" in done.stderr


def test_what_the_machine_built_is_kept_for_later_sessions(repo, tmp_path):
    """A built wheel (its '+' name only travels inside a tar) and FlashInfer's compiled modules,
    split in parts, land in .gpu_cache/ whole."""
    tree = tmp_path / "tree"
    (tree / "results/h200/cells").mkdir(parents=True)
    (tmp_path / "call/results/h200").mkdir(parents=True)
    at = files_at(tmp_path)
    wheel = tmp_path / "block_sparse_attn-0.0.2+sm90-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"wheel")
    with tarfile.open(at / "built_wheels.tar", "w") as tar:
        tar.add(wheel, arcname=wheel.name)
    module = tmp_path / "mod/batch_prefill_sm90/batch_prefill_sm90.so"
    module.parent.mkdir(parents=True)
    module.write_bytes(bytes(range(256)) * 4000)
    with tarfile.open(tmp_path / "aot.tgz", "w:gz") as tar:
        tar.add(module.parent, arcname="batch_prefill_sm90")
    packed = (tmp_path / "aot.tgz").read_bytes()
    half = len(packed) // 2
    (at / "flashinfer_aot.tgz.part0").write_bytes(packed[:half])
    (at / "flashinfer_aot.tgz.part1").write_bytes(packed[half:])
    done = take(repo, at, tree)
    assert done.returncode == 0, done.stderr
    assert (tree / ".gpu_cache/wheels" / wheel.name).read_bytes() == b"wheel"
    kept = tree / ".gpu_cache/flashinfer_aot/batch_prefill_sm90/batch_prefill_sm90.so"
    assert kept.read_bytes() == module.read_bytes()


def test_carry_wheels_empties_whl_and_refuses_what_a_call_cannot_carry(repo, tmp_path):
    """tools/offline-gpu/carry_wheels.sh, the other side of a call: .whl/ holds only this call's wheels, and
    .whl/ with the working tree may not pass the 64 MiB a call carries."""
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    (tree / ".gitignore").write_text(".whl/\n")  # as in the repository
    (tree / "tracked.txt").write_bytes(b"x" * 2**20)  # untracked, not ignored: it travels too
    (tree / ".whl").mkdir()
    (tree / ".whl/left_from_before.whl").write_bytes(b"old")
    small, big = tmp_path / "small-1.0-py3-none-any.whl", tmp_path / "big-1.0-py3-none-any.whl"
    small.write_bytes(b"w" * 2**20)
    with open(big, "wb") as f:
        f.truncate(63 * 2**20 + 2**19)  # sparse: its size counts, not its blocks

    def carry(wheel):
        return subprocess.run(
            ["bash", str(repo / "tools/offline-gpu/carry_wheels.sh"), str(wheel)],
            cwd=tree,
            env={"PATH": "/usr/bin:/bin", "BASE": "0"},
            capture_output=True,
            text=True,
        )

    ok = carry(small)
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in (tree / ".whl").iterdir()) == [small.name]
    assert "tree 1.0 MiB + .whl 1.0 MiB = 2 MiB of 64" in ok.stdout
    over = carry(big)
    assert over.returncode == 1 and "over the 64 MiB one call carries" in over.stderr
    assert "tree 1.0 MiB + .whl 63.5 MiB = 64.5 MiB" in over.stdout
