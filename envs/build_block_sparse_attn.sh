#!/usr/bin/env bash
# Builds a wheel of MIT Han Lab's Block-Sparse-Attention (module `block_sparse_attn`, the paper's
# "FA2 sparse") holding only the kernels attnbench measures: bf16, the chosen head dims (default
# 128), the chosen GPU archs (default sm90), forward and backward, causal and not; no dropout,
# local windows, exact streaming or returned probabilities (each a clear error if asked for).
# Upstream's setup.py compiles 24 kernel files for 5 archs, each with every dropout/window/streaming
# variant, and takes hours; this one compiles 4 files per head dim and takes minutes.
#
# The library is not on PyPI and its CUTLASS is a git submodule, so it builds from a source
# tarball holding both, made once on a machine that has the two git repositories:
#   envs/build_block_sparse_attn.sh --make-source .src/block_sparse_attn-src.tar.gz \
#     --git-dir Block-Sparse-Attention/.git --cutlass-git-dir cutlass/.git
# Nothing is installed: the wheel is written to the output folder.
set -euo pipefail

PROG=$(basename "$0")
# shellcheck source=envs/build_lib.sh
source "$(dirname "$0")/build_lib.sh"
# What Block-Sparse-Attention has kernels for, and what its setup.py knows how to target.
VALID_HEAD_DIMS=(32 64 128)
VALID_ARCHS=(80 90 100 110 120)
# What a source tarball holds (git archive paths); the tests and examples are left out.
SOURCE_PATHS=(setup.py README.md LICENSE MANIFEST.in block_sparse_attn csrc/block_sparse_attn)
LIB_NAME=block_sparse_attn
CUTLASS_SUBMODULE=csrc/cutlass
CUTLASS_PATHS=(include LICENSE.txt)

usage() {
  cat <<EOF
Usage: $PROG --source TARBALL [options]
       $PROG --make-source TARBALL --git-dir DIR --cutlass-git-dir DIR [--rev REV] [--cutlass-rev REV]

Builds a subset block_sparse_attn wheel (bf16, chosen head dims and archs) from a source tarball,
or (--make-source) writes that tarball from the two git repositories.

Options (environment variable in brackets):
  --source PATH      the source tarball (.tar.gz) --make-source wrote [BSA_SOURCE]
  --archs LIST       CUDA archs, from ${VALID_ARCHS[*]}, comma or ';' separated
                     [BLOCK_SPARSE_ATTN_CUDA_ARCHS]; default 90
  --head-dims LIST   head dims, from ${VALID_HEAD_DIMS[*]}, comma separated [BSA_HEAD_DIMS]; default 128
  --jobs N           parallel compile jobs [MAX_JOBS]; default: cores, at most one per kernel file
  --out-dir DIR      where the wheel is written [BSA_OUT_DIR]; default ./dist
  --work-dir DIR     where the source is unpacked and built [BSA_WORK_DIR];
                     default a new temporary folder, removed after a successful build
  --python PY        Python with a CUDA build of torch, used to build [PYTHON]; default python3
  --local-version L  PEP 440 local label of the wheel, '' for none [BSA_LOCAL_VERSION];
                     default auto (e.g. sm90.bf16.hd128, so a subset wheel is not taken for a full one)
  --patch-only       unpack and patch, then stop before compiling (no torch/nvcc needed); prints
                     the patched source folder
  --keep-work-dir    keep the work folder after a successful build
  -h, --help         this help
EOF
  source_options_help
}

source_tarball="${BSA_SOURCE:-}"
archs="${BLOCK_SPARSE_ATTN_CUDA_ARCHS:-90}"
head_dims="${BSA_HEAD_DIMS:-128}"
jobs="${MAX_JOBS:-}"
out_dir="${BSA_OUT_DIR:-$PWD/dist}"
work_dir="${BSA_WORK_DIR:-}"
python="${PYTHON:-python3}"
local_version="${BSA_LOCAL_VERSION-auto}"
patch_only=0
keep_work_dir=0

