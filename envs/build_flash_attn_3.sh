#!/usr/bin/env bash
# Builds a FlashAttention-3 wheel (module `flash_attn_interface`, extension `flash_attn_3._C`) from
# flash-attention's hopper/ sources holding only what attnbench measures: sm90, bf16, the chosen
# head dims (default 128), forward and backward, local windows and varlen (documents) kept; no
# split-KV, paged or appended KV, softcap, fp16, clusters or sm80 kernels. On request (--fp8) the
# FP8 (e4m3) forward of each head dim, and (--mla) the forward with q/k head dim 192 and v head dim
# 128 (DeepSeek's MLA shape; FA3 has no such backward: its backward takes one head dim). A full FA3
# build compiles hundreds of kernel files; this one compiles 3 per head dim (5 with FP8) plus the
# API and the scheduler, in minutes.
#
# FA3 is not on PyPI as source, and its CUTLASS is a git submodule, so it builds from a source
# tarball (or a folder) holding both, made once on a machine that has the two git repositories:
#   envs/build_flash_attn_3.sh --make-source .src/flash_attn_3-src.tar.gz \
#     --git-dir flash-attention/.git --rev 0251105 --cutlass-git-dir cutlass/.git
# Nothing is installed: the wheel is written to the output folder.
set -euo pipefail

PROG=$(basename "$0")
# shellcheck source=envs/build_lib.sh
source "$(dirname "$0")/build_lib.sh"
# What FA3's hopper/setup.py has kernels for (its FLASH_ATTENTION_DISABLE_HDIM* flags).
VALID_HEAD_DIMS=(64 96 128 192 256)
VALID_ARCHS=(90)
LIB_NAME=flash_attn_3
SOURCE_PATHS=(hopper README.md LICENSE AUTHORS)
CUTLASS_SUBMODULE=csrc/cutlass
CUTLASS_PATHS=(include tools/util/include LICENSE.txt)
# The features compiled out, as hopper/setup.py's flags (each must be read by that setup.py);
# FP8 and HDIMDIFF192 are kept when --fp8 and --mla ask for them.
DISABLED=(SPLIT PAGEDKV APPENDKV SOFTCAP FP16 CLUSTER SM80 HDIMDIFF64)

usage() {
  cat <<EOF
Usage: $PROG --source TARBALL|FOLDER [options]
       $PROG --make-source TARBALL --git-dir DIR --cutlass-git-dir DIR [--rev REV] [--cutlass-rev REV]

Builds a subset FlashAttention-3 wheel (sm90, bf16, chosen head dims, backward, windows and varlen)
from a source tarball or folder, or (--make-source) writes that tarball from the two git repositories.

Options (environment variable in brackets):
  --source PATH      the source tarball (.tar.gz) --make-source wrote, or a folder holding hopper/
                     and csrc/cutlass (a checkout with its submodule) [FA3_SOURCE]
  --archs LIST       CUDA archs, from ${VALID_ARCHS[*]} (FA3 is Hopper code) [FA3_CUDA_ARCHS]; default 90
  --head-dims LIST   head dims, from ${VALID_HEAD_DIMS[*]}, comma separated [FA3_HEAD_DIMS]; default 128
  --fp8              also the FP8 (e4m3) forward of each head dim [FA3_FP8=1]
  --mla              also the forward with q/k head dim 192 and v head dim 128 (needs 192 among the
                     head dims, whose backward it shares) [FA3_MLA=1]
  --jobs N           parallel compile jobs [MAX_JOBS]; default: cores, at most one per compile unit
  --out-dir DIR      where the wheel is written [FA3_OUT_DIR]; default ./dist
  --work-dir DIR     where the source is unpacked and built [FA3_WORK_DIR];
                     default a new temporary folder, removed after a successful build
  --python PY        Python with a CUDA build of torch, used to build [PYTHON]; default python3
  --local-version L  PEP 440 local label of the wheel, '' for none [FA3_LOCAL_VERSION];
                     default auto (e.g. sm90.bf16.hd128, so a subset wheel is not taken for a full one)
  --patch-only       unpack and patch, then stop before compiling (no torch/nvcc needed); prints
                     the patched source folder
  --keep-work-dir    keep the work folder after a successful build
  -h, --help         this help
EOF
  source_options_help
}

source_given="${FA3_SOURCE:-}"
archs="${FA3_CUDA_ARCHS:-90}"
head_dims="${FA3_HEAD_DIMS:-128}"
jobs="${MAX_JOBS:-}"
out_dir="${FA3_OUT_DIR:-$PWD/dist}"
work_dir="${FA3_WORK_DIR:-}"
python="${PYTHON:-python3}"
local_version="${FA3_LOCAL_VERSION-auto}"
fp8="${FA3_FP8:-0}"
mla="${FA3_MLA:-0}"
patch_only=0
keep_work_dir=0

while [[ $# -gt 0 ]]; do
  used=0; common_option "$@" || used=$?
  (( used == 0 )) && { source_option "$@" || used=$?; }
  (( used == 0 )) || { shift "$used"; continue; }
  case "$1" in
    --source) need_value "$@"; source_given="$2"; shift 2 ;;
    --fp8) fp8=1; shift ;;
    --mla) mla=1; shift ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

if [[ -n "$make_source" ]]; then
  write_source_tarball
  exit 0
fi

check_common_options
[[ "$fp8" == 0 || "$fp8" == 1 ]] || die "FA3_FP8 must be 0 or 1, got '$fp8'"
[[ "$mla" == 0 || "$mla" == 1 ]] || die "FA3_MLA must be 0 or 1, got '$mla'"
if [[ $mla -eq 1 && " ${head_dim_list[*]} " != *" 192 "* ]]; then
  die "--mla needs head dim 192 too (its backward is the head-dim-192 one); got head dims ${head_dim_list[*]}"
