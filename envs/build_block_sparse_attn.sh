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
Making the source tarball:
  --make-source PATH write the source tarball here and stop
  --git-dir DIR      the Block-Sparse-Attention git directory (a bare mirror is fine)
  --rev REV          its revision to archive; default HEAD
  --cutlass-git-dir DIR  an NVIDIA/cutlass git directory holding the submodule's commit
  --cutlass-rev REV  the CUTLASS revision; default the commit Block-Sparse-Attention pins (csrc/cutlass)
  -h, --help         this help
EOF
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
make_source=""
git_dir=""
rev=HEAD
cutlass_git_dir=""
cutlass_rev=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --source) need_value "$@"; source_tarball="$2"; shift 2 ;;
    --archs) need_value "$@"; archs="$2"; shift 2 ;;
    --head-dims) need_value "$@"; head_dims="$2"; shift 2 ;;
    --jobs) need_value "$@"; jobs="$2"; shift 2 ;;
    --out-dir) need_value "$@"; out_dir="$2"; shift 2 ;;
    --work-dir) need_value "$@"; work_dir="$2"; shift 2 ;;
    --python) need_value "$@"; python="$2"; shift 2 ;;
    --local-version) need_value "$@"; local_version="$2"; shift 2 ;;
    --patch-only) patch_only=1; shift ;;
    --keep-work-dir) keep_work_dir=1; shift ;;
    --make-source) need_value "$@"; make_source="$2"; shift 2 ;;
    --git-dir) need_value "$@"; git_dir="$2"; shift 2 ;;
    --rev) need_value "$@"; rev="$2"; shift 2 ;;
    --cutlass-git-dir) need_value "$@"; cutlass_git_dir="$2"; shift 2 ;;
    --cutlass-rev) need_value "$@"; cutlass_rev="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

# The source tarball: Block-Sparse-Attention's files at $rev and CUTLASS's include/ at the pinned
# submodule commit, under one folder named after both commits, with a note saying where they came from.
write_source_tarball() {
  [[ -n "$git_dir" && -n "$cutlass_git_dir" ]] || die "--make-source needs --git-dir and --cutlass-git-dir"
  local commit pinned tmp top
  commit=$(git --git-dir "$git_dir" rev-parse --verify "$rev^{commit}") \
    || die "'$rev' is not a commit of $git_dir"
  pinned=$(git --git-dir "$git_dir" ls-tree "$commit" csrc/cutlass | awk '$2 == "commit" {print $3}')
  [[ -n "$pinned" ]] || die "$git_dir at $commit has no csrc/cutlass submodule"
  cutlass_rev=$(git --git-dir "$cutlass_git_dir" rev-parse --verify "${cutlass_rev:-$pinned}^{commit}") \
    || die "$cutlass_git_dir has no commit ${cutlass_rev:-$pinned} (the submodule's: $pinned)"
  top="block_sparse_attn-${commit:0:12}"
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064  # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  git --git-dir "$git_dir" archive --prefix="$top/" "$commit" "${SOURCE_PATHS[@]}" | tar -x -C "$tmp"
  git --git-dir "$cutlass_git_dir" archive --prefix="$top/csrc/cutlass/" "$cutlass_rev" include LICENSE.txt \
    | tar -x -C "$tmp"
  printf 'Block-Sparse-Attention %s\ncutlass %s (the submodule pins %s)\n' \
    "$commit" "$cutlass_rev" "$pinned" >"$tmp/$top/ATTNBENCH_SOURCE"
  mkdir -p "$(dirname "$make_source")"
  tar -czf "$make_source" -C "$tmp" "$top"
  echo "Wrote $make_source ($(du -h "$make_source" | cut -f1)): Block-Sparse-Attention $commit, cutlass $cutlass_rev"
}

if [[ -n "$make_source" ]]; then
  write_source_tarball
  exit 0
fi

arch_list=()
head_dim_list=()
parse_choices arch_list "CUDA arch" "$archs" "${VALID_ARCHS[@]}"
parse_choices head_dim_list "head dim" "$head_dims" "${VALID_HEAD_DIMS[@]}"

