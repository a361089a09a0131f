#!/usr/bin/env bash
# Builds a FlashMask V3 wheel for PyTorch (PaddlePaddle/flash-attention's
# flashmask/flash_mask/flashmask_attention_v3: module `interface_torch`, extension `flashmask._C`;
# Paddle is not needed) holding only what attnbench measures: sm90, bf16, the chosen head dims
# (default 128), forward and backward; no split-KV, paged KV, softcap, packed GQA, fp16, fp8 or
# sm80 kernels. Upstream's setup_torch.py pins head dims 64, 128 and 256 in its own code, whatever
# the environment says; this build compiles the chosen ones only (a third of the time for one).
#
# Its CUTLASS is a git submodule, so it builds from a source tarball (or a folder) holding both,
# made once on a machine that has the two git repositories:
#   envs/build_flashmask.sh --make-source .src/flashmask-src.tar.gz \
#     --git-dir flash-attention-paddle/.git --rev 9985af5 --cutlass-git-dir cutlass/.git
# Nothing is installed: the wheel is written to the output folder.
set -euo pipefail

PROG=$(basename "$0")
# shellcheck source=envs/build_lib.sh
source "$(dirname "$0")/build_lib.sh"
# The head dims setup_torch.py has kernels for (the others it compiles out itself).
VALID_HEAD_DIMS=(64 128 256)
VALID_ARCHS=(90)
LIB_NAME=flashmask
V3=flashmask/flash_mask/flashmask_attention_v3
SOURCE_PATHS=("$V3" LICENSE README.md)
CUTLASS_SUBMODULE=$V3/cutlass
CUTLASS_PATHS=(include tools/util/include LICENSE.txt)
# The features compiled out, as setup_torch.py's FLASH_MASK_V3_DISABLE_* flags (each must be read
# by it; it also switches most of them off in its own code).
DISABLED=(SPLIT PAGEDKV APPENDKV SOFTCAP PACKGQA FP16 FP8 CLUSTER SM80 HDIMDIFF64 HDIMDIFF192)

usage() {
  cat <<EOF
Usage: $PROG --source TARBALL|FOLDER [options]
       $PROG --make-source TARBALL --git-dir DIR --cutlass-git-dir DIR [--rev REV] [--cutlass-rev REV]

Builds a subset FlashMask V3 wheel for PyTorch (sm90, bf16, chosen head dims, forward and backward)
from a source tarball or folder, or (--make-source) writes that tarball from the two git repositories.

Options (environment variable in brackets):
  --source PATH      the source tarball (.tar.gz) --make-source wrote, or a folder holding
                     $V3 with its cutlass submodule (a checkout) [FLASHMASK_SOURCE]
  --archs LIST       CUDA archs, from ${VALID_ARCHS[*]} (FlashMask V3 is Hopper code) [FLASHMASK_CUDA_ARCHS]; default 90
  --head-dims LIST   head dims, from ${VALID_HEAD_DIMS[*]}, comma separated [FLASHMASK_HEAD_DIMS]; default 128
  --jobs N           parallel compile jobs [MAX_JOBS]; default: cores, at most one per compile unit
  --out-dir DIR      where the wheel is written [FLASHMASK_OUT_DIR]; default ./dist
  --work-dir DIR     where the source is unpacked and built [FLASHMASK_WORK_DIR];
                     default a new temporary folder, removed after a successful build
  --python PY        Python with a CUDA build of torch, used to build [PYTHON]; default python3
  --local-version L  PEP 440 local label of the wheel, '' for none [FLASHMASK_LOCAL_VERSION];
                     default auto (e.g. sm90.bf16.hd128, so a subset wheel is not taken for a full one)
  --patch-only       unpack and patch, then stop before compiling (no torch/nvcc needed); prints
                     the patched source folder
  --keep-work-dir    keep the work folder after a successful build
  -h, --help         this help
EOF
  source_options_help
}

source_given="${FLASHMASK_SOURCE:-}"
archs="${FLASHMASK_CUDA_ARCHS:-90}"
head_dims="${FLASHMASK_HEAD_DIMS:-128}"
jobs="${MAX_JOBS:-}"
out_dir="${FLASHMASK_OUT_DIR:-$PWD/dist}"
work_dir="${FLASHMASK_WORK_DIR:-}"
python="${PYTHON:-python3}"
local_version="${FLASHMASK_LOCAL_VERSION-auto}"
patch_only=0
keep_work_dir=0