fi
source_given=$(absolute_source "$source_given")
resolve_python "$python"

# The flags for the head dims left out, then the features compiled out: FLASH_ATTENTION_DISABLE_*.
disable_flags() {
  local d
  for d in "${VALID_HEAD_DIMS[@]}"; do
    [[ " ${head_dim_list[*]} " == *" $d "* ]] || echo "HDIM$d"
  done
  printf '%s\n' "${DISABLED[@]}"
  [[ $fp8 -eq 1 ]] || echo FP8
  [[ $mla -eq 1 ]] || echo HDIMDIFF192
}
mapfile -t disabled < <(disable_flags)

# hopper/setup.py must read every flag this build sets (a flag it ignored would silently build
# everything), and must not run `git submodule update` (CUTLASS comes with the source; offline
# machines have no remote). Prints the compile units the flags leave, each checked to exist.
patch_sources() {
  PYTHONPATH="$ENVS_DIR" "$python" - "$1" "${head_dim_list[*]}" "${disabled[*]}" "$fp8" "$mla" <<'PY'
import sys

from subset_patch import MARK, Sources

src = Sources(sys.argv[1], "build_flash_attn_3.sh", "flash-attention's hopper/ (commit 0251105, 2026-08)",
              "flash_attn_3", "flash_attn_3")
head_dims = [int(d) for d in sys.argv[2].split()]
disabled = sys.argv[3].split()
dtypes = ["bf16"] + (["e4m3"] if sys.argv[4] == "1" else [])
fwd_dims = [str(d) for d in head_dims] + (["192_128"] if sys.argv[5] == "1" else [])
path, text = src.read_setup([f'os.getenv("FLASH_ATTENTION_DISABLE_{flag}"' for flag in disabled]
                            + ['"FLASH_ATTENTION_FORCE_BUILD"', '"FLASH_ATTN_LOCAL_VERSION"',
                               'name=f"{PACKAGE_NAME}._C"', "is_offline_build()"], "hopper/setup.py")
text = src.replace_once(path, text, 'subprocess.run(["git", "submodule", "update", "--init", "../csrc/cutlass"])\n',
                        f"pass  # {MARK}: csrc/cutlass comes with the source\n")
path.write_text(text)
# What setup.py compiles with these flags: the API, the scheduler, per head dim (and 192_128 with
# --mla) and dtype the forward and the forward with packed GQA, per head dim the bf16 backward
# (sm90, no split/paged/softcap variants).
units = ["hopper/flash_api_stable.cpp", "hopper/flash_prepare_scheduler.cu"] + [
    f"hopper/instantiations/flash_fwd_hdim{d}_{dtype}{variant}_sm90.cu"
    for d in fwd_dims for dtype in dtypes for variant in ("", "_packgqa")] + [
    f"hopper/instantiations/flash_bwd_hdim{d}_bf16_sm90.cu" for d in head_dims]
missing = [u for u in units if not (src.root / u).is_file()]
if missing:
    src.fail(src.root / missing[0], "a compile unit these flags leave is missing")
print("\n".join(units))
PY
}

[[ $patch_only -eq 1 ]] || check_build_tools "${arch_list[@]}"
make_work_dir "$work_dir" flash_attn_3_build

echo "source: $source_given"
tree=$(unpack_source_tree "$source_given" hopper/setup.py "$CUTLASS_SUBMODULE/include/cute/tensor.hpp")
version=$(sed -n 's/^__version__ *= *["'\'']\([^"'\'']*\)["'\''].*/\1/p' "$tree/hopper/__init__.py" | head -n 1)
[[ -n "$version" ]] || die "'$source_given' has no __version__ in hopper/__init__.py"
[[ -f "$tree/ATTNBENCH_SOURCE" ]] && sed 's/^/  /' "$tree/ATTNBENCH_SOURCE"
# setup.py reads ../README.md for its long description
[[ -f "$tree/README.md" ]] || : >"$tree/README.md"

echo "Disabled: $(printf 'FLASH_ATTENTION_DISABLE_%s ' "${disabled[@]}")"
if [[ "$local_version" == auto ]]; then
  local_version="$(printf 'sm%s.' "${arch_list[@]}")bf16$( ((fp8)) && echo .fp8)$(printf '.hd%s' "${head_dim_list[@]}")$( ((mla)) && echo .mla)"
fi
patch_and_settle "$tree" flash_attn_3 "$version"
flags=()
for flag in "${disabled[@]}"; do flags+=("FLASH_ATTENTION_DISABLE_$flag=TRUE"); done
# FLASH_ATTENTION_OFFLINE_BUILD: setup.py downloads no nvcc of its own (below CUDA 12.8 it would)
build_wheel "$tree/hopper" "${flags[@]}" FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTENTION_OFFLINE_BUILD=TRUE \
  MAX_JOBS="$jobs" NVCC_THREADS=4 FLASH_ATTN_LOCAL_VERSION="$local_version" "flash_attn_3-$version*.whl"
echo "Check it: $python -c \"import torch, flash_attn_interface as fa3; q = torch.randn(1, 256, 4, ${head_dim_list[0]}, device='cuda', dtype=torch.bfloat16, requires_grad=True); o = fa3.flash_attn_func(q, q, q, causal=True); o = o[0] if isinstance(o, tuple) else o; o.sum().backward(); print(o.shape, q.grad.shape)\""
