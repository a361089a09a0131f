# Shared by the subset-build scripts (build_flash_attn.sh, build_block_sparse_attn.sh); sourced,
# not run. The including script sets PROG (its name, for messages) before sourcing. Their source
# edits share envs/subset_patch.py (ENVS_DIR on the patching Python's path).

ENVS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}

need_value() {
  [[ $# -ge 2 ]] || die "option $1 needs a value (see --help)"
}

# The options both scripts take: sets its variable and returns how many arguments it used, or 0
# for an option that is not one of them (call as `common_option "$@" || used=$?`).
common_option() {
  case "$1" in
    --archs) need_value "$@"; archs="$2"; return 2 ;;
    --head-dims) need_value "$@"; head_dims="$2"; return 2 ;;
    --jobs) need_value "$@"; jobs="$2"; return 2 ;;
    --out-dir) need_value "$@"; out_dir="$2"; return 2 ;;
    --work-dir) need_value "$@"; work_dir="$2"; return 2 ;;
    --python) need_value "$@"; python="$2"; return 2 ;;
    --local-version) need_value "$@"; local_version="$2"; return 2 ;;
    --patch-only) patch_only=1; return 1 ;;
    --keep-work-dir) keep_work_dir=1; return 1 ;;
    -h|--help) usage; exit 0 ;;
  esac
  return 0
}

