#!/usr/bin/env bash
# Builds a FlashAttention-2 wheel from the flash-attn sdist holding only the kernels attnbench
# measures: bf16, the chosen head dims (default 64 and 128), the chosen GPU archs (default sm90),
# no dropout / ALiBi / softcap / uneven head dims (local windows kept). A full flash-attn build
# compiles 72 kernel files for 4 archs and takes hours; this one compiles 6 files per head dim and
# takes minutes. Nothing is installed: the wheel is written to the output folder.
set -euo pipefail

PROG=$(basename "$0")
# shellcheck source=envs/build_lib.sh
source "$(dirname "$0")/build_lib.sh"
# What FlashAttention-2 has kernels for, and what its setup.py knows how to target.
VALID_HEAD_DIMS=(32 64 96 128 192 256)
VALID_ARCHS=(80 90 100 120)

usage() {
  cat <<EOF
Usage: $PROG [options]

Builds a subset FlashAttention-2 wheel (bf16, chosen head dims and archs) from the flash-attn sdist.

Options (environment variable in brackets):
  --version V        flash-attn version to download [FA_VERSION]; default 2.8.3.post2
  --sdist PATH       use this local sdist (.tar.gz) instead of downloading (offline machines) [FA_SDIST]
  --archs LIST       CUDA archs, from ${VALID_ARCHS[*]}, comma or ';' separated
                     [FLASH_ATTN_CUDA_ARCHS]; default 90
  --head-dims LIST   head dims, from ${VALID_HEAD_DIMS[*]}, comma separated [FA_HEAD_DIMS];
                     default 64,128
  --jobs N           parallel compile jobs [MAX_JOBS]; default: cores, at most one per kernel file
                     (each nvcc job can take several GB of memory)
  --out-dir DIR      where the wheel is written [FA_OUT_DIR]; default ./dist
  --work-dir DIR     where the sdist is downloaded, unpacked and built [FA_WORK_DIR];
                     default a new temporary folder, removed after a successful build
  --python PY        Python with a CUDA build of torch, used to build [PYTHON]; default python3
  --local-version L  PEP 440 local label of the wheel, '' for none [FA_LOCAL_VERSION];
                     default auto (e.g. sm90.bf16.hd64.hd128, so a subset wheel is not taken for a full one)
  --patch-only       download, unpack and patch, then stop before compiling (no torch/nvcc needed
                     with --sdist); prints the patched source folder
  --keep-work-dir    keep the work folder after a successful build
  -h, --help         this help
EOF
}

version="${FA_VERSION:-2.8.3.post2}"
version_given=0
[[ -n "${FA_VERSION:-}" ]] && version_given=1
sdist="${FA_SDIST:-}"
archs="${FLASH_ATTN_CUDA_ARCHS:-90}"
head_dims="${FA_HEAD_DIMS:-64,128}"
jobs="${MAX_JOBS:-}"
out_dir="${FA_OUT_DIR:-$PWD/dist}"
work_dir="${FA_WORK_DIR:-}"
python="${PYTHON:-python3}"
local_version="${FA_LOCAL_VERSION-auto}"
patch_only=0
keep_work_dir=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --version) need_value "$@"; version="$2"; version_given=1; shift 2 ;;
    --sdist) need_value "$@"; sdist="$2"; shift 2 ;;
    --archs) need_value "$@"; archs="$2"; shift 2 ;;
    --head-dims) need_value "$@"; head_dims="$2"; shift 2 ;;
    --jobs) need_value "$@"; jobs="$2"; shift 2 ;;
    --out-dir) need_value "$@"; out_dir="$2"; shift 2 ;;
    --work-dir) need_value "$@"; work_dir="$2"; shift 2 ;;
    --python) need_value "$@"; python="$2"; shift 2 ;;
    --local-version) need_value "$@"; local_version="$2"; shift 2 ;;
    --patch-only) patch_only=1; shift ;;
    --keep-work-dir) keep_work_dir=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

