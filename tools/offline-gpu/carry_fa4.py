"""Fill .fa4a/, .fa4b/, ... with FlashAttention-4 and its CuTe DSL, one folder for each call of a
series made one right after the other (gpu_session.sh gathers them in /tmp/fa4 and installs FA4 once
the last part is there). The DSL's -libs-cu13 wheel (92 MB, 237 MB unpacked) is carried unpacked as
one tar.xz (its aarch64 and QNX stubs left out), split over the folders; the small wheels go first.

    python3 tools/offline-gpu/carry_fa4.py [--wheels DIR] [--first-room MIB] [--room MIB]

--wheels: a folder holding the wheels (default: the pins below, downloaded into .gpu_cache/fa4_wheels).
--first-room: MiB the first call has for its folder (default: 64 less the tree, .whl/ and .src/, as
carry_wheels.sh counts them, less a margin); --room: MiB each later call has (64 less the tree).
Then carry .whl, .src and .fa4a in the first call, .fa4b in the second, and so on.
"""

from __future__ import annotations

import argparse
import io
import lzma
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

PINS = [
    "flash-attn-4==4.0.0b36",
    "nvidia-cutlass-dsl==4.8.1",
    "nvidia-cutlass-dsl-libs-base==4.8.1",
    "nvidia-cutlass-dsl-libs-core==4.8.1",
    "nvidia-cutlass-dsl-libs-cu13==4.8.1",
    "quack-kernels==0.6.5",
    "apache-tvm-ffi==0.1.15.post2",
    "torch-c-dlpack-ext==0.1.5",
]
BIG = "nvidia_cutlass_dsl_libs_cu13-"
MIB, LIMIT, MARGIN = 1 << 20, 64.0, 0.5


def carried_mib(files) -> float:
    """As the device counts what travels: each file a 512-byte header plus its bytes padded to 512."""
    return sum(512 + -(-Path(f).stat().st_size // 512) * 512 for f in files) / MIB


def tree_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [f for f in out.split("\0") if f and Path(f).is_file()]


def folder_files(*folders) -> list[Path]:
    return [p for d in folders if Path(d).is_dir() for p in Path(d).rglob("*") if p.is_file()]


def download(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    platforms = ["manylinux_2_17_x86_64", "manylinux_2_24_x86_64", "manylinux_2_28_x86_64", "any"]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
           "--abi", "none", *(x for p in platforms for x in ("--platform", p)), "-d", str(dest), *PINS]  # fmt: skip
    subprocess.run(cmd, check=True)
    return dest


def unpacked_tar_xz(wheel: Path, out: Path) -> Path:
    """The wheel's files (not its stubs for other platforms) as one tar.xz."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / (wheel.name.split("-cp")[0] + ".tar.xz")
    buf = io.BytesIO()
    with zipfile.ZipFile(wheel) as z, tarfile.open(fileobj=buf, mode="w") as tar:
        for info in z.infolist():
            if info.is_dir() or "/lib/stubs/" in info.filename or ".dist-info/" in info.filename:
                continue
            entry = tarfile.TarInfo(info.filename)
            entry.size, entry.mode = (
                info.file_size,
                0o755 if info.filename.endswith(".so") else 0o644,
            )
            tar.addfile(entry, z.open(info))
    target.write_bytes(lzma.compress(buf.getvalue(), preset=9))
    return target


def plan(small: list[Path], big: Path, first_room: float, room: float) -> list[list]:
    """Folders of [(wheel path) | (big, start, end)]: small wheels first-fit, then the big file's
    bytes in order, each folder within its room (the first's `first_room`)."""
    folders: list[list] = [[]]
    left = [first_room]

    def fit(mib):
        while left[-1] < mib + 0.01:
            if not folders[-1] and mib > left[-1]:
                raise SystemExit(
                    f"carry_fa4.py: a {mib:.1f} MiB wheel fits in no call's {left[-1]:.1f} MiB"
                )
            folders.append([])
            left.append(room)

    for w in sorted(small, key=lambda p: -p.stat().st_size):
        mib = carried_mib([w])
        fit(mib)
        folders[-1].append(w)
        left[-1] -= mib
    size, start = big.stat().st_size, 0
    while start < size:
        fit(0.05)
        take = min(size - start, int((left[-1] - 0.01) * MIB) - 1024)  # less its header, padding
        folders[-1].append((big, start, start + take))
        left[-1] -= (take + 1024) / MIB
        start += take
    return folders


def write(folders: list[list], root: Path) -> list[Path]:
    parts = sum(1 for f in folders for x in f if isinstance(x, tuple))
    made, k = [], 0
    for i, content in enumerate(folders):
        d = root / f".fa4{chr(ord('a') + i)}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        for x in content:
            if isinstance(x, tuple):
                big, start, end = x
                k += 1
                with open(big, "rb") as f:
                    f.seek(start)
                    (d / f"{big.name}.part{k}-of-{parts}").write_bytes(f.read(end - start))
            else:
                shutil.copy2(x, d)
        made.append(d)
    return made


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path)
    ap.add_argument("--first-room", type=float)
    ap.add_argument("--room", type=float)
    a = ap.parse_args(argv)
    wheels = a.wheels or download(Path(".gpu_cache/fa4_wheels"))
    found = sorted(wheels.glob("*.whl"))
    big = [w for w in found if w.name.startswith(BIG)]
    if len(big) != 1:
        raise SystemExit(f"carry_fa4.py: {wheels} holds {len(big)} {BIG}*.whl wheels, expected 1")
    tree = carried_mib(tree_files()) if a.first_room is None or a.room is None else 0.0
    room = a.room if a.room is not None else LIMIT - tree - MARGIN
    first = a.first_room
    if first is None:
        first = room - carried_mib(folder_files(".whl", ".src"))
    tar_xz = unpacked_tar_xz(big[0], Path(".gpu_cache"))
    made = write(plan([w for w in found if w not in big], tar_xz, first, room), Path("."))
    for d in made:
        print(
            f"{d.name}: {carried_mib(folder_files(d)):.1f} MiB: {', '.join(sorted(p.name for p in d.iterdir()))}"
        )
    print(f"{len(made)} calls, one right after the other; the first also carries .whl and .src")


if __name__ == "__main__":
    main()