while [[ $# -gt 0 ]]; do
  used=0; common_option "$@" || used=$?
  (( used == 0 )) && { source_option "$@" || used=$?; }
  (( used == 0 )) || { shift "$used"; continue; }
  case "$1" in
    --source) need_value "$@"; source_given="$2"; shift 2 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

if [[ -n "$make_source" ]]; then
  write_source_tarball
  exit 0
fi

check_common_options
source_given=$(absolute_source "$source_given")
resolve_python "$python"

# The flags for the head dims left out, then the features compiled out: FLASH_MASK_V3_DISABLE_*.
disable_flags() {
  local d
  for d in "${VALID_HEAD_DIMS[@]}"; do
    [[ " ${head_dim_list[*]} " == *" $d "* ]] || echo "HDIM$d"
  done
  printf '%s\n' "${DISABLED[@]}"
}
mapfile -t disabled < <(disable_flags)

# setup_torch.py must read every flag this build sets, must not pin head dims in its own code (its
# pins are removed), must not run `git submodule update` (CUTLASS comes with the source; offline
# machines have no remote), and gets the wheel's local version label. Then its kernel generator
# writes the instantiations, and the compile units the flags leave are printed, each checked to exist.
patch_sources() {
  PYTHONPATH="$ENVS_DIR" "$python" - "$1" "$V3" "${head_dim_list[*]}" "${disabled[*]}" <<'PY'
import re
import subprocess
import sys

from subset_patch import MARK, Sources

src = Sources(sys.argv[1], "build_flashmask.sh",
              "PaddlePaddle/flash-attention's flashmask_attention_v3 (commit 9985af5, 2026-08)",
              "flashmask", "flashmask")
v3 = sys.argv[2]
head_dims = [int(d) for d in sys.argv[3].split()]
disabled = sys.argv[4].split()
path, text = src.read_setup([f'"FLASH_MASK_V3_DISABLE_{flag}"' for flag in disabled]
                            + ['"FLASH_MASK_V3_FORCE_BUILD"', 'name=f"{PACKAGE_NAME}._C"', "is_offline_build()"],
                            f"{v3}/setup_torch.py")
text = src.replace_once(path, text, 'subprocess.run(["git", "submodule", "update", "--init", "cutlass"])\n',
                        f"pass  # {MARK}: cutlass comes with the source\n")
for d in (64, 128, 256):
    pin = re.compile(rf"^DISABLE_HDIM{d} = False\b.*\n", re.M)
    if len(pin.findall(text)) != 1:
        src.fail(path, f"{len(pin.findall(text))} pins 'DISABLE_HDIM{d} = False', expected 1")
    text = pin.sub(f"# {MARK}: head dim {d} as FLASH_MASK_V3_DISABLE_HDIM{d} says\n", text)
text = src.replace_once(path, text, '    return "3.0.0b1"\n',
                        f'    # {MARK}: the local version label, as in FlashAttention setup scripts\n'
                        '    local = os.environ.get("FLASH_ATTN_LOCAL_VERSION")\n'
                        '    return "3.0.0b1" + (f"+{local}" if local else "")\n')
path.write_text(text)
gen = subprocess.run([sys.executable, "generate_kernels.py", "-o", "instantiations"], cwd=path.parent,
                     capture_output=True, text=True)
if gen.returncode != 0:
    src.fail(path.parent / "generate_kernels.py", f"it failed: {gen.stderr.strip()[-400:]}")
# What setup_torch.py compiles with these flags: the API (C++ and CUDA), the scheduler, and per
# head dim the forward and the four backwards (causal or not, deterministic or not).
units = [f"{v3}/flash_api_torch.cpp", f"{v3}/flash_api_cuda_torch.cu", f"{v3}/flash_prepare_scheduler.cu"]
for d in head_dims:
    units.append(f"{v3}/instantiations/flash_fwd_hdim{d}_bf16_sm90.cu")
    units += [f"{v3}/instantiations/flash_bwd_hdim{d}_bf16{c}{det}_sm90.cu"
              for c in ("", "_causal") for det in ("", "_determ")]
missing = [u for u in units if not (src.root / u).is_file()]
if missing:
    src.fail(src.root / missing[0], "a compile unit these flags leave is missing")
print("\n".join(units))
PY
}

[[ $patch_only -eq 1 ]] || check_build_tools "${arch_list[@]}"
make_work_dir "$work_dir" flashmask_build

echo "source: $source_given"
tree=$(unpack_source_tree "$source_given" "$V3/setup_torch.py" "$CUTLASS_SUBMODULE/include/cute/tensor.hpp")
version=$(sed -n 's/^    return "\([0-9][^"]*\)"$/\1/p' "$tree/$V3/setup_torch.py" | head -n 1)
[[ -n "$version" ]] || die "'$source_given' has no version in $V3/setup_torch.py's get_package_version"
[[ -f "$tree/ATTNBENCH_SOURCE" ]] && sed 's/^/  /' "$tree/ATTNBENCH_SOURCE"

echo "Disabled: $(printf 'FLASH_MASK_V3_DISABLE_%s ' "${disabled[@]}")"
patch_and_settle "$tree" flashmask "$version"
flags=()
for flag in "${disabled[@]}"; do flags+=("FLASH_MASK_V3_DISABLE_$flag=TRUE"); done
# FLASH_MASK_V3_OFFLINE_BUILD: no nvcc download of its own (below CUDA 12.8 it would)
SETUP_SCRIPT=setup_torch.py build_wheel "$tree/$V3" "${flags[@]}" FLASH_MASK_V3_FORCE_BUILD=TRUE \
  FLASH_MASK_V3_OFFLINE_BUILD=TRUE MAX_JOBS="$jobs" NVCC_THREADS=4 FLASH_ATTN_LOCAL_VERSION="$local_version" \
  "flashmask-${version}*.whl"
echo "Check it: $python -c \"import torch, interface_torch as fm; q = torch.randn(1, 256, 4, ${head_dim_list[0]}, device='cuda', dtype=torch.bfloat16); i = torch.full((1, 1, 256, 1), 256, dtype=torch.int32, device='cuda'); print(fm.flashmask_attention(q, q, q, i, causal=True).shape)\""
