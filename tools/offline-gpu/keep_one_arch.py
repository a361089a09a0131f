"""A copy of a wheel whose CUDA libraries keep the GPU code of one architecture only, to carry.

TransformerEngine's core wheel is 264 MiB, over four times what one call to the offline GPU machine
carries; its libtransformer_engine.so holds 251 MiB of GPU code (the `.nv_fatbin` section) for
eight architectures, 17.5 MiB of it for the H200's sm_90. This writes the same wheel with every
fatbin entry of another architecture blanked: its header kept, its payload zeroed, so the zip
compresses it to nothing and the file offsets, symbols and the sm_90 code stay byte for byte as
they were. The CUDA runtime loads a module's sm_90 image on an sm_90 GPU and never reads the
others (an sm_90 GPU cannot run another architecture's SASS; a fatbin with PTX, which it could
JIT, is refused here).

    python tools/offline-gpu/keep_one_arch.py WHEEL --arch 90 --out-dir DIR
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2


def fatbin_section(elf: bytes) -> tuple[int, int] | None:
    """(offset, size) of the .nv_fatbin section, read with readelf (binutils)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(elf)
        f.flush()
        out = subprocess.run(
            ["readelf", "-S", "-W", f.name], capture_output=True, text=True, check=True
        ).stdout
    for line in out.splitlines():
        if ".nv_fatbin " in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    return None


def blank_other_archs(elf: bytearray, arch: int) -> dict:
    """Zeroes, in place, the payload of every fatbin entry of another architecture; returns bytes
    kept and blanked per architecture."""
    where = fatbin_section(bytes(elf))
    if where is None:
        return {}
    start, size = where
    pos, end, seen = start, start + size, {}
    while pos < end:
        magic, _, header, entries = struct.unpack_from("<IHHQ", elf, pos)
        if magic != FATBIN_MAGIC:  # padding between fatbins, to 8 bytes from the section's start
            pos += 8 - (pos - start) % 8
            continue
        e, stop = pos + header, pos + header + entries
        while e < stop:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", elf, e)
            entry_arch = struct.unpack_from("<I", elf, e + 28)[0]
            if kind == KIND_PTX:
                sys.exit(
                    f"keep_one_arch: a fatbin at offset {e} holds PTX (sm_{entry_arch}), which a GPU could JIT; refusing"
                )
            key = f"sm_{entry_arch}"
            kept = entry_arch == arch
            if not kept:
                elf[e + entry_header : e + entry_header + payload] = bytes(payload)
            seen.setdefault(key, [0, kept])[0] += payload
            e += entry_header + payload
        pos = stop
    if f"sm_{arch}" not in seen:
        sys.exit(f"keep_one_arch: no sm_{arch} code in the fatbins; found {sorted(seen)}")
    return seen


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument(
        "--arch", type=int, default=90, help="the architecture kept (default 90: H100/H200)"
    )
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / args.wheel.name
    if out.resolve() == args.wheel.resolve():
        sys.exit("keep_one_arch: --out-dir must not be the wheel's own folder")
    records, record_name = [], None
    with (
        zipfile.ZipFile(args.wheel) as src,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst,
    ):
        for info in src.infolist():
            if info.filename.endswith(".dist-info/RECORD"):
                record_name = info.filename
                continue
            data = src.read(info)
            if data[:4] == b"\x7fELF":
                elf = bytearray(data)
                seen = blank_other_archs(elf, args.arch)
                for key, (n, kept) in sorted(seen.items()):
                    print(
                        f"{info.filename}: {key} {n / 2**20:.1f} MiB {'kept' if kept else 'blanked'}"
                    )
                data = bytes(elf)
            dst.writestr(info, data)
            records.append(record_line(info.filename, data))
        if record_name is None:
            sys.exit(f"keep_one_arch: {args.wheel} has no .dist-info/RECORD; not a wheel?")
        dst.writestr(record_name, "\n".join(records + [f"{record_name},,"]) + "\n")
    print(
        f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB; was {args.wheel.stat().st_size / 2**20:.1f} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