# After the options: the archs and head dims parsed into arch_list and head_dim_list (checked
# against VALID_ARCHS and VALID_HEAD_DIMS), jobs and the local version checked.
check_common_options() {
  arch_list=()
  head_dim_list=()
  parse_choices arch_list "CUDA arch" "$archs" "${VALID_ARCHS[@]}"
  parse_choices head_dim_list "head dim" "$head_dims" "${VALID_HEAD_DIMS[@]}"
  if [[ -n "$jobs" && ! "$jobs" =~ ^[1-9][0-9]*$ ]]; then
    die "--jobs/MAX_JOBS must be a positive integer, got '$jobs'"
  fi
  check_local_version "$local_version"
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
    "$python" "${SETUP_SCRIPT:-setup.py}" bdist_wheel --dist-dir "$out_dir"
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

# Unpacks the tarball $1 into a fresh $work_dir/src and prints the source tree's path.
unpack_tarball() {
  local src_root="$work_dir/src"
  rm -rf "$src_root"
  mkdir -p "$src_root"
  tar -xzf "$1" -C "$src_root" || die "could not unpack '$1' (not a .tar.gz?)"
  local trees=("$src_root"/*/)
  [[ ${#trees[@]} -eq 1 && -f "${trees[0]}setup.py" ]] \
    || die "'$1' does not hold one source folder with a setup.py"
  echo "${trees[0]%/}"
}

# After unpacking: the script's patch_sources on the tree $1 (library $2, version $3), a list of
# what will be compiled, the stop of --patch-only; then local_version (auto: e.g.
# sm90.bf16.hd128), jobs (cores, at most one per file) and arch_env settled for the build.
patch_and_settle() {
  local src=$1 lib=$2 version=$3 kept
  kept=$(patch_sources "$src") || die "patching the $lib $version sources failed (message above)"
  mapfile -t kept_sources <<<"$kept"
  echo "Patched $lib $version in $src: bf16, head dims ${head_dim_list[*]}, archs ${arch_list[*]}"
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
}

# The scripts that build from a source tarball of git repositories (a library and the CUTLASS its
# git submodule pins) share --make-source and its options; the script sets LIB_NAME (the tarball's
# top folder is LIB_NAME-<commit>), SOURCE_PATHS (what of the library's tree to archive),
# CUTLASS_SUBMODULE (the submodule's path) and CUTLASS_PATHS (what of CUTLASS to archive).
make_source=""
git_dir=""
rev=HEAD
cutlass_git_dir=""
cutlass_rev=""

# Like common_option, for the options of --make-source.
source_option() {
  case "$1" in
    --make-source) need_value "$@"; make_source="$2"; return 2 ;;
    --git-dir) need_value "$@"; git_dir="$2"; return 2 ;;
    --rev) need_value "$@"; rev="$2"; return 2 ;;
    --cutlass-git-dir) need_value "$@"; cutlass_git_dir="$2"; return 2 ;;
    --cutlass-rev) need_value "$@"; cutlass_rev="$2"; return 2 ;;
  esac
  return 0
}

# The help text of those options.
source_options_help() {
  cat <<EOF2
Making the source tarball (on a machine that has the git repositories):
  --make-source PATH write the source tarball here and stop
  --git-dir DIR      the $LIB_NAME git directory (a bare mirror is fine)
  --rev REV          its revision to archive; default HEAD
  --cutlass-git-dir DIR  an NVIDIA/cutlass git directory holding the submodule's commit
  --cutlass-rev REV  the CUTLASS revision; default the commit $LIB_NAME pins ($CUTLASS_SUBMODULE)
EOF2
}

# The source tarball $make_source: the library's SOURCE_PATHS at $rev and CUTLASS's CUTLASS_PATHS
# at the pinned submodule commit, under one folder named after the library's commit, with a note
# (ATTNBENCH_SOURCE) saying where they came from.
write_source_tarball() {
  [[ -n "$git_dir" && -n "$cutlass_git_dir" ]] || die "--make-source needs --git-dir and --cutlass-git-dir"
  local commit pinned tmp top
  commit=$(git --git-dir "$git_dir" rev-parse --verify "$rev^{commit}") \
    || die "'$rev' is not a commit of $git_dir"
  pinned=$(git --git-dir "$git_dir" ls-tree "$commit" "$CUTLASS_SUBMODULE" | awk '$2 == "commit" {print $3}')
  [[ -n "$pinned" ]] || die "$git_dir at $commit has no $CUTLASS_SUBMODULE submodule"
  cutlass_rev=$(git --git-dir "$cutlass_git_dir" rev-parse --verify "${cutlass_rev:-$pinned}^{commit}") \
    || die "$cutlass_git_dir has no commit ${cutlass_rev:-$pinned} (the submodule's: $pinned)"
  top="$LIB_NAME-${commit:0:12}"
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064  # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  git --git-dir "$git_dir" archive --prefix="$top/" "$commit" "${SOURCE_PATHS[@]}" | tar -x -C "$tmp"
  git --git-dir "$cutlass_git_dir" archive --prefix="$top/$CUTLASS_SUBMODULE/" "$cutlass_rev" "${CUTLASS_PATHS[@]}" \
    | tar -x -C "$tmp"
  printf '%s %s\ncutlass %s (the submodule pins %s)\n' \
    "$LIB_NAME" "$commit" "$cutlass_rev" "$pinned" >"$tmp/$top/ATTNBENCH_SOURCE"
  mkdir -p "$(dirname "$make_source")"
  tar -czf "$make_source" -C "$tmp" "$top"
  echo "Wrote $make_source ($(du -h "$make_source" | cut -f1)): $LIB_NAME $commit, cutlass $cutlass_rev"
}

# The source tree from $1, a tarball --make-source wrote or a folder holding the same (a git
# checkout with its submodule, say: copied, without .git, so that the edits leave it as it was),
# in a fresh $work_dir/src; $2: the setup script's path inside the tree, $3: a file of CUTLASS
# that must be there. Prints the tree's path.
unpack_source_tree() {
  local given=$1 setup=$2 cutlass_file=$3 src_root="$work_dir/src" trees
  rm -rf "$src_root"
  mkdir -p "$src_root"
  if [[ -d "$given" ]]; then
    mkdir -p "$src_root/$(basename "$given")"
    tar -C "$given" --exclude=.git -cf - . | tar -C "$src_root/$(basename "$given")" -xf - \
      || die "could not copy the source folder '$given'"
  else
    tar -xzf "$given" -C "$src_root" || die "could not unpack '$given' (not a .tar.gz?)"
  fi
  trees=("$src_root"/*/)
  [[ ${#trees[@]} -eq 1 && -f "${trees[0]}$setup" ]] \
    || die "'$given' does not hold one source folder with $setup"
  [[ -f "${trees[0]}$cutlass_file" ]] \
    || die "'$given' has no $cutlass_file (CUTLASS, a git submodule upstream); make a tarball with --make-source"
  echo "${trees[0]%/}"
}

# The --source argument checked and made absolute: a file or a folder.
absolute_source() {
  [[ -n "$1" ]] || die "no source given (--source TARBALL|FOLDER; --make-source writes a tarball)"
  [[ -e "$1" ]] || die "--source '$1' is neither a file nor a folder"
  echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
}
