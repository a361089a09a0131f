# Shared by the subset-build scripts (build_flash_attn.sh, build_block_sparse_attn.sh); sourced,
# not run. The including script sets PROG (its name, for messages) before sourcing.

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}

need_value() {
  [[ $# -ge 2 ]] || die "option $1 needs a value (see --help)"
}

# Splits a comma/semicolon separated list into the array named $1, sorted and unique, after
# checking each item against the valid choices (the remaining arguments).
parse_choices() {
  local -n parsed="$1"  # a nameref: the caller's array is filled
  local what="$2" given="$3"; shift 3
  local valid=" $* " item items=()
  IFS=',;' read -r -a items <<<"$given"
  [[ ${#items[@]} -gt 0 ]] || die "no $what given; choose from: $*"
  for item in "${items[@]}"; do
    item="${item// /}"
    [[ -n "$item" && "$valid" == *" $item "* ]] \
      || die "$what '$item' is not one this build supports; choose from: $*"
  done
  # shellcheck disable=SC2034  # the nameref above
  mapfile -t parsed < <(printf '%s\n' "${items[@]// /}" | sort -n -u)
}

# The Python to build with, as an absolute path ($1: as given), with the tools installed beside it
# (ninja in a virtual environment) found as if it were activated. Sets `python` and PATH.
resolve_python() {
  python=$(command -v "$1") || die "Python '$1' not found (set --python or PYTHON)"
  # Absolute, since the build runs from inside the source tree.
  [[ "$python" == /* ]] || python="$PWD/$python"
  PATH="$(dirname "$python"):$PATH"
}

check_local_version() {
  if [[ -n "$1" && "$1" != auto && ! "$1" =~ ^[a-z0-9]+(\.[a-z0-9]+)*$ ]]; then
    die "--local-version '$1' is not a PEP 440 local label (lowercase letters and digits, '.' between)"
  fi
}

# Checks, before compiling, what would otherwise fail late or silently: a CPU torch, no nvcc,
# an nvcc too old for an arch (setup.py would silently skip it), a CUDA major version other than
# torch's, no ninja (the build would run serially, for hours). Arguments: the archs.
check_build_tools() {
  "$python" - "$PROG" "$*" <<'PY'
import shutil
import subprocess
import sys

prog, archs = sys.argv[1], sys.argv[2].split()
def fail(why):
    sys.exit(f"{prog}: error: {why}")

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME
except ImportError as err:
    fail(f"{sys.executable} cannot import torch ({err}); use --python with a CUDA build of torch")
if torch.version.cuda is None:
    fail(f"torch {torch.__version__} at {sys.executable} is not a CUDA build; use --python with a CUDA torch")
if CUDA_HOME is None:
    fail("torch finds no CUDA toolkit (nvcc); set CUDA_HOME or put nvcc on PATH")
nvcc = f"{CUDA_HOME}/bin/nvcc"
try:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
except (OSError, subprocess.CalledProcessError) as err:
    fail(f"cannot run {nvcc} ({err})")
nvcc_version = tuple(int(x) for x in out.split("release ")[1].split(",")[0].split("."))
minimum = {"80": (11, 7), "90": (11, 8), "100": (12, 8), "110": (12, 8), "120": (12, 8)}
for arch in archs:
    if nvcc_version < minimum[arch]:
        fail(f"nvcc {nvcc_version} at {nvcc} is too old for sm{arch} (needs CUDA >= {minimum[arch]})")
torch_cuda_major = int(torch.version.cuda.split(".")[0])
if nvcc_version[0] != torch_cuda_major:
    fail(f"nvcc is CUDA {'.'.join(map(str, nvcc_version))} but torch {torch.__version__} was built with "
         f"CUDA {torch.version.cuda}; torch's extension builder needs the same major version")
if shutil.which("ninja") is None:
    fail("ninja not found on PATH; without it the build compiles one file at a time. "
         "Install it into this environment (pip install ninja)")
for module in ("packaging", "setuptools", "wheel.bdist_wheel"):
    try:
        __import__(module)
    except ImportError:
        fail(f"{sys.executable} cannot import {module}; install it into this environment")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), nvcc {'.'.join(map(str, nvcc_version))} at {nvcc}")
PY
}

# The work folder: $1 as given (created), else a new temporary one named after $2 that goes when
# the script fails before compiling; a failed build keeps it for its log (keep_work_dir_on_failure).
made_work_dir=0
keep_work_dir_on_failure=0
remove_work_dir_on_failure() {
  local status=$?
  if [[ $status -ne 0 && $made_work_dir -eq 1 && $keep_work_dir_on_failure -eq 0 ]]; then
    rm -rf "$work_dir"
  fi
  return $status
}
make_work_dir() {
  trap remove_work_dir_on_failure EXIT
  if [[ -z "$1" ]]; then
    work_dir=$(mktemp -d "${TMPDIR:-/tmp}/$2.XXXXXX")
    made_work_dir=1
  else
    mkdir -p "$1"
    work_dir=$1
  fi
  work_dir=$(cd "$work_dir" && pwd)
}

# Runs `python setup.py bdist_wheel` in the source tree $1 into $out_dir with the environment
# assignments that follow ($2...), logging to $work_dir/build.log; sets `wheel` to the newest
# wheel named $out_dir/<wheel glob> (the last argument). Removes the work folder after success
# unless keep_work_dir is 1.
build_wheel() {
  local src=$1 pattern=${!#} start
  local assignments=("${@:2:$#-2}")
  mkdir -p "$out_dir"
  out_dir=$(cd "$out_dir" && pwd)
  log="$work_dir/build.log"
  echo "Compiling; follow it with: tail -f $log"
  keep_work_dir_on_failure=1
  start=$SECONDS
  # Run in a subshell so the build's environment stays with the build.
  if ! (
    cd "$src"
    export "${assignments[@]}"
    "$python" setup.py bdist_wheel --dist-dir "$out_dir"
  ) >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "the build failed after $((SECONDS - start)) s; full log: $log (work folder kept)"
  fi
  local wheels=("$out_dir"/$pattern)
  [[ -f "${wheels[0]}" ]] || die "the build wrote no $pattern to $out_dir; log: $log"
  # The newest, should the folder hold an earlier build; wheel names have no odd characters.
  # shellcheck disable=SC2012
  wheel=$(ls -t "${wheels[@]}" | head -n 1)
  if [[ $made_work_dir -eq 1 && $keep_work_dir -eq 0 ]]; then
    rm -rf "$work_dir"
  else
    echo "Work folder kept: $work_dir"
  fi
  echo "Built in $((SECONDS - start)) s: $wheel ($(du -h "$wheel" | cut -f1))"
  echo "Install into your environment: $python -m pip install --no-deps '$wheel'"
}
