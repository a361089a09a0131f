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
  used=0; common_option "$@" || used=$?
  (( used == 0 )) || { shift "$used"; continue; }
  case "$1" in
    --version) need_value "$@"; version="$2"; version_given=1; shift 2 ;;
    --sdist) need_value "$@"; sdist="$2"; shift 2 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

check_common_options
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

sdist_version() {
  sed -n 's/^Version: *//p' "$1/PKG-INFO" | head -n 1
}

# Cuts csrc/flash_attn/src/static_switch.h and setup.py down to the subset. Each edit first checks
# that the text it replaces is the one it knows, and stops with a message naming the file otherwise.
patch_sources() {
  PYTHONPATH="$ENVS_DIR" "$python" - "$1" "${head_dim_list[*]}" "${VALID_HEAD_DIMS[*]}" <<'PY'
import sys

from subset_patch import MARK, Sources

src = Sources(sys.argv[1], "build_flash_attn.sh", "flash-attn 2.8.3.post2", "FlashAttention", "flash-attn")
head_dims = [int(d) for d in sys.argv[2].split()]
all_head_dims = [int(d) for d in sys.argv[3].split()]
DEFINES = ["-DFLASHATTENTION_DISABLE_DROPOUT", "-DFLASHATTENTION_DISABLE_ALIBI",
           "-DFLASHATTENTION_DISABLE_SOFTCAP", "-DFLASHATTENTION_DISABLE_UNEVEN_K"]


def kernel_sources(dims, dtypes):
    return [f"csrc/flash_attn/src/flash_{kind}_hdim{d}_{dtype}{causal}_sm80.cu"
            for kind in ("fwd", "fwd_split", "bwd") for d in dims for dtype in dtypes
            for causal in ("", "_causal")]


src.cut_switches("csrc/flash_attn/src/static_switch.h", all_head_dims, head_dims,
                 "With\n// FLASHATTENTION_DISABLE_UNEVEN_K a kernel's head dim must equal the input's: exact match.")
path, text, kept = src.setup_keeping(
    ('os.getenv("FLASH_ATTN_CUDA_ARCHS"', '"FLASH_ATTENTION_FORCE_BUILD"',
     '"FLASH_ATTN_LOCAL_VERSION"', 'name="flash_attn_2_cuda"'),
    "csrc/flash_attn/flash_api.cpp", kernel_sources(head_dims, ("bf16",)),
    kernel_sources(all_head_dims, ("fp16", "bf16")))
# The defines go to the host compiler too: flash_api.cpp's checks that reject dropout,
# softcap and uneven head dims with a clear error are compiled by it, not by nvcc.
text = src.replace_once(path, text, "ext_modules = []\n",
                        f"ext_modules = []\n# {MARK}: features compiled out\nSUBSET_BUILD_DEFINES = {DEFINES!r}\n")
text = src.replace_once(path, text, '"cxx": compiler_c17_flag,',
                        '"cxx": compiler_c17_flag + SUBSET_BUILD_DEFINES,')
text = src.replace_once(path, text, '"nvcc": append_nvcc_threads(nvcc_flags + cc_flag),',
                        '"nvcc": append_nvcc_threads(nvcc_flags + cc_flag + SUBSET_BUILD_DEFINES),')
path.write_text(text)
print("\n".join(kept))
PY
}

[[ $patch_only -eq 1 ]] || check_build_tools "${arch_list[@]}"
make_work_dir "$work_dir" flash_attn_build

if [[ -z "$sdist" ]]; then
  sdist=$(download_sdist)
fi
echo "sdist: $sdist"
src=$(unpack_tarball "$sdist")
found_version=$(sdist_version "$src")
[[ -n "$found_version" ]] || die "'$sdist' has no PKG-INFO version"
if [[ $version_given -eq 1 && "$found_version" != "$version" ]]; then
  die "the sdist is flash-attn $found_version but version $version was asked for"
fi
version="$found_version"

patch_and_settle "$src" flash-attn "$version"
build_wheel "$src" FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS="$arch_env" MAX_JOBS="$jobs" \
  NVCC_THREADS=1 FLASH_ATTN_LOCAL_VERSION="$local_version" "flash_attn-$version*.whl"
echo "Check it: $python -c \"import torch, flash_attn; from flash_attn import flash_attn_func; q = torch.randn(1, 256, 4, ${head_dim_list[0]}, device='cuda', dtype=torch.bfloat16); print(flash_attn.__version__, flash_attn_func(q, q, q, causal=True).shape)\""