arch_list=()
head_dim_list=()
parse_choices arch_list "CUDA arch" "$archs" "${VALID_ARCHS[@]}"
parse_choices head_dim_list "head dim" "$head_dims" "${VALID_HEAD_DIMS[@]}"

if [[ -n "$jobs" && ! "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  die "--jobs/MAX_JOBS must be a positive integer, got '$jobs'"
fi
check_local_version "$local_version"
if [[ -n "$sdist" ]]; then
  [[ -f "$sdist" ]] || die "--sdist '$sdist' is not a file"
  sdist=$(cd "$(dirname "$sdist")" && pwd)/$(basename "$sdist")
fi
resolve_python "$python"

download_sdist() {
  local dest="$work_dir/sdist"
  mkdir -p "$dest"
  echo "Downloading the flash-attn $version sdist into $dest" >&2
  # pip reads an sdist's metadata by running its setup.py, which imports torch: build isolation
  # would hide torch, and FLASH_ATTENTION_SKIP_CUDA_BUILD keeps that step from compiling anything.
  FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE "$python" -m pip download --quiet --no-deps \
    --no-binary :all: --no-build-isolation -d "$dest" "flash-attn==$version" >&2 \
    || die "could not download flash-attn==$version from PyPI (offline? pass a local sdist with --sdist)"
  local saved="$dest/flash_attn-$version.tar.gz"
  [[ -f "$saved" ]] || die "pip saved no $(basename "$saved") in $dest"
  echo "$saved"
}

# Unpacks the sdist into a fresh folder and prints the source tree's path.
unpack_sdist() {
  local src_root="$work_dir/src"
  rm -rf "$src_root"
  mkdir -p "$src_root"
  tar -xzf "$sdist" -C "$src_root" || die "could not unpack '$sdist' (not a .tar.gz sdist?)"
  local trees=("$src_root"/*/)
  [[ ${#trees[@]} -eq 1 && -f "${trees[0]}setup.py" ]] \
    || die "'$sdist' does not hold one source folder with a setup.py"
  echo "${trees[0]%/}"
}

sdist_version() {
  sed -n 's/^Version: *//p' "$1/PKG-INFO" | head -n 1
}

# Cuts csrc/flash_attn/src/static_switch.h and setup.py down to the subset. Each edit first checks
# that the text it replaces is the one it knows, and stops with a message naming the file otherwise.
patch_sources() {
  "$python" - "$1" "${head_dim_list[*]}" "${VALID_HEAD_DIMS[*]}" <<'PY'
import re
import sys
from pathlib import Path

src = Path(sys.argv[1])
head_dims = [int(d) for d in sys.argv[2].split()]
all_head_dims = [int(d) for d in sys.argv[3].split()]
MARK = "attnbench subset build"
DEFINES = ["-DFLASHATTENTION_DISABLE_DROPOUT", "-DFLASHATTENTION_DISABLE_ALIBI",
           "-DFLASHATTENTION_DISABLE_SOFTCAP", "-DFLASHATTENTION_DISABLE_UNEVEN_K"]


def fail(path, why):
    sys.exit(f"build_flash_attn.sh: error: {path.relative_to(src)} does not look as expected: {why}. "
             "This script knows the layout of flash-attn 2.8.3.post2; another version needs the "
             "script updated (or a full build).")


def macro_block(path, text, name):
    """The `#define name(...)` block, up to the line closing its lambda call."""
    found = list(re.finditer(rf"^#define {name}\(.*?^\s*\}}\(\)[ \t]*$", text, re.M | re.S))
    if len(found) != 1:
        fail(path, f"{len(found)} definitions of {name} found, expected 1")
    return found[0]


def patch_static_switch():
    path = src / "csrc/flash_attn/src/static_switch.h"
    if not path.is_file():
        fail(path, "file missing")
    text = path.read_text()
    if MARK in text:
        fail(path, "already patched")

    headdim = macro_block(path, text, "HEADDIM_SWITCH")
    body = headdim.group(0)
    bounds = [int(n) for n in re.findall(r"HEADDIM <= (\d+)", body)]
    kernels = [int(n) for n in re.findall(r"kHeadDim = (\d+);", body)]
    if bounds != all_head_dims or kernels != all_head_dims or body.count("return __VA_ARGS__();") != len(all_head_dims):
        fail(path, f"HEADDIM_SWITCH dispatches to {kernels} (bounds {bounds}), expected {all_head_dims}")
    dims = ", ".join(map(str, head_dims))
    opener = ["if"] + ["} else if"] * (len(head_dims) - 1)
    branches = "".join(
        f"    {keyword} (HEADDIM == {d}) {{ \\\n"
        f"      constexpr static int kHeadDim = {d}; \\\n"
        f"      return __VA_ARGS__(); \\\n"
        for keyword, d in zip(opener, head_dims))
    new_headdim = (
        f"// {MARK} (envs/build_flash_attn.sh): kernels for head dims {dims} only. With\n"
        "// FLASHATTENTION_DISABLE_UNEVEN_K a kernel's head dim must equal the input's: exact match.\n"
        "#define HEADDIM_SWITCH(HEADDIM, ...) \\\n"
        "  [&] { \\\n"
        f"{branches}"
        "    } else { \\\n"
        f"      TORCH_CHECK(false, \"This FlashAttention build has kernels for head dims {dims} only, got \", \\\n"
        "                  HEADDIM, \"; other head dims need a full flash-attn build.\"); \\\n"
        "    } \\\n"
        "  }()")

    fp16 = macro_block(path, text, "FP16_SWITCH")
    body = fp16.group(0)
    if (re.findall(r"cutlass::\w+", body) != ["cutlass::half_t", "cutlass::bfloat16_t"]
            or "if (COND)" not in body or body.count("return __VA_ARGS__();") != 2):
        fail(path, "FP16_SWITCH is not `if (COND) half_t else bfloat16_t`")
    new_fp16 = (
        f"// {MARK} (envs/build_flash_attn.sh): bf16 kernels only.\n"
        "#define FP16_SWITCH(COND, ...) \\\n"
        "  [&] { \\\n"
        "    TORCH_CHECK(!(COND), \"This FlashAttention build has bf16 kernels only, got fp16; \" \\\n"
        "                \"fp16 needs a full flash-attn build.\"); \\\n"
        "    using elem_type = cutlass::bfloat16_t; \\\n"
        "    return __VA_ARGS__(); \\\n"
        "  }()")

    # Replace the later block first so the earlier one's offsets stay valid.
    for match, new in sorted([(headdim, new_headdim), (fp16, new_fp16)], key=lambda p: -p[0].start()):
        text = text[:match.start()] + new + text[match.end():]
    path.write_text(text)


def kernel_sources(dims, dtypes):
    return [f"csrc/flash_attn/src/flash_{kind}_hdim{d}_{dtype}{causal}_sm80.cu"
            for kind in ("fwd", "fwd_split", "bwd") for d in dims for dtype in dtypes
            for causal in ("", "_causal")]


def replace_once(path, text, old, new):
    if text.count(old) != 1:
        fail(path, f"{text.count(old)} occurrences of {old.strip()!r}, expected 1")
    return text.replace(old, new)


def patch_setup_py():
    path = src / "setup.py"
    text = path.read_text()
    if MARK in text:
        fail(path, "already patched")
    for needed in ('os.getenv("FLASH_ATTN_CUDA_ARCHS"', '"FLASH_ATTENTION_FORCE_BUILD"',
                   '"FLASH_ATTN_LOCAL_VERSION"', 'name="flash_attn_2_cuda"'):
        if needed not in text:
            fail(path, f"{needed} not found")

    lists = list(re.finditer(
        r'^(?P<indent>[ \t]*)sources=\[\s*\n\s*"csrc/flash_attn/flash_api\.cpp",\n(?P<kernels>.*?)\n\s*\],',
        text, re.M | re.S))
    if len(lists) != 1:
        fail(path, f"{len(lists)} CUDA source lists starting with flash_api.cpp, expected 1")
    listed = re.findall(r'^\s*"([^"]+)",\s*$', lists[0].group("kernels"), re.M)
    expected = kernel_sources(all_head_dims, ("fp16", "bf16"))
    if sorted(listed) != sorted(expected):
        fail(path, f"the CUDA sources differ from the known 72 kernel files: "
                   f"unknown {sorted(set(listed) - set(expected))}, missing {sorted(set(expected) - set(listed))}")
    kept = ["csrc/flash_attn/flash_api.cpp"] + kernel_sources(head_dims, ("bf16",))
    for name in kept:
        if not (src / name).is_file():
            fail(path, f"source {name} is listed but not in the sdist")
    indent = lists[0].group("indent")
    new_list = (f"{indent}# {MARK}: bf16, head dims {head_dims} only\n{indent}sources=[\n"
                + "".join(f'{indent}    "{name}",\n' for name in kept) + f"{indent}],")
    text = text[:lists[0].start()] + new_list + text[lists[0].end():]

    # The defines go to the host compiler too: flash_api.cpp's checks that reject dropout,
    # softcap and uneven head dims with a clear error are compiled by it, not by nvcc.
    text = replace_once(path, text, "ext_modules = []\n",
                        f"ext_modules = []\n# {MARK}: features compiled out\nSUBSET_BUILD_DEFINES = {DEFINES!r}\n")
    text = replace_once(path, text, '"cxx": compiler_c17_flag,',
                        '"cxx": compiler_c17_flag + SUBSET_BUILD_DEFINES,')
    text = replace_once(path, text, '"nvcc": append_nvcc_threads(nvcc_flags + cc_flag),',
                        '"nvcc": append_nvcc_threads(nvcc_flags + cc_flag + SUBSET_BUILD_DEFINES),')
    path.write_text(text)
    return kept


patch_static_switch()
for name in patch_setup_py():
    print(name)
PY
}

[[ $patch_only -eq 1 ]] || check_build_tools "${arch_list[@]}"
make_work_dir "$work_dir" flash_attn_build

if [[ -z "$sdist" ]]; then
  sdist=$(download_sdist)
fi
echo "sdist: $sdist"
src=$(unpack_sdist)
found_version=$(sdist_version "$src")
[[ -n "$found_version" ]] || die "'$sdist' has no PKG-INFO version"
if [[ $version_given -eq 1 && "$found_version" != "$version" ]]; then
  die "the sdist is flash-attn $found_version but version $version was asked for"
fi
version="$found_version"

kept=$(patch_sources "$src") || die "patching the flash-attn $version sources failed (message above)"
mapfile -t kept_sources <<<"$kept"
echo "Patched flash-attn $version in $src: bf16, head dims ${head_dim_list[*]}, archs ${arch_list[*]}"
echo "Sources to compile (${#kept_sources[@]}):"
printf '  %s\n' "${kept_sources[@]}"

if [[ $patch_only -eq 1 ]]; then
  echo "Stopped before compiling (--patch-only). Patched source tree: $src"
  exit 0
fi

if [[ "$local_version" == auto ]]; then
  local_version="$(printf 'sm%s.' "${arch_list[@]}")bf16$(printf '.hd%s' "${head_dim_list[@]}")"
fi
if [[ -z "$jobs" ]]; then
  jobs=$(nproc)
  (( jobs > ${#kept_sources[@]} )) && jobs=${#kept_sources[@]}
fi
arch_env=$(IFS=';'; echo "${arch_list[*]}")
echo "Compiling with $jobs jobs"
build_wheel "$src" FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS="$arch_env" MAX_JOBS="$jobs" \
  NVCC_THREADS=1 FLASH_ATTN_LOCAL_VERSION="$local_version" "flash_attn-$version*.whl"
echo "Check it: $python -c \"import torch, flash_attn; from flash_attn import flash_attn_func; q = torch.randn(1, 256, 4, ${head_dim_list[0]}, device='cuda', dtype=torch.bfloat16); print(flash_attn.__version__, flash_attn_func(q, q, q, causal=True).shape)\""
