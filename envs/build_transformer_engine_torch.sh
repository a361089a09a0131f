#!/usr/bin/env bash
# Builds TransformerEngine's PyTorch extension (`transformer_engine_torch`) from PyPI's sdist
# against the installed torch, on a machine without network. The extension is C++ only (no CUDA
# code), so it needs CUDA's, cuDNN's, NCCL's and cuDNN-frontend's headers but no GPU and no nvcc.
# At run time it needs PyPI's `transformer-engine-cu13` (or -cu12, as torch's CUDA) of the same
# version: TE's core library and its Python code.
#
# Upstream's setup.py first tries to download a prebuilt wheel; this build never does
# (NVTE_PYTORCH_FORCE_BUILD), and leaves out the NCCL expert-parallel module (NVTE_WITH_NCCL_EP=0),
# which needs a newer NCCL than torch 2.11 brings. Headers are taken from the CUDA toolkit when
# there is one, else from the nvidia-* wheels beside torch (NVTE_BUILD_USE_NVIDIA_WHEELS).
# Nothing is installed: the wheel is written to the output folder.
set -euo pipefail

PROG=$(basename "$0")
# shellcheck source=envs/build_lib.sh
source "$(dirname "$0")/build_lib.sh"

usage() {
  cat <<EOF
Usage: $PROG --source SDIST|FOLDER [options]

Builds the transformer_engine_torch wheel (TransformerEngine's PyTorch extension) from its sdist
(transformer_engine_torch-VERSION.tar.gz, from PyPI) or an unpacked folder of it.

Options (environment variable in brackets):
  --source PATH   the sdist (.tar.gz) or its unpacked folder [TE_TORCH_SOURCE]
  --jobs N        parallel compile jobs [MAX_JOBS]; default: cores
  --out-dir DIR   where the wheel is written [TE_TORCH_OUT_DIR]; default ./dist
  --work-dir DIR  where the source is unpacked and built [TE_TORCH_WORK_DIR];
                  default a new temporary folder, removed after a successful build
  --python PY     Python with a CUDA build of torch and nvidia-cudnn-frontend [PYTHON]; default python3
  --check-only    check the Python, torch and headers, then stop before compiling
  -h, --help      this help
EOF
}

source_given="${TE_TORCH_SOURCE:-}"
jobs="${MAX_JOBS:-}"
out_dir="${TE_TORCH_OUT_DIR:-$PWD/dist}"
work_dir="${TE_TORCH_WORK_DIR:-}"
python="${PYTHON:-python3}"
check_only=0
keep_work_dir=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --source) need_value "$@"; source_given="$2"; shift 2 ;;
    --jobs) need_value "$@"; jobs="$2"; shift 2 ;;
    --out-dir) need_value "$@"; out_dir="$2"; shift 2 ;;
    --work-dir) need_value "$@"; work_dir="$2"; shift 2 ;;
    --python) need_value "$@"; python="$2"; shift 2 ;;
    --check-only) check_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
if [[ -n "$jobs" && ! "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  die "--jobs/MAX_JOBS must be a positive integer, got '$jobs'"
fi
source_given=$(absolute_source "$source_given")
resolve_python "$python"

# What the build needs, checked before compiling: a CUDA torch, the frontend's headers, and where
# cuDNN's and NCCL's headers are (torch's nvidia-* wheels hold them; the build does not look there
# by itself). Prints "CPATH=..." and "USE_WHEELS=0|1" lines for the build's environment.
check_build_needs() {
  "$python" - "$PROG" <<'PY'
import importlib.metadata as md
import sys
from pathlib import Path

prog = sys.argv[1]
def fail(why):
    sys.exit(f"{prog}: error: {why}")

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME
except ImportError as err:
    fail(f"{sys.executable} cannot import torch ({err}); use --python with a CUDA build of torch")
if torch.version.cuda is None:
    fail(f"torch {torch.__version__} at {sys.executable} is not a CUDA build; use --python with a CUDA torch")
try:
    front = Path(md.distribution("nvidia-cudnn-frontend").locate_file("include"))
except md.PackageNotFoundError:
    fail("nvidia-cudnn-frontend is not installed for this Python (its C++ headers are needed): "
         "pip install --no-deps nvidia-cudnn-frontend")
if not (front / "cudnn_frontend.h").is_file():
    fail(f"nvidia-cudnn-frontend has no {front / 'cudnn_frontend.h'}")
for module in ("setuptools", "wheel.bdist_wheel", "packaging"):
    try:
        __import__(module)
    except ImportError:
        fail(f"{sys.executable} cannot import {module}; install it into this environment")
import nvidia

roots = [Path(p) for p in nvidia.__path__]
# Without a CUDA toolkit, CUDA's headers come from wheels: the runtime's (beside torch), nvcc's
# crt/ and CCCL's nv/ (which the runtime's headers include)
CUDA_WHEELS_HEADERS = ("cuda_runtime.h", "crt/host_config.h", "nv/target")
CUDA_WHEELS_HINT = "pip install 'nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-cccl==13.0.*' (torch's CUDA)"
headers = {name: sorted({str(h.parent) for r in roots for h in r.glob(f"**/include/{name}")})
           for name in ("cudnn.h", "nccl.h") + CUDA_WHEELS_HEADERS}
toolkit = CUDA_HOME and Path(CUDA_HOME, "include", "cuda_runtime.h").is_file()
for name in ("cudnn.h", "nccl.h") + (() if toolkit else CUDA_WHEELS_HEADERS):
    if not headers[name]:
        fail(f"no {name} under {', '.join(map(str, roots))} (torch's nvidia-* wheels) nor a CUDA toolkit"
             + ("" if name in ("cudnn.h", "nccl.h") else f"; without a toolkit: {CUDA_WHEELS_HINT}"))
include = headers["cudnn.h"] + headers["nccl.h"]
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); CUDA headers from "
      f"{CUDA_HOME + '/include' if toolkit else 'the nvidia-* wheels'}; frontend {front}", file=sys.stderr)
print("CPATH=" + ":".join(include))
print(f"USE_WHEELS={0 if toolkit else 1}")
PY
}
needs=$(check_build_needs) || exit 1
cpath=$(sed -n 's/^CPATH=//p' <<<"$needs")
use_wheels=$(sed -n 's/^USE_WHEELS=//p' <<<"$needs")
[[ $check_only -eq 1 ]] && { echo "Checked; stopped before compiling (--check-only)."; exit 0; }

make_work_dir "$work_dir" te_torch_build
echo "source: $source_given"
if [[ -d "$source_given" ]]; then
  tree="$work_dir/src/$(basename "$source_given")"
  rm -rf "$tree" && mkdir -p "$tree" && cp -r "$source_given"/. "$tree"/
  [[ -f "$tree/setup.py" ]] || die "the folder '$source_given' has no setup.py"
else
  tree=$(unpack_tarball "$source_given")
fi
version=$(cat "$tree/build_tools/VERSION.txt" 2> /dev/null) || die "'$source_given' has no build_tools/VERSION.txt"
[[ -n "$jobs" ]] || jobs=$(nproc)
echo "transformer_engine_torch $version, $jobs jobs"
build_wheel "$tree" NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_WITH_NCCL_EP=0 NVTE_BUILD_USE_NVIDIA_WHEELS="$use_wheels" \
  MAX_JOBS="$jobs" CPATH="$cpath${CPATH:+:$CPATH}" "transformer_engine_torch-${version}*.whl"
echo "At run time it needs transformer-engine-cu<torch's CUDA major>==$version beside it."