while [[ $# -gt 0 ]]; do
  used=0; common_option "$@" || used=$?
  (( used == 0 )) && { source_option "$@" || used=$?; }
  (( used == 0 )) || { shift "$used"; continue; }
  case "$1" in
    --source) need_value "$@"; source_tarball="$2"; shift 2 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

if [[ -n "$make_source" ]]; then
  write_source_tarball
  exit 0
fi

check_common_options
[[ -n "$source_tarball" ]] || die "no source tarball given (--source or BSA_SOURCE; --make-source writes one)"
[[ -f "$source_tarball" ]] || die "--source '$source_tarball' is not a file"
source_tarball=$(cd "$(dirname "$source_tarball")" && pwd)/$(basename "$source_tarball")
resolve_python "$python"

# Unpacks the tarball and prints the source tree's path; CUTLASS must be in it.
unpack_source() {
  local tree
  tree=$(unpack_tarball "$source_tarball")
  [[ -f "$tree/csrc/cutlass/include/cute/tensor.hpp" ]] \
    || die "'$source_tarball' has no csrc/cutlass/include (CUTLASS, a git submodule upstream); make it with --make-source"
  echo "$tree"
}

package_version() {
  sed -n 's/^__version__ *= *["'\'']\([^"'\'']*\)["'\''].*/\1/p' "$1/block_sparse_attn/__init__.py" | head -n 1
}

# Cuts static_switch.h, the two launch templates and setup.py down to the subset. Each edit first
# checks that the text it replaces is the one it knows, and stops with a message naming the file
# otherwise.
patch_sources() {
  PYTHONPATH="$ENVS_DIR" "$python" - "$1" "${head_dim_list[*]}" "${VALID_HEAD_DIMS[*]}" <<'PY'
import sys

from subset_patch import MARK, Sources

src = Sources(sys.argv[1], "build_block_sparse_attn.sh",
              "Block-Sparse-Attention 0.0.2 (commit 49d6c39, 2025-12)", "block_sparse_attn", "block_sparse_attn")
head_dims = [int(d) for d in sys.argv[2].split()]
all_head_dims = [int(d) for d in sys.argv[3].split()]
KERNELS = "csrc/block_sparse_attn/src"
# A feature compiled out: its condition must be false at run time, and the kernel is built for
# false only (one template instance instead of two).
OFF_SWITCH = (
    f"\n// {MARK}: a feature this build compiles out.\n"
    "#define ATTNBENCH_OFF_SWITCH(COND, CONST_NAME, WHAT, ...) \\\n"
    "  [&] { \\\n"
    "    TORCH_CHECK(!(COND), \"This block_sparse_attn build has no \" WHAT \" kernels; \" \\\n"
    "                WHAT \" needs a full block_sparse_attn build.\"); \\\n"
    "    constexpr static bool CONST_NAME = false; \\\n"
    "    return __VA_ARGS__(); \\\n"
    "  }()\n")
# (launch template, the BOOL_SWITCH condition and constant compiled out, what it is, how many)
OFF = {
    "flash_fwd_launch_template.h": [
        ("(params.window_size_left >= 0 || params.window_size_right >= 0) && !Is_causal, Is_local",
         "local-window", 1),
        ("return_softmax, ReturnSoftmaxConst", "returned-probabilities", 1),
        ("params.is_exact_streaming, Is_exact_streaming", "exact-streaming", 1),
        ("params.p_dropout < 1.f, Is_dropout", "dropout", 3),
    ],
    "flash_bwd_launch_template.h": [
        ("(params.window_size_left >= 0 || params.window_size_right >= 0) && !params.is_causal, Is_local",
         "local-window", 1),
        ("params.p_dropout < 1.f, Is_dropout", "dropout", 3),
    ],
}


def kernel_sources(dims, dtypes):
    return [f"{KERNELS}/flash_{kind}_block_hdim{d}_{dtype}{causal}_sm80.cu"
            for kind in ("fwd", "bwd") for d in dims for dtype in dtypes for causal in ("", "_causal")]


# Upstream rounds a head dim up to the next kernel (and silently runs nothing above 128); a
# subset build takes exactly the head dims it has.
src.cut_switches(f"{KERNELS}/static_switch.h", all_head_dims, head_dims, "", OFF_SWITCH)
for name, switches in OFF.items():
    path, text = src.read(f"{KERNELS}/{name}")
    for switch, what, count in switches:
        old = f"BOOL_SWITCH({switch}, [&]"
        if text.count(old) != count:
            src.fail(path, f"{text.count(old)} occurrences of {old!r}, expected {count}")
        text = text.replace(old, f'ATTNBENCH_OFF_SWITCH({switch}, "{what}", [&]')
    path.write_text(f"// {MARK}: dropout, local windows and the like compiled out\n" + text)

path, text, kept = src.setup_keeping(
    ('os.getenv("BLOCK_SPARSE_ATTN_CUDA_ARCHS"', '"BLOCK_SPARSE_ATTN_FORCE_BUILD"',
     '"FLASH_ATTN_LOCAL_VERSION"', 'name="block_sparse_attn_cuda"'),
    "csrc/block_sparse_attn/flash_api.cpp", kernel_sources(head_dims, ("bf16",)),
    kernel_sources(all_head_dims, ("fp16", "bf16")))
# The tarball already holds CUTLASS; an offline machine cannot update a submodule, and one
# without git would stop here.
text = src.replace_once(path, text, 'subprocess.run(["git", "submodule", "update", "--init", "csrc/cutlass"])\n',
                        f"# {MARK}: csrc/cutlass comes with the source tarball\n")
# setuptools would try to download missing setup_requires (psutil is only used without
# MAX_JOBS, which the script sets); the script checks the build tools itself.
text = src.replace_once(path, text, '    setup_requires=[\n        "packaging",\n        "psutil",\n        "ninja",\n    ],\n', "")
path.write_text(text)
print("\n".join(kept))
PY
}

[[ $patch_only -eq 1 ]] || check_build_tools "${arch_list[@]}"
make_work_dir "$work_dir" block_sparse_attn_build

echo "source: $source_tarball"
src=$(unpack_source)
version=$(package_version "$src")
[[ -n "$version" ]] || die "'$source_tarball' has no __version__ in block_sparse_attn/__init__.py"
[[ -f "$src/ATTNBENCH_SOURCE" ]] && sed 's/^/  /' "$src/ATTNBENCH_SOURCE"

patch_and_settle "$src" block_sparse_attn "$version"
build_wheel "$src" BLOCK_SPARSE_ATTN_FORCE_BUILD=TRUE BLOCK_SPARSE_ATTN_CUDA_ARCHS="$arch_env" \
  MAX_JOBS="$jobs" NVCC_THREADS=1 FLASH_ATTN_LOCAL_VERSION="$local_version" \
  "block_sparse_attn-$version*.whl"
echo "Check it: $python -c \"import torch, block_sparse_attn; print(block_sparse_attn.__version__)\""