if [[ -n "$jobs" && ! "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  die "--jobs/MAX_JOBS must be a positive integer, got '$jobs'"
fi
check_local_version "$local_version"
[[ -n "$source_tarball" ]] || die "no source tarball given (--source or BSA_SOURCE; --make-source writes one)"
[[ -f "$source_tarball" ]] || die "--source '$source_tarball' is not a file"
source_tarball=$(cd "$(dirname "$source_tarball")" && pwd)/$(basename "$source_tarball")
resolve_python "$python"

# Unpacks the tarball into a fresh folder and prints the source tree's path.
unpack_source() {
  local src_root="$work_dir/src"
  rm -rf "$src_root"
  mkdir -p "$src_root"
  tar -xzf "$source_tarball" -C "$src_root" || die "could not unpack '$source_tarball' (not a .tar.gz?)"
  local trees=("$src_root"/*/)
  [[ ${#trees[@]} -eq 1 && -f "${trees[0]}setup.py" ]] \
    || die "'$source_tarball' does not hold one source folder with a setup.py"
  [[ -f "${trees[0]}csrc/cutlass/include/cute/tensor.hpp" ]] \
    || die "'$source_tarball' has no csrc/cutlass/include (CUTLASS, a git submodule upstream); make it with --make-source"
  echo "${trees[0]%/}"
}

package_version() {
  sed -n 's/^__version__ *= *["'\'']\([^"'\'']*\)["'\''].*/\1/p' "$1/block_sparse_attn/__init__.py" | head -n 1
}

# Cuts static_switch.h, the two launch templates and setup.py down to the subset. Each edit first
# checks that the text it replaces is the one it knows, and stops with a message naming the file
# otherwise.
patch_sources() {
  "$python" - "$1" "${head_dim_list[*]}" "${VALID_HEAD_DIMS[*]}" <<'PY'
import re
import sys
from pathlib import Path

src = Path(sys.argv[1])
head_dims = [int(d) for d in sys.argv[2].split()]
all_head_dims = [int(d) for d in sys.argv[3].split()]
MARK = "attnbench subset build"
KERNELS = "csrc/block_sparse_attn/src"
FULL = "a full block_sparse_attn build"


def fail(path, why):
    sys.exit(f"build_block_sparse_attn.sh: error: {path.relative_to(src)} does not look as expected: "
             f"{why}. This script knows the layout of Block-Sparse-Attention 0.0.2 (commit 49d6c39, "
             "2025-12); another revision needs the script updated (or a full build).")


def read(name):
    path = src / name
    if not path.is_file():
        fail(path, "file missing")
    text = path.read_text()
    if MARK in text:
        fail(path, "already patched")
    return path, text


def macro_block(path, text, name):
    """The `#define name(...)` block, up to the line closing its lambda call."""
    found = list(re.finditer(rf"^[ \t]*#define {name}\(.*?^\s*\}}\(\)[ \t]*$", text, re.M | re.S))
    if len(found) != 1:
        fail(path, f"{len(found)} definitions of {name} found, expected 1")
    return found[0]


def patch_static_switch():
    path, text = read(f"{KERNELS}/static_switch.h")
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
    # Upstream rounds a head dim up to the next kernel (and silently runs nothing above 128);
    # a subset build takes exactly the head dims it has.
    new_headdim = (
        f"// {MARK} (envs/build_block_sparse_attn.sh): kernels for head dims {dims} only.\n"
        "#define HEADDIM_SWITCH(HEADDIM, ...) \\\n"
        "  [&] { \\\n"
        f"{branches}"
        "    } else { \\\n"
        f"      TORCH_CHECK(false, \"This block_sparse_attn build has kernels for head dims {dims} only, got \", \\\n"
        f"                  HEADDIM, \"; other head dims need {FULL}.\"); \\\n"
        "    } \\\n"
        "  }()")

    fp16 = macro_block(path, text, "FP16_SWITCH")
    body = fp16.group(0)
    if (re.findall(r"cutlass::\w+", body) != ["cutlass::half_t", "cutlass::bfloat16_t"]
            or "if (COND)" not in body or body.count("return __VA_ARGS__();") != 2):
        fail(path, "FP16_SWITCH is not `if (COND) half_t else bfloat16_t`")
    new_fp16 = (
        f"// {MARK} (envs/build_block_sparse_attn.sh): bf16 kernels only.\n"
        "#define FP16_SWITCH(COND, ...) \\\n"
        "  [&] { \\\n"
        "    TORCH_CHECK(!(COND), \"This block_sparse_attn build has bf16 kernels only, got fp16; \" \\\n"
        f"                \"fp16 needs {FULL}.\"); \\\n"
        "    using elem_type = cutlass::bfloat16_t; \\\n"
        "    return __VA_ARGS__(); \\\n"
        "  }()")
    # A feature compiled out: its condition must be false at run time, and the kernel is built
    # for false only (one template instance instead of two).
    off_switch = (
        f"\n// {MARK}: a feature this build compiles out.\n"
        "#define ATTNBENCH_OFF_SWITCH(COND, CONST_NAME, WHAT, ...) \\\n"
        "  [&] { \\\n"
        "    TORCH_CHECK(!(COND), \"This block_sparse_attn build has no \" WHAT \" kernels; \" \\\n"
        f"                WHAT \" needs {FULL}.\"); \\\n"
        "    constexpr static bool CONST_NAME = false; \\\n"
        "    return __VA_ARGS__(); \\\n"
        "  }()\n")
    # Replace the later block first so the earlier one's offsets stay valid.
    for match, new in sorted([(headdim, new_headdim), (fp16, new_fp16)], key=lambda p: -p[0].start()):
        text = text[:match.start()] + new + text[match.end():]
    path.write_text(text + off_switch)


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


def patch_launch_templates():
    for name, switches in OFF.items():
        path, text = read(f"{KERNELS}/{name}")
        for switch, what, count in switches:
            old = f"BOOL_SWITCH({switch}, [&]"
            if text.count(old) != count:
                fail(path, f"{text.count(old)} occurrences of {old!r}, expected {count}")
            text = text.replace(old, f'ATTNBENCH_OFF_SWITCH({switch}, "{what}", [&]')
        if "BOOL_SWITCH(" not in text:  # the even-size switches stay
            fail(path, "no BOOL_SWITCH left")
        path.write_text(f"// {MARK}: dropout, local windows and the like compiled out\n" + text)


def kernel_sources(dims, dtypes):
    return [f"{KERNELS}/flash_{kind}_block_hdim{d}_{dtype}{causal}_sm80.cu"
            for kind in ("fwd", "bwd") for d in dims for dtype in dtypes for causal in ("", "_causal")]


def replace_once(path, text, old, new):
    if text.count(old) != 1:
        fail(path, f"{text.count(old)} occurrences of {old.strip()!r}, expected 1")
    return text.replace(old, new)


def patch_setup_py():
    path, text = read("setup.py")
    for needed in ('os.getenv("BLOCK_SPARSE_ATTN_CUDA_ARCHS"', '"BLOCK_SPARSE_ATTN_FORCE_BUILD"',
                   '"FLASH_ATTN_LOCAL_VERSION"', 'name="block_sparse_attn_cuda"'):
        if needed not in text:
            fail(path, f"{needed} not found")
    lists = list(re.finditer(
        r'^(?P<indent>[ \t]*)sources=\[\s*\n\s*"csrc/block_sparse_attn/flash_api\.cpp",\n(?P<kernels>.*?)\n\s*\],',
        text, re.M | re.S))
    if len(lists) != 1:
        fail(path, f"{len(lists)} CUDA source lists starting with flash_api.cpp, expected 1")
    listed = re.findall(r'^\s*"([^"]+)",\s*$', lists[0].group("kernels"), re.M)
    expected = kernel_sources(all_head_dims, ("fp16", "bf16"))
    if sorted(listed) != sorted(expected):
        fail(path, f"the CUDA sources differ from the known {len(expected)} kernel files: "
                   f"unknown {sorted(set(listed) - set(expected))}, missing {sorted(set(expected) - set(listed))}")
    kept = ["csrc/block_sparse_attn/flash_api.cpp"] + kernel_sources(head_dims, ("bf16",))
    for name in kept:
        if not (src / name).is_file():
            fail(path, f"source {name} is listed but not in the source tarball")
    indent = lists[0].group("indent")
    new_list = (f"{indent}# {MARK}: bf16, head dims {head_dims} only\n{indent}sources=[\n"
                + "".join(f'{indent}    "{name}",\n' for name in kept) + f"{indent}],")
    text = text[:lists[0].start()] + new_list + text[lists[0].end():]
    # The tarball already holds CUTLASS; an offline machine cannot update a submodule, and one
    # without git would stop here.
    text = replace_once(path, text, 'subprocess.run(["git", "submodule", "update", "--init", "csrc/cutlass"])\n',
                        f"# {MARK}: csrc/cutlass comes with the source tarball\n")
    # setuptools would try to download missing setup_requires (psutil is only used without
    # MAX_JOBS, which the script sets); the script checks the build tools itself.
    text = replace_once(path, text, '    setup_requires=[\n        "packaging",\n        "psutil",\n        "ninja",\n    ],\n', "")
    path.write_text(text)
    return kept


patch_static_switch()
patch_launch_templates()
for name in patch_setup_py():
    print(name)
PY
}

[[ $patch_only -eq 1 ]] || check_build_tools "${arch_list[@]}"
make_work_dir "$work_dir" block_sparse_attn_build

echo "source: $source_tarball"
src=$(unpack_source)
version=$(package_version "$src")
[[ -n "$version" ]] || die "'$source_tarball' has no __version__ in block_sparse_attn/__init__.py"
[[ -f "$src/ATTNBENCH_SOURCE" ]] && sed 's/^/  /' "$src/ATTNBENCH_SOURCE"

kept=$(patch_sources "$src") || die "patching the block_sparse_attn $version sources failed (message above)"
mapfile -t kept_sources <<<"$kept"
echo "Patched block_sparse_attn $version in $src: bf16, head dims ${head_dim_list[*]}, archs ${arch_list[*]}"
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
build_wheel "$src" BLOCK_SPARSE_ATTN_FORCE_BUILD=TRUE BLOCK_SPARSE_ATTN_CUDA_ARCHS="$arch_env" \
  MAX_JOBS="$jobs" NVCC_THREADS=1 FLASH_ATTN_LOCAL_VERSION="$local_version" \
  "block_sparse_attn-$version*.whl"
echo "Check it: $python -c \"import torch, block_sparse_attn; print(block_sparse_attn.__version__)\""
